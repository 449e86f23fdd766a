"""The published generation a reader serves, and its switch to the next one.

`Generations` is one object the reader (`ReaderCore`) holds: the loaded stores (Qdrant and its
private folder, FTS, the graph connection), the manifest that named them, and the lifecycle that
moves them - a switch when CURRENT moves (opened beside the old generation, which serves until the
swap), the prefetch of a Qdrant version a publish made before its manifest, and the removal of
the private folders no open store has a shard in. Queries hold `lock` shared while they read the
loaded generation; only the swap takes it alone."""
from __future__ import annotations

import contextlib
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import current_path
from mtrag_resources.publish.manifest import load_current
from mtrag_resources.serving.graph_connection import GraphConnection
from mtrag_resources.serving.shared_lock import SharedLock
from mtrag_resources.stores.connect import open_fts, open_published_qdrant, remove_reader_folder
from mtrag_resources.stores.page_cache import read_through
from mtrag_resources.stores.qdrant_edge_client import paced_loads
from mtrag_resources.stores.qdrant_folder import unchanged_collections

# A switch to a new generation that failed (a full disk, a store that will not open) is tried again
# after this long; the loaded generation serves meanwhile.
SWITCH_RETRY_S = 2.0
# How often a long-lived reader looks at CURRENT (a stat): a published change is served within it,
# and a longer poll was a visible share of a watch edit's wait (docs/performance.md#serving).
SWITCH_POLL_S = 0.02
# How long a switch waits for a moment with no query in flight before it loads a changed collection
# anyway (under a load that never pauses).
SWITCH_QUIET_WAIT_S = 0.25


def _warm_vectors(qdrant, manifest: dict, skip: set[str] = frozenset()) -> None:
    """One search in each of the new generation's collections before the swap, in the switch
    thread: the first query on a freshly opened Edge shard paid its page faults
    (docs/performance.md#serving). Best effort. `skip`:
    collections whose shard served before (adopted): warm already."""
    if qdrant is None:
        return
    import numpy as np
    for kind, name in (manifest.get("stores", {}).get("qdrant_collections") or {}).items():
        if name in skip:
            continue
        try:
            info = qdrant.collection_info(kind)
            if info and info["points"]:
                qdrant.search(kind, np.full(info["dim"], info["dim"] ** -0.5, dtype=np.float32), k=20)
        except Exception:  # noqa: BLE001 - a warm-up that fails costs the first query its faults
            continue


def stores_settings(settings: Settings, manifest: dict | None) -> Settings:
    """The home whose stores `manifest` names: another home's for a cut-over generation
    (publish/cutover.py, `stores_home`), else the reader's own."""
    home = (manifest or {}).get("stores_home")
    return Settings(home=Path(home)) if home else settings


