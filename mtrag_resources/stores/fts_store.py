"""The SQLite FTS5 store: lexical and identifier search, exact aliases, parent rows for hydration.

This is the only module that builds SQL against the FTS database. A write replaces a source's rows
in one transaction, so readers see a source before or after it, never half of it. The schema and
the concurrency rules: docs/retrieval.md#the-fts-database.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from mtrag_resources.core.faults import fault_point
from mtrag_resources.core.session import session_cache
from mtrag_resources.stores import fts_query
from mtrag_resources.stores.fts_query import (
    ALIAS_KIND_RANK,
    BM25_WEIGHTS,
    FTS_COLUMNS,
    FILE_ALIAS_KINDS,
    QueryPlan,
    build_query,
    derive_aliases,
    normalize_alias,
    short_symbol,
)
from mtrag_resources.stores.contract import BEGIN, COMMITTED, Marker

__all__ = ["FtsStore", "CHUNK_COLUMNS", "SCHEMA_VERSION", "derive_aliases", "normalize_alias"]

SCHEMA_VERSION = 2  # 2: exact_aliases indexed by (source_id, alias_kind) and by chunk_id

CHUNK_COLUMNS = (
    "chunk_id", "source_id", "source_kind", "role", "chunk_type", "parent_id", "file_path",
    "start_line", "end_line", "symbol", "title", "summary", "text", "language", "content_hash",
    "locator", "graph_ids",
)
_TEXT_DEFAULTS = {"source_kind", "chunk_type", "file_path", "symbol", "title", "summary", "text",
                  "language", "content_hash", "locator"}
_INT_COLUMNS = {"start_line", "end_line"}
_BATCH = 500
# FtsStore.compact: a file whose free pages are at least this share of it, and this many.
COMPACT_FREE_FRACTION = 0.5
COMPACT_MIN_FREE_PAGES = 256

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS chunks (
    rid          INTEGER PRIMARY KEY,
    chunk_id     TEXT NOT NULL UNIQUE,
    source_id    TEXT NOT NULL,
    source_kind  TEXT NOT NULL DEFAULT '',
    role         TEXT NOT NULL CHECK (role IN ('parent', 'child')),
    chunk_type   TEXT NOT NULL DEFAULT '',
    parent_id    TEXT,
    file_path    TEXT NOT NULL DEFAULT '',
    start_line   INTEGER NOT NULL DEFAULT 0,
    end_line     INTEGER NOT NULL DEFAULT 0,
    symbol       TEXT NOT NULL DEFAULT '',
    title        TEXT NOT NULL DEFAULT '',
    summary      TEXT NOT NULL DEFAULT '',
    text         TEXT NOT NULL DEFAULT '',
    language     TEXT NOT NULL DEFAULT '',
    content_hash TEXT NOT NULL DEFAULT '',
    locator      TEXT NOT NULL DEFAULT '',
    graph_ids    TEXT NOT NULL DEFAULT '[]',
    extra        TEXT NOT NULL DEFAULT '{{}}'
);
CREATE INDEX IF NOT EXISTS chunks_source_role ON chunks(source_id, role);
CREATE INDEX IF NOT EXISTS chunks_parent ON chunks(parent_id);
CREATE VIEW IF NOT EXISTS child_chunks AS
    SELECT rid, title, summary, text, symbol FROM chunks WHERE role = 'child';
CREATE VIRTUAL TABLE IF NOT EXISTS fts_trigram USING fts5(
    title, summary, text, symbol,
    tokenize = 'trigram', content = 'child_chunks', content_rowid = 'rid'
);
CREATE VIRTUAL TABLE IF NOT EXISTS fts_cjk USING fts5(
    title, summary, text, symbol, tokenize = 'unicode61'
);
CREATE TABLE IF NOT EXISTS exact_aliases (
    alias_norm TEXT NOT NULL,
    alias      TEXT NOT NULL,
    alias_kind TEXT NOT NULL,
    chunk_id   TEXT NOT NULL,
    source_id  TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS exact_aliases_norm ON exact_aliases(alias_norm);
DROP INDEX IF EXISTS exact_aliases_source;
CREATE INDEX IF NOT EXISTS exact_aliases_source_kind ON exact_aliases(source_id, alias_kind);
CREATE INDEX IF NOT EXISTS exact_aliases_chunk ON exact_aliases(chunk_id);
CREATE UNIQUE INDEX IF NOT EXISTS exact_aliases_uniq ON exact_aliases(alias_norm, alias_kind, chunk_id);
CREATE TABLE IF NOT EXISTS markers (
    source_id  TEXT PRIMARY KEY,
    generation TEXT NOT NULL,
    state      TEXT NOT NULL CHECK (state IN ('{BEGIN}', '{COMMITTED}')),
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (
    source_id    TEXT PRIMARY KEY,
    generation   TEXT NOT NULL,
    input_sha256 TEXT NOT NULL,
    child_rows   INTEGER NOT NULL,
    parent_rows  INTEGER NOT NULL,
    alias_rows   INTEGER NOT NULL,
    updated_at   REAL NOT NULL
);
PRAGMA user_version = {SCHEMA_VERSION};
"""

_W = ", ".join(repr(BM25_WEIGHTS[c]) for c in FTS_COLUMNS)


def _cjk_segment(value: Any) -> str:
    # Looked up through the module at call time so tests can inject failures.
    return fts_query.segment_for_index(value if isinstance(value, str) else "")


