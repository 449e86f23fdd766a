"""IndexReader: answers queries from the published generation only.

It loads `CURRENT`, compares every store's marker with the manifest per source (gate.py), and
leaves out - and reports - any channel that is stale for a source. Embedded Qdrant is read from
the version the manifest names (hard-linked into a private folder, because embedded mode allows
one process per folder), so a running build never blocks or half-feeds a reader, and a switch to
a new generation is opened beside the old one, which serves until the swap.

Queries run concurrently: they share the loaded generation under a readers-writer lock that a
reload (CURRENT moved) takes alone. Each query reads SQLite inside one snapshot that also holds
the markers the gate checked, and re-reads the graph markers after using the graph: a graph
write that began meanwhile drops the graph's answers (reported stale) instead of mixing them.

Results are typed (serving/results.py, re-exported here): `IndexReader.query` returns an `Answer`
(`hits: list[Hit]`, `bridge: list[BridgeEntry]`, `bundles: list[Bundle]`, `stale: list[Stale]`,
`exact: Exact`, ...), `paths` a `PathsAnswer`, `status` a `Status`; `.to_dict()` is the JSON of
`mtrag query --json` exactly, and each is also a read-only Mapping over that dict (the
compatibility view: `answer["hits"][0]["file_path"]` still works). `ReaderCore` builds and returns
the plain dicts."""
from __future__ import annotations

import contextlib
import difflib
import json
import os
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path


from mtrag_resources.core.errors import MtragError
from mtrag_resources.core.scripts import is_cjk_query
from mtrag_resources.embedding.multilingual import MultilingualEmbedder, collection_kind
from mtrag_resources.stores.cas import ContentStore
from mtrag_resources.core.config import Settings, env
from mtrag_resources.publish.journal import batch_summary, last_batch
from mtrag_resources.publish.manifest import load_current
from mtrag_resources.core.layout import current_path
from mtrag_resources.stores.connect import open_fts, open_neo4j, open_published_qdrant, remove_reader_folder
from mtrag_resources.stores.qdrant_folder import unchanged_collections
from mtrag_resources.stores.page_cache import read_through
from mtrag_resources.stores.qdrant_edge_client import paced_loads
from mtrag_resources.stores.contract import LINKS_SOURCE
from mtrag_resources.publish import gate
from mtrag_resources.publish.golden import load_refusal
from mtrag_resources.serving.bundles import Hit as BundleHit, MemoryGraph, apply_keyword_bonus, best_by_id, distance_from_cosine, score_bundles
from mtrag_resources.serving.fusion import (DEFAULT_WEIGHTS, demote_declarations, merge_exact_into_dense, named_first,
                                             weighted_rrf)
from mtrag_resources.serving.query_text import is_identifier_query, lexical_text, preprocess_query
from mtrag_resources.serving.requests import (  # noqa: F401  (QueryError, UnknownSource, UnknownSymbol: the reader's API)
    DEFAULT_PATH_RELATIONS, MODES, QueryError, UnknownSource, UnknownSymbol, check_known_sources, check_paths,
    check_query, check_sources, validate_text)
from mtrag_resources.serving import channels as channels_
from mtrag_resources.serving.bridge import code_named, doc_to_code_bridge, docs_default_role, log_proposals
from mtrag_resources.serving.shared_lock import SharedLock
from mtrag_resources.serving.translation import QueryTranslator, Translation
from mtrag_resources.serving.ranker import Ranker
from mtrag_resources.serving.results import (  # noqa: F401  (the reader's result types, re-exported)
    Answer, BridgeEntry, Bundle, ChannelCount, ChannelRank, Exact, Hit, Parent, PathsAnswer, Stale, Status, StoreState)

# A reader fails fast on an unreachable graph (its channel turns stale) instead of retrying for the
# driver's default 30 s per call, and tries to reconnect at most every NEO4J_RETRY_S.
READER_NEO4J_CONFIG = {"max_transaction_retry_time": 1.0, "connection_timeout": 5.0,
                       "connection_acquisition_timeout": 10.0}
NEO4J_RETRY_S = 5.0
# A switch to a new generation that failed (a full disk, a store that will not open) is tried again
# after this long; the loaded generation serves meanwhile.
SWITCH_RETRY_S = 2.0
# How often a long-lived reader looks at CURRENT (a stat, ~10 us of the GIL): a published change is
# served within it (0.05 s was ~30 ms of a Django watch edit's ~1 s until it is served).
SWITCH_POLL_S = 0.02
# How long a switch waits for a moment with no query in flight before it loads a changed collection
# anyway (under a load that never pauses).
SWITCH_QUIET_WAIT_S = 0.25


# A query whose best three hits are all farther than this (cosine, in the query's vector space) is
# answered with confidence "low": calibrated on the dev sets (bench/eval), see MIN_TOP_COSINE's note
# in docs/maintainers.md.
MIN_TOP_COSINE = {"default": 0.30, "multilingual": 0.855}
# Reported when a graph write began while a query read the graph: its graph answers were dropped.
GRAPH_MOVED = {"source": "*", "store": "neo4j", "reason": "a graph write began during the query; graph results left out"}


def _warm_vectors(qdrant, manifest: dict, skip: set[str] = frozenset()) -> None:
    """One search in each of the new generation's collections before the swap, in the switch
    thread: the first query on a freshly opened Edge shard paid its page faults (the first query
    after a switch took 135 ms against ~26 ms, bench/scale.py on Django). Best effort. `skip`:
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


def _unreachable(exc: Exception) -> str:
    """Why the graph channel is stale when Neo4j cannot be asked."""
    return f"Neo4j unreachable: {exc.__class__.__name__}: {str(exc)[:200]}"


class EmbedderMismatch(MtragError, RuntimeError):
    """The query embedder is not the one the published generation was embedded with."""

    http_status = 409


# The multilingual embedder's cost grows with the query's length (docs/performance.md#embedding);
# what an English question asks of the Chinese chunks is in its first words.
ML_QUERY_WORDS = 24
ML_QUERY_CJK_CHARS = 128


def multilingual_query_text(text: str) -> str:
    """The part of a query the multilingual channel embeds: a Chinese one's first
    ML_QUERY_CJK_CHARS characters, another's first ML_QUERY_WORDS words."""
    if is_cjk_query(text):
        return text[:ML_QUERY_CJK_CHARS]
    return " ".join(text.split()[:ML_QUERY_WORDS])


