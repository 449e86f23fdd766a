"""The publishing gate: per-source consistency checks that index_manifest runs before it writes a
generation, and that Dagster shows as blocking asset checks."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from mtrag_resources.core.arrow import pa, pc
from mtrag_resources.core.config import Settings
from mtrag_resources.core.session import session_cache
from mtrag_resources.stores.embedding_cache import EmbeddingCache
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.core.layout import SourceLayout, read_state
from mtrag_resources.core.models import cjk_children, vector_hash
from mtrag_resources.stores.tables import cached_rows, column_names, read_table

CHECK_NAMES = ("markers_committed", "counts_reconcile", "embedder_fingerprint", "no_dangling_parents")


@dataclass
class CheckOutcome:
    name: str
    source_id: str
    passed: bool
    description: str
    metadata: dict = field(default_factory=dict)


@dataclass
class StoreView:
    """What the gate reads from the stores for one source (gathered by the caller, which owns the
    store clients)."""
    markers: dict          # store name -> Marker | None
    qdrant_points: int = 0
    qdrant_dim: int | None = None
    fts_counts: dict = field(default_factory=dict)  # child_rows, parent_rows
    neo4j_chunk_nodes: int = 0
    qdrant_ml_points: int | None = None  # the multilingual collection's points (None: not counted)


# What the checks read of a chunk row (vector_hash, cjk_children, check_parents, the counts).
CHECKED_COLUMNS = ("chunk_id", "parent_id", "role", "script", "embed_hash", "content_hash")


@dataclass(frozen=True)
class RowFacts:
    """What the checks derive from a chunk table's rows."""
    rows: int
    children: int
    vector_hashes: list[str]  # sorted, distinct: the children's embedding texts (vector_hash)
    cjk_children: int
    cjk_hashes: list[str]     # sorted, distinct: the CJK children's content hashes
    dangling: list[str]       # chunks whose parent_id names no chunk of the rows


def chunk_facts(path) -> RowFacts:
    """The checks' facts of the chunk table at `path`: from the decoded rows this process holds
    (the stages' shared ones), else computed on the checked columns in Arrow. A publish checks
    every source, and decoding a source this process did not build into row dicts first cost about
    twice the Arrow pass (docs/performance.md#publishing)."""
    held = cached_rows(path)
    if held is not None:
        return row_facts(held)
    names = set(column_names(path))  # an older table may lack a column (script, embed_hash)
    return table_facts(read_table(path, columns=[c for c in CHECKED_COLUMNS if c in names]))


def table_facts(table: pa.Table) -> RowFacts:
    """row_facts of the table's rows, without decoding them (a missing script or embed_hash
    column reads as null, as a row dict without the key)."""
    def column(name: str) -> pa.ChunkedArray:
        return table[name] if name in table.column_names else pa.chunked_array([pa.nulls(table.num_rows, pa.string())])

    def where(mask) -> pa.ChunkedArray:  # a null comparison (a null value) counts as false
        return pc.fill_null(mask, False)

    child = where(pc.equal(column("role"), "child"))
    content = column("content_hash")
    vectors = pc.if_else(where(pc.not_equal(column("embed_hash"), "")), column("embed_hash"), content)
    cjk = pc.and_(child, where(pc.equal(column("script"), "cjk")))
    parent = column("parent_id")
    dangling = pc.and_(where(pc.not_equal(parent, "")),
                       pc.invert(where(pc.is_in(parent, value_set=pc.unique(column("chunk_id"))))))
    return RowFacts(rows=table.num_rows, children=pc.sum(child).as_py() or 0,
                    vector_hashes=sorted(pc.unique(vectors.filter(child)).to_pylist()),
                    cjk_children=pc.sum(cjk).as_py() or 0,
                    cjk_hashes=sorted(pc.unique(content.filter(cjk)).to_pylist()),
                    dangling=column("chunk_id").filter(dangling).to_pylist())


def check_source(settings: Settings, spec: SourceSpec, view: StoreView, fingerprint_id: str, dim: int,
                 ml_fingerprint_id: str | None = None) -> list[CheckOutcome]:
    layout = SourceLayout(settings, spec.id)
    facts = chunk_facts(layout.chunks)
    generation = read_state(layout).get("generation", "")
    return [check_markers(spec.id, view, generation), check_counts(spec.id, view, facts),
            check_embedder(settings, spec.id, view, facts, fingerprint_id, dim, ml_fingerprint_id),
            check_parents(spec.id, facts)]


