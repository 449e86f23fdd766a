"""Qdrant Edge (qdrant-edge-py) behind the few QdrantClient calls that QdrantStore makes.

QdrantStore keeps one code path for every engine: it builds qdrant_client `models` objects and
calls `collection_exists`, `upsert`, `scroll`, `query_points`, ...; `EdgeClient` answers those
calls on Edge shards. Edge has no collections, so each collection is one shard folder under the
store root (`<root>/mtrag_code`, `<root>/mtrag_docs`, `<root>/mtrag_markers`).

Search is Qdrant's own: a segment over Edge's indexing threshold (Qdrant's default of 10,000 KB of
vectors, about 6.5k 384-d points) gets an HNSW index when `optimize()` runs, smaller segments and the appendable one
are searched exactly. Vectors and payloads live in mmapped files, so a process's memory grows
with the pages it touches, not with Python objects per point. Only the calls and model shapes
QdrantStore uses are translated; anything else raises.
"""
from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# Qdrant's defaults (m 16, ef_construct 100); below full_scan_threshold KB of vectors a filtered
# query scans instead of walking the graph
HNSW_M, HNSW_EF_CONSTRUCT, HNSW_FULL_SCAN_KB = 16, 100, 10_000
EDGE_CONFIG_FILE = "edge_config.json"


def _edge():
    import qdrant_edge  # imported on first use: the default (local) engine never needs it

    return qdrant_edge


# Per thread, what a shard load waits for first (paced_loads).
_PACING = threading.local()


@contextmanager
def paced_loads(wait: Callable[[], object]):
    """Each shard this thread loads meanwhile calls `wait()` first. qdrant-edge-py holds the GIL for
    a whole load, so every query of the process stalls that long: a serving reader's switch waits for a moment without
    one in flight."""
    _PACING.wait = wait
    try:
        yield
    finally:
        _PACING.wait = None


def _before_load() -> None:
    wait = getattr(_PACING, "wait", None)
    if wait is not None:
        wait()


def is_edge_shard(folder: Path) -> bool:
    return (folder / EDGE_CONFIG_FILE).is_file()


def _match(match: Any):
    q = _edge()
    if hasattr(match, "any"):
        return q.MatchAny(list(match.any))
    if hasattr(match, "value"):
        return q.MatchValue(match.value)
    raise NotImplementedError(f"EdgeClient does not translate {type(match).__name__}")


def _filter(flt: Any):
    """qdrant_client models.Filter of FieldCondition(match=MatchValue|MatchAny) -> Edge Filter."""
    if flt is None:
        return None
    q = _edge()

    def conditions(conds):
        if conds is None:
            return None
        out = []
        for c in (conds if isinstance(conds, list) else [conds]):
            if hasattr(c, "must"):  # a nested Filter
                out.append(_filter(c))
            elif getattr(c, "match", None) is not None:
                out.append(q.FieldCondition(c.key, match=_match(c.match)))
            else:
                raise NotImplementedError(f"EdgeClient does not translate {c!r}")
        return out

    return q.Filter(must=conditions(flt.must), should=conditions(flt.should),
                    must_not=conditions(flt.must_not))


def edge_config(size: int, distance: str = "Cosine"):
    """The shard config of every mtrag collection: on-disk (mmapped) vectors and payloads, HNSW."""
    q = _edge()
    return q.EdgeConfig(
        vectors=q.EdgeVectorParams(size=int(size), distance=getattr(q.Distance, distance),
                                   on_disk=True),
        on_disk_payload=True,
        hnsw_config=q.HnswIndexConfig(m=HNSW_M, ef_construct=HNSW_EF_CONSTRUCT,
                                      full_scan_threshold=HNSW_FULL_SCAN_KB))


@dataclass
class PointStruct:
    id: Any
    vector: Any
    payload: dict | None = None


@dataclass
class MatchValue:
    value: Any


@dataclass
class MatchAny:
    any: list


@dataclass
class FieldCondition:
    key: str
    match: Any = None


@dataclass
class Filter:
    must: Any = None
    should: Any = None
    must_not: Any = None


@dataclass
class VectorParams:
    size: int
    distance: str


