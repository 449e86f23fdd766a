"""Open each store from Settings: the embedded defaults, or servers named by environment."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from mtrag_resources.core.config import Settings
from mtrag_resources.core.processes import alive
from mtrag_resources.core.session import session_cache

# Embedded Qdrant reads every point into memory when it opens, and a
# one-source build opened it eight times (its write, five checks, the gate, the snapshot). Inside
# `shared_qdrant` every `open_qdrant` of the thread gets the same open store.
_shared = threading.local()


class _Borrowed:
    """The shared store, as a context manager whose exit does not close it."""

    def __init__(self, store):
        self.store = store

    def __enter__(self):
        return self.store

    def __exit__(self, *exc: object) -> None:
        pass

    def __getattr__(self, name):
        return getattr(self.store, name)

    def close(self) -> None:
        pass


def open_qdrant(settings: Settings, path=None):
    from mtrag_resources.stores.qdrant_store import QdrantStore
    if settings.qdrant_url:
        return QdrantStore(url=settings.qdrant_url, api_key=settings.qdrant_api_key)
    path = path or settings.qdrant_path
    shared = getattr(_shared, "stores", {}).get(str(path))
    if shared is None:
        with _PARKED_LOCK:  # this process holds the folder's lock: a second open would be refused
            shared = _PARKED.get(str(path), (None,))[0]
    if shared is not None:
        return _Borrowed(shared)
    return QdrantStore(path=path)


# Stores a `shared_qdrant(keep_open=True)` block left open for the next one (`mtrag watch`: one open
# for many batches instead of one per batch: opening Edge is a large share of a small batch,
# see docs/performance.md#qdrant), by folder, with when they were parked.
# They hold the folder's writer lock: the watch closes one as soon as another process asks for the
# lock (its waiting FolderLock touches a request file beside it), or once idle for long
# (close_parked_qdrant). In the session: its close, or an eviction past more folders than a process
# opens, closes the store.
_PARKED = session_cache("connect.parked_qdrant", max_entries=16, on_evict=lambda _key, held: held[0].close())
_PARKED_LOCK = threading.Lock()


def close_parked_qdrant(idle_s: float = 0.0) -> int:
    """Close the parked stores idle for at least `idle_s` seconds, and those whose folder another
    process is waiting for (qdrant_folder.wanted_by_another); returns how many."""
    from mtrag_resources.stores.qdrant_folder import wanted_by_another
    now = time.monotonic()
    with _PARKED_LOCK:
        old = [key for key, (_, since) in _PARKED.items() if now - since >= idle_s or wanted_by_another(key)]
        stores = [_PARKED.pop(key)[0] for key in old]
    for store in stores:
        store.close()
    return len(stores)


@contextlib.contextmanager
def shared_qdrant(settings: Settings, keep_open: bool = False):
    """Open embedded Qdrant once for a sequence of steps in this thread (a CLI build); it holds
    the folder's writer lock until the block ends. `keep_open`: a block that ends without an error
    parks the store for the next block of this process instead of closing it (close_parked_qdrant
    closes it). A Qdrant server needs no sharing."""
    if settings.qdrant_url:
        yield
        return
    from mtrag_resources.stores.qdrant_store import QdrantStore
    stores = getattr(_shared, "stores", None)
    if stores is None:
        stores = _shared.stores = {}
    key = str(settings.qdrant_path)
    if key in stores:  # nested: the outer block owns it
        yield
        return
    with _PARKED_LOCK:
        store = _PARKED.pop(key, (None,))[0]
    store = store or QdrantStore(path=settings.qdrant_path)
    stores[key] = store
    kept = False
    try:
        yield
        if keep_open:
            with _PARKED_LOCK:
                _PARKED[key] = (store, time.monotonic())
            kept = True
    finally:
        del stores[key]
        if not kept:
            store.close()


def shared_stores() -> dict:
    """This thread's shared stores (empty outside `shared_qdrant`), for `sharing_stores` in a worker
    thread of the same sequence of steps."""
    return getattr(_shared, "stores", None) or {}


@contextlib.contextmanager
def sharing_stores(stores: dict):
    """In a worker thread: `open_qdrant` gets the stores another thread's `shared_qdrant` opened
    (the fast lane runs independent stages of one batch in threads; the steps that use Qdrant never
    run at the same time, the batch's dependencies order them)."""
    before = getattr(_shared, "stores", None)
    _shared.stores = stores
    try:
        yield
    finally:
        _shared.stores = before


def open_fts(settings: Settings, path=None):
    from mtrag_resources.stores.fts_store import FtsStore
    return FtsStore(path or settings.fts_path)


def open_neo4j(settings: Settings, **driver_config):
    from mtrag_resources.stores.neo4j_server import neo4j_connection, running_pid
    from mtrag_resources.stores.neo4j_store import Neo4jStore
    uri, user, password = neo4j_connection(settings)
    if not _KEEP_DRIVERS or driver_config:
        return Neo4jStore(uri, user, password, **driver_config)
    key = (os.getpid(), uri, user, password)
    with _DRIVERS_LOCK:
        store = _DRIVERS.get(key)
        if store is None:
            store = _DRIVERS[key] = Neo4jStore(uri, user, password)
        # The indexes the writes' hints need are checked once per server process (a restarted
        # local server may hold another database), not per batch: `SHOW INDEXES` beside a busy
        # batch is a round trip on the critical path, twice a batch.
        server = running_pid(settings)
        if _SCHEMA_CHECKED.get(key, "unchecked") != server:
            store._schema_ok = False
            _SCHEMA_CHECKED[key] = server
    return _Borrowed(store)


def forget_neo4j_schemas() -> None:
    """The kept stores check their server's indexes again at their next write (after a failed
    batch: an index dropped under a running watch is made again)."""
    with _DRIVERS_LOCK:
        _SCHEMA_CHECKED.clear()


# Neo4j stores kept open by this process (keep_neo4j_drivers: `mtrag watch`), by pid, server and
# user: a watch batch opened Neo4j six times (the session's markers, two checks, the graph and
# links stages, the gate), each a new driver, connection and authentication. A kept driver's pool
# reconnects to a restarted server by itself. In the session: its close, or an eviction past more
# servers than a process talks to, closes the store.
_DRIVERS = session_cache("connect.neo4j_drivers", max_entries=16, on_evict=lambda _key, store: store.close())
# kept store -> the local server pid its schema was checked on (evicted: checked again)
_SCHEMA_CHECKED = session_cache("connect.neo4j_schema_checked", max_entries=16)
_DRIVERS_LOCK = threading.Lock()
_KEEP_DRIVERS = False


def keep_neo4j_drivers() -> None:
    """From now on open_neo4j (without driver settings) gives this process's one store per server."""
    global _KEEP_DRIVERS
    _KEEP_DRIVERS = True


def close_kept_neo4j_drivers() -> int:
    """Close the kept stores (a watch that stops); returns how many."""
    with _DRIVERS_LOCK:
        stores = list(_DRIVERS.values())
        _DRIVERS.clear()
        _SCHEMA_CHECKED.clear()
    for store in stores:
        store.close()
    return len(stores)


def open_published_qdrant(settings: Settings, snapshot: str | None, adopted: dict | None = None):
    """The Qdrant a reader serves from: the server, or a private folder of the published embedded
    version (embedded mode allows one process per folder; Edge's files are hard links, so this
    costs the folder's file count). Returns (store or None, private folder to remove on close,
    or None). `adopted`: Edge shards of the reader's loaded generation served again instead of
    linked and loaded ({collection: (shard, folder)}, qdrant_edge_client.EdgeClient)."""
    from mtrag_resources.stores.qdrant_store import QdrantStore
    if not snapshot and settings.qdrant_url:
        return QdrantStore(url=settings.qdrant_url, api_key=settings.qdrant_api_key), None
    if not snapshot:
        return None, None
    # A manifest names an embedded version only where its build wrote one (a shadow with its own
    # vectors, cut over to a home whose builds use a server): what it published is what is read.
    from mtrag_resources.stores.qdrant_folder import link_for_reader
    # beside the version, so hard links stay on one filesystem
    parent = Path(snapshot).parent / ".readers"
    parent.mkdir(exist_ok=True)
    version = Path(snapshot).resolve().name
    # A one-shot `mtrag query` exits without closing: the next reader of the same version takes its
    # folder over (linking a new folder while the old one is removed in the background was a
    # third or more of a CLI query, see docs/performance.md#qdrant). A reader that serves adopted shards links only the
    # other collections, so it neither takes nor leaves a whole folder.
    private = None if adopted else _claim_idle_reader(parent, version)
    # Other dead readers' folders go in the background; a cleanup cut short by this process's exit
    # is finished by the next reader.
    threading.Thread(target=_remove_dead_readers, args=(parent, version), name="mtrag-reader-cleanup",
                     daemon=True).start()
    if private is None:
        private = tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=parent)
        try:
            link_for_reader(snapshot, private, skip=set(adopted or ()))
        except BaseException:
            shutil.rmtree(private, ignore_errors=True)
            raise
    try:
        store = QdrantStore(path=Path(private), lock_timeout=5, adopted=adopted)
    except BaseException:
        remove_reader_folder(private)
        raise
    if not adopted:  # opened whole: once this process is gone, the next reader of `version` may take it
        Path(f"{private}{_VERSION_MARK}").write_text(version)
    return store, private


