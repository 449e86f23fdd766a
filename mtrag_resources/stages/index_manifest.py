"""index_manifest: publish generation N only when every store of every source committed that
source's chunk-set generation and the gate checks pass; otherwise CURRENT stays as it was."""
from __future__ import annotations

import datetime as dt
import os

from mtrag_resources.core.errors import PublishError
from mtrag_resources.publish import manifest as manifests
from mtrag_resources.publish.checks import CheckOutcome, check_source
from mtrag_resources.publish.views import gather_views
from mtrag_resources.core.config import Settings
from mtrag_resources.embedding.embedder import Embedder
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.stores.connect import open_qdrant
from mtrag_resources.stores.tables import read_rows
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


def snapshot_qdrant(settings: Settings, number: int) -> str | None:
    """Embedded mode: publish a read-only copy of the Qdrant folder for readers, so serving never
    waits on the single-process lock a running build holds. A server needs no copy."""
    if settings.qdrant_url:
        return None
    # The copy CURRENT names stays whatever happens to this publish (a crash or a full disk before
    # CURRENT moves, again and again): a reader started later still finds it.
    published = (manifests.load_current(settings.manifest_dir) or {}).get("stores", {}).get("qdrant_snapshot")
    with open_qdrant(settings) as store:  # holds the writer lock: no build writes during the copy
        link = store.publish_snapshot(settings.qdrant_published_dir, keep=KEEP_QDRANT_SNAPSHOTS,
                                      protect=[published] if published else [])
    # The manifest names the versioned folder, so generation N is always read from N's copy.
    return os.path.realpath(link)


def build_index_manifest(settings: Settings, specs: list[SourceSpec], embedder: Embedder,
                         run_id: str = "") -> StageResult:
    previous = manifests.load_current(settings.manifest_dir)
    known = set((previous or {}).get("sources", {}))
    removed = sorted(known - {s.id for s in specs})
    meta: dict = {}
    with timed(meta, "seconds"):
        views, extra_markers, locations = gather_views(settings, specs, removed)
        outcomes = [o for spec in specs for o in
                    check_source(settings, spec, views[spec.id], embedder.fingerprint_id, embedder.dim)]
        failures = [o for o in outcomes if not o.passed]
        if failures:
            raise PublishRefused(failures)
        number = manifests.latest_number(settings.manifest_dir) + 1
        snapshot = snapshot_qdrant(settings, number)
        sources = {}
        for spec in specs:
            layout = SourceLayout(settings, spec.id)
            rows = read_rows(layout.chunks)
            inv = load_inventory(layout)
            gen = read_state(layout)["generation"]
            sources[spec.id] = {
                "kind": spec.kind,
                "snapshot_digest": inv.digest if inv else "",
                "commit": inv.commit if inv else "",
                "chunk_generation": gen,
                "counts": {"chunks": len(rows), "children": sum(r["role"] == "child" for r in rows),
                           "parents": sum(r["role"] == "parent" for r in rows),
                           "files": len(inv.included) if inv else 0},
                "stores": {name: {"generation": m.generation, "state": m.state}
                           for name, m in views[spec.id].markers.items()},
            }
        links_marker = extra_markers["links"]
        manifest = {
            "generation": number,
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(),
            "run_id": run_id,
            "embedder": {**embedder.fingerprint, "fingerprint_id": embedder.fingerprint_id},
            "code_versions": CODE_VERSIONS,
            "sources": sources,
            "links": {"generation": links_marker.generation if links_marker else "",
                      "state": links_marker.state if links_marker else "none",
                      "count": len(read_rows(settings.links_table))},
            "stores": {**locations, "qdrant_snapshot": snapshot, "qdrant_collections": {
                spec.kind: f"mtrag_{spec.kind}" for spec in specs}},
        }
        path = manifests.publish(settings.manifest_dir, manifest)
    change = manifests.diff(previous, manifest)
    meta.update({"generation": number, "path": str(path), "sources": len(sources),
                 "added": change["added"], "removed": change["removed"], "changed": change["changed"],
                 "chunks_before": change["chunks_before"], "chunks_after": change["chunks_after"],
                 "checks_passed": len(outcomes)})
    return StageResult(data_version=str(number), metadata=meta, value=manifest)
