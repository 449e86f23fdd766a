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
the plain dicts.

The parts live in modules of their own, each with one job: the loaded generation and its switch
(generations.py, with the graph connection in graph_connection.py), the gate and status
(reader_gate.py), the query-side models (query_embedding.py), the query pipeline (query_flow.py,
recall.py) and the graph reads (graph_queries.py). `ReaderCore` holds the stateful parts and
ties the helper modules to them."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mtrag_resources.core.config import Settings
from mtrag_resources.publish import gate
from mtrag_resources.serving.fusion import DEFAULT_WEIGHTS
from mtrag_resources.serving.generations import SWITCH_POLL_S, Generations
from mtrag_resources.serving.graph_queries import graph_paths, lookup_symbol
from mtrag_resources.serving.query_embedding import (  # noqa: F401  (EmbedderMismatch: the reader's API)
    EmbedderMismatch, QueryEmbedders)
from mtrag_resources.serving.query_flow import answer
from mtrag_resources.serving.ranker import Ranker
from mtrag_resources.serving.reader_gate import gate_now, hidden_sources, status, without
from mtrag_resources.serving.requests import (  # noqa: F401  (QueryError, UnknownSource, UnknownSymbol: the reader's API)
    MODES, QueryError, UnknownSource, UnknownSymbol, check_query, check_sources)
from mtrag_resources.serving.results import (  # noqa: F401  (the reader's result types, re-exported)
    Answer, BridgeEntry, Bundle, ChannelCount, ChannelRank, Exact, Hit, Parent, PathsAnswer, Stale, Status, StoreState)
from mtrag_resources.stores.cas import ContentStore


class ReaderCore:
    """The stateful part of the reader: the generation it serves and its switch (`generations`),
    the query-side models (`embedders`), the learned ranker, and the side pool a query's side
    reads run on; the query, the gate and the graph reads are the helper modules' over them."""

    def __init__(self, settings: Settings, weights: dict | None = None, max_hops_limit: int = 6,
                 proposals: bool = True, manifest_override: dict | None = None):
        """`manifest_override`: serve this manifest instead of the one CURRENT names. Only the
        publish step's golden-query gate uses it, to query a candidate generation whose stores
        are committed before CURRENT moves to it; such a reader never reloads."""
        self.settings = settings
        self.weights = {**DEFAULT_WEIGHTS, **(weights or {})}
        # weights the caller chose: they win over a cut-over profile's (`fusion_weights`)
        self._chosen_weights = {c: w for c, w in (weights or {}).items() if DEFAULT_WEIGHTS.get(c) != w}
        self.max_hops_limit = max_hops_limit
        self.log_proposals = proposals
        self.cas = ContentStore(settings.cas_dir)
        self._dense_wanted = False                 # the first query embeds: preload the embedder
        self.embedders = QueryEmbedders()
        self.ranker = Ranker()                     # the learned order of the fused list's head
        # A query's side reads (the query embedding, the graph's markers) run here while its own
        # thread searches FTS and Qdrant: onnxruntime and the Neo4j socket release the GIL.
        self.side_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="mtrag-query-side")
        self.generations = Generations(settings, self.side_pool, manifest_override, self._first_load,
                                       self._before_switch)

    def fusion_weights(self, manifest: dict | None) -> dict:
        """The fusion weights for `manifest`'s generation: the defaults, then those of the profile
        it serves (a cut-over, docs/shadow.md#cut-over), then the ones this reader was given."""
        served = ((manifest or {}).get("serving") or {}).get("fusion") or {}
        return {**self.weights, **served, **self._chosen_weights}

    @property
    def manifest(self) -> dict | None:
        """The manifest of the generation served now."""
        return self.generations.manifest

    @property
    def switch_error(self) -> str | None:
        """Why the last switch to a new CURRENT failed (None: it did not)."""
        return self.generations.switch_error

    def _first_load(self, manifest: dict) -> None:
        """The first generation opens: a query that embeds has its embedder loaded beside it."""
        if self._dense_wanted and manifest.get("embedder"):
            self.side_pool.submit(self.embedders.preload, manifest)

    def _before_switch(self, manifest: dict) -> None:
        """A serving reader's switch thread, before the swap: the next generation's query embedder
        ready (another one after a cut-over)."""
        if self._dense_wanted and manifest.get("embedder"):
            self.embedders.prepare(manifest)

    def refresh(self) -> None:
        self.generations.refresh()

    def watch_current(self, interval: float = SWITCH_POLL_S) -> None:
        """For a long-lived server: switch generations in a thread of its own (Generations)."""
        if not self.generations.watching.is_set():
            self.side_pool.submit(self.embedders.translator.load)  # a server's first Chinese question does not wait
        self.generations.watch_current(interval)

    def close(self) -> None:
        self.generations.close()
        self.side_pool.shutdown(wait=False, cancel_futures=True)

    def gate(self) -> gate.GateState:
        with self.generations.published_view():
            return gate_now(self.generations)

    def status(self, visible: frozenset[str] | None = None) -> dict:
        """The published generation, each store's marker per source and the stale channels
        (reader_gate.status); `visible`: a team's sources."""
        return status(self.generations, visible)

    def embedder(self):
        return self.embedders.embedder_for(self.manifest)

    def query(self, text: str, k: int = 10, kind: str | None = None, mode: str = "hybrid",
              sources: list[str] | None = None, visible: frozenset[str] | None = None) -> dict:
        """`visible`: the sources a team's key may read (None: every source); the query's scope is
        `sources` within them, and an id outside them is as unknown as one never published."""
        text = check_query(text, k, kind, mode, sources)
        # A first query that embeds has the embedder loaded beside the stores' opening (_first_load);
        # one that does not (lexical, exact) would only wait for a load it never uses.
        self._dense_wanted = "dense" in MODES[mode] or mode == "bundles"
        with self.generations.published_view():
            scope = check_sources(sources)
            out = answer(self, text, k, kind, mode, scope, visible)
            # what lags outside the sources the query read is not this answer's to report
            read = visible
            if scope is not None:
                read = frozenset(scope) if visible is None else visible & frozenset(scope)
            out["stale"] = without(out["stale"], hidden_sources(self.manifest, read))
            return out

    def paths(self, from_name: str, to_name: str | None = None, rel_types: list[str] | None = None,
              direction: str = "out", max_hops: int = 4, verified_only: bool = True, limit: int = 10,
              visible: frozenset[str] | None = None) -> dict:
        """`visible`: a team's sources; only paths whose every node is of them, asked of the graph."""
        return graph_paths(self.generations, self.max_hops_limit, from_name, to_name, rel_types, direction,
                           max_hops, verified_only, limit, visible)

    def symbol_lookup(self, name: str, limit: int = 5, visible: frozenset[str] | None = None) -> dict:
        """Is `name` a symbol of the published generation, and the nearest symbol names
        (graph_queries.lookup_symbol)."""
        return lookup_symbol(self.generations, name, limit, visible)


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
