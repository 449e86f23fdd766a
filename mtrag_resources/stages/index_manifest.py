"""index_manifest: publish generation N only when every store of every source committed that
source's chunk-set generation and the gate checks pass; otherwise CURRENT stays as it was."""
from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from mtrag_resources.publish import manifest as manifests
from mtrag_resources.publish.checks import CheckOutcome, StoreView, check_counts, check_embedder, check_markers, check_source
from mtrag_resources.core.config import Settings
from mtrag_resources.embedding.embedder import Embedder
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.stores.connect import open_fts, open_neo4j, open_qdrant
from mtrag_resources.stores.contract import LINKS_SOURCE
from mtrag_resources.stores.tables import read_rows
from mtrag_resources.stages.common import CODE_VERSIONS, SourceLayout, StageResult, read_state, timed
from mtrag_resources.stages.cross_source_links import links_path
from mtrag_resources.stages.raw_source import load_inventory

KEEP_QDRANT_SNAPSHOTS = 3


class PublishRefused(RuntimeError):
    def __init__(self, failures: list[CheckOutcome]):
        self.failures = failures
        lines = [f"{f.source_id}/{f.name}: {f.description}" for f in failures]
        super().__init__("generation not published; failing checks:\n  " + "\n  ".join(lines))


def _markers(qdrant, fts, neo, source_id: str) -> dict:
    return {"qdrant": qdrant.marker(source_id), "fts": fts.marker(source_id), "neo4j": neo.marker(source_id)}


def gather_views(settings: Settings, specs: list[SourceSpec], removed: list[str]) -> tuple[dict, dict, dict]:
    """Read markers and counts from every store (and drop sources no longer configured)."""
    views, links_marker, locations = {}, None, {}
    with open_qdrant(settings) as qdrant:
        fts = open_fts(settings)
        neo = open_neo4j(settings)
        try:
            for sid in removed:
                qdrant.delete_source(sid)
                fts.delete_source(sid)
                neo.delete_source(sid)
            for spec in specs:
                info = qdrant.collection_info(spec.kind) or {}
                views[spec.id] = StoreView(
                    markers=_markers(qdrant, fts, neo, spec.id),
                    qdrant_points=qdrant.count(spec.kind, spec.id) if info else 0,
                    qdrant_dim=info.get("dim"),
                    fts_counts=fts.counts(spec.id),
                    neo4j_chunk_nodes=neo.counts(spec.id).get("chunks", 0),
                )
            links_marker = neo.marker(LINKS_SOURCE)
            locations = {"qdrant": settings.qdrant_url or str(settings.qdrant_path),
                         "fts": str(settings.fts_path), "neo4j": neo.uri}
        finally:
            fts.close()
            neo.close()
    return views, {"links": links_marker}, locations


def check_one(settings: Settings, spec: SourceSpec, name: str, fingerprint_id: str, dim: int,
              store: str | None = None) -> CheckOutcome:
    """One gate check of one source, reading only the store it needs: the Dagster asset checks run
    one at a time, each right after its asset, and five full gathers per source cost ~1 s a build."""
    layout = SourceLayout(settings, spec.id)
    if name == "markers_committed":
        opener = {"qdrant": open_qdrant, "fts": open_fts, "neo4j": open_neo4j}[store]
        with opener(settings) as client:
            view = StoreView(markers={store: client.marker(spec.id)})
        return check_markers(spec.id, view, read_state(layout).get("generation", ""))
    rows = read_rows(layout.chunks)
    if name == "embedder_fingerprint":
        with open_qdrant(settings) as qdrant:
            view = StoreView(markers={}, qdrant_dim=(qdrant.collection_info(spec.kind) or {}).get("dim"))
        return check_embedder(settings, spec.id, view, rows, fingerprint_id, dim)
    if name == "counts_reconcile":
        views, _, _ = gather_views(settings, [spec], removed=[])
        return check_counts(spec.id, views[spec.id], rows)
    raise ValueError(f"unknown check {name!r}")


def lagging_sources(settings: Settings, specs: list[SourceSpec]) -> dict[str, str]:
    """Sources whose stores do not hold their current chunk set (a store lost data or was wiped by
    hand, or a write died): source id -> why. A build rebuilds them before publishing instead of
    failing the gate, since nothing in their files changed to trigger them. Markers only: a wiped
    store or a dead writer leaves a missing or uncommitted marker, and reading three markers costs
    milliseconds where counting every store took ~1 s of each incremental build (the publish gate
    still reconciles the counts)."""
    if not specs:
        return {}
    with open_qdrant(settings) as qdrant, open_fts(settings) as fts, open_neo4j(settings) as neo:
        markers = {spec.id: _markers(qdrant, fts, neo, spec.id) for spec in specs}
    out = {}
    for spec in specs:
        generation = read_state(SourceLayout(settings, spec.id)).get("generation", "")
        outcome = check_markers(spec.id, StoreView(markers=markers[spec.id]), generation)
        if not outcome.passed:
            out[spec.id] = f"{outcome.name}: {outcome.description}"
    return out


def snapshot_qdrant(settings: Settings, number: int) -> str | None:
    """Embedded mode: publish a read-only copy of the Qdrant folder for readers, so serving never
    waits on the single-process lock a running build holds. A server needs no copy."""
    if settings.qdrant_url:
        return None
    # The copy CURRENT names stays whatever happens to this publish (a crash or a full disk before
    # CURRENT moves, again and again): a reader started later still finds it.
    published = (manifests.load_current(settings.manifest_dir) or {}).get("stores", {}).get("qdrant_snapshot")
    with open_qdrant(settings) as store:  # holds the writer lock: no build writes during the copy
        link = store.publish_snapshot(settings.manifest_dir / "qdrant-published", keep=KEEP_QDRANT_SNAPSHOTS,
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
                      "count": len(read_rows(links_path(settings)))},
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
