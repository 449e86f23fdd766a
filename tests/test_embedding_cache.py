"""Embedding cache: Parquet shards under root/<fingerprint_id>/, read with DuckDB."""
from __future__ import annotations

import hashlib
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest

from mtrag_resources.embedding.embedder import Embedder, EmbedderConfig
from mtrag_resources.stores import embedding_cache
from mtrag_resources.stores.embedding_cache import EmbeddingCache, embed_missing

DIM = 8
FP = "0123456789abcdef"


def fake_vector(text: str, dim: int = DIM) -> np.ndarray:
    seed = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


class CountingEmbedder:
    """Stands in for Embedder: same surface (fingerprint_id, encode), counts what it embeds."""

    fingerprint_id = FP

    def __init__(self) -> None:
        self.encoded: list[str] = []

    def encode(self, texts, progress=None):
        self.encoded.extend(texts)
        if progress:
            progress(len(texts), len(texts))
        return np.stack([fake_vector(t) for t in texts]) if texts else np.zeros((0, DIM), np.float32)


def h(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def corpus(n: int) -> dict[str, str]:
    texts = [f"chunk number {i}: def f{i}(): return {i}" for i in range(n)]
    return {h(t): t for t in texts}


@pytest.mark.unit
def test_second_call_embeds_nothing_and_a_change_embeds_one(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path)
    emb = CountingEmbedder()
    docs = corpus(50)
    first = embed_missing(cache, emb, docs)
    assert (first["embedded"], first["cache_hits"]) == (50, 0)
    second = embed_missing(cache, emb, docs)
    assert (second["embedded"], second["cache_hits"]) == (0, 50)
    assert len(emb.encoded) == 50

    changed = dict(docs)
    old_hash = next(iter(changed))
    del changed[old_hash]
    changed[h("a brand new text")] = "a brand new text"
    third = embed_missing(cache, emb, changed)
    assert (third["embedded"], third["cache_hits"]) == (1, 49)
    assert emb.encoded[-1] == "a brand new text"
    assert cache.count(FP) == 51

    got = cache.lookup(FP, list(changed))
    assert set(got) == set(changed)
    for k, text in changed.items():
        np.testing.assert_allclose(got[k], fake_vector(text))
        assert got[k].dtype == np.float32


@pytest.mark.unit
def test_missing_lookup_count_on_empty_cache(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path)
    assert cache.lookup(FP, ["a"]) == {}
    assert cache.missing(FP, ["a", "b", "a"]) == ["a", "b"]
    assert cache.count(FP) == 0
    assert cache.add(FP, {}) is None


@pytest.mark.unit
def test_lookup_with_weird_strings_is_safe(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path)
    weird = ["it's", 'say "hi"', "'); DROP TABLE x; --", "back\\slash", "ünïcödé 内存", "%_*", ""]
    cache.add(FP, {w: fake_vector(w) for w in weird})
    embedding_cache._RECENT.clear()  # looked up in the shards, not in this process's recent vectors
    got = cache.lookup(FP, weird + ["' OR 1=1 --"])
    assert set(got) == set(weird)
    assert cache.missing(FP, ["' OR '1'='1", "it's"]) == ["' OR '1'='1"]
    for w in weird:
        np.testing.assert_allclose(got[w], fake_vector(w))


@pytest.mark.unit
def test_shards_are_separate_and_compact_dedupes(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path)
    cache.add(FP, {"a": fake_vector("a"), "b": fake_vector("b")})
    cache.add(FP, {"b": fake_vector("b"), "c": fake_vector("c")})
    assert len(cache.shards(FP)) == 2
    assert cache.count(FP) == 3
    stats = cache.compact(FP)
    assert stats == {"shards_before": 2, "shards_after": 1, "vectors": 3}
    assert set(cache.lookup(FP, ["a", "b", "c"])) == {"a", "b", "c"}
    # no temporary files left behind
    assert [p.name for p in (tmp_path / FP).iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.unit
def test_small_shards_are_merged_once_there_are_enough_and_large_ones_are_left(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path)
    big = {f"big{i}": fake_vector(f"big{i}") for i in range(50)}
    cache.add(FP, big)
    big_shard = cache.shards(FP)[0]
    limit = big_shard.stat().st_size  # shards smaller than the first one count as small
    for i in range(4):
        cache.add(FP, {f"k{i}": fake_vector(f"k{i}")})
        assert cache.compact_small(FP, max_small=5, small_bytes=limit) is None  # 1..4 small shards: kept
    assert len(cache.shards(FP)) == 5
    cache.add(FP, {"k4": fake_vector("k4"), "k0": fake_vector("k0")})  # a duplicate hash, as a rebuild may write
    stats = cache.compact_small(FP, max_small=5, small_bytes=limit)
    assert stats == {"shards_before": 5, "shards_after": 2, "vectors": 5}
    assert big_shard in cache.shards(FP)  # the large shard is not rewritten
    got = cache.lookup(FP, [*big, *(f"k{i}" for i in range(5))])
    assert len(got) == 55 and cache.count(FP) == 55 and cache.missing(FP, ["k3", "nope"]) == ["nope"]
    np.testing.assert_allclose(got["k3"], fake_vector("k3"))


@pytest.mark.unit
def test_fingerprints_do_not_mix(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path)
    cache.add(FP, {"a": fake_vector("a")})
    assert cache.lookup("fedcba9876543210", ["a"]) == {}
    with pytest.raises(ValueError):
        cache.fingerprint_dir("../escape")


def _writer(root: str, worker: int, n_shards: int, per_shard: int) -> None:
    cache = EmbeddingCache(Path(root))
    for s in range(n_shards):
        keys = [f"w{worker}-s{s}-{i}" for i in range(per_shard)]
        cache.add(FP, {k: fake_vector(k) for k in keys})


@pytest.mark.unit
def test_two_processes_adding_shards_concurrently(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 10, 100)) for w in range(2)]
    for p in procs:
        p.start()
    # read while they write: every read must succeed (never a torn shard)
    cache = EmbeddingCache(tmp_path)
    while any(p.is_alive() for p in procs):
        cache.count(FP)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    keys = [f"w{w}-s{s}-{i}" for w in range(2) for s in range(10) for i in range(100)]
    got = cache.lookup(FP, keys)
    assert len(got) == 2000
    assert len(cache.shards(FP)) < 20  # the small shards were merged as they came, reads and all
    np.testing.assert_allclose(got["w1-s9-99"], fake_vector("w1-s9-99"))


