"""The publishing gate: per-source consistency checks that index_manifest runs before it writes a
generation, and that Dagster shows as blocking asset checks."""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from mtrag_resources.core.config import Settings
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


def checked_rows(path) -> list[dict]:
    """The chunk table's rows as the checks read them: the decoded rows this process holds (the
    stages' shared ones), else those columns only (a CLI publish decoded every column of each
    source it did not build: Django's docs, ~10k rows)."""
    held = cached_rows(path)
    if held is not None:
        return held
    names = set(column_names(path))  # an older table may lack a column (script, embed_hash)
    return read_table(path, columns=[c for c in CHECKED_COLUMNS if c in names]).to_pylist()


def check_source(settings: Settings, spec: SourceSpec, view: StoreView, fingerprint_id: str, dim: int,
                 ml_fingerprint_id: str | None = None) -> list[CheckOutcome]:
    rows = checked_rows(SourceLayout(settings, spec.id).chunks)
    generation = read_state(SourceLayout(settings, spec.id)).get("generation", "")
    return [check_markers(spec.id, view, generation), check_counts(spec.id, view, rows),
            check_embedder(settings, spec.id, view, rows, fingerprint_id, dim, ml_fingerprint_id),
            check_parents(spec.id, rows)]



@dataclass(frozen=True)
class _RowFacts:
    """What the checks derive from a chunk table's rows."""
    children: int
    vector_hashes: list[str]  # sorted, distinct: the children's embedding texts (vector_hash)
    cjk_children: int
    cjk_hashes: list[str]     # sorted, distinct: the CJK children's content hashes
    dangling: list[str]       # chunks whose parent_id names no chunk of the rows


# By rows list (the list is held, so its id is not reused): the stages' shared rows are one list
# until the table changes, and a watch batch's asset checks and publish gate read each source's
# rows four times (django: ~60 ms of passes over 24k rows a batch).
_ROW_FACTS: "OrderedDict[int, tuple[list, _RowFacts]]" = OrderedDict()
_ROW_FACTS_MAX = 16
_ROW_FACTS_LOCK = threading.Lock()


def _row_facts(rows: list[dict]) -> _RowFacts:
    with _ROW_FACTS_LOCK:
        held = _ROW_FACTS.get(id(rows))
    if held is not None and held[0] is rows:
        return held[1]
    children = [r for r in rows if r["role"] == "child"]
    cjk = cjk_children(rows)
    ids = {r["chunk_id"] for r in rows}
    facts = _RowFacts(
        children=len(children), vector_hashes=sorted({vector_hash(r) for r in children}),
        cjk_children=len(cjk), cjk_hashes=sorted({r["content_hash"] for r in cjk}),
        dangling=[r["chunk_id"] for r in rows if r["parent_id"] and r["parent_id"] not in ids])
    with _ROW_FACTS_LOCK:
        _ROW_FACTS[id(rows)] = (rows, facts)
        while len(_ROW_FACTS) > _ROW_FACTS_MAX:
            _ROW_FACTS.popitem(last=False)
    return facts


def check_markers(source_id: str, view: StoreView, generation: str) -> CheckOutcome:
    lagging = {store: (m.generation, m.state) if m else None for store, m in view.markers.items()
               if m is None or not m.committed or m.generation != generation}
    return CheckOutcome("markers_committed", source_id, not lagging,
                        "every store committed the chunk set's generation" if not lagging else
                        f"stores not committed at {generation}: {lagging}", {"generation": generation})


def check_counts(source_id: str, view: StoreView, rows: list[dict]) -> CheckOutcome:
    facts = _row_facts(rows)
    children = facts.children
    parents = len(rows) - children
    counts = {"chunk_table_children": children, "qdrant_points": view.qdrant_points,
              "fts_child_rows": view.fts_counts.get("child_rows", -1),
              "chunk_table_parents": parents, "fts_parent_rows": view.fts_counts.get("parent_rows", -1),
              "chunk_table_rows": len(rows), "neo4j_chunk_nodes": view.neo4j_chunk_nodes}
    ok = (children == view.qdrant_points == counts["fts_child_rows"]
          and parents == counts["fts_parent_rows"] and len(rows) == view.neo4j_chunk_nodes)
    if view.qdrant_ml_points is not None:
        counts.update(chunk_table_cjk_children=facts.cjk_children, qdrant_ml_points=view.qdrant_ml_points)
        ok = ok and counts["chunk_table_cjk_children"] == view.qdrant_ml_points
    return CheckOutcome("counts_reconcile", source_id, ok,
                        "chunk table, Qdrant, FTS and Neo4j agree" if ok else f"counts differ: {counts}", counts)


def check_embedder(settings: Settings, source_id: str, view: StoreView, rows: list[dict], fingerprint_id: str,
                   dim: int, ml_fingerprint_id: str | None = None) -> CheckOutcome:
    cache = EmbeddingCache(settings.embeddings_dir)
    facts = _row_facts(rows)
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


def check_parents(source_id: str, rows: list[dict]) -> CheckOutcome:
    dangling = _row_facts(rows).dangling
    return CheckOutcome("no_dangling_parents", source_id, not dangling,
                        "every parent_id exists" if not dangling else f"{len(dangling)} chunks point at missing parents",
                        {"dangling": len(dangling)})