# By rows list (the list is held, so its id is not reused): the stages' shared rows are one list
# until the table changes, and a watch batch's asset checks and publish gate read each source's
# rows four times (docs/performance.md#publishing).
_ROW_FACTS = session_cache("checks.row_facts", max_entries=16)
_ROW_FACTS_LOCK = threading.Lock()


def row_facts(rows: list[dict]) -> RowFacts:
    with _ROW_FACTS_LOCK:
        held = _ROW_FACTS.get(id(rows))
    if held is not None and held[0] is rows:
        return held[1]
    children = [r for r in rows if r["role"] == "child"]
    cjk = cjk_children(rows)
    ids = {r["chunk_id"] for r in rows}
    facts = RowFacts(
        rows=len(rows), children=len(children), vector_hashes=sorted({vector_hash(r) for r in children}),
        cjk_children=len(cjk), cjk_hashes=sorted({r["content_hash"] for r in cjk}),
        dangling=[r["chunk_id"] for r in rows if r["parent_id"] and r["parent_id"] not in ids])
    with _ROW_FACTS_LOCK:
        _ROW_FACTS[id(rows)] = (rows, facts)
    return facts


def check_markers(source_id: str, view: StoreView, generation: str) -> CheckOutcome:
    lagging = {store: (m.generation, m.state) if m else None for store, m in view.markers.items()
               if m is None or not m.committed or m.generation != generation}
    return CheckOutcome("markers_committed", source_id, not lagging,
                        "every store committed the chunk set's generation" if not lagging else
                        f"stores not committed at {generation}: {lagging}", {"generation": generation})


def check_counts(source_id: str, view: StoreView, facts: RowFacts) -> CheckOutcome:
    children = facts.children
    parents = facts.rows - children
    counts = {"chunk_table_children": children, "qdrant_points": view.qdrant_points,
              "fts_child_rows": view.fts_counts.get("child_rows", -1),
              "chunk_table_parents": parents, "fts_parent_rows": view.fts_counts.get("parent_rows", -1),
              "chunk_table_rows": facts.rows, "neo4j_chunk_nodes": view.neo4j_chunk_nodes}
    ok = (children == view.qdrant_points == counts["fts_child_rows"]
          and parents == counts["fts_parent_rows"] and facts.rows == view.neo4j_chunk_nodes)
    if view.qdrant_ml_points is not None:
        counts.update(chunk_table_cjk_children=facts.cjk_children, qdrant_ml_points=view.qdrant_ml_points)
        ok = ok and counts["chunk_table_cjk_children"] == view.qdrant_ml_points
    return CheckOutcome("counts_reconcile", source_id, ok,
                        "chunk table, Qdrant, FTS and Neo4j agree" if ok else f"counts differ: {counts}", counts)


def check_embedder(settings: Settings, source_id: str, view: StoreView, facts: RowFacts, fingerprint_id: str,
                   dim: int, ml_fingerprint_id: str | None = None) -> CheckOutcome:
    cache = EmbeddingCache(settings.embeddings_dir)
    hashes = facts.vector_hashes  # a code child's embedding text
    missing = cache.missing(fingerprint_id, hashes)
    ml_hashes = facts.cjk_hashes if ml_fingerprint_id else []
    ml_missing = cache.missing(ml_fingerprint_id, ml_hashes) if ml_hashes else []
    if ml_missing:
        return CheckOutcome("embedder_fingerprint", source_id, False,
                            f"{len(ml_missing)} CJK texts lack a vector for the multilingual embedder {ml_fingerprint_id}",
                            {"fingerprint": fingerprint_id, "multilingual_fingerprint": ml_fingerprint_id,
                             "missing_vectors": len(missing), "missing_multilingual_vectors": len(ml_missing)})
    ok = not missing and (view.qdrant_dim in (None, dim) or not hashes)
    return CheckOutcome("embedder_fingerprint", source_id, ok,
                        "cache, collection and configuration share one embedder" if ok else
                        f"{len(missing)} texts lack a vector for {fingerprint_id}; collection dim {view.qdrant_dim} vs {dim}",
                        {"fingerprint": fingerprint_id, "missing_vectors": len(missing)})


def check_parents(source_id: str, facts: RowFacts) -> CheckOutcome:
    dangling = facts.dangling
    return CheckOutcome("no_dangling_parents", source_id, not dangling,
                        "every parent_id exists" if not dangling else f"{len(dangling)} chunks point at missing parents",
                        {"dangling": len(dangling)})
