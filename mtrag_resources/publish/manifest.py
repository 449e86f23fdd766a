"""Published generations: `manifest-N.json` files and the `CURRENT` pointer.

Publishing is one atomic rename of `CURRENT`; a manifest file is complete before it is named
there, so a reader sees generation N or N+1 and never a mixture."""
from __future__ import annotations

import json
import re
from pathlib import Path

from mtrag_resources.core.errors import PublishError
from mtrag_resources.core.atomic import write_text_atomic
from mtrag_resources.core.faults import fault_point
from mtrag_resources.core.layout import current_path, manifest_path
from mtrag_resources.core.session import session_cache

MANIFEST_RE = re.compile(r"^manifest-(\d+)\.json$")


class ManifestError(PublishError):
    pass


def load_current(manifest_dir: Path) -> dict | None:
    try:
        name = current_path(manifest_dir).read_text().strip()
    except FileNotFoundError:
        return None
    if not MANIFEST_RE.match(name):
        raise ManifestError(f"{current_path(manifest_dir)}: unexpected content {name[:80]!r}")
    return json.loads((Path(manifest_dir) / name).read_text())


def latest_number(manifest_dir: Path) -> int:
    """The highest N of the folder's manifest-N.json files. A process that publishes again and
    again (the watch) lists the folder once: the manifests are never renamed, so its last answer
    holds while that file exists, and only the numbers after it are looked for (a listing of
    every generation ever published grows with the history)."""
    key = str(manifest_dir)
    number = _LATEST.get(key)
    if number is None or not manifest_path(manifest_dir, number).exists():
        number = max((int(m.group(1)) for p in Path(manifest_dir).glob("manifest-*.json")
                      if (m := MANIFEST_RE.match(p.name))), default=0)
    while manifest_path(manifest_dir, number + 1).exists():
        number += 1
    _LATEST[key] = number
    return number


# manifest folder -> the highest number latest_number found there (evicted: the folder is listed again)
_LATEST = session_cache("manifest.latest_number", max_entries=256)


def publish(manifest_dir: Path, manifest: dict) -> Path:
    """Write manifest-N.json for N = manifest['generation'], then point CURRENT at it."""
    n = int(manifest["generation"])
    path = manifest_path(manifest_dir, n)
    write_text_atomic(path, json.dumps(manifest, indent=1, sort_keys=True))
    fault_point("manifest:before_current")
    write_text_atomic(current_path(manifest_dir), path.name + "\n")
    return path


def diff(previous: dict | None, current: dict) -> dict:
    old = (previous or {}).get("sources", {})
    new = current.get("sources", {})
    changed = sorted(s for s in set(old) & set(new)
                     if old[s].get("chunk_generation") != new[s].get("chunk_generation"))
    return {
        "added": sorted(set(new) - set(old)),
        "removed": sorted(set(old) - set(new)),
        "changed": changed,
        "chunks_before": sum(s.get("counts", {}).get("chunks", 0) for s in old.values()),
        "chunks_after": sum(s.get("counts", {}).get("chunks", 0) for s in new.values()),
    }
