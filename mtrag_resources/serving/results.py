"""Typed results of the reader: `IndexReader.query` returns an `Answer`, `paths` a `PathsAnswer`,
`status` a `Status`.

Each result is a frozen dataclass with typed attributes, and `to_dict()` gives exactly the JSON of
the CLI's `--json` and of the HTTP and MCP answers (DESIGN.md's "Interfaces"); keys a class does not
name yet are kept in `extra`, so none is dropped. Each is also a read-only `Mapping` over its
`to_dict()` form, so code written against the plain dicts the reader used to return keeps working;
a value read through it is a fresh copy. Serialise with `json.dumps(result.to_dict())`."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar


def _key(name: str | None = None, *, parse: Callable[[Any], Any] | None = None, optional: bool = False,
         **kwargs):
    """A result field: its JSON key when that differs from the attribute name (`from`), how a
    value of the reader's dict becomes the attribute, and whether the key is left out of the JSON
    when the attribute is None (it was absent in the reader's dict)."""
    return field(metadata={"key": name, "parse": parse, "optional": optional}, **kwargs)


def _plain(value: Any) -> Any:
    """A value in its JSON form: results as dicts, containers copied (tuples stay tuples)."""
    if isinstance(value, _Result):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


def _list_of(cls) -> Callable[[list], list]:
    return lambda items: [cls.from_dict(x) for x in items]


def _dict_of(cls) -> Callable[[dict], dict]:
    return lambda items: {k: cls.from_dict(v) for k, v in items.items()}


class _Result(Mapping):
    """Base of the result classes: `from_dict`, `to_dict` and the read-only Mapping view."""

    # (JSON key, attribute, parse, optional) per field, in the JSON's order; filled per class.
    _layout: ClassVar[tuple[tuple[str, str, Any, bool], ...]] = ()
    _by_key: ClassVar[dict[str, tuple[str, bool]]] = {}

    @classmethod
    def _finish(cls):
        layout = []
        for f in dataclasses.fields(cls):
            if f.name == "extra":
                continue
            layout.append((f.metadata.get("key") or f.name, f.name, f.metadata.get("parse"),
                           bool(f.metadata.get("optional"))))
        cls._layout = tuple(layout)
        cls._by_key = {key: (attr, optional) for key, attr, _, optional in layout}
        return cls

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]):
        """The typed result of a dict in the JSON shape (what the reader builds); keys this class
        does not name go to `extra`, in their order."""
        if isinstance(data, _Result):
            data = data.to_dict()
        kwargs: dict[str, Any] = {}
        for key, attr, parse, optional in cls._layout:
            if key in data:
                value = data[key]
                kwargs[attr] = parse(value) if parse is not None and value is not None else value
            elif optional:
                kwargs[attr] = None
            else:
                raise ValueError(f"{cls.__name__}: the reader's answer has no {key!r}")
        kwargs["extra"] = {k: v for k, v in data.items() if k not in cls._by_key}
        return cls(**kwargs)

    def _items(self) -> Iterator[tuple[str, Any]]:
        for key, attr, _, optional in self._layout:
            value = getattr(self, attr)
            if value is None and optional:
                continue
            yield key, value
        yield from self.extra.items()

    def to_dict(self) -> dict[str, Any]:
        """The result as the plain JSON-ready dict the CLI, HTTP and MCP print (a fresh copy)."""
        return {key: _plain(value) for key, value in self._items()}

    # ---- the read-only Mapping view over to_dict() (the compatibility view; see the module doc)
    def __getitem__(self, key: str) -> Any:
        if key in self._by_key:
            attr, optional = self._by_key[key]
            value = getattr(self, attr)
            if value is None and optional:
                raise KeyError(key)
            return _plain(value)
        if key in self.extra:
            return _plain(self.extra[key])
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        if key in self._by_key:
            attr, optional = self._by_key[key]
            return not (optional and getattr(self, attr) is None)
        return key in self.extra

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self._items())

    def __len__(self) -> int:
        return sum(1 for _ in self._items())

    def copy(self) -> dict[str, Any]:
        """A plain dict, as `dict.copy()` gave: `to_dict()`."""
        return self.to_dict()

    def __or__(self, other):
        """`answer | {...}`: a plain dict, as with the dicts the reader used to return."""
        if not isinstance(other, Mapping):
            return NotImplemented
        return self.to_dict() | dict(other)

    def __ror__(self, other):
        if not isinstance(other, Mapping):
            return NotImplemented
        return dict(other) | self.to_dict()


# ------------------------------------------------------------------ query answers