class ReaderCore:
    """The stateful part of the reader: open stores for the currently published generation."""

    def __init__(self, settings: Settings, weights: dict | None = None, max_hops_limit: int = 6,
                 proposals: bool = True, manifest_override: dict | None = None):
        """`manifest_override`: serve this manifest instead of the one CURRENT names. Only the
        publish step's golden-query gate uses it, to query a candidate generation whose stores
        are committed before CURRENT moves to it; such a reader never reloads."""
        self.settings = settings
        self._manifest_override = manifest_override
        self.weights = {**DEFAULT_WEIGHTS, **(weights or {})}
        self.max_hops_limit = max_hops_limit
        self.log_proposals = proposals
        self.cas = ContentStore(settings.cas_dir)
        self._lock = SharedLock()                 # the loaded generation: queries share, reloads own
        self._qdrant_lock = threading.Lock()       # embedded Qdrant's client is not thread-safe
        self._neo4j_lock = threading.Lock()        # (re)connecting the graph
        self._switching = threading.Lock()         # one thread opens a new generation at a time
        self._switch_retry_at = 0.0
        self.switch_error: str | None = None       # why the last switch to a new CURRENT failed
        self._read_files: set = set()              # the files read through (page_cache.read_through)
        self._watching = threading.Event()         # a switch thread moves this reader (watch_current)
        self._stopped = threading.Event()
        self._embedder_lock = threading.Lock()
        self._dense_wanted = False                 # the first query embeds: preload the embedder
        self._loaded_stamp = None
        self.manifest: dict | None = None
        self._neo4j_store = None                   # the graph connection (the `_neo4j` property)
        self._neo4j_pending: Future | None = None  # or the connection a switch is still making
        self._pending_lock = threading.Lock()
        self._qdrant = self._fts = self._neo4j = None
        self._neo4j_error: str | None = None
        self._neo4j_tried = 0.0
        self._graph_cold = True                    # no default graph read planned yet (_warm_graph)
        self._qdrant_copy: str | None = None
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
        self._embedder = None
        self._multilingual = None
        self._translator = QueryTranslator()       # a Chinese question's English words (loaded on first use)
        self.ranker = Ranker()                     # the learned order of the fused list's head
        # A query's side reads (the query embedding, the graph's markers) run here while its own
        # thread searches FTS and Qdrant: onnxruntime and the Neo4j socket release the GIL.
        self._side_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="mtrag-query-side")

    # ------------------------------------------------------------------ loading
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
        if self._watching.is_set() and self.manifest is not None:
            return  # the switch thread (watch_current) moves this reader
        self._switch()

    def watch_current(self, interval: float = SWITCH_POLL_S) -> None:
        """For a long-lived server: switch generations in a thread of its own that looks at
        CURRENT every `interval` seconds, so no query pays for opening a new generation; queries
        answer from the loaded one until the swap."""
        if self._watching.is_set():
            return
        self._watching.set()
        self._side_pool.submit(self._translator.load)  # a server's first Chinese question does not wait for it

        def loop() -> None:
            while not self._stopped.wait(interval):
                try:
                    self._switch()
                    self._prefetch()
                except Exception as exc:  # noqa: BLE001 - the first load failed: the next turn retries
                    self.switch_error = f"{type(exc).__name__}: {exc}"

        threading.Thread(target=loop, daemon=True, name="mtrag-reader-switch").start()

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
            if first_load and self._dense_wanted and manifest and manifest.get("embedder"):
                self._side_pool.submit(self._preload_embedder, manifest)
            try:
                # The graph is one server whatever the generation: a live connection goes on
                # serving the new one (a new driver, handshake and markers read per switch was
                # ~20-50 ms of it); only a reader without one connects.
                graph = None if first_load else self._live_graph()
                # Collections whose points this generation did not change go on being served by
                # the loaded shards: loading one holds the GIL (~40-100 ms a collection at
                # django's size), and every query waits that long
                adopted = {} if first_load or not manifest else self._adoptable(manifest)
                prepared = self._take_prefetched(manifest)
                if prepared is not None:
                    adopted = prepared[2]
                # A serving reader loads the changed collections' shards where no query is in
                # flight (the load holds the GIL): queries answer from the loaded one meanwhile.
                paced = not first_load and self._watching.is_set()
                with paced_loads(lambda: paced and self._lock.wait_idle(SWITCH_QUIET_WAIT_S)):
                    stores = self._open_stores(manifest, graph, adopted, prepared) if manifest else (None, None, None, None)
                if not first_load and isinstance(stores[3], Future):
                    # A switch thread waits for the graph connection itself: a query after the
                    # swap must not wait for it (an unreachable Neo4j takes its connect timeout).
                    # Only a first load, which a query waits for anyway, leaves it to the graph's
                    # first use.
                    stores = (*stores[:3], stores[3].result())
            except Exception as exc:
                # Without a loaded generation the call fails (the next one tries again); with one,
                # it keeps serving (its channels report what lags) and retries the switch shortly.
                if first_load:
                    raise
                self.switch_error = f"{type(exc).__name__}: {exc}"
                self._switch_retry_at = time.monotonic() + SWITCH_RETRY_S
                return
            self.switch_error = None
            if not first_load and prepared is None:
                self._read_through(stores[1], skip=set(adopted))
                _warm_vectors(stores[0], manifest, skip=set(adopted))
            elif prepared is not None:
                # _prefetch read the folder through and warmed the collections the loaded manifest
                # names: one this manifest adds is warmed here
                loaded = (self.manifest or {}).get("stores", {}).get("qdrant_collections") or {}
                _warm_vectors(stores[0], manifest, skip=set(adopted) | set(loaded.values()))
            with self._lock.exclusive():
                old = self._take_stores()
                if old[3] is not None and old[3] is stores[3]:
                    old = (*old[:3], None)  # the connection the new generation goes on with
                if adopted:  # the adopted shards are the new generation's to close now
                    old[0].client.hand_over(adopted)
                    stores[0].client.take_over(adopted)
                self._qdrant, self._qdrant_copy, self._fts, self._neo4j = stores
                self.manifest, self._loaded_stamp = manifest, stamp
            if first_load and self._watching.is_set():  # a query may be waiting: read on the side
                self._side_pool.submit(self._read_through, stores[1])
            # closing flushes and unmaps the old generation (~0.4 s at 20k points): not a query's wait
            threading.Thread(target=self._close, args=(old,), daemon=True, name="mtrag-reader-close").start()
        finally:
            self._switching.release()

    def _read_through(self, folder: str | None, skip: set[str] = frozenset()) -> None:
        """A long-lived reader (`watch_current`) reads its private folder's newly loaded collections
        through once, so its first queries on them do not fault page by page (stores/page_cache.py);
        a one-shot reader does not."""
        if folder is None or not self._watching.is_set():
            return
        try:
            roots = [p for p in Path(folder).iterdir() if p.is_dir() and p.name not in skip]
        except OSError:  # closed meanwhile (a side-pool pass after the reader moved on)
            return
        read_through(roots, stop=self._stopped.is_set, known=self._read_files)

    def _moved(self, stamp=None) -> bool:
        stamp = self._stamp() if stamp is None else stamp
        return stamp != self._loaded_stamp or (self.manifest is None and stamp is not None)

    def _load_override(self) -> None:
        if self._loaded_stamp == "override":
            return
        with self._lock.exclusive():
            if self._loaded_stamp != "override":
                self._close(self._take_stores())
                self._qdrant, self._qdrant_copy, self._fts, self._neo4j = self._open_stores(self._manifest_override)
                self.manifest = self._manifest_override
                self._loaded_stamp = "override"

    def _live_graph(self):
        """The loaded generation's graph connection when it has one made (None: none, or one still
        being made)."""
        with self._pending_lock:
            return self._neo4j_store if self._neo4j_pending is None else None

    def _adoptable(self, manifest: dict) -> dict:
        """{collection: (shard, folder)} of the loaded generation's Edge shards whose collection
        `manifest`'s published version holds unchanged (qdrant_folder.unchanged_collections: the
        same segments at the same versions, so no point was written), for its store to adopt."""
        client = getattr(self._qdrant, "client", None)
        if self.manifest is None or not hasattr(client, "shared"):
            return {}  # nothing loaded, a server, or qdrant-client's local mode: nothing to adopt
        loaded = (self.manifest.get("stores") or {}).get("qdrant_snapshot")
        wanted = (manifest.get("stores") or {}).get("qdrant_snapshot")
        if not loaded or not wanted:
            return {}
        return client.shared(unchanged_collections(loaded, wanted, client.homes))

    def _open_stores(self, manifest: dict, graph=None, adopted: dict | None = None,
                     prepared: tuple | None = None) -> tuple:
        """(qdrant, its private folder, fts, neo4j) for `manifest`; nothing stays open on failure
        (but `graph`, a connection the caller holds and passes on, is left open, and so are the
        `adopted` shards, the loaded generation's). `prepared`: (qdrant, folder, adopted) opened
        for the manifest's version already (_take_prefetched)."""
        snapshot = manifest.get("stores", {}).get("qdrant_snapshot")
        # The graph connection (the driver's import, a Bolt handshake, the markers' read) is made
        # on the side pool while this thread opens the vector segments and a first query embeds and
        # searches; the first graph use waits for it (`_neo4j`). A CLI query pays the longest, not
        # the sum.
        reused = graph is not None
        if not reused:
            graph = self._side_pool.submit(self._connect_neo4j)
        try:
            if prepared is not None:
                qdrant, copy = prepared[:2]  # registered in _open_qdrants when it was opened
            else:
                qdrant, copy = self._open_qdrant(snapshot, adopted)
            try:
                fts = open_fts(self.settings)
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

    def _prefetch(self) -> None:
        """A serving reader opens the embedded Qdrant version a publish made as soon as the
        `qdrant-published` link names it: the publishing stage makes the version before its gate
        reads the stores and writes the manifest, so the switch that follows finds it linked,
        its changed collections loaded and warm (at django, ~60-100 ms of a switch beside a
        running watch). Only what a manifest names is served: a version the next manifest does
        not name is closed then (_take_prefetched). Called by the switch thread alone."""
        if not self._watching.is_set() or self.manifest is None or self.settings.qdrant_url \
                or self._manifest_override is not None or self._stopped.is_set():
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
                with paced_loads(lambda: self._lock.wait_idle(SWITCH_QUIET_WAIT_S)):
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

    @property
    def _neo4j(self):
        """The graph connection or None; waits for one a switch is still making."""
        with self._pending_lock:
            if self._neo4j_pending is not None:
                self._neo4j_store, self._neo4j_pending = self._neo4j_pending.result(), None
            return self._neo4j_store

    @_neo4j.setter
    def _neo4j(self, value) -> None:
        """A connection, None, or a Future of one (from _open_stores)."""
        with self._pending_lock:
            if isinstance(value, Future):
                self._neo4j_store, self._neo4j_pending = None, value
            else:
                self._neo4j_store, self._neo4j_pending = value, None

    def _connect_neo4j(self):
        """A graph connection, or None (its channel then reports why: `_neo4j_error`)."""
        self._neo4j_tried = time.monotonic()
        store = None
        try:
            store = open_neo4j(self.settings, **READER_NEO4J_CONFIG)
            store.markers()
            self._neo4j_error = None
            if self._graph_cold and self._watching.is_set():
                # a long-lived server's first connection (or the first after the graph was lost,
                # e.g. a Neo4j restart): plan the default graph reads aside, not in a query
                self._graph_cold = False
                self._side_pool.submit(self._warm_graph, store)
            return store
        except Exception as exc:  # noqa: BLE001 - an unreachable graph makes its channel stale, not the reader dead
            if store is not None:
                with contextlib.suppress(Exception):
                    store.close()
            self._neo4j_error = _unreachable(exc)
            self._graph_cold = True
            return None

    @staticmethod
    def _warm_graph(store) -> None:
        with contextlib.suppress(Exception):  # best effort: a switch may close this connection meanwhile
            store.warm_serving()

    def _neo4j_lost(self, exc: Exception) -> None:
        """Drop the graph connection: every graph use checks `self._neo4j` and skips, and the next
        gate after NEO4J_RETRY_S tries again."""
        if self._neo4j is not None:
            with contextlib.suppress(Exception):  # closing is best effort
                self._neo4j.close()
        self._neo4j = None
        self._neo4j_error = _unreachable(exc)
        self._graph_cold = True

    def _take_stores(self) -> tuple:
        """The loaded stores, now this reader's no more; a graph connection still being made goes
        as its Future (called under the exclusive lock: nothing here waits for it)."""
        with self._pending_lock:
            graph = self._neo4j_pending or self._neo4j_store
            self._neo4j_store = self._neo4j_pending = None
        stores = (self._qdrant, self._qdrant_copy, self._fts, graph)
        self._qdrant = self._qdrant_copy = self._fts = None
        return stores

    def _close(self, stores: tuple) -> None:
        qdrant, copy, fts, neo4j = stores
        if isinstance(neo4j, Future):
            neo4j = neo4j.result()  # _connect_neo4j never raises: a store or None
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
        self._stopped.set()
        with self._switching:
            self._drop_prefetched(wait=True)
        with self._lock.exclusive():
            self._close(self._take_stores())
            self._loaded_stamp = None
        self._side_pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ gate
    @contextlib.contextmanager
    def _published_view(self):
        """The loaded generation, kept loaded while the block runs, with every SQLite read of the
        block (the gate's markers and the query's rows) inside one snapshot."""
        self.refresh()
        with self._lock.shared():
            if self._fts is None:
                yield
                return
            with self._fts.snapshot():
                yield

    def gate(self) -> gate.GateState:
        with self._published_view():
            return self._gate_now()

    def _gate_now(self) -> gate.GateState:
        """Evaluate the gate on the loaded generation (the caller holds the shared lock and, for
        a query, the FTS snapshot the query then reads from)."""
        return self._gate_from(self._local_markers(), self._graph_markers())

    def _local_markers(self) -> dict:
        """The markers of the stores this process reads locally (Qdrant copy, FTS snapshot)."""
        live = {"qdrant": {}, "fts": self._fts.markers() if self._fts else {}}
        if self._qdrant:
            with self._qdrant_lock:
                live["qdrant"] = {s: self._qdrant.marker(s) for s in self.manifest["sources"]}
        return live

    def _gate_from(self, local: dict, neo: dict | str) -> gate.GateState:
        """The gate from the local markers and the graph's (or why the graph could not be asked)."""
        if not self.manifest:
            return gate.evaluate(None, {})
        live, unreachable = dict(local), {}
        links_marker = None
        if isinstance(neo, dict):
            live["neo4j"] = neo
            links_marker = neo.get(LINKS_SOURCE)
        else:
            unreachable["neo4j"] = neo
        if self._qdrant is None:
            unreachable["qdrant"] = "no Qdrant snapshot in the manifest"
        state = gate.evaluate(self.manifest, live, links_marker, unreachable)
        state.graph_markers = neo if isinstance(neo, dict) else None
        return state

    def _graph_markers(self) -> dict | str:
        """The graph's projection markers, or why the graph could not be asked."""
        with self._neo4j_lock:
            if self._neo4j is None and time.monotonic() - self._neo4j_tried >= NEO4J_RETRY_S:
                self._neo4j = self._connect_neo4j()
            store = self._neo4j
        try:
            if store is None:
                raise RuntimeError(self._neo4j_error or "Neo4j not connected")
            return store.markers()
        except Exception as exc:  # noqa: BLE001 - an unreachable graph makes its channel stale
            with self._neo4j_lock:
                if self._neo4j is store and store is not None:
                    self._neo4j_lost(exc)
            return self._neo4j_error or f"Neo4j unreachable: {exc}"

    def _graph_unchanged(self, state: gate.GateState) -> bool:
        """After reading the graph: did any projection marker move since the gate? A write begins
        by committing its 'begin' marker, so equal markers mean the reads saw the gated graph."""
        return state.graph_markers is not None and self._graph_markers() == state.graph_markers

    def status(self, visible: frozenset[str] | None = None) -> dict:
        """The published generation, each store's marker per source and the stale channels;
        `visible` (a team's sources, serving/api_keys.py): only what those sources show, and
        nothing of the fast lane's or the golden gate's that names another source."""
        state = self.gate()
        manifest = self.manifest
        hidden = _hidden_sources(manifest, visible)
        out = {"generation": state.generation, "sources": {s: v for s, v in state.stores.items() if s not in hidden},
               "stale": _without(state.stale, hidden)}
        quality = (manifest or {}).get("quality") if state.generation is not None else None
        if quality:  # the published generation's golden figures (publish/golden.py)
            out["quality"] = {k: quality.get(k) for k in ("recall", "recalled", "queries", "baseline",
                                                           "accepted_drop")}
        fast_lane = batch_summary(last_batch(self.settings))
        if fast_lane and not hidden.intersection(fast_lane.get("sources") or ()):
            out["fast_lane"] = fast_lane  # the last batch `mtrag watch` applied (publish/journal.py)
        refusal = load_refusal(self.settings.quality_refusal)
        # the golden gate's refusal names the queries and hits of every source: not a team's to read
        if refusal and refusal.get("published_generation") == state.generation and visible is None:
            out["quality_refused"] = refusal  # the last candidate the golden gate refused, until a publish
        return out

    # ------------------------------------------------------------------ embedder
    def _embed_query(self, text: str):
        t0 = time.perf_counter()
        return self.embedder().encode([text])[0], _ms(t0)

    def _multilingual_channel(self) -> tuple[bool, list[dict]]:
        """Does the query also search the multilingual collections (the CJK chunks, embedded by
        the multilingual model)? Yes when the generation has them and the query-side multilingual
        embedder is the one that embedded them, whatever the question's language: an English
        question finds a Chinese doc there. A mismatch is reported stale."""
        published = self.manifest.get("multilingual")
        if not published:
            return False, []
        if self._multilingual is None:
            self._multilingual = MultilingualEmbedder(threads=2)
        if self._multilingual.fingerprint_id != published.get("fingerprint_id"):
            return False, [{"source": "*", "store": "qdrant_ml",
                            "reason": f"the query's multilingual embedder {self._multilingual.fingerprint_id} is not "
                                      f"the generation's {published.get('fingerprint_id')}"}]
        return True, []

    def _embed_query_ml(self, text: str):
        t0 = time.perf_counter()
        return self._multilingual.encode_query(multilingual_query_text(text)), _ms(t0)

    def embedder(self):
        return self._embedder_for(self.manifest["embedder"])

    def _preload_embedder(self, manifest: dict) -> None:
        """Load the query embedder for `manifest` on the side pool while the first generation's
        stores open (a one-shot `mtrag query` otherwise loads it after them). A failure here is
        the first query's to report, so it is not raised."""
        with contextlib.suppress(Exception):
            self._embedder_for(manifest["embedder"]).model  # noqa: B018 - loads the model files

    def _embedder_for(self, expected: dict):
        from mtrag_resources.embedding.embedder import Embedder, EmbedderConfig
        with self._embedder_lock:
            # one thread per query: requests run in parallel threads, and one short text
            # gains nothing from splitting (measured: p50 22 ms vs 92 ms with 2 on a busy box)
            config = EmbedderConfig.from_env(threads=1)
            if not env("MTRAG_EMBED_BACKEND") and config.device.startswith("cpu"):
                # unset: embed queries the way the published generation embedded its chunks
                config.backend = "onnx-int8" if _with_vector_kind(expected)["vectors"] != "fp32" else "onnx"
            if self._embedder is None or self._embedder.config.backend != config.backend:
                self._embedder = Embedder(config)
        fp = self._embedder.fingerprint  # cached: what the loaded model is (the files' state re-read cost ~1.3 ms a query)
        keys = ("model_id", "dim", "max_seq_length", "normalize", "prompt", "vectors")
        fp, expected = _with_vector_kind(fp), _with_vector_kind(expected)
        diff = {k: (fp.get(k), expected.get(k)) for k in keys if fp.get(k) != expected.get(k)}
        if diff:
            raise EmbedderMismatch(
                "the query embedder does not match the published generation's embedder: "
                + ", ".join(f"{k}: query {a!r} vs manifest {b!r}" for k, (a, b) in diff.items())
                + " (set MTRAG_EMBED_MODEL to the manifest's model or rebuild)")
        return self._embedder

    # ------------------------------------------------------------------ query
    def query(self, text: str, k: int = 10, kind: str | None = None, mode: str = "hybrid",
              sources: list[str] | None = None, visible: frozenset[str] | None = None) -> dict:
        """`visible`: the sources a team's key may read (None: every source); the query's scope is
        `sources` within them, and an id outside them is as unknown as one never published."""
        text = check_query(text, k, kind, mode, sources)
        # A first query that embeds has the embedder loaded beside the stores' opening (_switch);
        # one that does not (lexical, exact) would only wait for a load it never uses.
        self._dense_wanted = "dense" in MODES[mode] or mode == "bundles"
        with self._published_view():
            scope = check_sources(sources)
            out = self._query(text, k, kind, mode, scope, visible)
            # what lags outside the sources the query read is not this answer's to report
            read = visible
            if scope is not None:
                read = frozenset(scope) if visible is None else visible & frozenset(scope)
            out["stale"] = _without(out["stale"], _hidden_sources(self.manifest, read))
            return out

    def _query(self, text: str, k: int, kind: str | None, mode: str, scope_ids: list[str] | None = None,
               visible: frozenset[str] | None = None) -> dict:
        t = {}
        out = {"generation": None, "query": text, "mode": mode, "hits": [], "bridge": [], "paths": [],
               "bundles": [], "stale": [], "channels": {},
               "exact": {"identifier": is_identifier_query(text), "matched": False}, "confidence": "low"}
        if not self.manifest:
            out["stale"] = list(self._gate_from({}, {}).stale)
            out["empty_reason"] = "nothing is published yet: run `mtrag build`"
            return out
        # A scoped query: every channel (dense, FTS, exact, bridge, paths, bundles) reads only these
        # published sources; an id the manifest does not hold is refused before any store is read.
        # A team's key (`visible`) scopes every query to its sources, and makes the others unknown.
        readable = {s for s in self.manifest["sources"] if visible is None or s in visible}
        scope = None if scope_ids is None else set(check_known_sources(scope_ids, readable))
        if scope is None and visible is not None:
            scope = readable
        # The gate's graph markers (a Neo4j round trip) and the query embedding are read beside the
        # FTS and dense searches, which need only the local stores' markers; the graph markers are
        # joined before the first graph read, so "markers before == markers after" still brackets it.
        graph = self._side_pool.submit(self._graph_markers)
        # A Chinese question's English words: the lexical channel and the default embedder read
        # English; the original question still reaches the Chinese index and the multilingual one.
        translation = self._translate(text)
        english = translation.english
        embedding = ml_embedding = None
        multilingual, space_stale = self._multilingual_channel()
        if "dense" in MODES[mode] or mode == "bundles":
            embedding = self._side_pool.submit(self._embed_query, english or text)
            if multilingual:
                ml_embedding = self._side_pool.submit(self._embed_query_ml, text)
        local = self._local_markers()
        state = self._gate_from(local, "graph markers not read yet")  # qdrant and fts verdicts only
        out["generation"] = state.generation
        sources = self.manifest["sources"]
        kinds = [kind] if kind else sorted({e["kind"] for s, e in sources.items() if scope is None or s in scope})
        pre = preprocess_query(text)
        # the exact channel and the bridge share them
        lookups = channels_.AliasLookups(self._fts, channels_.scope_ids(sources, state.stale_for("fts"), scope))
        rankings, cosines, dense_kind, qvec, exact_found = self._recall(text, translation, k, kind, mode, state, kinds,
                                                                        embedding, t, lookups, scope)
        ml_cosines = self._recall_multilingual(ml_embedding, k, kinds, state, scope, rankings, dense_kind, t)
        recalled = list(dict.fromkeys(cid for r in rankings.values() for cid in
                                      (x[0] if isinstance(x, tuple) else x for x in r)))
        rows, payloads = self._rows(recalled, dense_kind, state.stale_for("fts"))
        stale_f = state.stale_for("fts")
        # a single-channel mode (dense, lexical) stays that channel's ranking alone
        named = set(channels_.exactly_named(exact_found, text)) \
            if is_identifier_query(text) and "exact" in MODES[mode] else set()
        hits = self._fuse(rankings, cosines, rows, payloads, recalled, kinds, qvec, k, state.stale_for("qdrant"),
                          text if mode == "hybrid" else None, named)
        state = self._gate_from(local, graph.result())  # the full gate: the graph's verdicts too
        out["stale"] = list(state.stale)
        self._hydrate_parents(hits, stale_f)
        self._name_commits(hits)
        out["hits"] = hits
        out["exact"], out["confidence"] = self._honesty(text, hits, exact_found, ml_cosines)
        out["bridge"], proposals = doc_to_code_bridge(self._neo4j, self._fts, self.manifest, hits, state,
                                                      self._query_code(text, state, lookups, scope), text, scope)
        if proposals and self.log_proposals:
            log_proposals(self.settings.proposals_log, proposals)
        out["paths"] = self._query_paths(rankings.get("exact", []), rows, state, scope)
        if (out["paths"] or any(b["via"] == "graph" for b in out["bridge"])) and not self._graph_unchanged(state):
            out["paths"] = []
            out["bridge"] = [b for b in out["bridge"] if b["via"] != "graph"]
            out["stale"].append(GRAPH_MOVED)
        if mode == "bundles":
            out["bundles"] = self._bundles(pre, rows, cosines, recalled)
        out["channels"] = {c: {"hits": len(r)} for c, r in rankings.items()}
        if "dense" in out["channels"]:
            out["channels"]["dense"]["embedder"] = "default"
        if "dense_ml" in out["channels"]:
            out["channels"]["dense_ml"]["embedder"] = "multilingual"
        if english:
            out["translation"] = english
        out["stale"].extend(space_stale)
        if not hits:
            out["empty_reason"] = self._why_empty(text, mode, kind, kinds, scope, state, translation)
        out["timings_ms"] = t
        return out

    def _query_code(self, text: str, state: gate.GateState, lookups: channels_.AliasLookups,
                    scope: set[str] | None = None) -> list[dict]:
        """Code rows the query names (bridge.named_in_query: a pasted doc section's references,
        never its literals or examples; a question's identifiers), each naming exactly one code
        chunk, with the text that names it (`matched_text`): what a pasted doc section is about.
        An identifier query is answered by its hits, not bridged."""
        if is_identifier_query(text):
            return []
        code = {s for s, e in self.manifest["sources"].items() if e["kind"] == "code" and (scope is None or s in scope)}
        found = code_named(self._fts, text, lookups, code - state.stale_for("fts"),
                           docs_default_role(self.manifest, scope), channels_.MAX_QUERY_IDENTIFIERS)
        rows = self._fts.get_chunks([c for c, _ in found]) if found else {}
        return [dict(rows[c], matched_text=matched) for c, matched in found if c in rows]

    def _honesty(self, text: str, hits: list[dict], exact_found: list[dict],
                 ml_cosines: dict[str, float]) -> tuple[dict, str]:
        """Say when nothing answers: an identifier-shaped query with no symbol of that name is
        `exact.matched: false` and low confidence (a made-up name never looks like a hit); other
        queries are low confidence when no top hit is as close as a calibrated cosine in either
        vector space (the default one, or the multilingual one for a Chinese chunk)."""
        identifier = is_identifier_query(text)
        if identifier:
            matched = channels_.exact_matched(exact_found, text)
            return {"identifier": True, "matched": matched}, "high" if matched else "low"
        exact = {"identifier": False, "matched": bool(exact_found)}
        top = hits[:3]
        close = any(h.get("cosine") is not None and h["cosine"] >= MIN_TOP_COSINE["default"] for h in top) \
            or any(ml_cosines.get(h["chunk_id"], 0.0) >= MIN_TOP_COSINE["multilingual"] for h in top)
        return exact, "normal" if exact_found or close else "low"

    def _why_empty(self, text: str, mode: str, kind: str | None, kinds: list[str], scope: set[str] | None,
                   state: gate.GateState, translation: Translation) -> str:
        """One sentence on why a query found nothing: the scope, the kind, lagging stores, the exact
        mode given a sentence or an unknown name, or words neither the index nor the dictionary knows."""
        sources = {s: e for s, e in self.manifest["sources"].items()
                   if (scope is None or s in scope) and (kind is None or e["kind"] == kind)}
        where = f"the sources {sorted(scope)}" if scope else "the published sources" if scope is None \
            else "the sources this API key may read"
        if not sources:
            return f"{where} hold no source of kind {kind!r}" if kind else f"{where} hold no source"
        if all(state.is_stale(s, "fts") and state.is_stale(s, "qdrant") for s in sources):
            return f"every store of {where} lags the published generation (see `stale`)"
        if mode == "exact":
            if not is_identifier_query(text):
                return ("mode exact looks up identifiers (a name such as `Group` or `pkg.mod.func`) and the "
                        "query is a sentence: ask it in mode hybrid, the default")
            return f"no symbol, file or alias of {where} is named {text.strip()!r}"
        if translation.words and not translation.english:
            return (f"no chunk of {where} shares a word with the question, and its Chinese words "
                    f"{translation.unknown} have no English translation in the dictionary")
        searched = ", ".join(sorted(kinds))
        return f"no chunk of {where} ({searched}) shares a word with the question or is close to it"

    def _translate(self, text: str) -> Translation:
        """The English words of a question written (mostly) in Chinese; no translation otherwise:
        an English question with a Chinese word keeps its own words."""
        return self._translator.translate(text) if is_cjk_query(text) else Translation("", ())

    def _recall_multilingual(self, ml_embedding, k: int, kinds: list[str], state: gate.GateState,
                             scope: set[str] | None, rankings: dict, dense_kind: dict, t: dict) -> dict[str, float]:
        """The multilingual collections' ranking (`dense_ml`, Chinese chunks) added to `rankings`;
        returns its cosines (a space of its own: not comparable with the default one's)."""
        if ml_embedding is None or self._qdrant is None:
            return {}
        qvec, t["embed_ml_ms"] = ml_embedding.result()
        t0 = time.perf_counter()
        found, ml_kind = channels_.dense(self._qdrant, self._qdrant_lock, qvec, k, kinds, self.manifest["sources"],
                                         state.stale_for("qdrant"), self._unpublished, collection_kind, scope)
        for cid, kd in ml_kind.items():
            dense_kind.setdefault(cid, kd)
        rankings["dense_ml"] = [cid for cid, _ in found]
        t["dense_ml_ms"] = _ms(t0)
        return dict(found)

    def _recall(self, text: str, translation: Translation, k: int, kind: str | None, mode: str, state: gate.GateState,
                kinds: list[str], embedding, t: dict, lookups,
                scope: set[str] | None = None) -> tuple[dict, dict, dict, object, list[dict]]:
        """Each channel's ranking for the query (the dense one with cosines), the collection kind of
        each dense hit, the query vector (None when no dense channel runs) and the exact matches
        (looked up for an identifier-shaped query even when the mode has no exact channel).
        `translation`: a Chinese question's content words (its lexical query: words, not bigrams
        across word boundaries) and its translated keywords, searched lexically beside it (`fts_en`).
        `scope`: a scoped query's sources, which each store is asked to restrict itself to."""
        sources = self.manifest["sources"]
        channels = MODES[mode]
        rankings: dict[str, list[str]] = {}
        cosines: dict[str, float] = {}
        dense_kind: dict[str, str] = {}  # dense hit -> collection kind (its payload is fetched only if needed)
        stale_q, stale_f = state.stale_for("qdrant"), state.stale_for("fts")
        fts_hits = None
        if "fts" in channels:  # before waiting for the embedding, which runs meanwhile
            t0 = time.perf_counter()
            lexical = translation.segmented or lexical_text(text)
            fts_hits = channels_.fts(self._fts, lexical, k, kind, sources, stale_f, scope)
            english = translation.keywords
            if english:
                rankings["fts_en"] = [h["chunk_id"] for h in
                                      channels_.fts(self._fts, lexical_text(english), k, kind, sources, stale_f, scope)]
            t["fts_ms"] = _ms(t0)
        qvec = None
        if embedding is not None:
            t0 = time.perf_counter()
            qvec, t["embed_ms"] = embedding.result()
            t["embed_wait_ms"] = _ms(t0)
        if "dense" in channels and self._qdrant is not None:
            t0 = time.perf_counter()
            dense, dense_kind = channels_.dense(self._qdrant, self._qdrant_lock, qvec, k, kinds, sources,
                                                stale_q, self._unpublished, scope=scope)
            dense.sort(key=lambda x: -x[1])
            cosines.update(dict(dense))
            rankings["dense"] = dense
            t["dense_ms"] = _ms(t0)
        if fts_hits is not None:
            rankings["fts"] = [h["chunk_id"] for h in fts_hits]
        exact_found: list[dict] = []
        if "exact" in channels or is_identifier_query(text):
            t0 = time.perf_counter()
            exact_found = channels_.exact_hits(self._fts, text, k, kind, sources, stale_f, lookups, scope)
            if "exact" in channels:
                rankings["exact"] = [h["chunk_id"] for h in exact_found]
            t["exact_ms"] = _ms(t0)
        return rankings, cosines, dense_kind, qvec, exact_found

    def _fuse(self, rankings: dict, cosines: dict, rows: dict, payloads: dict, recalled: list[str],
              kinds: list[str], qvec, k: int, stale_q: set[str], rerank_for: str | None = None,
              named: set[str] = frozenset()) -> list[dict]:
        """The channels' rankings fused into the top k hits, each with its true cosine; the head
        reordered by the learned ranker for the question `rerank_for` (hybrid queries); what the
        whole query names first."""
        if qvec is not None and self._qdrant is not None:
            # Exact and lexical candidates get their true cosine by point id: no invented ranks.
            cosines.update(channels_.true_cosines(self._qdrant, self._qdrant_lock, qvec, recalled, cosines, rows,
                                                  kinds, stale_q))
            if "dense" in rankings and "exact" in rankings:
                exact_cos = {c: cosines[c] for c in rankings["exact"] if c in cosines}
                rankings["dense"] = merge_exact_into_dense(rankings["dense"][: max(k * 3, 20)], exact_cos)
        if "dense" in rankings:
            rankings["dense"] = [cid for cid, _ in rankings["dense"]]
        fused = weighted_rrf(rankings, {c: self.weights.get(c, 1.0) for c in rankings})
        if rerank_for is not None:
            fused = self.ranker.reorder(rerank_for, fused, {**payloads, **rows}, cosines)
        fused = named_first(fused, named)
        fused = demote_declarations(fused, lambda cid: rows.get(cid) or payloads.get(cid), k)
        hits = []
        for cid, score, per_channel in fused:
            row = rows.get(cid) or self._row_from_payload(cid, payloads.get(cid))
            if row is None:
                continue
            hits.append(self._hit(len(hits) + 1, row, score, per_channel, cosines.get(cid)))
            if len(hits) >= k:
                break
        return hits

    def _rows(self, recalled: list[str], dense_kind: dict, stale_f: set[str]) -> tuple[dict, dict]:
        """Rows for everything recalled, and the Qdrant payloads of dense hits that have no row."""
        payloads: dict[str, dict] = {}
        # FTS rows for sources whose FTS is current, else the
        # Qdrant payload plus the CAS text (the CAS is append-only, so always consistent).
        rows = {cid: r for cid, r in self._fts.get_chunks(recalled).items() if r["source_id"] not in stale_f}
        # Dense hits of sources whose FTS is stale: their row is the Qdrant payload (+ CAS text).
        need: dict[str, list[str]] = {}
        for cid, kd in dense_kind.items():
            if cid not in rows:
                need.setdefault(kd, []).append(cid)
        for kd, ids in need.items():
            with self._qdrant_lock:
                payloads.update(self._qdrant.payloads_for(kd, ids))
        return rows, payloads

    def _unpublished(self, kind: str) -> bool:
        """Does the Qdrant copy hold sources of `kind` that the manifest does not publish?"""
        if self._qdrant_copy is not None:
            return False  # the copy was taken at publish time and holds exactly the manifest's sources
        published = {s for s, e in self.manifest["sources"].items() if e["kind"] == kind}
        return bool(set(self._qdrant.markers()) - published - {LINKS_SOURCE})

    def _row_from_payload(self, cid: str, payload: dict | None) -> dict | None:
        if not payload:
            return None
        row = dict(payload)
        try:
            row["text"] = self.cas.get_text(payload["content_hash"])
        except FileNotFoundError:
            row["text"] = ""
        return row

    @staticmethod
    def _hit(rank: int, row: dict, score: float, per_channel: dict, cosine: float | None) -> dict:
        return {"rank": rank, "chunk_id": row["chunk_id"], "source_id": row["source_id"],
                "source_kind": row.get("source_kind", ""), "file_path": row["file_path"],
                "start_line": row["start_line"], "end_line": row["end_line"], "symbol": row.get("symbol", ""),
                "title": row.get("title", ""), "text": row.get("text", ""), "score": round(score, 6),
                "cosine": None if cosine is None else round(cosine, 6),
                "channels": {c: {"rank": v["rank"], "score": round(v["score"], 6)} for c, v in per_channel.items()},
                "parent": None, "parent_id": row.get("parent_id"),
                **({"page": int(row["page"])} if row.get("page") else {}),  # a PDF's chunk: its 1-based page
                # an issue's chunk: the key and its state (a closed issue is found, and says so)
                **({"issue_key": row["issue_key"], "state": row.get("state") or ""} if row.get("issue_key") else {})}

    def _name_commits(self, hits: list[dict]) -> None:
        """A git source's hits name the snapshot the generation published: its `commit_sha`,
        `repository` and `ref` (the manifest's entry; each chunk's text is its file's at that
        commit, rows carry the commit they were parsed at)."""
        sources = self.manifest["sources"]
        for h in hits:
            entry = sources.get(h["source_id"]) or {}
            if entry.get("ref"):
                h.update(commit_sha=entry["commit_sha"], repository=entry["repository"], ref=entry["ref"])

    def _hydrate_parents(self, hits: list[dict], stale_f: set[str]) -> None:
        """Parent text is context for a hit, not a new scored hit."""
        ids = [h["chunk_id"] for h in hits if h["parent_id"] and h["source_id"] not in stale_f]
        parents = self._fts.parents_of(ids) if ids else {}
        for h in hits:
            p = parents.get(h["chunk_id"])
            if p:
                h["parent"] = {"chunk_id": p["chunk_id"], "title": p["title"], "symbol": p["symbol"],
                               "start_line": p["start_line"], "end_line": p["end_line"], "text": p["text"]}
            del h["parent_id"]

    # ------------------------------------------------------------------ graph

    def _query_paths(self, exact_ids: list[str], rows: dict, state: gate.GateState,
                     scope: set[str] | None = None) -> list[dict]:
        """Call paths from the best exact code anchor (2 hops), when its graph is current. A scoped
        query starts them at the anchor's own graph nodes (not every node of its name) and keeps
        only paths whose every node is in the scope."""
        for cid in exact_ids[:3]:
            row = rows.get(cid)
            neo = self._neo4j  # read once: a failed gate elsewhere may drop it meanwhile
            if row and row.get("source_kind") == "code" and row.get("symbol") and neo is not None \
                    and not state.is_stale(row["source_id"], "neo4j"):
                anchors = [row["symbol"]]
                if scope is not None:
                    graph_ids = row.get("graph_ids") or []
                    graph_ids = json.loads(graph_ids) if isinstance(graph_ids, str) else graph_ids
                    anchors = [g for g in graph_ids if _node_source({"node_id": g}) in scope] or anchors
                # the graph itself keeps to the scope: other sources' paths take none of the limit
                paths = neo.paths(anchors, rel_types=["CALLS"], direction="out", max_hops=2,
                                  verified_only=True, limit=5, hard_max_hops=self.max_hops_limit,
                                  source_ids=None if scope is None else sorted(scope))
                if scope is not None:
                    paths = [p for p in paths if all(_node_source(n) in scope for n in p["nodes"])]
                return paths
        return []

    def paths(self, from_name: str, to_name: str | None = None, rel_types: list[str] | None = None,
              direction: str = "out", max_hops: int = 4, verified_only: bool = True, limit: int = 10,
              visible: frozenset[str] | None = None) -> dict:
        """`visible`: a team's sources; only paths whose every node is of them, asked of the graph."""
        from_name, to_name = check_paths(from_name, to_name, rel_types, direction, max_hops, self.max_hops_limit)
        with self._published_view():
            state = self._gate_now()
            out = {"generation": state.generation, "from": from_name, "to": to_name, "paths": [],
                   "stale": _without(state.stale, _hidden_sources(self.manifest, visible))}
            neo = self._neo4j
            if state.generation is None or neo is None:
                return out
            stale_graph = state.stale_for("neo4j")
            # no relation named: calls, and from a web endpoint (`GET /login`) to its handler
            paths = neo.paths([from_name], [to_name] if to_name else None,
                              rel_types=rel_types or list(DEFAULT_PATH_RELATIONS), direction=direction,
                              max_hops=max_hops, verified_only=verified_only, limit=limit,
                              hard_max_hops=self.max_hops_limit, source_ids=self._readable_ids(visible))
            # Fail closed: a path touching a source whose graph is not the published one is dropped.
            published = set(self.manifest["sources"])
            out["paths"] = [p for p in paths
                            if all(_node_source(n) in published and _node_source(n) not in stale_graph
                                   for n in p["nodes"])]
            if out["paths"] and not self._graph_unchanged(state):
                out["paths"] = []
                out["stale"].append(GRAPH_MOVED)
            return out

    def _readable_ids(self, visible: frozenset[str] | None) -> list[str] | None:
        """The published sources a team's key may read, sorted (a bound `IN` list); None: every source."""
        return None if visible is None else sorted(s for s in self.manifest["sources"] if s in visible)

    def symbol_lookup(self, name: str, limit: int = 5, visible: frozenset[str] | None = None) -> dict:
        """Is `name` a symbol of the published generation (a graph entity by node id, qualified
        name or name; without the graph, an FTS `symbol` alias)? And the nearest symbol names:
        the FTS store's last-part matches, then an FTS search of code chunks (at most `limit`).
        `{"generation", "known", "nearest"}`; `known` is None when nothing is published.
        `visible` (a team's sources): another source's symbol is as unknown as one never written,
        and is never named among the nearest."""
        name = validate_text(name, "symbol")
        with self._published_view():
            state = self._gate_now()
            out = {"generation": state.generation, "known": None, "nearest": []}
            if state.generation is None or self._fts is None:
                return out
            neo = self._neo4j
            ids = self._readable_ids(visible)
            known = None
            if neo is not None:
                try:
                    known = bool(neo.resolve_anchors([name], limit=1, source_ids=ids))
                except Exception:  # noqa: BLE001 - the FTS store answers instead
                    known = None
            exact = self._fts.exact(name, k=50, source_ids=ids)
            if known is None:
                known = any(e["match"] == "exact" and e["alias_kind"] in ("symbol", "graph_id") for e in exact)
            # candidates: same last part, then an FTS search of code; ranked by likeness to the name
            last_part = [e["symbol"] for e in exact if e.get("symbol")]
            hits = self._fts.search(name, k=50, source_kind="code", source_ids=ids)
            rows = self._fts.get_chunks([h["chunk_id"] for h in hits])
            found = [(rows.get(h["chunk_id"]) or {}).get("symbol") for h in hits]
            candidates = [c for c in dict.fromkeys(last_part + found) if c and c != name]
            nearest = sorted(candidates, key=lambda c: -difflib.SequenceMatcher(None, name, c).ratio())[:limit]
            if len(nearest) < limit:  # nothing alike by words: the closest spellings of every symbol
                others = [c for c in self._fts.symbol_names(source_ids=ids) if c != name and c not in nearest]
                nearest += difflib.get_close_matches(name, others, n=limit - len(nearest), cutoff=0.0)
            out.update(known=known, nearest=nearest)
            return out

    # ------------------------------------------------------------------ bundles (seed 002)
    def _bundles(self, pre, rows: dict, cosines: dict, recalled: list[str]) -> list[dict]:
        hits = []
        for cid in recalled:
            row = rows.get(cid)
            if row is None or cid not in cosines:
                continue
            hits.append(BundleHit(cid, "chunk", f"{row.get('title', '')} {row.get('text', '')}",
                            distance_from_cosine(cosines[cid])))
        hits = apply_keyword_bonus(hits, pre.keywords)
        best = best_by_id(hits)
        graph = MemoryGraph()
        parents = self._fts.parents_of(list(best))
        for cid in best:
            row = rows[cid]
            unit = f"unit:{row['source_id']}:{row['file_path']}"
            graph.add_node(unit, "unit", row["file_path"])
            parent = parents.get(cid)
            facet = parent["chunk_id"] if parent else f"facet:{cid}"
            graph.add_node(facet, "facet", parent["title"] if parent else "")
            graph.add_node(cid, "point", row.get("title", ""))
            # Containment comes from the chunk table and is certain: it costs a hop, never a miss.
            graph.add_edge(unit, facet, relationship="CONTAINS", cost=0.0)
            graph.add_edge(facet, cid, relationship="CONTAINS", cost=0.0)
        out = []
        for b in score_bundles(graph, best, {}, top=10):
            _, source_id, file_path = b.unit_id.split(":", 2)
            out.append({"unit": file_path, "source_id": source_id, "score": round(b.score, 6),
                        "best_path": b.best_path, "cost_path": getattr(b, "cost_path", b.best_path),
                        "best_support_id": b.best_support_id, "best_facet_id": b.best_facet_id,
                        "best_point_id": b.best_point_id})
        return out


