"""What the publish gate reads from the stores: each source's markers and counts (`StoreView`),
one check of one source for Dagster's asset checks, and the sources whose stores lag."""
from __future__ import annotations

from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import SourceLayout, read_state
from mtrag_resources.embedding.multilingual import collection_kind
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.publish.checks import (CheckOutcome, StoreView, check_counts, check_embedder,
                                            check_markers, chunk_facts)
from mtrag_resources.stores.connect import open_fts, open_neo4j, open_qdrant
from mtrag_resources.stores.contract import LINKS_SOURCE


def _markers(qdrant, fts, neo_markers: dict, source_id: str) -> dict:
    """`neo_markers`: every Neo4j marker, read in one query, not a round trip per source."""
    return {"qdrant": qdrant.marker(source_id), "fts": fts.marker(source_id), "neo4j": neo_markers.get(source_id)}


def _ml_points(qdrant, spec: SourceSpec) -> int:
    kind = collection_kind(spec.kind)
    return qdrant.count(kind, spec.id) if qdrant.collection_info(kind) else 0


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
            neo_markers = neo.markers()
            chunk_nodes = neo.chunk_counts([spec.id for spec in specs])
            for spec in specs:
                info = qdrant.collection_info(spec.kind) or {}
                views[spec.id] = StoreView(
                    markers=_markers(qdrant, fts, neo_markers, spec.id),
                    qdrant_points=qdrant.count(spec.kind, spec.id) if info else 0,
                    qdrant_dim=info.get("dim"),
                    fts_counts=fts.counts(spec.id),
                    neo4j_chunk_nodes=chunk_nodes[spec.id],
                    qdrant_ml_points=_ml_points(qdrant, spec),
                )
            links_marker = neo_markers.get(LINKS_SOURCE)
            locations = {"qdrant": settings.qdrant_url or str(settings.qdrant_path),
                         "fts": str(settings.fts_path), "neo4j": neo.uri}
        finally:
            fts.close()
            neo.close()
    return views, {"links": links_marker}, locations


def check_one(settings: Settings, spec: SourceSpec, name: str, fingerprint_id: str, dim: int,
              store: str | None = None, ml_fingerprint_id: str | None = None) -> CheckOutcome:
    """One gate check of one source, reading only the store it needs: the Dagster asset checks run
    one at a time, each right after its asset, and a full gather per check would read every store
    five times a source (docs/performance.md#publishing)."""
    layout = SourceLayout(settings, spec.id)
    if name == "markers_committed":
        opener = {"qdrant": open_qdrant, "fts": open_fts, "neo4j": open_neo4j}[store]
        with opener(settings) as client:
            view = StoreView(markers={store: client.marker(spec.id)})
        return check_markers(spec.id, view, read_state(layout).get("generation", ""))
    facts = chunk_facts(layout.chunks)
    if name == "embedder_fingerprint":
        with open_qdrant(settings) as qdrant:
            view = StoreView(markers={}, qdrant_dim=(qdrant.collection_info(spec.kind) or {}).get("dim"))
        return check_embedder(settings, spec.id, view, facts, fingerprint_id, dim, ml_fingerprint_id)
    if name == "counts_reconcile":
        views, _, _ = gather_views(settings, [spec], removed=[])
        return check_counts(spec.id, views[spec.id], facts)
    raise ValueError(f"unknown check {name!r}")


def lagging_sources(settings: Settings, specs: list[SourceSpec]) -> dict[str, str]:
    """Sources whose stores do not hold their current chunk set (a store lost data or was wiped by
    hand, or a write died): source id -> why. A build rebuilds them before publishing instead of
    failing the gate, since nothing in their files changed to trigger them. Markers only: a wiped
    store or a dead writer leaves a missing or uncommitted marker, and three markers are cheap
    where counting every store weighed on each incremental build (the publish gate still
    reconciles the counts; docs/performance.md#publishing)."""
    if not specs:
        return {}
    with open_qdrant(settings) as qdrant, open_fts(settings) as fts, open_neo4j(settings) as neo:
        neo_markers = neo.markers()
        markers = {spec.id: _markers(qdrant, fts, neo_markers, spec.id) for spec in specs}
    out = {}
    for spec in specs:
        generation = read_state(SourceLayout(settings, spec.id)).get("generation", "")
        outcome = check_markers(spec.id, StoreView(markers=markers[spec.id]), generation)
        if not outcome.passed:
            out[spec.id] = f"{outcome.name}: {outcome.description}"
    return out
