"""neo4j_graph: the canonical graph of one source projected into Neo4j (MERGE by stable id,
stale ids removed) with a chunk node per chunk, bracketed by a ProjectionMarker.

After a committed projection the stage keeps the tables it projected (stores/table_delta.py); the
next build projects only their difference while Neo4j still holds that generation, so a one-file
change does not read, shape or compare the whole source. Otherwise (first build, another code
version, a store that lost or never finished the generation, a rebuild of the same generation,
which doubles as a repair) the full write diffs against what Neo4j holds."""
from __future__ import annotations

from collections import Counter

from mtrag_resources.core.config import Settings
from mtrag_resources.core.models import GraphNode, GraphRelation
from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.stores.connect import open_neo4j
from mtrag_resources.stores.contract import COMMITTED, Marker
from mtrag_resources.stores.neo4j_store import chunk_node_id
from mtrag_resources.stores.table_delta import ProjectedTables, diff_tables
from mtrag_resources.stores.tables import as_rows, column_counts, held_table, read_rows, truthy_count
from mtrag_resources.stages.common import StageResult, projected_tables, timed
from mtrag_resources.core.layout import SourceLayout, read_state

CHUNK_NODE_FIELDS = ("chunk_id", "source_id", "role", "chunk_type", "file_path", "symbol", "title",
                     "start_line", "end_line", "parent_id")


def _inputs(layout: SourceLayout) -> dict:
    return {"nodes": layout.nodes, "relations": layout.relations, "chunks": layout.chunks}


def _snapshot_version() -> dict:
    return {v: CODE_VERSIONS[v] for v in ("cas_chunks", "canonical_graph", "neo4j_graph")}


def build_neo4j_graph(settings: Settings, spec: SourceSpec) -> StageResult:
    layout = SourceLayout(settings, spec.id)
    generation = read_state(layout)["generation"]
    snapshot = projected_tables(layout, "neo4j")
    meta: dict = {}
    with timed(meta, "seconds"):
        store = open_neo4j(settings)
        try:
            store.ensure_schema_once()
            stats = _write_delta(store, layout, spec.id, generation, snapshot)
            if stats is None:
                nodes = read_rows(layout.nodes, GraphNode)
                relations = read_rows(layout.relations, GraphRelation)
                chunks = [{k: r[k] for k in CHUNK_NODE_FIELDS} for r in read_rows(layout.chunks)]
                stats = store.write_source(spec.id, generation, nodes, relations, chunks)
            # Both writes end by committing this marker in their last transaction or raise: not read
            # back (a round trip on the batch's critical path; the asset check reads it).
            marker = Marker(spec.id, generation, COMMITTED)
        finally:
            store.close()
        snapshot.save_if_committed(marker, generation, _inputs(layout), extra=_snapshot_version())
    for key, value in stats.items():
        if value is not None:
            meta[key] = value if isinstance(value, (int, float, str, bool)) else dict(value)
    meta.update({"generation": generation, "marker": marker.state if marker else "none",
                 "write": "delta" if stats.get("delta_from") else "full",
                 "total_nodes": sum(stats.get("nodes", {}).values()),
                 "total_relationships": sum(stats.get("relationships", {}).values())})
    return StageResult(data_version=generation, metadata=meta)


def _write_delta(store, layout: SourceLayout, source_id: str, generation: str,
                 snapshot: ProjectedTables) -> dict | None:
    """The delta write against the last projected tables, or None where only a full write is right."""
    last = snapshot.base_for(generation, _snapshot_version(), _inputs(layout))
    if last is None:
        return None
    node_delta = diff_tables(layout.nodes, last.tables["nodes"], key=("node_id",))
    chunk_delta = diff_tables(layout.chunks, last.tables["chunks"], key=("chunk_id",), columns=CHUNK_NODE_FIELDS)
    rel_delta = diff_tables(layout.relations, last.tables["relations"], key=("rel_type", "rel_id"))
    changed_ids = sorted(set(rel_delta.changed.column("rel_id").to_pylist()))
    relations = []
    if changed_ids:  # every edge of a changed rel_id: it is replaced as a whole
        rel_rows = held_table(layout.relations, filters=[("rel_id", "in", changed_ids)]).to_pylist()
        relations = as_rows(rel_rows, GraphRelation)
    nodes = as_rows(node_delta.changed.to_pylist(), GraphNode)
    chunks = chunk_delta.changed.to_pylist()
    removed_nodes = [k[0] for k in node_delta.removed] + [chunk_node_id(k[0]) for k in chunk_delta.removed]
    stats = store.write_source_delta(source_id, generation, last.generation, nodes, relations, chunks,
                                     removed_nodes, list(rel_delta.removed), totals=_totals(layout))
    if stats is not None:  # per table: the change log's difference, or the tables compared
        stats["delta_read"] = " ".join(f"{name}:{d.via}" for name, d in
                                       (("nodes", node_delta), ("chunks", chunk_delta), ("relations", rel_delta)))
    return stats


def _totals(layout: SourceLayout) -> dict:
    """Entity nodes by label and relationships by type (HAS_CHUNK: the entities with a chunk) of
    the whole new projection, read column-wise."""
    nodes = held_table(layout.nodes, ["label", "chunk_id"])
    by_label = Counter(column_counts(nodes, "label"))
    by_type = Counter(column_counts(held_table(layout.relations, ["rel_type"]), "rel_type"))
    has_chunk = truthy_count(nodes, "chunk_id")
    if has_chunk:
        by_type["HAS_CHUNK"] += has_chunk
    return {"nodes": dict(by_label), "relationships": {t: n for t, n in sorted(by_type.items()) if n}}