def _with_vector_kind(fp: dict) -> dict:
    """torch and onnx (fp32) give the same vectors (to ~3e-7): a query may use either against an
    index built by the other; int8 vectors are another kind."""
    backend = fp.get("backend") or "torch"
    return {**fp, "vectors": backend if backend.startswith("onnx-int8") else "fp32"}


def _hidden_sources(manifest: dict | None, visible: frozenset[str] | None) -> set[str]:
    """The published sources a team's key may not read (none for an unscoped reader)."""
    if visible is None or not manifest:
        return set()
    return {s for s in manifest["sources"] if s not in visible}


def _without(stale: list[dict], hidden: set[str]) -> list[dict]:
    """The stale entries that name no hidden source (`*` and the links projection stay)."""
    return [e for e in stale if e["source"] not in hidden] if hidden else list(stale)


def _node_source(node: dict) -> str:
    return node.get("source_id") or node.get("node_id", "").split(":", 1)[0]


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000, 2)


class IndexReader:
    """Hybrid retrieval, verified graph paths, the doc-to-code bridge and bundle scoring over the
    published generation only: `IndexReader(home="data").query("...")`. `home` empty = MTRAG_HOME.

    A plain class, so `mtrag query` and `mtrag serve` never import Dagster; assets and sensors use
    it through `mtrag_assets.resources.IndexReaderResource`. Stores open on the first call."""

    def __init__(self, home: str = "", weight_dense: float = DEFAULT_WEIGHTS["dense"],
                 weight_fts: float = DEFAULT_WEIGHTS["fts"], weight_exact: float = DEFAULT_WEIGHTS["exact"],
                 max_hops_limit: int = 6, log_proposals: bool = True):
        self.home = home
        self.weights = {"dense": weight_dense, "fts": weight_fts, "exact": weight_exact}
        self.max_hops_limit = max_hops_limit
        self.log_proposals = log_proposals
        self._core_state: ReaderCore | None = None

    def _core(self) -> ReaderCore:
        if self._core_state is None:
            settings = Settings(home=Path(self.home).resolve()) if self.home else Settings.from_env()
            self._core_state = ReaderCore(settings, self.weights, self.max_hops_limit, self.log_proposals)
        return self._core_state

    def query(self, text: str, k: int = 10, kind: str | None = None, mode: str = "hybrid",
              sources: list[str] | None = None) -> Answer:
        """Top `k` hits for `text` (1 <= k <= 100, at most 16 KB of UTF-8) with the bridge, paths
        and stale channels, as an `Answer` (`.to_dict()`: the JSON of `mtrag query --json`);
        `kind` `code` | `docs` | None (both), `mode` one of MODES; `sources`: 1 to 50 published
        source ids that every channel is restricted to (duplicates collapsed; None: every source).
        Raises QueryError for bad input (UnknownSource for an id the published generation does
        not hold), EmbedderMismatch when the query embedder is not the published generation's."""
        return Answer.from_dict(self._core().query(text, k=k, kind=kind, mode=mode, sources=sources))

    def paths(self, from_name: str, to_name: str | None = None, rel_types: list[str] | None = None,
              direction: str = "out", max_hops: int = 4, verified_only: bool = True,
              limit: int = 10) -> PathsAnswer:
        """Verified graph paths from a symbol (at most `max_hops_limit` hops), as a `PathsAnswer`;
        raises QueryError for bad input."""
        return PathsAnswer.from_dict(
            self._core().paths(from_name, to_name, rel_types, direction, max_hops, verified_only, limit))

    def symbol_lookup(self, name: str, limit: int = 5) -> dict:
        """`{"generation", "known", "nearest"}`: whether `name` is a symbol of the published
        generation, and up to `limit` nearest symbol names (`mtrag paths` says them for an
        unknown `--from`/`--to`)."""
        return self._core().symbol_lookup(name, limit)

    def watch_current(self, interval: float = SWITCH_POLL_S) -> None:
        """Switch generations in a background thread (`mtrag serve` does): queries never wait for
        a new generation to open."""
        self._core().watch_current(interval)

    def status(self) -> Status:
        """The published generation, each store's marker per source, and the stale channels, as a
        `Status`."""
        return Status.from_dict(self._core().status())

    def scoped(self, sources) -> "ScopedReader":
        """This reader answering for one team: only `sources` (a team key's, serving/api_keys.py)."""
        return ScopedReader(self, sources)

    def close(self) -> None:
        if self._core_state is not None:
            self._core_state.close()


