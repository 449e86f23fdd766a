"""index_manifest: publish generation N only when every store of every source committed that
source's chunk-set generation, the gate checks pass and, where a golden query file exists, the
candidate's golden recall holds (publish/golden.py); otherwise CURRENT stays as it was."""
from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path
from typing import Callable

from mtrag_resources.core.errors import PublishError
from mtrag_resources.publish import manifest as manifests
from mtrag_resources.publish.checks import CheckOutcome, check_source
from mtrag_resources.publish.golden import (GoldenFile, QualityRefused, Verdict, accepted_record, clear_refusal,
                                            judge, load_golden, record_refusal)
from mtrag_resources.publish.build_state import publish_lock
from mtrag_resources.publish.reclaim import reclaim
from mtrag_resources.publish.shadow_home import built_profile
from mtrag_resources.core.profiles import serving_block
from mtrag_resources.publish.views import gather_views
from mtrag_resources.core.config import Settings
from mtrag_resources.embedding.embedder import Embedder
from mtrag_resources.embedding.multilingual import MultilingualEmbedder, collection_kind
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.stores.connect import open_qdrant
from mtrag_resources.stores.qdrant_folder import prune_versions
from mtrag_resources.stores.tables import row_count, value_counts
from mtrag_resources.stages.common import StageResult, timed
from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.core.layout import SourceLayout, read_state
from mtrag_resources.ingest.snapshot import load_inventory

KEEP_QDRANT_SNAPSHOTS = 3


class PublishRefused(PublishError):
    def __init__(self, failures: list[CheckOutcome]):
        self.failures = failures
        lines = [f"{f.source_id}/{f.name}: {f.description}" for f in failures]
        super().__init__("generation not published; failing checks:\n  " + "\n  ".join(lines))


def snapshot_qdrant(settings: Settings, meta: dict) -> str | None:
    """Embedded mode: publish a read-only version of the Qdrant folder for readers, so serving
    never waits on the single-process lock a running build holds (it shares unchanged files with
    the previous version; what it cost goes into `meta`). A server needs no copy."""
    if settings.qdrant_url:
        return None
    # Older versions are pruned once the manifest names this one (prune_snapshots), off the
    # publish's path; the one CURRENT names stays whatever happens to this publish meanwhile.
    with open_qdrant(settings) as store:  # holds the writer lock: no build writes during the copy
        stats = store.publish_snapshot(settings.qdrant_published_dir, keep=KEEP_QDRANT_SNAPSHOTS, prune=False)
    meta.update(stats.as_metadata())
    # The manifest names the versioned folder, so generation N is always read from N's version.
    return os.path.realpath(stats.version)


def prune_snapshots(settings: Settings, *published: str | None) -> int:
    """The published Qdrant versions but the newest KEEP_QDRANT_SNAPSHOTS and `published` (the one
    the new manifest names and the one before it, which a reader may be opening) removed."""
    if settings.qdrant_url:
        return 0
    return prune_versions(settings.qdrant_published_dir, KEEP_QDRANT_SNAPSHOTS, [p for p in published if p])


GoldenEvaluator = Callable[[Settings, GoldenFile, dict], dict]


def golden_gate(settings: Settings, golden: GoldenFile | None, evaluate: GoldenEvaluator | None, manifest: dict,
                previous: dict | None, accept: bool, run_id: str, meta: dict) -> Verdict | None:
    """Run the golden queries on the candidate `manifest` (its stores are committed, CURRENT has
    not moved) and hold its recall to the golden file's quality_gate against the published
    generation's figures; records them as the manifest's `quality`."""
    if golden is None:
        return None
    t0 = time.perf_counter()
    verdict = judge(golden, evaluate(settings, golden, manifest), previous)
    meta["golden_seconds"] = round(time.perf_counter() - t0, 4)
    manifest["quality"] = verdict.record
    if not verdict.passed:
        if not accept:
            refused = QualityRefused(verdict, manifest["generation"], (previous or {}).get("generation"), golden.path)
            record_refusal(settings.quality_refusal, refused, run_id)
            raise refused
        verdict.record["accepted_drop"] = accepted_record(verdict)
    return verdict


