"""An unfiltered lexical search ranks its matches in the FTS table alone and joins only the best
ones to their chunk rows (FtsStore._top_matches); it must answer exactly as the search that joins
every match (_matches): the same hits, scores and order, ties at the k-th score broken by chunk id."""
from __future__ import annotations

import random

import pytest

from mtrag_resources.stores.fts_store import FtsStore
from tests.test_fts_store import row

pytestmark = pytest.mark.unit

WORDS = ["client", "return", "response", "test", "handler", "error", "register", "template", "render", "cache"]


def _rows(seed: int) -> list[dict]:
    rnd = random.Random(seed)
    names = [f"{rnd.choice('abcdefghij')}{n:03d}" for n in range(120)]
    rnd.shuffle(names)  # chunk ids in another order than the rows' insertion (their rowids)
    out = []
    for i, name in enumerate(names):
        if i % 3 == 0:  # 40 identical rows: their scores tie
            text, title = "the test client returns the response", ""
        else:
            text = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(3, 12)))
            title = rnd.choice(["", "client", "render"])
        out.append(row(f"c_{name}", text, title=title, parent_id="p_file"))
    out.append(row("p_file", "file", role="parent", chunk_type="file"))
    return out


@pytest.fixture(params=[1, 2])
def store(tmp_path, request):
    s = FtsStore(tmp_path / "fts.sqlite")
    s.write_source("shop", "g1", "sha-1", _rows(request.param), None)
    yield s
    s.close()


QUERIES = ["what does the test client return", "register an error handler", "client", "the response",
           "render a template", "cache", "test client", "nothing matches this"]


def test_top_matches_answer_as_the_joined_search(store, monkeypatch):
    fast = {(q, k): store.search(q, k=k) for q in QUERIES for k in (1, 3, 10, 20, 40, 200)}
    monkeypatch.setattr(FtsStore, "_top_matches", classmethod(lambda cls, *a: None))
    for (q, k), hits in fast.items():
        assert hits == store.search(q, k=k), (q, k)
    assert any(len(h) >= 20 for h in fast.values())


def test_the_window_is_used_unless_a_tie_crosses_it(store, monkeypatch):
    joined = []
    matches = FtsStore._matches

    def counted(*args):
        joined.append(args[2])
        return matches(*args)

    monkeypatch.setattr(FtsStore, "_matches", staticmethod(counted))
    store.search("register error handler", k=5)
    assert joined == []  # ranked in the FTS table, joined after
    store.search("register an error handler", k=5)  # a 2-letter word: its filter joins
    assert joined
    joined.clear()
    # 40 rows share one text and score: a cut inside them needs the join's tie-break
    hits = store.search('"the test client returns the response"', k=5)
    assert joined and len(hits) == 5
    assert [h["chunk_id"] for h in hits] == sorted(h["chunk_id"] for h in hits)
    joined.clear()
    store.search("client", k=3, source_kind="code")  # a filtered search always joins
    assert joined


def _common_word_rows(seed: int) -> list[dict]:
    """Rows where "the" is in ~80% and "return" in ~60%: bm25 floors both words' idf."""
    rnd = random.Random(seed)
    out = []
    for i in range(150):
        words = [rnd.choice(WORDS[2:]) for _ in range(rnd.randint(2, 8))]
        if rnd.random() < 0.8:
            words.insert(rnd.randrange(len(words) + 1), "the")
        if rnd.random() < 0.6:
            words.append("return")
        if rnd.random() < 0.05:
            words.append("client")
        out.append(row(f"c_{seed}_{i:03d}", " ".join(words), title=rnd.choice(["", "the", "render"]),
                       parent_id="p_file"))
    out.append(row("p_file", "file", role="parent", chunk_type="file"))
    return out


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_leaving_out_the_words_bm25_does_not_weigh_keeps_the_ranking(tmp_path, monkeypatch, seed):
    """The "any" stage leaves out of its OR the phrases in half of the rows or more (their idf is
    floored at 1e-6): the hits are those of the whole OR, up to score differences of ~1e-5; where
    fewer than k rows match the other words, the whole OR fills the tail."""
    s = FtsStore(tmp_path / "fts.sqlite")
    s.write_source("shop", "g1", "sha-1", _common_word_rows(seed), None)
    # a word no row holds: no row matches all of a query, so each runs the "any" stage
    queries = ["what does the test client return", "the client zzq", "the render return zzq",
               "return the cache zzq", "the return zzq"]
    pruned = []
    informative = FtsStore._informative

    def seen(self, conn, table, terms):
        out = informative(self, conn, table, terms)
        pruned.append(out)
        return out

    monkeypatch.setattr(FtsStore, "_informative", seen)
    fast = {(q, k, f): s.search(q, k=k, source_kind=f) for q in queries for k in (1, 5, 20, 100)
            for f in (None, "code")}
    assert any(p is not None for p in pruned)  # some OR left words out
    monkeypatch.setattr(FtsStore, "_informative", lambda self, conn, table, terms: None)
    for (q, k, f), hits in fast.items():
        whole = s.search(q, k=k, source_kind=f)
        assert len(hits) == len(whole), (q, k, f)
        for a, b in zip(hits, whole):
            assert abs(a["score"] - b["score"]) < 1e-4, (q, k, f)
        # every row clearly inside the whole OR's top k is in the pruned top k
        cut = whole[-1]["score"] + 1e-4 if whole else 0
        assert {h["chunk_id"] for h in whole if h["score"] > cut} <= {h["chunk_id"] for h in hits}, (q, k, f)
    # few rows hold "client", so the rows of "the" alone fill the tail of a top 100
    assert len(fast[("the client zzq", 100, None)]) == 100
    s.close()


def test_a_new_store_of_the_same_file_counts_no_word_again(tmp_path):
    """A serving reader opens a new FtsStore at each switch: the words' row counts of the file are
    shared, so its first question runs no count again (and another file's store counts its own)."""
    path = tmp_path / "fts.sqlite"
    first = FtsStore(path)
    first.write_source("shop", "g1", "sha-1", _common_word_rows(3), None)
    question = "what does the test client return"
    hits = first.search(question, k=10)
    second = FtsStore(path)
    statements: list[str] = []
    second._conn.set_trace_callback(statements.append)
    assert second.search(question, k=10) == hits
    assert statements and not [s for s in statements if "count(*)" in s]
    other = FtsStore(tmp_path / "other.sqlite")
    other.write_source("shop", "g1", "sha-1", _common_word_rows(4), None)
    statements.clear()
    other._conn.set_trace_callback(statements.append)
    other.search(question, k=10)
    assert [s for s in statements if "count(*)" in s]
    for s in (first, second, other):
        s.close()