class Generations:
    """Open stores for the currently published generation (or for `manifest_override`: the
    golden gate's candidate, which never reloads). `on_first_load(manifest)` runs when the first
    generation is about to open (the reader preloads its embedder beside the stores);
    `before_switch(manifest)` when a later one has opened, before the swap (its embedder made ready)."""

    def __init__(self, settings: Settings, side_pool: ThreadPoolExecutor, manifest_override: dict | None = None,
                 on_first_load: Callable[[dict], None] | None = None,
                 before_switch: Callable[[dict], None] | None = None):
        self.settings = settings
        self._manifest_override = manifest_override
        self._side_pool = side_pool
        self._on_first_load = on_first_load
        self._before_switch = before_switch
        self.lock = SharedLock()                   # the loaded generation: queries share, reloads own
        self.qdrant_lock = threading.Lock()        # embedded Qdrant's client is not thread-safe
        self._switching = threading.Lock()         # one thread opens a new generation at a time
        self._switch_retry_at = 0.0
        self.switch_error: str | None = None       # why the last switch to a new CURRENT failed
        self._read_files: set = set()              # the files read through (page_cache.read_through)
        self.watching = threading.Event()          # a switch thread moves this reader (watch_current)
        self.stopped = threading.Event()
        self._loaded_stamp = None
        self.manifest: dict | None = None
        self.graph = GraphConnection(settings, side_pool, self.watching)
        self.qdrant = self.fts = None
        self.qdrant_copy: str | None = None
        # Private Qdrant folders: the stores open on them (a store's shards may live in an older
        # generation's folder, adopted), and the folders whose store closed, removed once no open
        # store has a shard in them (_retire_folder)
        self._folders_lock = threading.Lock()
        self._open_qdrants: list = []
        self._retired: set[str] = set()
        # The published Qdrant version a serving reader opened before a manifest named it
        # (_prefetch): (version, store, private folder, adopted collections), and the
        # `qdrant-published` link target it last looked at
        self._prefetched: tuple | None = None
        self._prefetch_seen: str | None = None

    # ------------------------------------------------------------------ switching
    def _stamp(self):
        try:
            st = current_path(self.settings.manifest_dir).stat()
            return (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            return None

    def refresh(self) -> None:
        """Switch to the generation CURRENT names when it moved (one stat per query). The new
        generation's stores are opened while queries go on with the old one; only the swap
        itself waits for the queries in flight. A thread that finds another one opening the new
        generation serves the old one meanwhile instead of waiting."""
        if self._manifest_override is not None:
            self._load_override()
            return
        if self.watching.is_set() and self.manifest is not None:
            return  # the switch thread (watch_current) moves this reader
        self._switch()

    def watch_current(self, interval: float = SWITCH_POLL_S) -> None:
        """For a long-lived server: switch generations in a thread of its own that looks at
        CURRENT every `interval` seconds, so no query pays for opening a new generation; queries
        answer from the loaded one until the swap."""
        if self.watching.is_set():
            return
        self.watching.set()

        def loop() -> None:
            while not self.stopped.wait(interval):
                try:
                    self._switch()
                    self._prefetch()
                except Exception as exc:  # noqa: BLE001 - the first load failed: the next turn retries
                    self.switch_error = f"{type(exc).__name__}: {exc}"

        threading.Thread(target=loop, daemon=True, name="mtrag-reader-switch").start()

    @contextlib.contextmanager
    def published_view(self):
        """The loaded generation, kept loaded while the block runs, with every SQLite read of the
        block (the gate's markers and the query's rows) inside one snapshot."""
        self.refresh()
        with self.lock.shared():
            if self.fts is None:
                yield
                return
            with self.fts.snapshot():
                yield

    def _switch(self) -> None:
        if not self._moved():
            return
        first_load = self.manifest is None
        if not first_load and time.monotonic() < self._switch_retry_at:
            return
        if not self._switching.acquire(blocking=first_load):
            return
        try:
            stamp = self._stamp()
            if not self._moved(stamp):
                return
            manifest = load_current(self.settings.manifest_dir)
            if first_load and manifest and self._on_first_load is not None:
                self._on_first_load(manifest)
            try:
                stores, adopted, prepared = self._open_next(manifest, first_load)
            except Exception as exc:
                # Without a loaded generation the call fails (the next one tries again); with one,
                # it keeps serving (its channels report what lags) and retries the switch shortly.
                if first_load:
                    raise
                self.switch_error = f"{type(exc).__name__}: {exc}"
                self._switch_retry_at = time.monotonic() + SWITCH_RETRY_S
                return
            self.switch_error = None
            if not first_load and manifest and self._before_switch is not None:
                self._before_switch(manifest)
            self._warm_next(stores, manifest, adopted, prepared, first_load)
            self._swap(stores, manifest, stamp, adopted, first_load)
        finally:
            self._switching.release()

    def _open_next(self, manifest: dict | None, first_load: bool) -> tuple:
        """(stores, adopted, prepared) of the generation `manifest` names, opened beside the
        loaded one."""
        # The graph is one server whatever the generation: a live connection goes on
        # serving the new one (a new driver, handshake and markers read per switch were a
        # large part of it); only a reader without one connects.
        graph = None if first_load else self.graph.live()
        # Collections whose points this generation did not change go on being served by
        # the loaded shards: loading one holds the GIL, and every query waits that long
        adopted = {} if first_load or not manifest else self._adoptable(manifest)
        prepared = self._take_prefetched(manifest)
        if prepared is not None:
            adopted = prepared[2]
        # A serving reader loads the changed collections' shards where no query is in
        # flight (the load holds the GIL): queries answer from the loaded one meanwhile.
        paced = not first_load and self.watching.is_set()
        with paced_loads(lambda: paced and self.lock.wait_idle(SWITCH_QUIET_WAIT_S)):
            stores = self.open_stores(manifest, graph, adopted, prepared) if manifest else (None, None, None, None)
        if not first_load and isinstance(stores[3], Future):
            # A switch thread waits for the graph connection itself: a query after the
            # swap must not wait for it (an unreachable Neo4j takes its connect timeout).
            # Only a first load, which a query waits for anyway, leaves it to the graph's
            # first use.
            stores = (*stores[:3], stores[3].result())
        return stores, adopted, prepared

    def _warm_next(self, stores: tuple, manifest: dict | None, adopted: dict, prepared: tuple | None,
                   first_load: bool) -> None:
        """Read the next generation's newly loaded collections through and search each once."""
        if not first_load and prepared is None:
            self._read_through(stores[1], skip=set(adopted))
            _warm_vectors(stores[0], manifest, skip=set(adopted))
        elif prepared is not None:
            # _prefetch read the folder through and warmed the collections the loaded manifest
            # names: one this manifest adds is warmed here
            loaded = (self.manifest or {}).get("stores", {}).get("qdrant_collections") or {}
            _warm_vectors(stores[0], manifest, skip=set(adopted) | set(loaded.values()))

    def _swap(self, stores: tuple, manifest: dict | None, stamp, adopted: dict, first_load: bool) -> None:
        """Serve `stores` from now on; the old generation closes on a thread of its own."""
        with self.lock.exclusive():
            old = self._take_stores()
            if old[3] is not None and old[3] is stores[3]:
                old = (*old[:3], None)  # the connection the new generation goes on with
            if adopted:  # the adopted shards are the new generation's to close now
                old[0].client.hand_over(adopted)
                stores[0].client.take_over(adopted)
            self._put_stores(stores)
            self.manifest, self._loaded_stamp = manifest, stamp
        if first_load and self.watching.is_set():  # a query may be waiting: read on the side
            self._side_pool.submit(self._read_through, stores[1])
        # closing flushes and unmaps the old generation, which takes long: not a query's wait
        threading.Thread(target=self._close, args=(old,), daemon=True, name="mtrag-reader-close").start()

    def _read_through(self, folder: str | None, skip: set[str] = frozenset()) -> None:
        """A long-lived reader (`watch_current`) reads its private folder's newly loaded collections
        through once, so its first queries on them do not fault page by page (stores/page_cache.py);
        a one-shot reader does not."""
        if folder is None or not self.watching.is_set():
            return
        try:
            roots = [p for p in Path(folder).iterdir() if p.is_dir() and p.name not in skip]
        except OSError:  # closed meanwhile (a side-pool pass after the reader moved on)
            return
        read_through(roots, stop=self.stopped.is_set, known=self._read_files)

    def _moved(self, stamp=None) -> bool:
        stamp = self._stamp() if stamp is None else stamp
        return stamp != self._loaded_stamp or (self.manifest is None and stamp is not None)

    def _load_override(self) -> None:
        if self._loaded_stamp == "override":
            return
        with self.lock.exclusive():
            if self._loaded_stamp != "override":
                self._close(self._take_stores())
                self._put_stores(self.open_stores(self._manifest_override))
                self.manifest = self._manifest_override
                self._loaded_stamp = "override"

    def _adoptable(self, manifest: dict) -> dict:
        """{collection: (shard, folder)} of the loaded generation's Edge shards whose collection
        `manifest`'s published version holds unchanged (qdrant_folder.unchanged_collections: the
        same segments at the same versions, so no point was written), for its store to adopt."""
        client = getattr(self.qdrant, "client", None)
        if self.manifest is None or not hasattr(client, "shared"):
            return {}  # nothing loaded, a server, or qdrant-client's local mode: nothing to adopt
        loaded = (self.manifest.get("stores") or {}).get("qdrant_snapshot")
        wanted = (manifest.get("stores") or {}).get("qdrant_snapshot")
        if not loaded or not wanted:
            return {}
        return client.shared(unchanged_collections(loaded, wanted, client.homes))

    # ------------------------------------------------------------------ opening and closing stores
    def open_stores(self, manifest: dict, graph=None, adopted: dict | None = None,
                    prepared: tuple | None = None) -> tuple:
        """(qdrant, its private folder, fts, neo4j) for `manifest`; nothing stays open on failure
        (but `graph`, a connection the caller holds and passes on, is left open, and so are the
        `adopted` shards, the loaded generation's). `prepared`: (qdrant, folder, adopted) opened
        for the manifest's version already (_take_prefetched)."""
        snapshot = manifest.get("stores", {}).get("qdrant_snapshot")
        # The graph connection (the driver's import, a Bolt handshake, the markers' read) is made
        # on the side pool while this thread opens the vector segments and a first query embeds and
        # searches; the first graph use waits for it (`graph.store`). A CLI query pays the longest,
        # not the sum.
        reused = graph is not None
        if not reused:
            graph = self._side_pool.submit(self.graph.connect)
        try:
            if prepared is not None:
                qdrant, copy = prepared[:2]  # registered in _open_qdrants when it was opened
            else:
                qdrant, copy = self._open_qdrant(snapshot, adopted)
            try:
                fts = open_fts(stores_settings(self.settings, manifest))
            except BaseException:
                self._close((qdrant, copy, None, None))
                raise
        except BaseException:
            if not reused:
                self._close((None, None, None, graph.result()))
            raise
        return qdrant, copy, fts, graph

    def _open_qdrant(self, snapshot: str | None, adopted: dict | None) -> tuple:
        qdrant, copy = open_published_qdrant(self.settings, snapshot, adopted)
        if qdrant is not None:
            with self._folders_lock:
                self._open_qdrants.append(qdrant)
        return qdrant, copy

    def _put_stores(self, stores: tuple) -> None:
        self.qdrant, self.qdrant_copy, self.fts, self.graph.store = stores

    def _take_stores(self) -> tuple:
        """The loaded stores, now this reader's no more; a graph connection still being made goes
        as its Future (called under the exclusive lock: nothing here waits for it)."""
        stores = (self.qdrant, self.qdrant_copy, self.fts, self.graph.take())
        self.qdrant = self.qdrant_copy = self.fts = None
        return stores

    def _close(self, stores: tuple) -> None:
        qdrant, copy, fts, neo4j = stores
        if isinstance(neo4j, Future):
            neo4j = neo4j.result()  # GraphConnection.connect never raises: a store or None
        for store in (qdrant, fts, neo4j):
            if store is not None:
                try:
                    store.close()
                except Exception:  # noqa: BLE001 - closing is best effort
                    pass
        with self._folders_lock:
            self._open_qdrants = [q for q in self._open_qdrants if q is not qdrant]
        self._retire_folder(copy)

    def _retire_folder(self, copy: str | None) -> None:
        """Remove `copy` (a closed generation's private Qdrant folder) and any retired before it,
        each once no open store has a shard in it (a later generation may serve one it adopted)."""
        with self._folders_lock:
            if copy:
                self._retired.add(str(copy))
            homes = [str(h) for q in self._open_qdrants for h in getattr(q.client, "homes", {}).values()]
            for folder in sorted(self._retired):
                if not any(h == folder or h.startswith(folder + os.sep) for h in homes):
                    remove_reader_folder(folder)
                    self._retired.discard(folder)

    def close(self) -> None:
        self.stopped.set()
        with self._switching:
            self._drop_prefetched(wait=True)
        with self.lock.exclusive():
            self._close(self._take_stores())
            self._loaded_stamp = None

    # ------------------------------------------------------------------ prefetch
    def _prefetch(self) -> None:
        """A serving reader opens the embedded Qdrant version a publish made as soon as the
        `qdrant-published` link names it: the publishing stage makes the version before its gate
        reads the stores and writes the manifest, so the switch that follows finds it linked,
        its changed collections loaded and warm (a share of a switch beside a running watch:
        docs/performance.md#serving). Only what a manifest names is served: a version the next manifest does
        not name is closed then (_take_prefetched). Called by the switch thread alone."""
        if not self.watching.is_set() or self.manifest is None or self.settings.qdrant_url \
                or self._manifest_override is not None or self.stopped.is_set():
            return
        link = self.settings.qdrant_published_dir
        try:
            target = os.readlink(link)
        except OSError:  # no version yet, or a folder from before the links
            return
        if target == self._prefetch_seen:
            return
        self._prefetch_seen = target
        version = os.path.realpath(link)
        if version == (self.manifest.get("stores") or {}).get("qdrant_snapshot"):
            return
        with self._switching:
            self._drop_prefetched()
            adopted = self._adoptable({"stores": {"qdrant_snapshot": version}})
            try:
                with paced_loads(lambda: self.lock.wait_idle(SWITCH_QUIET_WAIT_S)):
                    qdrant, copy = self._open_qdrant(version, adopted)
            except Exception:  # noqa: BLE001 - the switch opens it itself and says what failed
                return
            self._read_through(copy, skip=set(adopted))
            _warm_vectors(qdrant, self.manifest, skip=set(adopted))
            self._prefetched = (version, qdrant, copy, adopted)

    def _take_prefetched(self, manifest: dict | None) -> tuple | None:
        """(qdrant, folder, adopted) prefetched for `manifest`'s Qdrant version, now the caller's;
        a prefetched store of another version is closed. The caller holds `_switching`."""
        prepared = self._prefetched
        if prepared is not None and manifest and (manifest.get("stores") or {}).get("qdrant_snapshot") == prepared[0]:
            self._prefetched = None
            return prepared[1:]
        self._drop_prefetched()
        return None

    def _drop_prefetched(self, wait: bool = False) -> None:
        """Close the prefetched store, if any, that no manifest named (its adopted shards stay the
        loaded generation's): on a thread of its own like a replaced generation, or here (`wait`).
        The caller holds `_switching`."""
        prepared, self._prefetched = self._prefetched, None
        if prepared is None:
            return
        stores = (prepared[1], prepared[2], None, None)
        if wait:
            self._close(stores)
        else:
            threading.Thread(target=self._close, args=(stores,), daemon=True, name="mtrag-reader-close").start()