def served_profile(settings: Settings, previous: dict | None) -> dict | None:
    """The profile the generation serves: a shadow home's own (docs/shadow.md), or the one a
    cut-over made live, which every later build of the live home goes on serving."""
    built = built_profile(settings.home)
    if built is not None:
        return serving_block(built)
    return (previous or {}).get("serving")


def golden_figures(verdict: Verdict) -> dict:
    """The generation's golden figures as plain metadata (the asset adds the per-query table)."""
    r = verdict.record
    out = {"golden_file": r["golden_file"], "golden_recall": float(r["recall"]), "golden_recalled": r["recalled"],
           "golden_queries": r["queries"], "golden_accepted_drop": bool(r["accepted_drop"])}
    if r["baseline"]:
        out.update({"golden_previous_recall": float(r["baseline"]["recall_before"]),
                    "golden_drop": float(r["baseline"]["drop"])})
    return out


def _role_counts(chunks: Path) -> dict:
    """{role: chunks} of a source's chunk table, from its `role` column alone: a CLI publish decoded
    every column of each source it did not build for these three counts."""
    try:
        return value_counts(chunks, "role")
    except FileNotFoundError:  # no chunk table: no chunks (the checks have said what that means)
        return {}


def build_index_manifest(settings: Settings, specs: list[SourceSpec], embedder: Embedder,
                         run_id: str = "", multilingual: MultilingualEmbedder | None = None,
                         evaluate_golden: GoldenEvaluator | None = None,
                         accept_quality_drop: bool = False) -> StageResult:
    """_publish under the publish lock: no cut-over or other publish moves CURRENT between its
    reading of the published manifest and its own move."""
    with publish_lock(settings):
        return _publish(settings, specs, embedder, run_id, multilingual, evaluate_golden, accept_quality_drop)


def _publish(settings: Settings, specs: list[SourceSpec], embedder: Embedder,
             run_id: str = "", multilingual: MultilingualEmbedder | None = None,
             evaluate_golden: GoldenEvaluator | None = None,
             accept_quality_drop: bool = False) -> StageResult:
    """`evaluate_golden(settings, golden, candidate_manifest) -> {query id: rank or None}` runs the
    golden queries on the candidate (the application passes `serving.golden.evaluate_candidate`:
    this layer may not import the reader); required where a golden file exists. A candidate the
    golden gate refuses raises QualityRefused (recorded for `mtrag status`) unless
    `accept_quality_drop`, which publishes it with the drop recorded in its manifest."""
    previous = manifests.load_current(settings.manifest_dir)
    known = set((previous or {}).get("sources", {}))
    removed = sorted(known - {s.id for s in specs})
    meta: dict = {}
    golden = load_golden(settings.golden_file)  # a malformed file fails before any store is touched
    if golden is not None:
        golden.unknown_sources(s.id for s in specs)
        if evaluate_golden is None:
            raise PublishError(f"{golden.path} holds golden queries but this caller passed no evaluator "
                               "(evaluate_golden); refusing to publish around the quality gate")
    snapshot = None
    try:
        with timed(meta, "seconds"):
            # The Qdrant version first: a serving reader opens it as soon as `qdrant-published`
            # names it (serving/generations.py, _prefetch) while the gate reads the stores and the manifest is
            # written; a refused candidate's version is pruned below like any other. Not where a
            # source was removed: gather_views deletes its points first.
            publish_cost: dict = {}
            early = not removed
            if early:
                snapshot = snapshot_qdrant(settings, publish_cost)
            views, extra_markers, locations = gather_views(settings, specs, removed)
            outcomes, uses_ml = _check_sources(settings, specs, views, embedder, multilingual)
            number = manifests.latest_number(settings.manifest_dir) + 1
            if not early:
                snapshot = snapshot_qdrant(settings, publish_cost)
            sources = {spec.id: _source_entry(settings, spec, views[spec.id]) for spec in specs}
            links_marker = extra_markers["links"]
            manifest = {
                "generation": number,
                "created_at": dt.datetime.now(dt.timezone.utc).isoformat(),
                "run_id": run_id,
                "embedder": {**embedder.fingerprint, "fingerprint_id": embedder.fingerprint_id},
                **({"multilingual": {**multilingual.fingerprint, "fingerprint_id": multilingual.fingerprint_id}}
                   if uses_ml else {}),
                "code_versions": CODE_VERSIONS,
                "sources": sources,
                "links": {"generation": links_marker.generation if links_marker else "",
                          "state": links_marker.state if links_marker else "none",
                          "count": row_count(settings.links_table)},
                "stores": {**locations, "qdrant_snapshot": snapshot, "qdrant_collections": {
                    k: f"mtrag_{k}" for spec in specs
                    for k in ((spec.kind, collection_kind(spec.kind)) if uses_ml else (spec.kind,))}},
            }
            serving = served_profile(settings, previous)
            if serving:
                manifest["serving"] = serving
            verdict = golden_gate(settings, golden, evaluate_golden, manifest, previous, accept_quality_drop,
                                  run_id, meta)
            path = manifests.publish(settings.manifest_dir, manifest)
            clear_refusal(settings.quality_refusal)
    finally:  # refused or failed too: the versions do not pile up
        if snapshot is not None:
            prune_snapshots(settings, snapshot, ((previous or {}).get("stores") or {}).get("qdrant_snapshot"))
    if verdict is not None:
        meta.update(golden_figures(verdict))
    else:
        meta["golden_file"] = f"none at {settings.golden_file}"
    change = manifests.diff(previous, manifest)
    meta.update({"generation": number, "path": str(path), "sources": len(sources),
                 "added": change["added"], "removed": change["removed"], "changed": change["changed"],
                 "chunks_before": change["chunks_before"], "chunks_after": change["chunks_after"],
                 "checks_passed": len(outcomes), **publish_cost})
    meta.update(_reclaim_after(settings, {s.id for s in specs} | set(manifest["sources"])))
    return StageResult(data_version=str(number), metadata=meta, value=manifest)