def _result(cls):
    """Decorator: a frozen dataclass (compared as a Mapping, not field by field) with its layout."""
    return dataclass(frozen=True, eq=False)(cls)._finish()


@_result
class ChannelRank(_Result):
    """Where one retrieval channel ranked a hit: `rank` (1 = its best) and the channel's fused
    contribution `score`."""

    rank: int
    score: float
    extra: dict = field(default_factory=dict)


@_result
class Parent(_Result):
    """The parent chunk of a hit (its class or section), context for the hit rather than a scored
    hit: `chunk_id`, `title`, `symbol`, lines `start_line`-`end_line`, `text`."""

    chunk_id: str
    title: str
    symbol: str
    start_line: int
    end_line: int
    text: str
    extra: dict = field(default_factory=dict)


@_result
class Hit(_Result):
    """One hit of an answer, best first.

    `rank` (1-based), `chunk_id`, `source_id`, `source_kind` (`code` | `docs` | `issues`), `file_path`
    (relative to the source root), `start_line`-`end_line`, `symbol` (qualified name, code) and
    `title`, the chunk's `text`, the fused `score` (weighted reciprocal rank fusion), `cosine` (the
    query's cosine to the chunk in its vector space, None when no dense channel ran), `channels`
    (channel name -> its `ChannelRank`: `dense`, `fts`, `exact`) and `parent` (a `Parent` or
    None). A hit of a git source also names the published snapshot it comes from: `commit_sha`
    (the commit the source's ref named when it was built), `repository` and `ref` (absent, None,
    for other sources). A hit of a PDF document has its `page` (1-based; the hit's whole text is on
    that page); absent (None) for every other hit. A hit of an issue-tracker export (`source_kind`
    `issues`) names its issue: `issue_key` (`owner/repo#12`, `#12`, `PROJ-12`) and `state` (`open`,
    `closed`, a Jira status); absent (None) for other hits."""

    rank: int
    chunk_id: str
    source_id: str
    source_kind: str
    file_path: str
    start_line: int
    end_line: int
    symbol: str
    title: str
    text: str
    score: float
    cosine: float | None
    channels: dict[str, ChannelRank] = _key(parse=_dict_of(ChannelRank))
    parent: Parent | None = _key(parse=Parent.from_dict)
    commit_sha: str | None = _key(optional=True)
    repository: str | None = _key(optional=True)
    ref: str | None = _key(optional=True)
    page: int | None = _key(optional=True)
    issue_key: str | None = _key(optional=True)
    state: str | None = _key(optional=True)
    extra: dict = field(default_factory=dict)


@_result
class BridgeEntry(_Result):
    """A code symbol the answer's docs (or the query itself) point at: the doc -> code bridge.

    `from_chunk_id`, `from_title`, `from_rank`: the doc hit it came from (rank 0, title
    "(the query)", empty chunk id: named by the query's own prose); `symbol`, `file_path`,
    `start_line`: the code it names; `relation` (`MENTIONS` | `IMPLEMENTS`), `confidence`
    (`VERIFIED` | `INFERRED` | `PROPOSED`), `evidence` (a dict: the matched text and where),
    `via` (`query` | `graph` | `alias`) and `source_id` (the code's source; a scoped query bridges
    only to its own sources)."""

    from_chunk_id: str
    from_title: str
    from_rank: int
    symbol: str | None
    file_path: str | None
    start_line: int | None
    relation: str | None
    confidence: str | None
    evidence: dict | None
    via: str
    source_id: str | None = _key(optional=True)
    extra: dict = field(default_factory=dict)


@_result
class Bundle(_Result):
    """A scored unit (a file) of a `bundles` query: `unit` (its file path), `source_id`, `score`,
    and the best support path through it (`best_path`, `cost_path`, `best_support_id`,
    `best_facet_id`, `best_point_id`)."""

    unit: str
    source_id: str
    score: float
    best_path: Any
    cost_path: Any
    best_support_id: Any
    best_facet_id: Any
    best_point_id: Any
    extra: dict = field(default_factory=dict)


@_result
class Stale(_Result):
    """A channel left out of the answer because its store does not hold the published generation
    for a source: `source` (a source id; `*` for every source), `store` (`qdrant`, `qdrant_ml`,
    `fts`, `neo4j`; `*` for all) and `reason`."""

    source: str
    store: str
    reason: str
    extra: dict = field(default_factory=dict)


@_result
class Exact(_Result):
    """Whether the query is identifier-shaped (`identifier`) and whether a symbol of that name
    exists (`matched`; for other queries: whether the exact channel matched anything)."""

    identifier: bool
    matched: bool
    extra: dict = field(default_factory=dict)