def _code_segment(value: Any) -> str:
    """A code row's column in `fts_cjk`: `_cjk_segment`, then the words of its camelCase
    identifiers (`fts_query.case_words_for_index`)."""
    text = value if isinstance(value, str) else ""
    extra = fts_query.case_words_for_index(text)
    return f"{_cjk_segment(text)} {extra}" if extra else _cjk_segment(text)


# Per database file, (table, phrase) -> (rows that match it, when counted): FtsStore._rows_in.
# A store holds its file's dict: one evicted only stops being shared with the next store opened.
_DF_COUNTS = session_cache("fts_store.df_counts", max_entries=64)


class FtsStore:
    """SQLite FTS5 store at `path`. One connection per (process, thread), opened lazily."""

    def __init__(self, path: Path | str, *, busy_timeout_ms: int = 60_000, readonly: bool = False):
        self.path = Path(path)
        self.busy_timeout_ms = int(busy_timeout_ms)
        self.readonly = readonly
        self._local = threading.local()
        self._all: list[tuple[threading.Thread, sqlite3.Connection]] = []  # (owner thread, connection)
        self._lock = threading.Lock()
        # _rows_in's counts, shared by the stores of one file: a serving reader opens a new store at
        # each switch, and its first questions would count their words again
        self._df = _DF_COUNTS.setdefault(os.path.realpath(self.path), {})
        if readonly:
            if not self.path.exists():
                raise FileNotFoundError(self.path)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._ensure_schema()

    # ------------------------------------------------------------------ connections
    def _connect(self) -> sqlite3.Connection:
        if self.readonly:
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, isolation_level=None,
                                   timeout=self.busy_timeout_ms / 1000, check_same_thread=False)
        else:
            conn = sqlite3.connect(str(self.path), isolation_level=None,
                                   timeout=self.busy_timeout_ms / 1000, check_same_thread=False)
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.execute("PRAGMA cache_size = -32768")
        conn.execute("PRAGMA journal_size_limit = 67108864")  # WAL shrinks back after a big write
        conn.create_function("mtrag_cjk_segment", 1, _cjk_segment, deterministic=True)
        conn.create_function("mtrag_code_segment", 1, _code_segment, deterministic=True)
        return conn

    @property
    def _conn(self) -> sqlite3.Connection:
        loc = self._local
        conn = getattr(loc, "conn", None)
        if conn is None or getattr(loc, "pid", None) != os.getpid():
            conn = self._connect()
            loc.conn, loc.pid = conn, os.getpid()
            with self._lock:
                # Threads come and go (one per request in some servers): close the connections
                # of finished threads, or each would keep its page cache for the store's life.
                dead = [c for t, c in self._all if not t.is_alive()]
                self._all = [(t, c) for t, c in self._all if t.is_alive()]
                self._all.append((threading.current_thread(), conn))
            for c in dead:
                with contextlib.suppress(sqlite3.Error):
                    c.close()
        return conn

    def close(self) -> None:
        with self._lock:
            conns, self._all = [c for _, c in self._all], []
        for c in conns:
            try:
                c.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()

    def __enter__(self) -> "FtsStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ensure_schema(self) -> None:
        conn = self._conn
        # Reading user_version needs no write lock: a reader never waits on a running writer.
        if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
            return
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise RuntimeError(f"{self.path}: could not switch to WAL (journal_mode={mode})")
        conn.execute("BEGIN IMMEDIATE")
        try:
            for stmt in _split_sql(_SCHEMA):
                conn.execute(stmt)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _read(self):
        return _ReadTxn(self._conn)

    def snapshot(self):
        """A read transaction on this thread's connection: every read inside it (markers included)
        sees one committed state of the database, whatever writers commit meanwhile."""
        return _ReadTxn(self._conn)

    # ------------------------------------------------------------------ writes
    def holds(self, source_id: str, generation: str, input_sha256: str) -> bool:
        """Is the source committed at `generation` from the same input, with all its rows? Then
        `write_source` writes nothing (and its rows need no texts)."""
        cur = self.meta(source_id)
        mk = self.marker(source_id)
        return bool(cur and mk and mk.committed and mk.generation == generation
                    and cur["generation"] == generation and cur["input_sha256"] == input_sha256
                    # rows lost behind a committed marker (a restored or hand-edited file) are rewritten
                    and self._role_counts(self._conn, source_id) == (cur["child_rows"], cur["parent_rows"]))

    def write_source(self, source_id: str, generation: str, input_sha256: str,
                     rows: Sequence[dict | Any],
                     aliases: Iterable[tuple[str, str, str]] | None = None) -> dict:
        """Replace every row of `source_id` with `rows` (chunk dicts or `Chunk`s, parents and
        children) and `aliases` ((alias, alias_kind, chunk_id); None derives the standard set with
        `derive_aliases`). Marker `begin` is committed first in its own transaction; then one
        transaction deletes the source's rows from every table, inserts the new ones (rows
        identical to the stored ones are kept as they are: same result, less FTS work), and sets
        meta and the marker to `committed`. If meta already holds this generation and input
        sha256, the marker is committed and the source's row counts are meta's, nothing is
        written (`skipped=True`)."""
        t0 = time.perf_counter()
        conn = self._conn
        cur = self.meta(source_id)
        if self.holds(source_id, generation, input_sha256):
            secs = time.perf_counter() - t0
            return {"source_id": source_id, "generation": generation, "skipped": True,
                    "child_rows": cur["child_rows"], "parent_rows": cur["parent_rows"],
                    "alias_rows": cur["alias_rows"], "kept_rows": cur["child_rows"] + cur["parent_rows"],
                    "inserted_rows": 0, "deleted_rows": 0, "bytes": self._bytes(), "seconds": secs,
                    "rows_per_s": 0.0}

        records = [self._row_record(source_id, r) for r in rows]
        if aliases is None:
            aliases = derive_aliases([dict(zip(CHUNK_COLUMNS, rec[:-1]), graph_ids=json.loads(rec[16]))
                                      for rec in records], source_id)
        alias_records = self._alias_records(source_id, aliases)

        self._begin(source_id, generation)

        with self._write_transaction():
            # Replace by difference: a stored row identical (every column) to its new version
            # keeps its rowid and FTS entries; every other stored row of the source is deleted
            # (FTS entries first) and every new or changed row inserted. Inside this one
            # transaction that is observably the same as delete-all + insert-all, at a fraction
            # of the FTS work when little changed.
            new_by_id: dict[str, tuple] = {}
            for rec in records:
                if rec[0] in new_by_id:
                    raise sqlite3.IntegrityError(f"duplicate chunk_id {rec[0]!r} in rows of {source_id!r}")
                new_by_id[rec[0]] = rec
            cols = ", ".join(CHUNK_COLUMNS) + ", extra"
            keep: set[str] = set()
            drop: list[tuple[int]] = []
            for r in conn.execute(f"SELECT rid, {cols} FROM chunks WHERE source_id = ?", (source_id,)):
                old = tuple(r)
                if new_by_id.get(old[1]) == old[1:]:
                    keep.add(old[1])
                else:
                    drop.append((old[0],))
            self._delete_staged(conn, lambda: conn.executemany("INSERT INTO temp.mtrag_drop(rid) VALUES (?)", drop))
            conn.execute("DELETE FROM exact_aliases WHERE source_id = ?", (source_id,))
            inserts = [rec for rec in records if rec[0] not in keep]
            self._insert_rows(conn, source_id, inserts, alias_records)
            child_rows, parent_rows, alias_rows = self._commit_meta(conn, source_id, generation, input_sha256)
        secs = time.perf_counter() - t0
        total = child_rows + parent_rows
        return {"source_id": source_id, "generation": generation, "skipped": False,
                "child_rows": child_rows, "parent_rows": parent_rows, "alias_rows": alias_rows,
                "kept_rows": len(keep), "inserted_rows": len(inserts), "deleted_rows": len(drop),
                "bytes": self._bytes(), "seconds": secs,
                "rows_per_s": (total / secs) if secs > 0 else 0.0}

    def write_source_delta(self, source_id: str, generation: str, input_sha256: str,
                           base: tuple[str, str], drop_chunk_ids: Iterable[str], rows: Sequence[dict],
                           aliases: Iterable[tuple[str, str, str]], replaced_kinds: Sequence[str],
                           refiled_chunk_ids: Iterable[str] = ()) -> dict | None:
        """Apply one source's change since `base` ((generation, input sha256) the store must hold,
        committed; else None and nothing is written): delete the rows `drop_chunk_ids` names (with
        their FTS entries and aliases), the source's aliases of `replaced_kinds` (the ones derived
        from the whole source) and the file aliases (FILE_ALIAS_KINDS) anchored at
        `refiled_chunk_ids` (the changed files' rows before), insert `rows` and `aliases`; one
        transaction, under the same begin/committed marker and meta as write_source."""
        t0 = time.perf_counter()
        conn = self._conn
        marker = self.marker(source_id)
        if not self.holds(source_id, *base) or marker is None or marker.state != COMMITTED:
            return None
        records = [self._row_record(source_id, r) for r in rows]
        alias_records = self._alias_records(source_id, aliases)
        drop = sorted(set(drop_chunk_ids))
        self._begin(source_id, generation)
        with self._write_transaction():
            conn.execute("CREATE TEMP TABLE IF NOT EXISTS mtrag_drop_ids (chunk_id TEXT PRIMARY KEY)")
            conn.execute("DELETE FROM temp.mtrag_drop_ids")
            conn.executemany("INSERT OR IGNORE INTO temp.mtrag_drop_ids(chunk_id) VALUES (?)", [(c,) for c in drop])
            # Rows and aliases are found by chunk_id's index (`+source_id`: not by the source's
            # index, which visits every row of the source), once.
            self._delete_staged(conn, lambda: conn.execute(
                "INSERT INTO temp.mtrag_drop(rid) SELECT rid FROM chunks WHERE chunk_id IN "
                "(SELECT chunk_id FROM temp.mtrag_drop_ids) AND +source_id = ?", (source_id,)))
            if replaced_kinds:
                kinds = ", ".join("?" * len(replaced_kinds))
                conn.execute(f"DELETE FROM exact_aliases WHERE source_id = ? AND alias_kind IN ({kinds})",
                             (source_id, *replaced_kinds))
            conn.execute("DELETE FROM exact_aliases WHERE chunk_id IN (SELECT chunk_id FROM temp.mtrag_drop_ids) "
                         "AND +source_id = ?", (source_id,))
            conn.execute("DELETE FROM temp.mtrag_drop_ids")
            refiled = sorted(set(refiled_chunk_ids))
            if refiled:
                conn.executemany("INSERT OR IGNORE INTO temp.mtrag_drop_ids(chunk_id) VALUES (?)",
                                 [(c,) for c in refiled])
                file_kinds = ", ".join("?" * len(FILE_ALIAS_KINDS))
                conn.execute("DELETE FROM exact_aliases WHERE chunk_id IN (SELECT chunk_id FROM temp.mtrag_drop_ids) "
                             f"AND +source_id = ? AND +alias_kind IN ({file_kinds})", (source_id, *FILE_ALIAS_KINDS))
                conn.execute("DELETE FROM temp.mtrag_drop_ids")
            self._insert_rows(conn, source_id, records, alias_records)
            child_rows, parent_rows, alias_rows = self._commit_meta(conn, source_id, generation, input_sha256)
        secs = time.perf_counter() - t0
        return {"source_id": source_id, "generation": generation, "skipped": False, "delta_from": base[0],
                "child_rows": child_rows, "parent_rows": parent_rows, "alias_rows": alias_rows,
                "inserted_rows": len(records), "deleted_rows": len(drop), "bytes": self._bytes(),
                "seconds": secs}

    def _begin(self, source_id: str, generation: str) -> None:
        """Marker `begin`, committed in its own transaction before the write's."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            self._set_marker(conn, source_id, generation, BEGIN, time.time())
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
        fault_point("fts:after_begin")

    @staticmethod
    def _alias_records(source_id: str, aliases: Iterable[tuple[str, str, str]]) -> list[tuple]:
        out = []
        for alias, kind, chunk_id in aliases:
            norm = normalize_alias(alias)
            if norm:
                out.append((norm, str(alias), str(kind), str(chunk_id), source_id))
        return out

    @staticmethod
    def _insert_rows(conn: sqlite3.Connection, source_id: str, records: list[tuple], alias_records: list[tuple]) -> None:
        """Insert chunk rows, their FTS entries and aliases (inside the caller's transaction)."""
        max_rid = conn.execute("SELECT coalesce(max(rid), 0) FROM chunks").fetchone()[0]
        cols = ", ".join(CHUNK_COLUMNS) + ", extra"
        marks = ", ".join("?" * (len(CHUNK_COLUMNS) + 1))
        conn.executemany(f"INSERT INTO chunks({cols}) VALUES ({marks})", records)
        # INTEGER PRIMARY KEY: new rows get rowids above the previous maximum.
        conn.execute(
            "INSERT INTO fts_trigram(rowid, title, summary, text, symbol) "
            "SELECT rid, title, summary, text, symbol FROM chunks "
            "WHERE source_id = ? AND role = 'child' AND rid > ?", (source_id, max_rid))
        conn.execute(
            "INSERT INTO fts_cjk(rowid, title, summary, text, symbol) "
            "SELECT rid, mtrag_cjk_segment(title), mtrag_cjk_segment(summary), "
            "mtrag_cjk_segment(text), mtrag_cjk_segment(symbol) FROM chunks "
            "WHERE source_id = ? AND role = 'child' AND rid > ? AND source_kind != 'code'",
            (source_id, max_rid))
        conn.execute(  # code rows: camelCase identifiers' words too ("terminal size" -> getTerminalSize)
            "INSERT INTO fts_cjk(rowid, title, summary, text, symbol) "
            "SELECT rid, mtrag_code_segment(title), mtrag_code_segment(summary), "
            "mtrag_code_segment(text), mtrag_code_segment(symbol) FROM chunks "
            "WHERE source_id = ? AND role = 'child' AND rid > ? AND source_kind = 'code'",
            (source_id, max_rid))
        conn.executemany(
            "INSERT OR IGNORE INTO exact_aliases(alias_norm, alias, alias_kind, chunk_id, source_id) "
            "VALUES (?, ?, ?, ?, ?)", alias_records)

    def _commit_meta(self, conn: sqlite3.Connection, source_id: str, generation: str,
                     input_sha256: str) -> tuple[int, int, int]:
        """Meta (generation, input sha256, counts) and marker `committed`, inside the caller's transaction."""
        child_rows, parent_rows = self._role_counts(conn, source_id)
        alias_rows = conn.execute("SELECT count(*) FROM exact_aliases WHERE source_id = ?",
                                  (source_id,)).fetchone()[0]
        now = time.time()
        conn.execute(
            "INSERT INTO meta(source_id, generation, input_sha256, child_rows, parent_rows, "
            "alias_rows, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(source_id) DO UPDATE SET generation = excluded.generation, "
            "input_sha256 = excluded.input_sha256, child_rows = excluded.child_rows, "
            "parent_rows = excluded.parent_rows, alias_rows = excluded.alias_rows, "
            "updated_at = excluded.updated_at",
            (source_id, generation, input_sha256, child_rows, parent_rows, alias_rows, now))
        self._set_marker(conn, source_id, generation, COMMITTED, now)
        return child_rows, parent_rows, alias_rows

    @contextlib.contextmanager
    def _write_transaction(self):
        """BEGIN IMMEDIATE ... COMMIT (rolled back on any error), then the WAL folded back so the
        file size is meaningful (PASSIVE: never blocks readers)."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error:
            pass

    @staticmethod
    def _set_marker(conn: sqlite3.Connection, source_id: str, generation: str, state: str,
                    now: float) -> None:
        conn.execute(
            "INSERT INTO markers(source_id, generation, state, updated_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(source_id) DO UPDATE SET generation = excluded.generation, "
            "state = excluded.state, updated_at = excluded.updated_at",
            (source_id, generation, state, now))

    def delete_source(self, source_id: str) -> dict:
        """Remove every row, alias, meta and marker of `source_id` in one transaction."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            child_rows, parent_rows = self._role_counts(conn, source_id)
            self._delete_rows(conn, source_id)
            conn.execute("DELETE FROM meta WHERE source_id = ?", (source_id,))
            conn.execute("DELETE FROM markers WHERE source_id = ?", (source_id,))
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
        return {"source_id": source_id, "child_rows": child_rows, "parent_rows": parent_rows}

    @staticmethod
    def _delete_rows(conn: sqlite3.Connection, source_id: str) -> None:
        FtsStore._delete_rids(conn, "SELECT rid FROM chunks WHERE source_id = ?", (source_id,))
        conn.execute("DELETE FROM exact_aliases WHERE source_id = ?", (source_id,))

    @staticmethod
    def _delete_staged(conn: sqlite3.Connection, stage) -> None:
        """Delete the chunk rows (and their FTS entries) whose rids `stage()` puts into the empty
        temp.mtrag_drop: a set of rids read once, however many statements select by it."""
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS mtrag_drop (rid INTEGER PRIMARY KEY)")
        conn.execute("DELETE FROM temp.mtrag_drop")
        stage()
        FtsStore._delete_rids(conn, "SELECT rid FROM temp.mtrag_drop", ())
        conn.execute("DELETE FROM temp.mtrag_drop")

    @staticmethod
    def _delete_rids(conn: sqlite3.Connection, rid_select: str, args: tuple) -> None:
        """Delete the chunk rows whose rid `rid_select` yields, and their FTS entries. External
        content: the FTS 'delete' command gets the exact values it indexed, read from the chunk
        rows while they still exist."""
        conn.execute(
            "INSERT INTO fts_trigram(fts_trigram, rowid, title, summary, text, symbol) "
            "SELECT 'delete', rid, title, summary, text, symbol FROM chunks "
            f"WHERE role = 'child' AND rid IN ({rid_select})", args)
        conn.execute(f"DELETE FROM fts_cjk WHERE rowid IN ({rid_select})", args)
        conn.execute(f"DELETE FROM chunks WHERE rid IN ({rid_select})", args)

    @staticmethod
    def _role_counts(conn: sqlite3.Connection, source_id: str) -> tuple[int, int]:
        got = dict(conn.execute("SELECT role, count(*) FROM chunks WHERE source_id = ? GROUP BY role",
                                (source_id,)).fetchall())
        return int(got.get("child", 0)), int(got.get("parent", 0))

    @staticmethod
    def _row_record(source_id: str, row: Any) -> tuple:
        if dataclasses.is_dataclass(row) and not isinstance(row, type):
            row = dataclasses.asdict(row)
        row = dict(row)
        rsid = row.get("source_id") or source_id
        if rsid != source_id:
            raise ValueError(f"row {row.get('chunk_id')!r} belongs to {rsid!r}, not {source_id!r}")
        vals: list[Any] = []
        for col in CHUNK_COLUMNS:
            v = row.get(col)
            if col == "source_id":
                v = source_id
            elif col == "graph_ids":
                v = json.dumps(list(v or []), ensure_ascii=False)
            elif col in _INT_COLUMNS:
                v = int(v or 0)
            elif col in _TEXT_DEFAULTS:
                v = "" if v is None else str(v)
            elif col == "parent_id":
                v = v or None
            vals.append(v)
        extra = {k: v for k, v in row.items() if k not in CHUNK_COLUMNS}
        vals.append(json.dumps(extra, ensure_ascii=False, default=str))
        return tuple(vals)

    def _bytes(self) -> int:
        """Size of the database file (the WAL, checkpointed after each write, is not counted)."""
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    # ------------------------------------------------------------------ search
    def search(self, query: str, k: int = 20, source_kind: str | None = None,
               source_ids: Sequence[str] | None = None) -> list[dict]:
        """bm25 search over child rows. Returns [{chunk_id, score, channel: 'fts', source_id,
        index: 'trigram'|'cjk', match: 'all'|'any'}], best first (score = -bm25, higher better).
        Empty or punctuation-only queries return []."""
        plan = build_query(query)
        if plan.empty or k <= 0 or (source_ids is not None and len(source_ids) == 0):
            return []
        with self._read() as conn:
            hits = self._run_plan(conn, plan, "all", k, source_kind, source_ids)
            if not hits:
                hits = self._run_plan(conn, plan, "any", k, source_kind, source_ids)
        return hits

    def _run_plan(self, conn, plan: QueryPlan, stage: str, k: int, source_kind, source_ids) -> list[dict]:
        best: dict[str, dict] = {}
        if stage == "all":
            jobs = [("trigram", plan.all_trigram, plan.all_trigram_filter, ()), ("cjk", plan.all_cjk, None, ())]
        else:
            jobs = [("trigram", plan.any_trigram, None, plan.any_trigram_terms),
                    ("cjk", plan.any_cjk, None, plan.any_cjk_terms)]
        for index, expr, filt, terms in jobs:
            if not expr:
                continue
            table = f"fts_{index}"
            informative = self._informative(conn, table, terms)
            rows = self._ranked(conn, table, informative or expr, filt, k, source_kind, source_ids)
            if informative and len(rows) < k:  # the rows of common words alone fill the rest
                rows = self._ranked(conn, table, expr, filt, k, source_kind, source_ids)
            for r in rows:
                prev = best.get(r["chunk_id"])
                if prev is None or r["score"] > prev["score"]:
                    best[r["chunk_id"]] = {"chunk_id": r["chunk_id"], "score": float(r["score"]),
                                           "channel": "fts", "source_id": r["source_id"],
                                           "index": index, "match": stage}
        hits = sorted(best.values(), key=lambda h: (-h["score"], h["chunk_id"]))
        return hits[:k]

    def _ranked(self, conn, table: str, expr: str, filt: str | None, k: int, source_kind, source_ids) -> list:
        rows = None if filt or source_kind or source_ids is not None else self._top_matches(conn, table, expr, k)
        return self._matches(conn, table, expr, filt, k, source_kind, source_ids) if rows is None else rows

    # How long a counted document frequency is used (_informative): a phrase near the half-of-rows
    # line weighs next to nothing in bm25 on either side of it, so a count a few edits old will do.
    DF_MAX_AGE_S = 30.0
    DF_CACHE_MAX = 50_000  # counts kept per file before they are all dropped

    def _informative(self, conn, table: str, terms: tuple[str, ...]) -> str | None:
        """The OR of the `terms` that bm25 weighs, where it leaves some out; else None. FTS5's bm25
        gives a phrase found in half of the table's rows or more the idf 1e-6 (log((N - n + 0.5) /
        (n + 0.5)) <= 0, floored), so it moves no row's score by more than ~1e-5, yet ranking every
        row that holds one was most of a question's lexical search (see
        docs/performance.md#fts). The caller falls back to the whole OR when fewer than k rows
        match the rest (the common words' rows fill the tail)."""
        if len(terms) < 2:
            return None
        total = self._rows_in(conn, table, None)
        keep = [t for t in terms if 2 * self._rows_in(conn, table, t) < total]
        return " OR ".join(keep) if keep and len(keep) < len(terms) else None

    def _rows_in(self, conn, table: str, term: str | None) -> int:
        """Rows of `table` that match the phrase `term` (None: all of its rows), counted at most
        DF_MAX_AGE_S ago."""
        now = time.monotonic()
        cached = self._df.get((table, term))
        if cached is not None and now - cached[1] < self.DF_MAX_AGE_S:
            return cached[0]
        if term is None:  # bm25's N: the table's row count, one docsize row each
            n = conn.execute(f"SELECT count(*) FROM {table}_docsize").fetchone()[0]
        else:
            n = conn.execute(f"SELECT count(*) FROM {table} WHERE {table} MATCH ?", (term,)).fetchone()[0]
        if len(self._df) >= self.DF_CACHE_MAX:
            self._df.clear()
        self._df[(table, term)] = (n, now)
        return n

    # Rows an unfiltered search ranks beyond k, so that scores tied at the k-th are all seen.
    TIE_WINDOW = 16

    @classmethod
    def _top_matches(cls, conn, table: str, expr: str, k: int) -> list[dict] | None:
        """The k best matches of an unfiltered search (by score, then chunk id, as _matches ranks),
        ranked in the FTS table alone and joined to their chunk rows after: a question of common
        words matches most rows, and joining each match only to sort it was a large share of the
        query (see docs/performance.md#fts). None where the window cannot tell (a score
        tied across its end, a match without its chunk row): the caller runs _matches."""
        window = conn.execute(f"SELECT rowid AS rid, -bm25({table}, {_W}) AS score FROM {table} "
                              f"WHERE {table} MATCH ? ORDER BY score DESC LIMIT ?",
                              (expr, k + cls.TIE_WINDOW)).fetchall()
        if len(window) > k and window[-1]["score"] >= window[k - 1]["score"]:
            return None  # rows past the window may tie with the k-th and win on chunk id
        score = {r["rid"]: r["score"] for r in window}
        marks = ", ".join("?" * len(score))
        chunks = conn.execute(f"SELECT rid, chunk_id, source_id FROM chunks WHERE rid IN ({marks})",
                              list(score)).fetchall() if score else []
        if len(chunks) != len(score):
            return None
        rows = [{"chunk_id": c["chunk_id"], "source_id": c["source_id"], "score": score[c["rid"]]} for c in chunks]
        return sorted(rows, key=lambda r: (-r["score"], r["chunk_id"]))[:k]

    @staticmethod
    def _matches(conn, table: str, expr: str, filt: str | None, k: int, source_kind, source_ids) -> list:
        """The k best matches joined to their chunk rows, filtered by `filt` (an FTS expression the
        CJK table must match too), kind and sources, ranked by score then chunk id."""
        sql = [f"SELECT c.chunk_id, c.source_id, -bm25({table}, {_W}) AS score "
               f"FROM {table} JOIN chunks c ON c.rid = {table}.rowid WHERE {table} MATCH ?"]
        args: list[Any] = [expr]
        if filt:
            # `+c.rid`, not `{table}.rowid`: SQLite would push the list into the FTS scan as one
            # rowid lookup per short-token match, and a 1-letter token matches most rows.
            sql.append("AND +c.rid IN (SELECT rowid FROM fts_cjk WHERE fts_cjk MATCH ?)")
            args.append(filt)
        if source_kind:
            sql.append("AND c.source_kind = ?")
            args.append(source_kind)
        if source_ids is not None:
            sql.append(f"AND c.source_id IN ({', '.join('?' * len(source_ids))})")
            args.extend(source_ids)
        sql.append("ORDER BY score DESC, c.chunk_id LIMIT ?")
        args.append(int(k))
        return conn.execute(" ".join(sql), args).fetchall()

    def exact(self, query: str, k: int = 20, source_ids: Sequence[str] | None = None) -> list[dict]:
        """Chunks whose alias equals `normalize_alias(query)`; for a dotted query without `/`,
        also short_symbol aliases equal to its last part (`match: 'last_part'`, ranked after
        the exact ones; among them, symbols ending with the query first). Returns
        [{chunk_id, alias_kind, alias, source_id, match}] (last_part entries also carry the chunk's
        `symbol`), one entry per chunk. Within an alias kind (and a last-part quality), chunks
        flagged `declaration` (abstract or Protocol stubs) come after the ones that implement.
        `source_ids`: only aliases of these sources (a bound `IN (...)`; None: every source)."""
        norm = normalize_alias(query)
        if not norm or k <= 0 or (source_ids is not None and len(source_ids) == 0):
            return []
        in_sources, scope_args = "", ()
        if source_ids is not None:
            in_sources = f" AND a.source_id IN ({', '.join('?' * len(source_ids))})"
            scope_args = tuple(source_ids)
        out: list[dict] = []
        seen: set[str] = set()
        with self._read() as conn:
            # declarations (`@overload`/abstract stubs, cas_chunks' `declaration`) after the code
            # that implements them, within an alias kind
            rows = conn.execute("SELECT a.alias, a.alias_kind, a.chunk_id, a.source_id, "
                                "coalesce(json_extract(c.extra, '$.declaration'), 0) AS decl "
                                "FROM exact_aliases a LEFT JOIN chunks c ON c.chunk_id = a.chunk_id "
                                "WHERE a.alias_norm = ?" + in_sources, (norm, *scope_args)).fetchall()
            rows = sorted(rows, key=lambda r: (ALIAS_KIND_RANK.get(r["alias_kind"], 99), bool(r["decl"]),
                                               r["source_id"], r["chunk_id"]))
            for r in rows:
                if r["chunk_id"] not in seen:
                    seen.add(r["chunk_id"])
                    out.append({"chunk_id": r["chunk_id"], "alias_kind": r["alias_kind"],
                                "alias": r["alias"], "source_id": r["source_id"], "match": "exact"})
            last = short_symbol(norm)
            if last and len(out) < k:
                cands = conn.execute(
                    "SELECT a.alias, a.alias_kind, a.chunk_id, a.source_id, c.symbol, "
                    "coalesce(json_extract(c.extra, '$.declaration'), 0) AS decl FROM exact_aliases a "
                    "JOIN chunks c ON c.chunk_id = a.chunk_id "
                    "WHERE a.alias_norm = ? AND a.alias_kind = 'short_symbol'" + in_sources,
                    (last, *scope_args)).fetchall()
                head = norm.split(".", 1)[0]

                def quality(r) -> tuple:
                    sym = normalize_alias(r["symbol"])
                    return (0 if sym.endswith("." + norm) else 1,
                            0 if sym.split(".", 1)[0] == head else 1,
                            sym.count("."), bool(r["decl"]), r["chunk_id"])

                for r in sorted(cands, key=quality):
                    if r["chunk_id"] not in seen:
                        seen.add(r["chunk_id"])
                        out.append({"chunk_id": r["chunk_id"], "alias_kind": r["alias_kind"],
                                    "alias": r["alias"], "source_id": r["source_id"],
                                    "match": "last_part", "symbol": r["symbol"]})
        return out[:k]

    def symbol_names(self, limit: int = 200_000, source_ids: Sequence[str] | None = None) -> list[str]:
        """The distinct code symbols of the stored chunks (at most `limit`), sorted; `source_ids`:
        only those of these sources."""
        if source_ids is not None and not source_ids:
            return []
        in_sources = "" if source_ids is None else f" AND source_id IN ({', '.join('?' * len(source_ids))})"
        with self._read() as conn:
            return [r["symbol"] for r in conn.execute(
                f"SELECT DISTINCT symbol FROM chunks WHERE symbol != '' AND source_kind = 'code'{in_sources} "
                "ORDER BY symbol LIMIT ?", (*(source_ids or ()), int(limit)))]

    # ------------------------------------------------------------------ rows
    def get_chunks(self, chunk_ids: Iterable[str]) -> dict[str, dict]:
        ids = list(dict.fromkeys(c for c in chunk_ids if c))
        out: dict[str, dict] = {}
        with self._read() as conn:
            for i in range(0, len(ids), _BATCH):
                part = ids[i:i + _BATCH]
                marks = ", ".join("?" * len(part))
                for r in conn.execute(f"SELECT * FROM chunks WHERE chunk_id IN ({marks})", part):
                    out[r["chunk_id"]] = _row_dict(r)
        return out

    def parents_of(self, chunk_ids: Iterable[str]) -> dict[str, dict]:
        """{child_id: parent row} for each given chunk whose parent row is stored."""
        ids = list(dict.fromkeys(c for c in chunk_ids if c))
        out: dict[str, dict] = {}
        with self._read() as conn:
            for i in range(0, len(ids), _BATCH):
                part = ids[i:i + _BATCH]
                q = ("SELECT ch.chunk_id AS child_id, p.* FROM chunks ch JOIN chunks p "
                     f"ON p.chunk_id = ch.parent_id WHERE ch.chunk_id IN ({', '.join('?' * len(part))})")
                for r in conn.execute(q, part):
                    d = _row_dict(r)
                    out[d.pop("child_id")] = d
        return out

    def first_children(self, parent_ids: Iterable[str]) -> dict[str, str]:
        """{parent_id: the chunk id of its first child (lowest start line)} for each given parent
        that has a child stored."""
        ids = list(dict.fromkeys(c for c in parent_ids if c))
        out: dict[str, str] = {}
        with self._read() as conn:
            for i in range(0, len(ids), _BATCH):
                part = ids[i:i + _BATCH]
                q = (f"SELECT parent_id, chunk_id FROM chunks WHERE role = 'child' AND parent_id IN "
                     f"({', '.join('?' * len(part))}) ORDER BY start_line DESC, chunk_id DESC")
                out.update({r["parent_id"]: r["chunk_id"] for r in conn.execute(q, part)})
        return out

    # ------------------------------------------------------------------ markers / meta
    def marker(self, source_id: str) -> Marker | None:
        r = self._conn.execute("SELECT source_id, generation, state FROM markers WHERE source_id = ?",
                               (source_id,)).fetchone()
        return Marker(r["source_id"], r["generation"], r["state"]) if r else None

    def markers(self) -> dict[str, Marker]:
        return {r["source_id"]: Marker(r["source_id"], r["generation"], r["state"])
                for r in self._conn.execute("SELECT source_id, generation, state FROM markers")}

    def meta(self, source_id: str) -> dict | None:
        r = self._conn.execute("SELECT * FROM meta WHERE source_id = ?", (source_id,)).fetchone()
        return dict(r) if r else None

    def counts(self, source_id: str) -> dict:
        """Row counts of one source, all read in one transaction (a consistent snapshot)."""
        with self._read() as conn:
            child, parent = self._role_counts(conn, source_id)
            return {
                "child_rows": child,
                "parent_rows": parent,
                "alias_rows": conn.execute("SELECT count(*) FROM exact_aliases WHERE source_id = ?",
                                           (source_id,)).fetchone()[0],
                # FTS5's docsize shadow table has one row per indexed row: a join on it reads a
                # plain table, far cheaper than going through fts_cjk's rowids
                "fts_cjk_rows": conn.execute(
                    "SELECT count(*) FROM chunks c JOIN fts_cjk_docsize d ON d.id = c.rid "
                    "WHERE c.source_id = ? AND c.role = 'child'", (source_id,)).fetchone()[0],
                "generation": (conn.execute("SELECT generation FROM meta WHERE source_id = ?",
                                            (source_id,)).fetchone() or [None])[0],
            }

    def snapshot_meta(self) -> dict[str, dict]:
        """{source_id: meta row + marker generation/state}, read in one transaction."""
        with self._read() as conn:
            out = {r["source_id"]: dict(r) for r in conn.execute("SELECT * FROM meta")}
            for r in conn.execute("SELECT source_id, generation, state FROM markers"):
                d = out.setdefault(r["source_id"], {"source_id": r["source_id"]})
                d["marker_generation"], d["marker_state"] = r["generation"], r["state"]
        return out

    def compact(self, min_free_fraction: float = COMPACT_FREE_FRACTION,
                min_free_pages: int = COMPACT_MIN_FREE_PAGES) -> dict:
        """Give the file's free pages back to the disk when they are most of it (sources removed
        or shrunk leave their pages free, and SQLite reuses them but never returns them): the
        FTS indexes merged into one segment each ('optimize': a deleted row's index entries go
        only then), then VACUUM. In WAL mode VACUUM is one write transaction: readers go on with
        the snapshot they hold and see the rebuilt file from their next read; the file shrinks
        when the checkpoint after it gets past every reader. `{pages, free_pages, page_size,
        bytes_before, bytes_after, compacted}`."""
        conn = self._conn
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        out = {"pages": pages, "free_pages": free, "page_size": size, "bytes_before": self._bytes(),
               "compacted": False}
        if free < min_free_pages or free < pages * min_free_fraction:
            out["bytes_after"] = out["bytes_before"]
            return out
        with self._write_transaction() as conn:
            for table in ("fts_trigram", "fts_cjk"):
                conn.execute(f"INSERT INTO {table}({table}) VALUES ('optimize')")
        conn.execute("VACUUM")
        with contextlib.suppress(sqlite3.Error):
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        out.update(compacted=True, bytes_after=self._bytes())
        return out

    def integrity_check(self) -> None:
        """Raise sqlite3.DatabaseError if either FTS index disagrees with its content."""
        conn = self._conn
        conn.execute("INSERT INTO fts_trigram(fts_trigram, rank) VALUES ('integrity-check', 1)")
        conn.execute("INSERT INTO fts_cjk(fts_cjk) VALUES ('integrity-check')")


class _ReadTxn:
    """One deferred read transaction (a WAL snapshot) around several SELECTs."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn
        self.own = False

    def __enter__(self) -> sqlite3.Connection:
        if not self.conn.in_transaction:
            self.conn.execute("BEGIN")
            self.own = True
        return self.conn

    def __exit__(self, *exc: object) -> None:
        if self.own:
            _rollback(self.conn)


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass


def _row_dict(r: sqlite3.Row) -> dict:
    d = dict(r)
    d.pop("rid", None)
    d["graph_ids"] = json.loads(d.get("graph_ids") or "[]")
    extra = json.loads(d.pop("extra", None) or "{}")
    for k, v in extra.items():
        d.setdefault(k, v)
    return d


def _split_sql(script: str) -> list[str]:
    return [s.strip() for s in script.split(";\n") if s.strip()]