def _check_sources(settings: Settings, specs: list[SourceSpec], views: dict, embedder: Embedder,
                   multilingual: MultilingualEmbedder | None) -> tuple[list, bool]:
    """Every source's publish checks (raises PublishRefused naming the failed ones), and whether
    the candidate uses the multilingual embedder. With one configured, every CJK child needs its
    multilingual point and vector (the gate checks both); the manifest records it only where CJK
    text is."""
    ml_id = multilingual.fingerprint_id if multilingual is not None else None
    if multilingual is None:
        for view in views.values():
            view.qdrant_ml_points = None  # not built with one: nothing to count
    uses_ml = multilingual is not None and any(views[s.id].qdrant_ml_points for s in specs)
    outcomes = [o for spec in specs for o in
                check_source(settings, spec, views[spec.id], embedder.fingerprint_id, embedder.dim, ml_id)]
    failures = [o for o in outcomes if not o.passed]
    if failures:
        raise PublishRefused(failures)
    return outcomes, uses_ml


def _source_entry(settings: Settings, spec: SourceSpec, view) -> dict:
    """A source's entry in the manifest: its snapshot, chunk generation, counts and store markers."""
    layout = SourceLayout(settings, spec.id)
    roles = _role_counts(layout.chunks)
    inv = load_inventory(layout)
    state = read_state(layout)
    return {
        "kind": spec.kind,
        "snapshot_digest": inv.digest if inv else "",
        "commit": inv.commit if inv else "",
        # A git source: the snapshot's commit, its ref and repository (every hit of it names them).
        **({"commit_sha": inv.commit, "ref": inv.ref, "repository": inv.repository}
           if inv and inv.ref else {}),
        "chunk_generation": state["generation"],
        # a docs source's Sphinx default role: the bridge reads a pasted section of it
        # as its build read the pages (serving/bridge.py)
        **({"default_role": state["default_role"]} if state.get("default_role") else {}),
        "counts": {"chunks": sum(roles.values()), "children": roles.get("child", 0),
                   "parents": roles.get("parent", 0), "files": len(inv.included) if inv else 0,
                   # the CJK children in the multilingual collection: where a query may find them
                   **({"multilingual": view.qdrant_ml_points} if view.qdrant_ml_points is not None else {})},
        "stores": {name: {"generation": m.generation, "state": m.state} for name, m in view.markers.items()},
    }


def _reclaim_after(settings: Settings, kept: set[str]) -> dict:
    """Disk no generation needs any more, once the new one is CURRENT; a failure here is reported,
    and never undoes the publish."""
    try:
        return reclaim(settings, kept)
    except Exception as exc:  # noqa: BLE001 - the next publish tries again
        return {"reclaim_error": f"{type(exc).__name__}: {exc}"}
