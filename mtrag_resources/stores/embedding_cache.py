"""One vector per (embedder fingerprint, content hash), in Parquet shards read with DuckDB.

Layout: `root/<fingerprint_id>/shard-<uuid>.parquet` with columns `content_hash` (string) and
`vector` (fixed-size list<float32>[dim]). Every shard is written to a hidden temporary file and
renamed into place, so partitions writing at the same time never see (or make) a torn shard; a
hash that ends up in two shards is harmless (same fingerprint, same text, same vector) and
`compact` folds duplicates away.
"""
from __future__ import annotations

import fcntl
import os
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
from mtrag_resources.core.arrow import pa, pq, read_parquet_file
from mtrag_resources.core.real_paths import resolved_name
from mtrag_resources.core.session import session_cache

SHARD_GLOB = "shard-*.parquet"
SMALL_SHARD_BYTES = 4 << 20  # a shard under this is merged with the other small ones ...
MAX_SMALL_SHARDS = 16        # ... once there are this many
_READ_RETRIES = 5


class EmbeddingCache:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    # -- layout -------------------------------------------------------------------------------
    def fingerprint_dir(self, fingerprint_id: str) -> Path:
        if not fingerprint_id or "/" in fingerprint_id or fingerprint_id.startswith("."):
            raise ValueError(f"not a fingerprint id: {fingerprint_id!r}")
        return self.root / fingerprint_id

    def shards(self, fingerprint_id: str) -> list[Path]:
        d = self.fingerprint_dir(fingerprint_id)
        if not d.is_dir():
            return []
        return sorted(d.glob(SHARD_GLOB))

    # -- reading ------------------------------------------------------------------------------
    def _query(self, fingerprint_id: str, sql: str, wanted: pa.Table | None = None):
        """Run `sql` over the current shards (bound as $files; `wanted` registered as a table).
        Retries when a concurrent `compact` removed a shard between listing and reading."""
        import duckdb

        last_error: Exception | None = None
        for attempt in range(_READ_RETRIES):
            files = [str(p) for p in self.shards(fingerprint_id)]
            if not files:
                return None
            con = duckdb.connect()
            try:
                if wanted is not None:
                    con.register("wanted", wanted)
                return con.sql(sql, params={"files": files}).to_arrow_table()
            except Exception as exc:  # duckdb.IOException and friends
                if all(Path(f).exists() for f in files):
                    raise
                last_error = exc
                time.sleep(0.02 * (attempt + 1))
            finally:
                con.close()
        raise RuntimeError(f"embedding cache {self.fingerprint_dir(fingerprint_id)} kept changing "
                           f"while being read") from last_error

    def lookup(self, fingerprint_id: str, hashes: Iterable[str]) -> dict[str, np.ndarray]:
        """The cached vectors (float32, 1-d) of those `hashes` that are cached. Those this process
        added lately come from memory; only the others are looked up in the shards."""
        recent = _recent(self.fingerprint_dir(fingerprint_id))
        found: dict[str, np.ndarray] = {}
        wanted_hashes = []
        with _RECENT_LOCK:
            for h in dict.fromkeys(hashes):
                vector = recent.get(h)
                if vector is None:
                    wanted_hashes.append(h)
                else:
                    found[h] = vector
        if not wanted_hashes:
            return found
        wanted = pa.table({"content_hash": pa.array(wanted_hashes, type=pa.string())})
        table = self._query(
            fingerprint_id,
            "SELECT s.content_hash, any_value(s.vector) AS vector "
            "FROM read_parquet($files) AS s JOIN wanted AS w USING (content_hash) "
            "GROUP BY s.content_hash",
            wanted,
        )
        if table is None or table.num_rows == 0:
            return found
        keys = table.column("content_hash").to_pylist()
        matrix = _vectors_to_matrix(table.column("vector"), len(keys))
        found.update((h, matrix[i]) for i, h in enumerate(keys))
        return found

    def missing(self, fingerprint_id: str, hashes: Iterable[str]) -> list[str]:
        """The hashes (in their given order, deduplicated) that have no cached vector."""
        wanted_hashes = list(dict.fromkeys(hashes))
        if not wanted_hashes:
            return []
        present = self._present(fingerprint_id)
        return [h for h in wanted_hashes if h not in present]

    def _present(self, fingerprint_id: str) -> set[str]:
        """Every cached hash of the fingerprint. A shard does not change once written (a unique
        name, renamed into place), so this process reads each shard's hash column once and later
        only the shards added since (a one-file change: one small shard), not the whole cache."""
        d = self.fingerprint_dir(fingerprint_id)
        for attempt in range(_READ_RETRIES):
            with _PRESENT_LOCK:
                known = _PRESENT.setdefault(resolved_name(d), _ShardHashes())
                try:
                    return known.refresh(self.shards(fingerprint_id))
                except FileNotFoundError:  # compacted between listing and reading: list again
                    time.sleep(0.02 * (attempt + 1))
        raise RuntimeError(f"embedding cache {d} kept changing while being read")

    def count(self, fingerprint_id: str) -> int:
        table = self._query(fingerprint_id,
                            "SELECT count(DISTINCT content_hash) AS n FROM read_parquet($files)")
        return 0 if table is None else int(table.column("n")[0].as_py())

    # -- writing ------------------------------------------------------------------------------
    def add(self, fingerprint_id: str, vectors: dict[str, np.ndarray]) -> Path | None:
        """Write `vectors` as one new shard (atomically); None when there is nothing to write."""
        if not vectors:
            return None
        keys = list(vectors)
        matrix = np.stack([np.asarray(vectors[k], dtype=np.float32).reshape(-1) for k in keys])
        shard = self._write_shard(self.fingerprint_dir(fingerprint_id), keys, matrix)
        if len(keys) <= RECENT_MAX:  # a full build's shards are looked up by the store stage anyway
            recent = _recent(self.fingerprint_dir(fingerprint_id))
            with _RECENT_LOCK:
                for i, k in enumerate(keys):
                    recent[k] = matrix[i]
                    recent.move_to_end(k)
                while len(recent) > RECENT_MAX:
                    recent.popitem(last=False)
        self.compact_small(fingerprint_id)
        return shard

    def _write_shard(self, d: Path, keys: list[str], matrix: np.ndarray) -> Path:
        d.mkdir(parents=True, exist_ok=True)
        dim = int(matrix.shape[1])
        table = pa.table({
            "content_hash": pa.array(keys, type=pa.string()),
            "vector": pa.FixedSizeListArray.from_arrays(
                pa.array(np.ascontiguousarray(matrix, dtype=np.float32).reshape(-1)), dim),
        })
        name = f"shard-{uuid.uuid4().hex}.parquet"
        final = d / name
        tmp = d / f".{name}.tmp"
        try:
            pq.write_table(table, tmp, compression="zstd")
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        finally:
            if tmp.exists():
                tmp.unlink()
        return final

    def compact(self, fingerprint_id: str) -> dict:
        """Merge every shard into one (duplicates dropped). The merged shard is in place before
        the old ones go, so readers always see every vector; shards added meanwhile are kept."""
        return self._merge(fingerprint_id, lambda shards: shards, wait=True)

    def compact_small(self, fingerprint_id: str, max_small: int = MAX_SMALL_SHARDS,
                      small_bytes: int = SMALL_SHARD_BYTES) -> dict | None:
        """Merge the small shards into one once there are `max_small` of them; None when there are
        fewer, or another process is merging. Every small change writes a shard of a few vectors
        (a watch batch, a one-file build), and every fresh process reads each shard's hashes and
        every lookup opens each file (see docs/performance.md#embedding). A merged shard under `small_bytes` is merged again with later
        ones, so a vector is rewritten a few times at most and the large shards never."""
        def small(shards: list[Path]) -> list[Path]:
            found = []
            for p in shards:
                try:
                    if p.stat().st_size < small_bytes:
                        found.append(p)
                except FileNotFoundError:
                    continue
            return found if len(found) >= max_small else []
        if len(small(self.shards(fingerprint_id))) < max_small:
            return None
        return self._merge(fingerprint_id, small, wait=False)

    def _merge(self, fingerprint_id: str, pick: Callable[[list[Path]], list[Path]], wait: bool) -> dict | None:
        """Merge the shards `pick` chooses (under the fingerprint's compaction lock) into one."""
        d = self.fingerprint_dir(fingerprint_id)
        if not d.is_dir():
            return {"shards_before": 0, "shards_after": 0, "vectors": 0}
        with open(d / ".compact.lock", "a+") as lock_fh:
            try:
                fcntl.flock(lock_fh, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                return None  # another process merges them
            try:
                old = pick(self.shards(fingerprint_id))
                if len(old) <= 1:
                    if not wait:  # compact_small: merged meanwhile by another process
                        return None
                    return {"shards_before": len(old), "shards_after": len(old),
                            "vectors": self.count(fingerprint_id)}
                import duckdb

                con = duckdb.connect()
                try:
                    table = con.sql(
                        "SELECT content_hash, any_value(vector) AS vector FROM read_parquet($files) "
                        "GROUP BY content_hash ORDER BY content_hash",
                        params={"files": [str(p) for p in old]},
                    ).to_arrow_table()
                finally:
                    con.close()
                keys = table.column("content_hash").to_pylist()
                matrix = _vectors_to_matrix(table.column("vector"), len(keys))
                self._write_shard(d, keys, matrix)
                for p in old:
                    try:
                        p.unlink()
                    except FileNotFoundError:
                        pass
                return {"shards_before": len(old), "shards_after": len(self.shards(fingerprint_id)),
                        "vectors": len(keys)}
            finally:
                fcntl.flock(lock_fh, fcntl.LOCK_UN)


class _ShardHashes:
    """The hash column of each shard this process read, and their union. A shard is known by its
    path and file identity (inode, mtime, size): one replaced under the same name is read again."""

    def __init__(self) -> None:
        self.by_shard: dict[tuple, frozenset[str]] = {}
        self.union: set[str] = set()

    def refresh(self, shards: list[Path]) -> set[str]:
        current = set()
        for p in shards:
            st = p.stat()
            current.add((str(p), st.st_ino, st.st_mtime_ns, st.st_size))
        if set(self.by_shard) - current:  # compacted (its hashes are in the new shard) or replaced
            self.by_shard = {k: v for k, v in self.by_shard.items() if k in current}
            self.union = set().union(*self.by_shard.values())
        for key in sorted(current - set(self.by_shard)):
            hashes = frozenset(read_parquet_file(key[0], ["content_hash"]).column(0).to_pylist())
            self.by_shard[key] = hashes
            self.union |= hashes
        return self.union


_PRESENT = session_cache("embedding_cache.shard_hashes", max_entries=64)  # per fingerprint folder
_PRESENT_LOCK = threading.Lock()

# The vectors this process added lately, per fingerprint folder (a hash's vector never changes):
# the Qdrant stage right after the embedding stage wants exactly those (a watch batch's new
# chunks), and a DuckDB scan of every shard for them costs a batch far more than a dict.
RECENT_MAX = 4096
_RECENT = session_cache("embedding_cache.recent_vectors", max_entries=64)  # per fingerprint folder
_RECENT_LOCK = threading.Lock()


def _recent(folder: Path) -> OrderedDict:
    with _RECENT_LOCK:
        return _RECENT.setdefault(os.path.abspath(folder), OrderedDict())


def _vectors_to_matrix(column: pa.ChunkedArray, n: int) -> np.ndarray:
    if n == 0:
        return np.zeros((0, 0), dtype=np.float32)
    arr = column.combine_chunks()
    flat = arr.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    return flat.reshape(n, -1)


def embed_missing(cache: EmbeddingCache, embedder, hash_to_text: dict[str, str],
                  progress: Callable[[int, int], None] | None = None,
                  flush_every: int = 2048) -> dict:
    """Embed only the texts whose hash has no vector under the embedder's fingerprint, and cache
    them. Checking needs no model: the fingerprint comes from the model's files. Vectors are
    flushed every `flush_every` texts so an interrupted run keeps what it already paid for."""
    t0 = time.perf_counter()
    fingerprint_id = embedder.fingerprint_id
    todo = cache.missing(fingerprint_id, list(hash_to_text))
    total = len(todo)
    done = 0
    embed_seconds = 0.0
    for start in range(0, total, max(1, flush_every)):
        part = todo[start:start + flush_every]
        t_embed = time.perf_counter()

        def part_progress(n: int, _total: int, _base: int = done) -> None:
            if progress is not None:
                progress(_base + n, total)

        vectors = embedder.encode([hash_to_text[h] for h in part], progress=part_progress)
        embed_seconds += time.perf_counter() - t_embed
        cache.add(fingerprint_id, dict(zip(part, vectors)))
        done += len(part)
    seconds = time.perf_counter() - t0
    return {
        "fingerprint_id": fingerprint_id,
        "requested": len(hash_to_text),
        "embedded": total,
        "cache_hits": len(hash_to_text) - total,
        "seconds": seconds,
        "texts_per_s": (total / embed_seconds) if total and embed_seconds > 0 else 0.0,
    }
