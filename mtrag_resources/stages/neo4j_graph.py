"""neo4j_graph: the canonical graph of one source projected into Neo4j (MERGE by stable id,
stale ids removed) with a chunk node per chunk, bracketed by a ProjectionMarker."""
from __future__ import annotations

from mtrag_resources.core.config import Settings
from mtrag_resources.core.models import GraphNode, GraphRelation
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.stores.connect import open_neo4j
from mtrag_resources.stores.tables import read_rows
from mtrag_resources.stages.common import StageResult, timed
from mtrag_resources.core.layout import SourceLayout, read_state

CHUNK_NODE_FIELDS = ("chunk_id", "source_id", "role", "chunk_type", "file_path", "symbol", "title",
                     "start_line", "end_line", "parent_id")


def build_neo4j_graph(settings: Settings, spec: SourceSpec) -> StageResult:
    layout = SourceLayout(settings, spec.id)
    generation = read_state(layout)["generation"]
    meta: dict = {}
    with timed(meta, "seconds"):
        nodes = read_rows(layout.nodes, GraphNode)
        relations = read_rows(layout.relations, GraphRelation)
        chunks = [{k: r[k] for k in CHUNK_NODE_FIELDS} for r in read_rows(layout.chunks)]
        store = open_neo4j(settings)
        try:
            store.ensure_schema()
            stats = store.write_source(spec.id, generation, nodes, relations, chunks)
            marker = store.marker(spec.id)
        finally:
            store.close()
    for key, value in stats.items():
        meta[key] = value if isinstance(value, (int, float, str, bool)) else dict(value)
    meta.update({"generation": generation, "marker": marker.state if marker else "none",
                 "total_nodes": sum(stats.get("nodes", {}).values()),
                 "total_relationships": sum(stats.get("relationships", {}).values())})
    return StageResult(data_version=generation, metadata=meta)