@pytest.mark.integration  # the real embedding model
def test_real_embedder_no_change_run_does_not_load_the_model(tmp_path: Path) -> None:
    cache = EmbeddingCache(tmp_path)
    texts = {h(t): t for t in ["def add(a, b): return a + b", "Click creates CLIs.", "x"]}
    first = Embedder(EmbedderConfig())
    stats = embed_missing(cache, first, texts)
    assert stats["embedded"] == 3 and stats["cache_hits"] == 0
    stored = cache.lookup(first.fingerprint_id, list(texts))
    expected = first.encode(list(texts.values()))
    assert sorted(stored) == sorted(texts)  # one vector per text, under its content hash: the model's vector
    np.testing.assert_allclose(np.stack([stored[k] for k in texts]), expected, atol=1e-5)
    second = Embedder(EmbedderConfig())
    stats = embed_missing(cache, second, texts)
    assert stats["embedded"] == 0 and stats["cache_hits"] == 3
    assert not second.loaded
    vecs = cache.lookup(second.fingerprint_id, list(texts))
    assert sorted(vecs) == sorted(texts) and all(v.shape == (384,) for v in vecs.values())


@pytest.mark.unit
def test_vectors_this_process_added_are_looked_up_without_reading_the_shards(tmp_path: Path, monkeypatch) -> None:
    cache = EmbeddingCache(tmp_path)
    old = corpus(5)
    cache.add(FP, {k: fake_vector(t) for k, t in old.items()})
    embedding_cache._RECENT.clear()  # as if another process had added them
    new = {h("fresh"): "fresh"}
    cache.add(FP, {h("fresh"): fake_vector("fresh")})
    queries = []
    real = EmbeddingCache._query
    monkeypatch.setattr(EmbeddingCache, "_query", lambda self, *a, **k: queries.append(a) or real(self, *a, **k))
    got = cache.lookup(FP, list(new))
    assert not queries and list(got) == list(new)
    np.testing.assert_allclose(got[h("fresh")], fake_vector("fresh"))
    both = cache.lookup(FP, [*old, *new, "unknown"])  # the others from the shards, in one query
    assert len(queries) == 1 and set(both) == set(old) | set(new)
    for k, t in old.items():
        np.testing.assert_allclose(both[k], fake_vector(t))
    assert cache.lookup("fedcba9876543210", list(new)) == {}  # another fingerprint's folder