# Beside a reader's private folder: the published version it holds whole, written once the folder
# opened (a reader killed while linking or opening leaves none, and its folder is removed, not taken).
_VERSION_MARK = ".mtrag-version"
_LOCK_MARK = ".mtrag.lock"  # QdrantStore's lock file beside its folder
# Folders of the version being opened that dead one-shot readers left, kept for the next readers
# to take: at most this many (about the number of CLI queries that run at once).
IDLE_READERS_KEPT = 2


def _dead_reader(path: Path) -> bool:
    """Is `path` (`<pid>-...`) a dead reader's: its process is neither this one nor alive?"""
    pid = path.name.split("-", 1)[0]
    return pid.isdigit() and int(pid) != os.getpid() and not alive(int(pid))


def _marked_version(folder: Path) -> str | None:
    try:
        return Path(f"{folder}{_VERSION_MARK}").read_text()
    except OSError:
        return None


def _claim_idle_reader(parent: Path, version: str) -> str | None:
    """A private folder of `version` whose reader process is gone, renamed to this process's (the
    rename is the claim: of two readers, or a reader and a cleanup, one wins), or None."""
    for folder in sorted(parent.iterdir()):
        if not folder.is_dir() or not _dead_reader(folder) or _marked_version(folder) != version:
            continue
        mine = parent / f"{os.getpid()}-{folder.name.split('-', 1)[1]}"
        try:
            os.rename(folder, mine)
        except OSError:
            continue
        _remove_marks(folder)
        return str(mine)
    return None


