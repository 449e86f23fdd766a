"""Qdrant: the dense ("what is similar") store. The only module that imports qdrant_client.

One API whether Qdrant is embedded (`QdrantStore(path=...)`, the local default, with the engines
`local` and `edge`) or a server (`QdrantStore(url=...)`); callers never branch on the deployment.
A source's write is idempotent and bracketed by its marker, so an interrupted one reads as stale.
Collections, ids, markers and the engines' durability: docs/incremental.md#the-dense-store-qdrant.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import time
import uuid
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from mtrag_resources.core.faults import fault_point
from mtrag_resources.stores.contract import BEGIN, COMMITTED, Marker
from mtrag_resources.stores.qdrant_folder import (
    DEFAULT_ENGINE, ENGINES, FolderLock, PublishStats, QdrantStoreError, QdrantStoreLocked, checkpoint_wal,
    claim_engine, engine_from_env, ensure_free_disk, folder_engine, now_iso, publish_version, tune_wal,
)

COLLECTION_PREFIX = "mtrag_"
MARKERS_COLLECTION = "mtrag_markers"
# Payload indexes on the fields queries filter by: a source scope (a scoped query, a stale source
# left out, a source's deletion). Every index costs each write, each publish and each reader's open:
# Edge loads an index's maps and flags whole, and the keyword indexes on source_kind and file_path
# that no query filters by made up half of loading a collection (GIL held: a serving reader's
# switch; docs/performance.md#qdrant). Fields without one (file_path, chunk_id, ...) still
# filter, by scanning. Collections made with those indexes lose them on their next write or
# publish (RETIRED_FIELDS).
KEYWORD_FIELDS = ("source_id",)
RETIRED_FIELDS = ("source_kind", "file_path")
_MARKER_NAMESPACE = uuid.UUID("6f1c8a52-51d0-4b55-9a43-9b7c2a1e0d11")
_CHUNK_NAMESPACE = uuid.UUID("0b8e2f0e-3f0c-4f3a-8d7e-5b1f6c0a9e27")
_SCROLL_PAGE = 1024
# Embedded mode evaluates a scroll filter over the whole collection for every page, so it pages
# in one big step there.
_LOCAL_SCROLL_PAGE = 100_000
DIGEST_FIELD = "point_digest"  # in every point's payload: what write_source compares
NEW_COLLECTION_BYTES = 32 << 20


class CollectionDimMismatch(QdrantStoreError, ValueError):
    pass


def _qdrant():
    from qdrant_client import QdrantClient, models

    return QdrantClient, models


def collection_name(kind: str) -> str:
    if not kind or not kind.replace("_", "").isalnum() or kind != kind.lower():
        raise ValueError(f"not a source kind: {kind!r}")
    if f"{COLLECTION_PREFIX}{kind}" == MARKERS_COLLECTION:
        raise ValueError(f"{kind!r} names the markers collection, not a source kind")
    return f"{COLLECTION_PREFIX}{kind}"


def point_id(chunk_id: str) -> str:
    """The Qdrant point id of a chunk: its 32 hex chars read as a UUID; any other id goes through
    uuid5 so it is still stable."""
    try:
        if len(chunk_id) == 32:
            return str(uuid.UUID(hex=chunk_id))
    except ValueError:
        pass
    return str(uuid.uuid5(_CHUNK_NAMESPACE, chunk_id))


def marker_point_id(source_id: str) -> str:
    return str(uuid.uuid5(_MARKER_NAMESPACE, source_id))


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, Path):
        return value.as_posix()
    raise TypeError(f"payload value of type {type(value).__name__} is not JSON")



def _public(payload: dict | None) -> dict:
    """A stored payload as callers gave it (without the store's own digest)."""
    out = dict(payload or {})
    out.pop(DIGEST_FIELD, None)
    return out


def _unit(vector: Any) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float32).reshape(-1)
    n = float(np.linalg.norm(v))
    return v / n if n > 0 else v


