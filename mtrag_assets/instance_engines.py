"""Kept SQLite connections for the Dagster instance of an mtrag process: one engine per SQLite
file whose pool keeps a connection open between uses, instead of Dagster's engine per use. A use
is still one transaction, and what is written, and when it is committed, is unchanged. Only this
process's instance object changes; PostgreSQL storages keep their own pools. Written for Dagster
1.13.27 (pinned in pyproject.toml): a storage without the methods this replaces is left as it is.
The design: docs/configuration.md#kept-sqlite-connections."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections import OrderedDict

from sqlalchemy import create_engine, event
from sqlalchemy.pool import NullPool, QueuePool

from mtrag_assets.dagster_private import (INDEX_SHARD_NAME, SQLITE_BUSY_TIMEOUT_SECONDS, SqliteEventLogStorage,
                                          SqliteRunStorage, SqliteScheduleStorage, create_db_conn_string)

_ATTR = "_mtrag_engines"
MAX_FILES = 8


class _Engines:
    """Pooled engines by connection string, made on first use, the least recently used closed
    beyond `limit`; thread-safe."""

    def __init__(self, limit: int = MAX_FILES):
        self._lock = threading.Lock()
        self._engines: OrderedDict = OrderedDict()
        self._limit = limit

    def get(self, conn_string: str):
        with self._lock:
            engine = self._engines.get(conn_string)
            if engine is None:
                # check_same_thread off (pysqlite's default with a QueuePool): a kept connection
                # may serve another thread next; each use is still one thread's at a time
                engine = create_engine(conn_string, poolclass=QueuePool, pool_size=1, max_overflow=16,
                                       connect_args={"timeout": SQLITE_BUSY_TIMEOUT_SECONDS,
                                                     "check_same_thread": False})
                event.listen(engine, "connect", _commit_without_fsync_in_wal)
                self._engines[conn_string] = engine
                while len(self._engines) > self._limit:
                    _, old = self._engines.popitem(last=False)
                    old.dispose()  # a connection in use now is closed when it is returned
            else:
                self._engines.move_to_end(conn_string)
            return engine

    def strings(self) -> list[str]:
        with self._lock:
            return list(self._engines)

    def close_all(self) -> None:
        with self._lock:
            while self._engines:
                self._engines.popitem()[1].dispose()


def _commit_without_fsync_in_wal(dbapi_connection, _record) -> None:
    """`synchronous=NORMAL` on a connection to a WAL file (every Dagster SQLite file once set up):
    a commit appends to the WAL without an fsync, the WAL is synced at checkpoints. SQLite's
    documented trade: durable against a crash of the process, while a power loss may roll back the
    last transactions, never corrupt the file. The event log is lineage; what a build publishes is
    synced by mtrag itself. A build makes many small commits (docs/performance.md#the-dagster-instance)."""
    cursor = dbapi_connection.cursor()
    try:
        if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
            cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


class _ShardTemplate:
    """The bytes of an empty run shard as Dagster's `_initdb` makes one (its tables, WAL mode, the
    alembic head stamped), made once per process in a folder of its own. `_initdb` reads alembic's
    migration scripts again for each new shard, and `mtrag watch` makes a shard per batch (its
    check evaluations go under the batch's run id) (docs/performance.md#the-dagster-instance)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes: bytes | None = None

    def content(self, storage: SqliteEventLogStorage) -> bytes:
        with self._lock:
            if self._bytes is None:
                self._bytes = self._make(storage)
            return self._bytes

    @staticmethod
    def _make(storage: SqliteEventLogStorage) -> bytes:
        folder = tempfile.mkdtemp(prefix="mtrag-run-shard-")
        try:
            engine = create_engine(create_db_conn_string(folder, "template"), poolclass=NullPool)
            try:
                storage._initdb(engine)
                with engine.connect() as conn:  # everything in the main file, none left in a WAL beside it
                    conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            finally:
                engine.dispose()
            with open(os.path.join(folder, "template.db"), "rb") as fh:
                return fh.read()
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def write(self, storage: SqliteEventLogStorage, shard: str) -> bool:
        """Create the run shard `shard` from the template; False (nothing written) where its file
        exists (another process made it, or an earlier run: `_initdb` checks it as before)."""
        path = storage.path_for_shard(shard)
        if shard == INDEX_SHARD_NAME or os.path.exists(path):
            return False
        content = self.content(storage)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.part"  # not `*.db`: no run shard to Dagster
        try:
            with open(tmp, "wb") as fh:
                fh.write(content)
                fh.flush()
                os.fsync(fh.fileno())
            os.link(tmp, path)  # whole or not at all, and never over a file another process made
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return True


_TEMPLATE = _ShardTemplate()


def _event_log_connect(storage: SqliteEventLogStorage, engines: _Engines):
    """`SqliteEventLogStorage._connect` (Dagster 1.13) with a kept engine per shard file, a new run
    shard written from the template."""
    @contextlib.contextmanager
    def _connect(shard: str):
        with storage._db_lock:
            engine = engines.get(storage.conn_string_for_shard(shard))
            if shard not in storage._initialized_dbs:
                if not _TEMPLATE.write(storage, shard):
                    storage._initdb(engine)
                storage._initialized_dbs.add(shard)
                engine.dispose()  # a new shard is in WAL mode only now: its kept connection is made again
            with engine.connect() as conn, conn.begin():
                yield conn
    return _connect


def _single_file_connect(storage, engines: _Engines):
    """`SqliteRunStorage.connect` / `SqliteScheduleStorage.connect` with a kept engine."""
    @contextlib.contextmanager
    def connect():
        with engines.get(storage._conn_string).connect() as conn, conn.begin():
            yield conn
    return connect


def _memo_has_table(storage) -> set[str]:
    """`has_table` opened the index file with a new engine on every call (each `has_dynamic_partition`
    asks whether its table exists; docs/performance.md#the-dagster-instance). A table that exists stays: only
    that answer is kept (until `wipe`)."""
    found: set[str] = set()
    original = storage.has_table

    def has_table(table_name: str) -> bool:
        if table_name in found:
            return True
        exists = original(table_name)
        if exists:
            found.add(table_name)
        return exists
    storage.has_table = has_table
    return found


def _then_close(method, engines: _Engines):
    def wrapped(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        finally:
            engines.close_all()
    return wrapped


def reuse_sqlite_engines(instance) -> int:
    """Give `instance`'s SQLite storages kept engines (idempotent); returns how many storages it
    changed. A storage of another kind (PostgreSQL), or a Dagster whose storages no longer have
    the methods replaced here, is left as it is."""
    changed = 0
    event_log = getattr(instance, "_event_storage", None)
    if type(event_log) is SqliteEventLogStorage and callable(getattr(event_log, "conn_string_for_shard", None)) \
            and not hasattr(event_log, _ATTR):
        engines = _Engines()
        setattr(event_log, _ATTR, engines)
        event_log._connect = _event_log_connect(event_log, engines)
        tables = _memo_has_table(event_log)
        wipe = _then_close(event_log.wipe, engines)  # it deletes the files: no kept handle on them

        def wipe_and_forget(*args, **kwargs):
            tables.clear()
            return wipe(*args, **kwargs)
        event_log.wipe = wipe_and_forget
        changed += 1
    for storage in (getattr(instance, "_run_storage", None), getattr(instance, "_schedule_storage", None)):
        if type(storage) in (SqliteRunStorage, SqliteScheduleStorage) and not hasattr(storage, _ATTR) \
                and isinstance(getattr(storage, "_conn_string", None), str):
            engines = _Engines()
            setattr(storage, _ATTR, engines)
            storage.connect = _single_file_connect(storage, engines)
            changed += 1
    return changed
