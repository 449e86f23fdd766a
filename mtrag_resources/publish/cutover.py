"""Cut-over and rollback (docs/shadow.md#cut-over): a shadow's published generation becomes the
live one in one step, and the step is undone by another.

A cut-over publishes the shadow's manifest into the live series as generation N+1, with the
same atomic move of CURRENT as any publish: it names the shadow's stores (`stores_home`, whose FTS
file a reader opens; the Qdrant version is named by path already), the profile's settings
(`serving`: its fusion weights and the environment its builds and readers run under) and what it
replaced (`cutover.previous`). Nothing of the live home's stores is written, so a rollback only
publishes the manifest the cut-over replaced again, renumbered. The graph is not switched: a
cut-over is refused unless the shadow's chunk sets and links are the ones the live graph holds."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from mtrag_resources.core.atomic import write_text_atomic
from mtrag_resources.core.config import Settings
from mtrag_resources.core.errors import ConfigError, NotPublished, PublishError
from mtrag_resources.core.layout import manifest_path
from mtrag_resources.publish import manifest as manifests
from mtrag_resources.publish.build_state import publish_lock
from mtrag_resources.publish.golden import GoldenFile, Verdict, accepted_record, judge, refusal_lines


MEASURED = "measured.json"  # in a read-time profile's shadow folder: its golden ranks on the live generation


class CutoverRefused(PublishError):
    """The shadow may not become live: the golden gate, or a graph it does not match."""


def promote(live: Settings, shadow: Settings | None, serving: dict, golden: GoldenFile | None,
            ranks: dict[str, int | None] | None, accept_quality_drop: bool = False) -> dict:
    """_promote under the publish lock (a build publishing meanwhile waits, and then reads this)."""
    with publish_lock(live):
        return _promote(live, shadow, serving, golden, ranks, accept_quality_drop)


def _promote(live: Settings, shadow: Settings | None, serving: dict, golden: GoldenFile | None,
             ranks: dict[str, int | None] | None, accept_quality_drop: bool = False) -> dict:
    """Publish the shadow's generation as the live home's next one; returns its manifest.
    `shadow` None: a profile of read-time settings alone, which has no stores of its own: the live
    generation is published again with it. `ranks`: the golden queries' best ranks on the
    candidate read with the profile (None: no golden file)."""
    current = _current(live, "live")
    name = serving["profile"]
    if shadow is None:
        if current.get("serving"):
            raise ConfigError(f"live generation {current['generation']} serves profile "
                              f"{current['serving']['profile']!r}; `mtrag rollback` to the index it replaced first")
        candidate, moved = current, {}
    else:
        candidate = _current(shadow, name)
        if candidate.get("stores_home") or candidate.get("cutover"):
            raise ConfigError(f"{shadow.home}: its generation is itself a cut-over; build the shadow again")
        _same_graph(current, candidate, name)
        moved = {"stores_home": str(shadow.home)}
    now = _now()
    manifest = {**{k: v for k, v in candidate.items() if k not in ("stores_home", "rollback", "quality")},
                **moved, "generation": manifests.latest_number(live.manifest_dir) + 1, "created_at": now,
                "serving": serving,
                "cutover": {"profile": name, "previous": current["generation"], "at": now,
                            "shadow_generation": None if shadow is None else candidate["generation"]}}
    if golden is not None:
        verdict = judge(golden, ranks or {}, current)
        if not verdict.passed:
            if not accept_quality_drop:
                raise CutoverRefused(_refusal(verdict, name, current["generation"]))
            verdict.record["accepted_drop"] = {**accepted_record(verdict), "how": "mtrag cutover --accept-quality-drop"}
        manifest["quality"] = verdict.record
    manifests.publish(live.manifest_dir, manifest)
    return manifest


def gated_ranks(manifest: dict, golden: GoldenFile, serving: dict) -> dict[str, int | None] | None:
    """The golden ranks a shadow's own publish measured, read with the profile it serves: reused
    when the golden file and the profile are the ones it was measured with (None: ask again)."""
    quality = manifest.get("quality") or {}
    if quality.get("golden_digest") != golden.digest or manifest.get("serving") != serving:
        return None
    per_query = quality.get("per_query") or {}
    if any(per_query.get(q.id, {}).get("digest") != q.digest for q in golden.queries):
        return None
    return {q.id: per_query[q.id]["rank"] for q in golden.queries}


def record_measured(shadow_home: Path, live_generation: int, serving: dict, golden: GoldenFile,
                    ranks: dict[str, int | None]) -> dict:
    """What `mtrag build --profile NAME` measures for a profile of read-time settings (it has no
    stores to build): the golden ranks of the live generation read with it, for its cut-over."""
    record = {"generation": int(live_generation), "serving": serving, "quality": judge(golden, ranks, None).record}
    write_text_atomic(Path(shadow_home) / MEASURED, json.dumps(record, indent=1, sort_keys=True))
    return record


def measured_ranks(shadow_home: Path, live_generation: int, golden: GoldenFile,
                   serving: dict) -> dict[str, int | None] | None:
    """The ranks record_measured kept, while the live generation, the golden file and the profile
    are the ones measured (None: ask again)."""
    try:
        record = json.loads((Path(shadow_home) / MEASURED).read_text())
    except (FileNotFoundError, ValueError):
        return None
    if record.get("generation") != int(live_generation):
        return None
    return gated_ranks(record, golden, serving)


def rollback(live: Settings) -> dict:
    """Publish again the generation the served cut-over replaced; returns its manifest. Only while
    CURRENT is the cut-over itself: a live build after it wrote the live stores with the profile."""
    with publish_lock(live):
        return _rollback(live)


def _rollback(live: Settings) -> dict:
    current = _current(live, "live")
    cut = current.get("cutover")
    if not cut:
        raise ConfigError(f"generation {current['generation']} is not a cut-over"
                          + (f" (it was built after the cut-over of {current['serving']['profile']!r}: its stores "
                             "hold that profile's index)" if current.get("serving") else "")
                          + "; nothing to roll back")
    path = manifest_path(live.manifest_dir, int(cut["previous"]))
    try:
        previous = json.loads(path.read_text())
    except FileNotFoundError:
        raise PublishError(f"{path}: the generation the cut-over replaced is gone; nothing to roll back to") from None
    snapshot = (previous.get("stores") or {}).get("qdrant_snapshot")
    if snapshot and not Path(snapshot).is_dir():
        raise PublishError(f"{snapshot}: generation {previous['generation']}'s vectors are gone; "
                           "nothing to roll back to")
    now = _now()
    manifest = {**previous, "generation": manifests.latest_number(live.manifest_dir) + 1, "created_at": now,
                "rollback": {"from": current["generation"], "profile": cut["profile"],
                             "restored": previous["generation"], "at": now}}
    manifests.publish(live.manifest_dir, manifest)
    return manifest


def serves_shadow(live: Settings, shadow: Settings) -> int | None:
    """The live generation that reads `shadow`'s stores (a cut-over), if CURRENT is one."""
    current = manifests.load_current(live.manifest_dir) or {}
    if current.get("stores_home") and Path(current["stores_home"]) == shadow.home:
        return int(current["generation"])
    return None