def remove_reader_folder(folder: str | Path) -> None:
    """A reader's private folder and the files beside it (its lock, its version mark)."""
    shutil.rmtree(folder, ignore_errors=True)
    _remove_marks(folder)


def _remove_marks(folder: str | Path) -> None:
    for mark in (_LOCK_MARK, _VERSION_MARK):
        Path(f"{folder}{mark}").unlink(missing_ok=True)


def _remove_dead_readers(parent: Path, version: str) -> None:
    """Private folders (and the files beside them) of reader processes that died without closing
    (named `<pid>-...`), but up to IDLE_READERS_KEPT whole ones of `version` for the next readers.
    A folder is renamed away before it is removed, so a reader taking it over meanwhile either has
    it whole or does not get it."""
    kept = 0
    for folder in sorted(parent.iterdir()):
        if folder.name.startswith(".trash-"):  # a removal an exiting process cut short
            shutil.rmtree(folder, ignore_errors=True)
            continue
        if not folder.is_dir() or not _dead_reader(folder):
            continue
        if _marked_version(folder) == version and kept < IDLE_READERS_KEPT:
            kept += 1
            continue
        trash = parent / f".trash-{folder.name}"
        try:
            os.rename(folder, trash)
        except OSError:
            continue  # taken over (or removed) by another process
        _remove_marks(folder)
        shutil.rmtree(trash, ignore_errors=True)
    for path in parent.iterdir():  # lock and version files of dead readers whose folder is gone
        if path.is_file() and _dead_reader(path) and not path.with_name(path.name.split(".", 1)[0]).exists():
            path.unlink(missing_ok=True)