@dataclass
class PointIdsList:
    points: list


@dataclass
class FilterSelector:
    filter: Filter


# What QdrantStore builds its requests from when the engine is Edge: the few qdrant_client model
# shapes it uses, as plain dataclasses, so an Edge process never imports qdrant_client (a slow
# start-up: its async client, gRPC and pydantic models).
models = SimpleNamespace(
    PointStruct=PointStruct, MatchValue=MatchValue, MatchAny=MatchAny, FieldCondition=FieldCondition,
    Filter=Filter, VectorParams=VectorParams, PointIdsList=PointIdsList, FilterSelector=FilterSelector,
    Distance=SimpleNamespace(COSINE="Cosine", DOT="Dot"), PayloadSchemaType=SimpleNamespace(KEYWORD="keyword"))


class EdgeClient:
    """One Edge shard per collection under `root`; all existing shards are opened at once, so a
    folder held elsewhere fails here, as QdrantClient(path=...) does.

    `adopted`: {collection: (shard, its folder)} that another client of this process has open and
    this one serves too instead of loading (a reader's next generation, where those collections
    did not change: loading one holds the GIL). An
    adopted shard is not this client's to close until `take_over`; the other client gives it up
    with `hand_over`. `homes`: each collection's folder (where its shard's files are)."""

    def __init__(self, root: Path, adopted: dict[str, tuple[Any, Path]] | None = None) -> None:
        self.root = Path(root)
        self._shards: dict[str, Any] = {name: shard for name, (shard, _home) in (adopted or {}).items()}
        self.homes: dict[str, Path] = {name: Path(home) for name, (_shard, home) in (adopted or {}).items()}
        self._owned: set[str] = set()
        # The collections flushed with no update through this client since: a publish flushes every
        # collection, and a shard with nothing new still holds the GIL to flush. One loaded, created or adopted is not in until its first flush here (the updates of
        # a collection go through the client that writes it, which is the one that flushes it).
        self._clean: set[str] = set()
        try:
            for folder in sorted(self.root.iterdir()):
                if folder.is_dir() and folder.name not in self._shards and is_edge_shard(folder):
                    _before_load()
                    self._shards[folder.name] = _edge().EdgeShard.load(str(folder))
                    self.homes[folder.name] = folder
                    self._owned.add(folder.name)
        except BaseException:
            self.close()
            raise

    @property
    def adopted(self) -> set[str]:
        """The collections whose shard another client opened (and still closes)."""
        return set(self._shards) - self._owned

    def shared(self, names) -> dict[str, tuple[Any, Path]]:
        """{collection: (shard, folder)} of `names` this client has open: for another's `adopted`."""
        return {n: (self._shards[n], self.homes[n]) for n in names if n in self._shards}

    def hand_over(self, names) -> None:
        """The shards of `names` are another client's to close now (it adopted them)."""
        self._owned -= set(names)

    def take_over(self, names) -> None:
        """The adopted shards of `names` are this client's to close now."""
        self._owned |= set(names) & set(self._shards)

    def _shard(self, name: str):
        try:
            return self._shards[name]
        except KeyError:
            raise ValueError(f"collection {name} not found in {self.root}") from None

    # -- collections ----------------------------------------------------------------------
    def collection_exists(self, name: str) -> bool:
        return name in self._shards

    def get_collections(self):
        return SimpleNamespace(collections=[SimpleNamespace(name=n) for n in sorted(self._shards)])

    def create_collection(self, name: str, vectors_config: Any) -> None:
        q = _edge()
        distance = getattr(vectors_config.distance, "value", vectors_config.distance)
        self._shards[name] = q.EdgeShard.create(
            str(self.root / name), edge_config(int(vectors_config.size), distance))
        self.homes[name] = self.root / name
        self._owned.add(name)
        self._clean.discard(name)

    def create_payload_index(self, name: str, field: str, schema: Any) -> None:
        q = _edge()
        kind = getattr(q.PayloadSchemaType, str(getattr(schema, "value", schema)).capitalize())
        self._update(name, q.UpdateOperation.create_field_index(field, kind))

    def delete_payload_index(self, name: str, field: str) -> None:
        self._update(name, _edge().UpdateOperation.delete_field_index(field))

    def delete_collection(self, name: str) -> None:
        shard = self._shards.pop(name, None)
        self.homes.pop(name, None)
        self._clean.discard(name)
        if shard is not None and name in self._owned:
            shard.close()
        self._owned.discard(name)
        shutil.rmtree(self.root / name, ignore_errors=True)

    def get_collection(self, name: str):
        # Edge has no config getter; the shard keeps its config in this file
        config = json.loads((self.homes.get(name, self.root / name) / EDGE_CONFIG_FILE).read_text())
        vectors = config["vectors"][""]
        info = self._shard(name).info()
        return SimpleNamespace(
            points_count=info.points_count, payload_schema=dict(info.payload_schema),
            config=SimpleNamespace(params=SimpleNamespace(vectors=SimpleNamespace(
                size=int(vectors["size"]), distance=vectors["distance"]))))

    # -- points ---------------------------------------------------------------------------
    def upsert(self, name: str, points: list, wait: bool = True) -> None:
        q = _edge()
        self._update(name, q.UpdateOperation.upsert_points([q.Point(p.id, p.vector, p.payload) for p in points]))

    def delete(self, name: str, points_selector: Any, wait: bool = True) -> None:
        q = _edge()
        if hasattr(points_selector, "points"):
            op = q.UpdateOperation.delete_points(list(points_selector.points))
        else:
            op = q.UpdateOperation.delete_points_by_filter(_filter(points_selector.filter))
        self._update(name, op)

    def _update(self, name: str, op: Any) -> None:
        shard = self._shard(name)
        try:
            shard.update(op)
        finally:  # after the update: a flush that began before it does not count it as flushed
            self._clean.discard(name)

    def retrieve(self, name: str, ids: list, with_payload: bool = True,
                 with_vectors: bool = False) -> list:
        return self._shard(name).retrieve(list(ids), with_payload=with_payload,
                                          with_vector=with_vectors)

    def scroll(self, name: str, scroll_filter: Any = None, limit: int = 10, offset: Any = None,
               with_payload: Any = True, with_vectors: bool = False) -> tuple[list, Any]:
        return self._shard(name).scroll(_edge().ScrollRequest(
            offset=offset, limit=limit, filter=_filter(scroll_filter), with_payload=with_payload,
            with_vector=with_vectors))

    def count(self, name: str, count_filter: Any = None, exact: bool = True):
        return SimpleNamespace(count=self._shard(name).count(
            _edge().CountRequest(exact=exact, filter=_filter(count_filter))))

    def query_points(self, name: str, query: list, limit: int = 10, query_filter: Any = None,
                     with_payload: Any = True, with_vectors: bool = False):
        q = _edge()
        points = self._shard(name).query(q.QueryRequest(
            limit=limit, query=q.Query.Nearest(list(query)), filter=_filter(query_filter),
            with_payload=with_payload, with_vector=with_vectors))
        return SimpleNamespace(points=points)

    # -- durability -----------------------------------------------------------------------
    def flush(self, name: str) -> None:
        """Make the collection's updates durable; nothing to do where none came since its last flush."""
        shard = self._shards.get(name)
        if shard is None or name in self._clean:
            return
        self._clean.add(name)  # before the flush: an update meanwhile takes it out again
        try:
            shard.flush()
        except BaseException:
            self._clean.discard(name)
            raise

    def optimize(self, name: str) -> None:
        """Drop deleted points for good (Edge only marks them until its optimizer runs). One that
        found nothing to do changed nothing, so the next flush still has nothing to do: a publish
        optimizes then flushes every collection, and re-flushing the unchanged ones held the GIL."""
        if name in self._shards:
            changed = True
            try:
                changed = self._shards[name].optimize() is not False
            finally:
                if changed:
                    self._clean.discard(name)

    def close(self) -> None:
        """Close the shards this client owns (not the adopted ones another client still holds)."""
        shards, owned, self._shards, self._owned = self._shards, self._owned, {}, set()
        self._clean = set()
        for name in owned:
            shards[name].close()
