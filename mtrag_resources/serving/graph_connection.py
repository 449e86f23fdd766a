"""The reader's Neo4j connection: made on the side pool while a generation's other stores open,
dropped when a read finds the graph gone, and made again at most every NEO4J_RETRY_S.

One object the reader's generations (serving/generations.py) hold: the graph is one server whatever
the generation, so a live connection goes on serving the next one. An unreachable graph never
fails the reader: its channel turns stale and says why (`error`)."""
from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from mtrag_resources.core.config import Settings
from mtrag_resources.stores.connect import open_neo4j

# A reader fails fast on an unreachable graph (its channel turns stale) instead of retrying for the
# driver's default 30 s per call, and tries to reconnect at most every NEO4J_RETRY_S.
READER_NEO4J_CONFIG = {"max_transaction_retry_time": 1.0, "connection_timeout": 5.0,
                       "connection_acquisition_timeout": 10.0}
NEO4J_RETRY_S = 5.0


def unreachable(exc: Exception) -> str:
    """Why the graph channel is stale when Neo4j cannot be asked."""
    return f"Neo4j unreachable: {exc.__class__.__name__}: {str(exc)[:200]}"


class GraphConnection:
    """The graph connection, None, or one still being made (a Future from the side pool)."""

    def __init__(self, settings: Settings, side_pool: ThreadPoolExecutor, watching: threading.Event):
        self.settings = settings
        self._side_pool = side_pool
        self._watching = watching                  # a long-lived server: plan the graph reads aside
        self._connecting = threading.Lock()        # (re)connecting the graph
        self._pending_lock = threading.Lock()
        self._store = None
        self._pending: Future | None = None
        self.error: str | None = None              # why there is no connection
        self._tried = 0.0
        self._cold = True                          # no default graph read planned yet (_warm)

    @property
    def store(self):
        """The graph connection or None; waits for one a switch is still making."""
        with self._pending_lock:
            if self._pending is not None:
                self._store, self._pending = self._pending.result(), None
            return self._store

    @store.setter
    def store(self, value) -> None:
        """A connection, None, or a Future of one (from Generations.open_stores)."""
        with self._pending_lock:
            if isinstance(value, Future):
                self._store, self._pending = None, value
            else:
                self._store, self._pending = value, None

    def live(self):
        """The connection when one is made (None: none, or one still being made)."""
        with self._pending_lock:
            return self._store if self._pending is None else None

    def take(self):
        """The connection (or its Future), now the caller's to close."""
        with self._pending_lock:
            graph = self._pending or self._store
            self._store = self._pending = None
        return graph

    def connect(self):
        """A graph connection, or None (its channel then reports why: `error`)."""
        self._tried = time.monotonic()
        store = None
        try:
            store = open_neo4j(self.settings, **READER_NEO4J_CONFIG)
            store.markers()
            self.error = None
            if self._cold and self._watching.is_set():
                # a long-lived server's first connection (or the first after the graph was lost,
                # e.g. a Neo4j restart): plan the default graph reads aside, not in a query
                self._cold = False
                self._side_pool.submit(self._warm, store)
            return store
        except Exception as exc:  # noqa: BLE001 - an unreachable graph makes its channel stale, not the reader dead
            if store is not None:
                with contextlib.suppress(Exception):
                    store.close()
            self.error = unreachable(exc)
            self._cold = True
            return None

    @staticmethod
    def _warm(store) -> None:
        with contextlib.suppress(Exception):  # best effort: a switch may close this connection meanwhile
            store.warm_serving()

    def lost(self, exc: Exception) -> None:
        """Drop the connection: every graph use checks `store` and skips, and the next gate after
        NEO4J_RETRY_S tries again."""
        if self.store is not None:
            with contextlib.suppress(Exception):  # closing is best effort
                self.store.close()
        self.store = None
        self.error = unreachable(exc)
        self._cold = True

    def markers(self) -> dict | str:
        """The graph's projection markers, or why the graph could not be asked."""
        with self._connecting:
            if self.store is None and time.monotonic() - self._tried >= NEO4J_RETRY_S:
                self.store = self.connect()
            store = self.store
        try:
            if store is None:
                raise RuntimeError(self.error or "Neo4j not connected")
            return store.markers()
        except Exception as exc:  # noqa: BLE001 - an unreachable graph makes its channel stale
            with self._connecting:
                if self.store is store and store is not None:
                    self.lost(exc)
            return self.error or f"Neo4j unreachable: {exc}"