class ScopedReader:
    """An IndexReader that answers only from `sources` (a team key's source ids, published or
    not yet): every query is scoped to them in the stores themselves (a request's own `sources`
    narrow it further; an id outside them is refused as unknown, exactly as an id never
    published, and the known ones listed are only these), paths and symbol lookups read only
    their graph nodes and aliases (another team's symbol is "no such symbol"), and status lists
    only them. Shares the reader's stores: one per team costs nothing."""

    def __init__(self, reader: IndexReader, sources):
        self._reader = reader
        self.sources = frozenset(sources)
        self.max_hops_limit = reader.max_hops_limit

    def query(self, text: str, k: int = 10, kind: str | None = None, mode: str = "hybrid",
              sources: list[str] | None = None) -> Answer:
        return Answer.from_dict(self._reader._core().query(text, k=k, kind=kind, mode=mode, sources=sources,
                                                           visible=self.sources))

    def paths(self, from_name: str, to_name: str | None = None, rel_types: list[str] | None = None,
              direction: str = "out", max_hops: int = 4, verified_only: bool = True,
              limit: int = 10) -> PathsAnswer:
        return PathsAnswer.from_dict(self._reader._core().paths(from_name, to_name, rel_types, direction, max_hops,
                                                                verified_only, limit, visible=self.sources))

    def symbol_lookup(self, name: str, limit: int = 5) -> dict:
        return self._reader._core().symbol_lookup(name, limit, visible=self.sources)

    def status(self) -> Status:
        return Status.from_dict(self._reader._core().status(visible=self.sources))

    def watch_current(self, interval: float = SWITCH_POLL_S) -> None:
        self._reader.watch_current(interval)

    def close(self) -> None:
        self._reader.close()