@_result
class ChannelCount(_Result):
    """How many candidates a channel recalled for the answer (`hits`), and for the dense channel
    which embedder served the query (`embedder`: `default` | `multilingual`; None otherwise)."""

    hits: int
    embedder: str | None = _key(optional=True)
    extra: dict = field(default_factory=dict)


@_result
class Answer(_Result):
    """The answer to a query, from the published generation only.

    `generation` (None: nothing published), `query` (the text as searched), `mode`, `hits`
    (`Hit`s, best first), `bridge` (`BridgeEntry`s, at most 12), `paths` (verified call paths
    from the best exact code hit: dicts with `nodes`, `edges`, `hops`), `bundles` (`Bundle`s, mode
    `bundles` only), `stale` (`Stale`: the channels left out and why), `channels` (channel ->
    `ChannelCount`), `exact` (`Exact`), `confidence` (`high` | `normal` | `low`), `timings_ms`
    (stage -> milliseconds; None when nothing is published, and then absent from the JSON),
    `translation` (the English words a Chinese question was also searched with) and `empty_reason`
    (why there is no hit); both None, and absent from the JSON, where they do not apply.

    Also a read-only Mapping over `to_dict()` (the module doc's compatibility view)."""

    generation: int | None
    query: str
    mode: str
    hits: list[Hit] = _key(parse=_list_of(Hit))
    bridge: list[BridgeEntry] = _key(parse=_list_of(BridgeEntry))
    paths: list[dict] = _key()
    bundles: list[Bundle] = _key(parse=_list_of(Bundle))
    stale: list[Stale] = _key(parse=_list_of(Stale))
    channels: dict[str, ChannelCount] = _key(parse=_dict_of(ChannelCount))
    exact: Exact = _key(parse=Exact.from_dict)
    confidence: str = _key()
    timings_ms: dict[str, float] | None = _key(optional=True)
    translation: str | None = _key(optional=True)
    empty_reason: str | None = _key(optional=True)
    extra: dict = field(default_factory=dict)


# ------------------------------------------------------------------ paths and status


@_result
class PathsAnswer(_Result):
    """Verified graph paths from a symbol: `generation`, `from_name` (JSON `from`), `to_name`
    (JSON `to`, None when not asked), `paths` (dicts with `nodes` - `name`, `qualified_name`,
    `node_id`, ... - `edges` - `type`, `evidence`, ... - and `hops`) and `stale`.

    Also a read-only Mapping over `to_dict()` (the module doc's compatibility view)."""

    generation: int | None
    from_name: str = _key("from")
    to_name: str | None = _key("to")
    paths: list[dict] = _key()
    stale: list[Stale] = _key(parse=_list_of(Stale))
    extra: dict = field(default_factory=dict)


@_result
class StoreState(_Result):
    """One store's marker for one source: the `generation` it holds (None: no marker) and its
    `state` (`committed`, `begin`, `missing`, `unreachable`)."""

    generation: str | None
    state: str
    extra: dict = field(default_factory=dict)


def _stores_by_source(items: dict) -> dict:
    return {sid: {store: StoreState.from_dict(v) for store, v in stores.items()} for sid, stores in items.items()}


@_result
class Status(_Result):
    """The published generation and every store's marker per source.

    `generation` (None: nothing published), `sources` (source id -> store -> `StoreState`),
    `stale` (`Stale`), `quality` (the generation's golden-query figures: `recall`, `recalled`,
    `queries`, `baseline`, `accepted_drop`; None and absent from the JSON without a golden file),
    `quality_refused` (the last candidate the golden gate refused, until a publish; None and
    absent otherwise) and `fast_lane` (the last batch `mtrag watch` applied: generation, at,
    batch, sources, files, deleted, seconds; None and absent when no watch ran) and `serving` (the
    shadow profile the generation serves after `mtrag cutover`: `profile`, `fusion`, `cutover`: the
    generation a rollback restores, None once a build followed; None and absent otherwise).

    Also a read-only Mapping over `to_dict()` (the module doc's compatibility view)."""

    generation: int | None
    sources: dict[str, dict[str, StoreState]] = _key(parse=_stores_by_source)
    stale: list[Stale] = _key(parse=_list_of(Stale))
    quality: dict | None = _key(optional=True)
    quality_refused: dict | None = _key(optional=True)
    fast_lane: dict | None = _key(optional=True)
    serving: dict | None = _key(optional=True)
    extra: dict = field(default_factory=dict)


__all__ = ["Answer", "BridgeEntry", "Bundle", "ChannelCount", "ChannelRank", "Exact", "Hit", "Parent",
           "PathsAnswer", "Stale", "Status", "StoreState"]
