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
