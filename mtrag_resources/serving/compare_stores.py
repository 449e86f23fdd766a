"""`mtrag compare-stores`: the published generation's dense vectors loaded into a second store,
pgvector on PostgreSQL, and both searched with the same query vectors (seed 000's
`compare_stores`), so that a difference is the store's and not the model's: per collection, each
store's recall of the exact nearest neighbours (numpy, brute force over the same vectors), the
overlap of the two top k, search latency, and what the second store cost to load, index and keep.
docs/shadow.md#store-comparison."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from mtrag_resources.core.config import Settings
from mtrag_resources.core.errors import NotPublished
from mtrag_resources.publish.manifest import load_current
from mtrag_resources.serving.query_embedding import QueryEmbedders
from mtrag_resources.stores.connect import open_published_qdrant, remove_reader_folder
from mtrag_resources.stores.pgvector_store import PgVectorStore

# pgvector's search breadth, as Qdrant searches an HNSW graph built with ef_construct 100
EF_SEARCH = 100


def compare_stores(settings: Settings, pg_url: str, queries: list[str], k: int = 10) -> dict:
    """{generation, k, queries, collections: [one row per collection of the default embedder]}."""
    manifest = load_current(settings.manifest_dir)
    if not manifest:
        raise NotPublished(f"{settings.home} has no published generation; run mtrag build")
    snapshot = manifest["stores"].get("qdrant_snapshot")
    qdrant, folder = open_published_qdrant(settings, snapshot)
    if qdrant is None:
        raise NotPublished(f"generation {manifest['generation']} names no Qdrant version to read")
    embedders = QueryEmbedders()
    vectors = [embedders.embed(q, manifest)[0] for q in queries]
    pg = PgVectorStore(pg_url)
    rows = []
    try:
        # the multilingual collections are embedded by another model than the queries here
        for kind in sorted(k_ for k_ in (manifest["stores"].get("qdrant_collections") or {}) if not k_.endswith("_ml")):
            rows.append(_compare_collection(qdrant, pg, kind, vectors, k, snapshot))
    finally:
        pg.close()
        qdrant.close()
        if folder:
            remove_reader_folder(folder)
    return {"generation": manifest["generation"], "embedder": manifest["embedder"].get("model_id"), "k": k,
            "queries": len(queries), "collections": rows}


def _compare_collection(qdrant, pg: PgVectorStore, kind: str, queries: list, k: int, snapshot: str | None) -> dict:
    ids, matrix = [], []
    for cid, vec in qdrant.vectors(kind):
        ids.append(cid)
        matrix.append(vec)
    if not ids:
        return {"collection": kind, "points": 0}
    matrix = np.stack(matrix)
    built = pg.load(kind, zip(ids, matrix), matrix.shape[1], EF_SEARCH)
    try:
        found = {"qdrant": [], "pgvector": []}
        ms = {"qdrant": [], "pgvector": []}
        recall = {"qdrant": [], "pgvector": []}
        overlap = []
        for q in queries:
            exact = {ids[i] for i in np.argsort(-(matrix @ np.asarray(q, dtype=np.float32)))[:k]}
            for store, search in (("qdrant", lambda v: [h["chunk_id"] for h in qdrant.search(kind, v, k=k,
                                                                                               payload_fields=[])]),
                                  ("pgvector", lambda v: [cid for cid, _ in pg.search(kind, v, k)])):
                t0 = time.perf_counter()
                hits = search(q)
                ms[store].append((time.perf_counter() - t0) * 1000)
                found[store] = hits
                recall[store].append(len(exact & set(hits)) / min(k, len(ids)))
            overlap.append(len(set(found["qdrant"]) & set(found["pgvector"])) / min(k, len(ids)))
    finally:
        pg.drop(kind)
    row = {"collection": kind, "points": len(ids), "dim": int(matrix.shape[1]),
           "overlap": round(float(np.mean(overlap)), 4)}
    for store in ("qdrant", "pgvector"):
        row[f"{store}_recall"] = round(float(np.mean(recall[store])), 4)
        row[f"{store}_p50_ms"] = round(float(np.percentile(ms[store], 50)), 2)
        row[f"{store}_p95_ms"] = round(float(np.percentile(ms[store], 95)), 2)
    row.update({"pgvector_load_s": built["load_s"], "pgvector_index_s": built["index_s"],
                "pgvector_bytes": built["bytes"], "qdrant_bytes": _folder_bytes(snapshot, kind)})
    return row


def _folder_bytes(snapshot: str | None, kind: str) -> int | None:
    """The disk the published version's folder of the collection takes (embedded Qdrant); None
    for a server."""
    folder = Path(snapshot or "") / f"mtrag_{kind}"
    if not snapshot or not folder.is_dir():
        return None
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())  # on disk: segments are sparse


def render(report: dict) -> str:
    import pandas as pd
    table = pd.DataFrame({r["collection"]: {k: v for k, v in r.items() if k != "collection"}
                          for r in report["collections"]}, dtype=object)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        return (f"generation {report['generation']} ({report['embedder']}), {report['queries']} queries, k "
                f"{report['k']}: Qdrant (the published version) vs pgvector (HNSW m 16, ef_construction 100, "
                f"ef_search {EF_SEARCH}), recall of the exact top k\n{table.to_string()}")