def _current(settings: Settings, name: str) -> dict:
    manifest = manifests.load_current(settings.manifest_dir)
    if not manifest:
        raise NotPublished(f"{name}: {settings.home} has no published generation"
                           + ("" if name == "live" else f"; run mtrag build --profile {name}"))
    return manifest


def _same_graph(current: dict, candidate: dict, name: str) -> None:
    """The live graph serves the promoted generation: its chunk sets and links must be the live ones."""
    live_sets = {s: e["chunk_generation"] for s, e in current["sources"].items()}
    shadow_sets = {s: e["chunk_generation"] for s, e in candidate["sources"].items()}
    differ = sorted(s for s in live_sets.keys() | shadow_sets.keys() if live_sets.get(s) != shadow_sets.get(s))
    if differ or (current.get("links") or {}).get("generation") != (candidate.get("links") or {}).get("generation"):
        what = f"the sources {differ}" if differ else "the doc-to-code links"
        raise CutoverRefused(f"{name}: {what} differ from live generation {current['generation']}'s, whose graph "
                             f"would then be stale; build the shadow again (`mtrag build --profile {name}`)")


def _refusal(verdict: Verdict, name: str, live_generation: int) -> str:
    return (f"{name} not cut over by the golden-query gate; CURRENT still names generation {live_generation}:\n  "
            + "\n  ".join(refusal_lines(verdict)) + "\n  cut over anyway with `mtrag cutover --accept-quality-drop`")


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()