class QdrantStore:
    def __init__(self, path: Path | str | None = None, url: str | None = None,
                 api_key: str | None = None, lock_timeout: float = 300,
                 fast_local_writes: bool = True, engine: str | None = None,
                 adopted: dict | None = None) -> None:
        """`adopted`: open Edge shards this (read-only) store serves too instead of loading
        (qdrant_edge_client.EdgeClient); an embedded Edge folder only."""
        if (path is None) == (url is None):
            raise ValueError("QdrantStore needs exactly one of path (embedded) or url (server)")
        self.path = Path(path).resolve() if path is not None else None
        self.url = url
        if url is not None:
            self.engine = "server"
        else:
            self.engine = engine or engine_from_env() or folder_engine(Path(path)) or DEFAULT_ENGINE
        if self.path is not None and self.engine not in ENGINES:
            raise ValueError(f"engine={self.engine!r}: expected one of {', '.join(ENGINES)}")
        self._lock: FolderLock | None = None
        self._dims: dict[str, int] = {}
        self._fast_local_writes = fast_local_writes
        self._tuned: set[str] = set()
        self._indexes_checked: set[str] = set()
        if self.engine == "edge":
            from mtrag_resources.stores.qdrant_edge_client import models
            self._models = models
        else:
            QdrantClient, self._models = _qdrant()
        if self.path is not None:
            self._lock = FolderLock(self.path, lock_timeout)
            self._lock.acquire()
            try:
                self.path.mkdir(parents=True, exist_ok=True)
                claim_engine(self.path, self.engine)
                if self.engine == "edge":
                    from mtrag_resources.stores.qdrant_edge_client import EdgeClient
                    self.client = EdgeClient(self.path, adopted)
                else:
                    self.client = QdrantClient(path=str(self.path))
            except Exception as exc:
                self._lock.release()
                # local mode's and Edge's (a WAL flock) own one-process-per-folder errors
                if "already accessed" in str(exc) or "WouldBlock" in str(exc):
                    raise QdrantStoreLocked(
                        f"the embedded Qdrant folder {self.path} is open in a process that does "
                        f"not take {self._lock.path}: {exc}") from exc
                raise
            except BaseException:
                self._lock.release()
                raise
        else:
            self.client = QdrantClient(url=url, api_key=api_key)
        self._closed = False
        for name in list(self._local_collections()):
            self._tune_local(name)

    # -- lifetime -----------------------------------------------------------------------------
    @property
    def location(self) -> str:
        return str(self.path) if self.path is not None else str(self.url)

    @property
    def embedded(self) -> bool:
        return self.path is not None

    def close(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        try:
            self.client.close()
        finally:
            if self._lock is not None:
                self._lock.release()

    def __enter__(self) -> "QdrantStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # -- embedded-mode SQLite tuning ----------------------------------------------------------
    def _local_collections(self) -> dict:
        """qdrant-client's embedded collections by name ({} for a server)."""
        if self.path is None:
            return {}
        local = getattr(self.client, "_client", None)
        collections = getattr(local, "collections", None)
        return collections if isinstance(collections, dict) else {}

    def _local_sqlite(self, name: str) -> sqlite3.Connection | None:
        persistence = getattr(self._local_collections().get(name), "storage", None)
        conn = getattr(persistence, "storage", None)
        return conn if isinstance(conn, sqlite3.Connection) else None

    def _tune_local(self, name: str) -> None:
        if not self._fast_local_writes or name in self._tuned:
            return
        conn = self._local_sqlite(name)
        if conn is None:
            return
        tune_wal(conn)
        self._tuned.add(name)

    def _sync_local(self, name: str) -> None:
        """Make the collection's committed points durable (and fold the WAL into the file)."""
        if self.engine == "edge":
            self.client.flush(name)
            return
        conn = self._local_sqlite(name)
        if conn is not None and name in self._tuned:
            checkpoint_wal(conn)

    def checkpoint(self) -> None:
        if self.engine == "edge":
            names = [c.name for c in self.client.get_collections().collections]
        else:
            names = list(self._local_collections())
        for name in names:
            self._sync_local(name)

    # -- collections --------------------------------------------------------------------------
    def _exists(self, name: str) -> bool:
        return bool(self.client.collection_exists(name))

    def collection_dim(self, kind: str) -> int | None:
        name = collection_name(kind)
        if name in self._dims:
            return self._dims[name]
        if not self._exists(name):
            return None
        dim = int(self._vector_params(name).size)
        self._dims[name] = dim
        return dim

    def _vector_params(self, name: str):
        vectors = self.client.get_collection(name).config.params.vectors
        if isinstance(vectors, dict):  # named vectors: we only ever create the default one
            vectors = next(iter(vectors.values()))
        return vectors

    def ensure_collection(self, kind: str, dim: int) -> str:
        name = collection_name(kind)
        existing = self.collection_dim(kind)
        if existing is not None:
            if existing != int(dim):
                raise CollectionDimMismatch(
                    f"collection {name} in {self.location} holds {existing}-d vectors but "
                    f"{int(dim)}-d vectors were given: the embedder changed. Drop the collection "
                    "(drop_collection) and rebuild, or configure the model it was built with.")
            self._retire_indexes(name)
            return name
        m = self._models
        if self.path is not None:  # a new Edge shard and its payload indexes (NEW_COLLECTION_BYTES)
            ensure_free_disk(self.path, NEW_COLLECTION_BYTES, f"creating collection {name}")
        self.client.create_collection(
            name, vectors_config=m.VectorParams(size=int(dim), distance=m.Distance.COSINE))
        with warnings.catch_warnings():  # local mode: "payload indexes have no effect"
            warnings.simplefilter("ignore")
            for field in KEYWORD_FIELDS:
                self.client.create_payload_index(name, field, m.PayloadSchemaType.KEYWORD)
        self._dims[name] = int(dim)
        self._tune_local(name)
        return name

    def _retire_indexes(self, name: str) -> None:
        """Drop the payload indexes of RETIRED_FIELDS from a collection made before they went (once
        per collection and store): the writer's next publish then shares nothing of them with readers."""
        if name in self._indexes_checked:
            return
        self._indexes_checked.add(name)
        schema = getattr(self.client.get_collection(name), "payload_schema", None) or {}
        for field in RETIRED_FIELDS:
            if field in schema:
                self.client.delete_payload_index(name, field)

    def drop_collection(self, kind: str) -> None:
        name = collection_name(kind)
        if self._exists(name):
            self.client.delete_collection(name)
        self._dims.pop(name, None)
        self._tuned.discard(name)

    def collection_info(self, kind: str) -> dict | None:
        name = collection_name(kind)
        if not self._exists(name):
            return None
        info = self.client.get_collection(name)
        vectors = self._vector_params(name)
        distance = vectors.distance
        return {"name": name, "dim": int(vectors.size),
                "distance": getattr(distance, "value", str(distance)),
                "points": int(info.points_count or 0)}

    def existing_kinds(self) -> list[str]:
        names = [c.name for c in self.client.get_collections().collections]
        return sorted(n[len(COLLECTION_PREFIX):] for n in names
                      if n.startswith(COLLECTION_PREFIX) and n != MARKERS_COLLECTION)

    # -- markers ------------------------------------------------------------------------------
    def _ensure_markers(self) -> None:
        if MARKERS_COLLECTION in self._dims:
            return
        if not self._exists(MARKERS_COLLECTION):
            m = self._models
            self.client.create_collection(
                MARKERS_COLLECTION, vectors_config=m.VectorParams(size=1, distance=m.Distance.DOT))
        self._dims[MARKERS_COLLECTION] = 1
        self._tune_local(MARKERS_COLLECTION)

    def _set_marker(self, source_id: str, generation: str, state: str) -> None:
        self._ensure_markers()
        m = self._models
        self.client.upsert(MARKERS_COLLECTION, wait=True, points=[m.PointStruct(
            id=marker_point_id(source_id), vector=[1.0],
            payload={"source_id": source_id, "generation": generation, "state": state,
                     "updated_at": now_iso()})])

    def begin(self, source_id: str, generation: str) -> None:
        self._set_marker(source_id, generation, BEGIN)

    def commit(self, source_id: str, generation: str) -> None:
        self._set_marker(source_id, generation, COMMITTED)

    def marker_record(self, source_id: str) -> dict | None:
        """The marker's payload, updated_at included."""
        if not self._exists(MARKERS_COLLECTION):
            return None
        found = self.client.retrieve(MARKERS_COLLECTION, [marker_point_id(source_id)],
                                     with_payload=True, with_vectors=False)
        return dict(found[0].payload or {}) if found else None

    def marker(self, source_id: str) -> Marker | None:
        rec = self.marker_record(source_id)
        return None if rec is None else Marker(rec["source_id"], rec["generation"], rec["state"])

    def markers(self) -> dict[str, Marker]:
        if not self._exists(MARKERS_COLLECTION):
            return {}
        out: dict[str, Marker] = {}
        for rec in self._scroll(MARKERS_COLLECTION, None, with_payload=True):
            p = rec.payload or {}
            out[p["source_id"]] = Marker(p["source_id"], p["generation"], p["state"])
        return out

    # -- writing ------------------------------------------------------------------------------
    def _source_filter(self, source_id: str):
        m = self._models
        return m.Filter(must=[m.FieldCondition(key="source_id",
                                               match=m.MatchValue(value=source_id))])

    def _scroll(self, name: str, flt, with_payload: Any = False, with_vectors: bool = False,
                page: int | None = None) -> Iterator[Any]:
        offset = None
        page = page or (_LOCAL_SCROLL_PAGE if self.embedded else _SCROLL_PAGE)
        while True:
            records, offset = self.client.scroll(name, scroll_filter=flt, limit=page,
                                                 offset=offset, with_payload=with_payload,
                                                 with_vectors=with_vectors)
            yield from records
            if offset is None:
                return

    def vectors(self, kind: str) -> Iterator[tuple[str, np.ndarray]]:
        """Every point of the collection of `kind` as (chunk id, vector): what `mtrag
        compare-stores` loads into a second store."""
        if self.collection_dim(kind) is None:
            return
        # pages of a server's size: a page of vectors is lists of floats in memory, whatever the mode
        for r in self._scroll(collection_name(kind), None, with_payload=["chunk_id"], with_vectors=True,
                              page=_SCROLL_PAGE):
            yield (r.payload or {}).get("chunk_id") or str(r.id), np.asarray(r.vector, dtype=np.float32)

    def _stored_digests(self, name: str, source_id: str) -> dict[str, str | None]:
        """{point id: its `point_digest`} of the source's points (one payload field, no vectors)."""
        return {str(r.id): (r.payload or {}).get(DIGEST_FIELD)
                for r in self._scroll(name, self._source_filter(source_id), with_payload=[DIGEST_FIELD])}

    def _upsert(self, name: str, points: list) -> None:
        self.client.upsert(name, points=points, wait=True)

    def write_source(self, source_id: str, kind: str, generation: str, points: list[dict],
                     batch_size: int = 256, skip_unchanged: bool = True,
                     extra: dict[str, list[dict]] | None = None,
                     resolve_vectors: Callable[[list[str]], dict] | None = None) -> dict:
        """Make the source's points in `kind`'s collection exactly `points` (and, for each
        collection kind in `extra`, exactly its points there: the multilingual vectors), all under
        one bracket of the source's marker, so a write that dies in any collection leaves the
        marker at `begin`. Each point is {chunk_id, vector | vector_key, payload}; source_id,
        source_kind (the source's kind) and chunk_id are set in the payload here. A point given by
        `vector_key` (what identifies its vector, e.g. embedder fingerprint and text hash) gets its
        vector from `resolve_vectors(keys)` only when it is written.

        Each point's payload carries `point_digest` (of its payload and its vector or vector key):
        a point whose stored digest is the new one is not rewritten, so a one-file change reads one
        payload field per point of the source and writes only the changed points. A collection of
        another kind that still holds the source's points (its kind changed) is emptied of them."""
        t0 = time.perf_counter()
        wanted = {kind: points, **(extra or {})}
        prepared = {k: self._prepare(source_id, kind, pts) for k, pts in wanted.items()}

        self._ensure_room(MARKERS_COLLECTION, [])
        self.begin(source_id, generation)
        fault_point("qdrant:after_begin")
        stats = {}
        for k, rows in prepared.items():
            stats[k] = self._write_collection(k, source_id, rows, batch_size, skip_unchanged, resolve_vectors)
            fault_point(f"qdrant:after_collection:{k}")
        deleted = sum(st["deleted"] for st in stats.values())
        m = self._models
        for other in self.existing_kinds():
            if other in wanted:
                continue
            other_name = collection_name(other)
            flt = self._source_filter(source_id)
            n = self.client.count(other_name, count_filter=flt, exact=True).count
            if n:
                self.client.delete(other_name, points_selector=m.FilterSelector(filter=flt),
                                   wait=True)
                deleted += n
                self._sync_local(other_name)
        for k, st in stats.items():
            if st["has_collection"]:
                self._sync_local(collection_name(k))  # points durable before the marker says committed

        self.commit(source_id, generation)
        seconds = time.perf_counter() - t0
        main = stats[kind]
        n_points = sum(len(rows) for rows in prepared.values())
        return {"collection": collection_name(kind), "upserted": main["upserted"], "skipped": main["skipped"],
                "deleted": deleted, "points": main["points"], "seconds": seconds,
                "points_per_s": (n_points / seconds) if seconds > 0 else 0.0,
                **{f"{k}_points": st["points"] for k, st in stats.items() if k != kind},
                **{f"{k}_upserted": st["upserted"] for k, st in stats.items() if k != kind}}

    def write_source_delta(self, source_id: str, kind: str, generation: str, base_generation: str,
                           changes: dict[str, tuple[list[dict], list[str]]], batch_size: int = 256,
                           resolve_vectors: Callable[[list[str]], dict] | None = None) -> dict | None:
        """Apply one source's change since `base_generation`: for each collection kind in
        `changes`, (points to upsert as write_source takes them, chunk ids whose points go), under
        one begin/committed bracket of the source's marker. Only when the marker says the source
        committed `base_generation` (else None, nothing written: the caller does write_source);
        nothing else of the source is read."""
        marker = self.marker(source_id)
        if marker is None or marker.state != COMMITTED or marker.generation != base_generation:
            return None
        t0 = time.perf_counter()
        prepared = {k: self._prepare(source_id, kind, pts) for k, (pts, _gone) in changes.items()}
        self._ensure_room(MARKERS_COLLECTION, [])
        self.begin(source_id, generation)
        fault_point("qdrant:after_begin")
        stats: dict[str, dict] = {}
        for k, rows in prepared.items():
            name = collection_name(k)
            upserted = self._upsert_prepared(k, source_id, rows, batch_size, resolve_vectors)
            gone = sorted({point_id(c) for c in changes[k][1]} - {r[0] for r in rows})
            deleted = 0
            if self.collection_dim(k) is not None:
                deleted = self._delete_points(name, gone, batch_size)
                self._sync_local(name)  # points durable before the marker says committed
            stats[k] = {"upserted": upserted, "deleted": deleted}
            fault_point(f"qdrant:after_collection:{k}")
        self.commit(source_id, generation)
        main = stats.get(kind, {"upserted": 0, "deleted": 0})
        return {"collection": collection_name(kind), "upserted": main["upserted"],
                "deleted": sum(st["deleted"] for st in stats.values()), "delta_from": base_generation,
                "seconds": time.perf_counter() - t0,
                **{f"{k}_upserted": st["upserted"] for k, st in stats.items() if k != kind}}

    def _ensure_room(self, name: str, points: list) -> None:
        """An embedded write refuses before it starts when the disk cannot take it (Edge would
        die of SIGBUS writing a mapped page): each point is written about three times (WAL,
        segment, payload storage)."""
        if self.path is None:
            return
        needed = sum(3 * (r[1].nbytes + len(json.dumps(r[2]))) for r in points)
        ensure_free_disk(self.path, needed, f"writing {len(points)} points to {name}")

    @staticmethod
    def _prepare(source_id: str, source_kind: str, points: list[dict]) -> list[list]:
        """[point id, unit vector or None (not resolved yet), payload with its digest, vector key]."""
        prepared: list[list] = []
        seen: set[str] = set()
        for p in points:
            chunk_id = p["chunk_id"]
            pid = point_id(chunk_id)
            if pid in seen:
                raise ValueError(f"chunk id {chunk_id!r} given twice for source {source_id!r}")
            seen.add(pid)
            payload = dict(p.get("payload") or {})
            payload.update(source_id=source_id, source_kind=source_kind, chunk_id=chunk_id)
            payload.pop(DIGEST_FIELD, None)
            text = json.dumps(payload, default=_json_default, sort_keys=True)
            payload = json.loads(text)  # JSON-native, so what we compare equals what Qdrant gives back
            key = p.get("vector_key")
            vec = None if key is not None else _unit(p["vector"])
            h = hashlib.sha256(text.encode())
            h.update(b"\0" + (str(key).encode() if key is not None else vec.tobytes()))
            payload[DIGEST_FIELD] = h.hexdigest()[:32]
            prepared.append([pid, vec, payload, key])
        return prepared

    @staticmethod
    def _vectors(source_id: str, rows: list[list], resolve: Callable[[list[str]], dict] | None) -> None:
        """Fill in the vectors of `rows` given by key (only rows about to be written)."""
        keys = sorted({r[3] for r in rows if r[1] is None})
        if keys:
            if resolve is None:
                raise ValueError(f"points of source {source_id!r} name vector keys but no resolve_vectors was given")
            found = resolve(keys)
            missing = [k for k in keys if k not in found]
            if missing:
                raise ValueError(f"source {source_id!r}: no vector for {len(missing)} keys, e.g. {missing[0]!r}")
            for r in rows:
                if r[1] is None:
                    r[1] = _unit(found[r[3]])
        dims = {r[1].shape[0] for r in rows}
        if len(dims) > 1:
            raise ValueError(f"points of source {source_id!r} have mixed dims {sorted(dims)}")

    def _write_collection(self, kind: str, source_id: str, prepared: list[list], batch_size: int,
                          skip_unchanged: bool, resolve: Callable[[list[str]], dict] | None) -> dict:
        """Upsert what changed, delete the source's points that are no longer wanted."""
        name = collection_name(kind)
        existing = self._stored_digests(name, source_id) if self.collection_dim(kind) is not None else {}
        to_write = [r for r in prepared if not skip_unchanged or existing.get(r[0]) != r[2][DIGEST_FIELD]]
        upserted = self._upsert_prepared(kind, source_id, to_write, batch_size, resolve)
        has_collection = self.collection_dim(kind) is not None
        deleted = total = 0
        if has_collection:
            keep = {r[0] for r in prepared}
            total = len(keep)
            deleted = self._delete_points(name, sorted(set(existing) - keep), batch_size)
        return {"upserted": upserted, "skipped": len(prepared) - len(to_write), "deleted": deleted, "points": total,
                "has_collection": has_collection}

    def _upsert_prepared(self, kind: str, source_id: str, rows: list[list], batch_size: int,
                         resolve: Callable[[list[str]], dict] | None) -> int:
        """Resolve the rows' vectors, create the collection on the first point, check the disk,
        upsert in batches; returns the number of points written."""
        m = self._models
        name = collection_name(kind)
        self._vectors(source_id, rows, resolve)
        if rows:
            self.ensure_collection(kind, rows[0][1].shape[0])
        self._ensure_room(name, rows)
        for start in range(0, len(rows), batch_size):
            self._upsert(name, [m.PointStruct(id=pid, vector=vec.tolist(), payload=payload)
                                for pid, vec, payload, _ in rows[start:start + batch_size]])
        return len(rows)

    def _delete_points(self, name: str, ids: list[str], batch_size: int) -> int:
        m = self._models
        for start in range(0, len(ids), batch_size):
            self.client.delete(name, points_selector=m.PointIdsList(points=ids[start:start + batch_size]), wait=True)
        return len(ids)

    def delete_source(self, source_id: str) -> int:
        """Remove the source's points from every collection and its marker."""
        m = self._models
        deleted = 0
        flt = self._source_filter(source_id)
        for kind in self.existing_kinds():
            name = collection_name(kind)
            n = self.client.count(name, count_filter=flt, exact=True).count
            if n:
                self.client.delete(name, points_selector=m.FilterSelector(filter=flt), wait=True)
                deleted += n
                self._sync_local(name)
        if self._exists(MARKERS_COLLECTION):
            self.client.delete(MARKERS_COLLECTION, wait=True, points_selector=m.PointIdsList(
                points=[marker_point_id(source_id)]))
        return deleted

    # -- reading ------------------------------------------------------------------------------
    def _filter(self, source_ids: Iterable[str] | None, filters: dict | None):
        m = self._models
        must = []
        if source_ids is not None:
            must.append(m.FieldCondition(key="source_id",
                                         match=m.MatchAny(any=[str(s) for s in source_ids])))
        for key, value in (filters or {}).items():
            if isinstance(value, (list, tuple, set, frozenset)):
                match = m.MatchAny(any=list(value))
            else:
                match = m.MatchValue(value=value)
            must.append(m.FieldCondition(key=key, match=match))
        return m.Filter(must=must) if must else None

    def search(self, kind: str, vector: Any, k: int = 20, source_ids: Iterable[str] | None = None,
               filters: dict | None = None, payload_fields: list[str] | None = None) -> list[dict]:
        """Nearest chunks by cosine: [{chunk_id, score, payload}], best first. `payload_fields`
        limits the payload returned (local mode deep-copies each payload, a large share of a query)."""
        name = collection_name(kind)
        if self.collection_dim(kind) is None:
            return []
        if source_ids is not None:
            source_ids = list(source_ids)
            if not source_ids:
                return []
        vec = np.asarray(vector, dtype=np.float32).reshape(-1)
        if vec.shape[0] != self.collection_dim(kind):
            raise CollectionDimMismatch(
                f"query vector has {vec.shape[0]} dims; collection {name} holds "
                f"{self.collection_dim(kind)}-d vectors")
        result = self.client.query_points(name, query=vec.tolist(), limit=int(k),
                                          query_filter=self._filter(source_ids, filters),
                                          with_payload=["chunk_id", *payload_fields] if payload_fields is not None else True,
                                          with_vectors=False)
        return [{"chunk_id": (p.payload or {}).get("chunk_id"), "score": float(p.score),
                 "payload": _public(p.payload)} for p in result.points]

    def payloads_for(self, kind: str, chunk_ids: Iterable[str]) -> dict[str, dict]:
        """Full payloads by chunk id; ids not in the collection are left out."""
        ids = list(dict.fromkeys(chunk_ids))
        if not ids or self.collection_dim(kind) is None:
            return {}
        recs = self.client.retrieve(collection_name(kind), [point_id(c) for c in ids], with_payload=True,
                                    with_vectors=False)
        return {r.payload["chunk_id"]: _public(r.payload) for r in recs if r.payload and "chunk_id" in r.payload}

    def vectors_for(self, kind: str, chunk_ids: Iterable[str]) -> dict[str, np.ndarray]:
        """Stored (unit) vectors by chunk id; ids not in the collection are left out."""
        name = collection_name(kind)
        ids = list(dict.fromkeys(chunk_ids))
        if not ids or self.collection_dim(kind) is None:
            return {}
        by_pid = {point_id(c): c for c in ids}
        out: dict[str, np.ndarray] = {}
        for start in range(0, len(ids), _SCROLL_PAGE):
            batch = list(by_pid)[start:start + _SCROLL_PAGE]
            for rec in self.client.retrieve(name, batch, with_payload=False, with_vectors=True):
                vec = rec.vector
                if isinstance(vec, dict):
                    vec = next(iter(vec.values()), None)
                if vec is not None:
                    out[by_pid[str(rec.id)]] = np.asarray(vec, dtype=np.float32)
        return out

    def count(self, kind: str, source_id: str | None = None) -> int:
        name = collection_name(kind)
        if self.collection_dim(kind) is None:
            return 0
        flt = self._source_filter(source_id) if source_id is not None else None
        return int(self.client.count(name, count_filter=flt, exact=True).count)

    # -- publishing ---------------------------------------------------------------------------
    def publish_snapshot(self, dst: Path | str, keep: int = 2, protect: Iterable[Path | str] = (),
                         prune: bool = True) -> PublishStats:
        """Publish this embedded store (whose lock we hold) as a new version behind the `dst` link
        for readers, sharing unchanged files with the previous version; versions named in
        `protect` (the one the published manifest names) are never pruned. prune=False: the
        caller prunes (qdrant_folder.prune_versions)."""
        if self.path is None:
            raise QdrantStoreError("publish_snapshot needs an embedded store; a server serves "
                                   "readers directly")
        if self.engine == "edge":
            # Edge keeps deleted points until its optimizer vacuums them (a no-op while under 20%
            # of a segment); vacuum here, once per build, rather than after every write
            for c in self.client.get_collections().collections:
                if c.name != MARKERS_COLLECTION:  # a delete-only build retires them here
                    self._retire_indexes(c.name)
                self.client.optimize(c.name)
        self.checkpoint()  # Edge: flushed segments, so the copy needs no WAL replay to be whole
        return publish_version(self.path, dst, lock=False, keep=keep, protect=protect, prune=prune)


