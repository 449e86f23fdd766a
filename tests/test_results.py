"""The reader's typed results (serving/results.py): `to_dict()` is exactly the JSON the reader
builds (keys, order, values), attributes are typed, and the read-only Mapping view keeps the
dict-style callers working."""
from __future__ import annotations

import dataclasses
import json

import pytest

from mtrag_resources.serving.reader import ReaderCore
from mtrag_resources.serving.results import (Answer, BridgeEntry, Bundle, ChannelCount, ChannelRank, Exact, Hit,
                                             Parent, PathsAnswer, Stale, Status, StoreState)


def _hit(rank=1, **over):
    h = {"rank": rank, "chunk_id": f"c{rank}", "source_id": "shop", "source_kind": "code",
         "file_path": "src/shopcart/tax.py", "start_line": 3, "end_line": 9, "symbol": "shopcart.tax.apply_tax",
         "title": "apply_tax", "text": "def apply_tax(...):", "score": 0.032787, "cosine": 0.61234,
         "channels": {"dense": {"rank": 1, "score": 0.016393}, "exact": {"rank": 1, "score": 0.032787}},
         "parent": None}
    h.update(over)
    return h


def _answer(**over):
    a = {"generation": 3, "query": "apply tax", "mode": "hybrid",
         "hits": [_hit(), _hit(2, parent={"chunk_id": "p", "title": "Cart", "symbol": "shopcart.cart.Cart",
                                          "start_line": 1, "end_line": 40, "text": "class Cart:"}, cosine=None)],
         "bridge": [{"from_chunk_id": "d1", "from_title": "Totals", "from_rank": 1, "symbol": "shopcart.tax.apply_tax",
                     "file_path": "src/shopcart/tax.py", "start_line": 3, "relation": "MENTIONS",
                     "confidence": "VERIFIED", "evidence": {"matched_text": "apply_tax"}, "via": "graph"}],
         "paths": [{"nodes": [{"name": "total", "qualified_name": "shopcart.cart.Cart.total"}],
                    "edges": [], "hops": 0}],
         "bundles": [{"unit": "src/shopcart/tax.py", "source_id": "shop", "score": 0.5, "best_path": ["a", "b"],
                      "cost_path": ("a", "b"), "best_support_id": "c1", "best_facet_id": "f", "best_point_id": "c1"}],
         "stale": [{"source": "shop", "store": "fts", "reason": "marker at begin"}],
         "channels": {"dense": {"hits": 12, "embedder": "default"}, "fts": {"hits": 4}},
         "exact": {"identifier": False, "matched": True}, "confidence": "normal",
         "timings_ms": {"fts_ms": 1.2, "embed_ms": 8.5}}
    a.update(over)
    return a


def _same(result, expected: dict) -> None:
    """Equal, and equal as JSON text: the same keys in the same order at every level."""
    out = result.to_dict()
    assert out == expected
    assert json.dumps(out, ensure_ascii=False) == json.dumps(expected, ensure_ascii=False)


@pytest.mark.unit
def test_answer_round_trips_the_readers_dict_exactly():
    d = _answer()
    a = Answer.from_dict(d)
    _same(a, d)
    assert isinstance(a.hits[0], Hit) and isinstance(a.hits[0].channels["dense"], ChannelRank)
    assert a.hits[0].file_path == "src/shopcart/tax.py" and a.hits[0].channels["exact"].rank == 1
    assert a.hits[0].parent is None and isinstance(a.hits[1].parent, Parent)
    assert a.hits[1].parent.symbol == "shopcart.cart.Cart"
    assert isinstance(a.bridge[0], BridgeEntry) and a.bridge[0].relation == "MENTIONS"
    assert isinstance(a.bundles[0], Bundle) and a.bundles[0].cost_path == ("a", "b")
    assert isinstance(a.stale[0], Stale) and a.stale[0].store == "fts"
    assert isinstance(a.exact, Exact) and a.exact.matched is True
    assert isinstance(a.channels["fts"], ChannelCount) and a.channels["fts"].embedder is None
    assert a.timings_ms == {"fts_ms": 1.2, "embed_ms": 8.5}


@pytest.mark.unit
def test_absent_optional_keys_stay_absent_and_unknown_keys_are_kept_in_order():
    # No published generation: the reader's answer has no timings_ms.
    d = _answer(generation=None, hits=[], bridge=[], paths=[], bundles=[], channels={}, confidence="low",
                stale=[{"source": "*", "store": "*", "reason": "no published generation (run `mtrag build`)"}])
    del d["timings_ms"]
    a = Answer.from_dict(d)
    _same(a, d)
    assert a.timings_ms is None and "timings_ms" not in a and a.get("timings_ms") is None
    with pytest.raises(KeyError):
        a["timings_ms"]
    # Per-hit additions (DESIGN: `commit_sha`, `page`) and new top-level keys survive to_dict.
    d = _answer(hits=[_hit(commit_sha="abc123", page=4)], extra_field={"x": 1})
    a = Answer.from_dict(d)
    _same(a, d)
    assert a.hits[0].commit_sha == "abc123" and "commit_sha" not in a.hits[0].extra  # a named, optional field
    assert a.hits[0].repository is None and "repository" not in a["hits"][0]          # absent stays absent
    assert a["hits"][0]["page"] == 4
    assert a.extra == {"extra_field": {"x": 1}}
    with pytest.raises(ValueError, match="no 'confidence'"):
        Answer.from_dict({k: v for k, v in _answer().items() if k != "confidence"})


@pytest.mark.unit
def test_the_mapping_view_is_read_only_and_gives_fresh_plain_values():
    d = _answer()
    a = Answer.from_dict(d)
    assert list(a) == list(d) and len(a) == len(d) and set(a.keys()) == set(d)
    assert a["hits"][0]["file_path"] == "src/shopcart/tax.py" and a.hits[0]["file_path"] == "src/shopcart/tax.py"
    assert a.get("confidence") == "normal" and a.get("nope", 7) == 7 and "nope" not in a
    assert a == d and d == a and dict(a) == d and {**a} == d
    assert a | {"timings_ms": {}} == {**d, "timings_ms": {}} and a.copy() == d
    assert type(a["hits"][0]) is dict and type(a["exact"]) is dict
    a["hits"][0]["file_path"] = "changed"
    a["hits"].clear()
    assert a.hits[0].file_path == "src/shopcart/tax.py" and len(a["hits"]) == 2
    with pytest.raises(TypeError):
        a["confidence"] = "high"  # no item assignment
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.confidence = "high"
    with pytest.raises(TypeError, match="not JSON serializable"):
        json.dumps(a)


@pytest.mark.unit
def test_paths_and_status_round_trip():
    p = {"generation": 2, "from": "shopcart.cart.Cart.total", "to": None,
         "paths": [{"nodes": [{"name": "total"}, {"name": "apply_tax"}], "edges": [{"type": "CALLS"}], "hops": 1}],
         "stale": []}
    pa = PathsAnswer.from_dict(p)
    _same(pa, p)
    assert pa.from_name == "shopcart.cart.Cart.total" and pa.to_name is None and pa["from"] == pa.from_name
    s = {"generation": 2, "sources": {"shop": {"qdrant": {"generation": "g1", "state": "committed"},
                                               "fts": {"generation": None, "state": "missing"}}},
         "stale": [{"source": "shop", "store": "fts", "reason": "no marker"}]}
    st = Status.from_dict(s)
    _same(st, s)
    assert isinstance(st.sources["shop"]["qdrant"], StoreState) and st.sources["shop"]["fts"].state == "missing"
    assert st.quality is None and "quality" not in st and "quality_refused" not in st
    s2 = {**s, "quality": {"recall": 1.0, "recalled": 3, "queries": 3, "baseline": None, "accepted_drop": None},
          "quality_refused": {"candidate_generation": 3, "published_generation": 2, "reasons": ["recall"]}}
    _same(Status.from_dict(s2), s2)


# ------------------------------------------------------------------ against a real generation


@pytest.fixture(scope="module")
def reader(published):
    from mtrag_resources.serving.reader import IndexReader
    r = IndexReader(home=str(published["home"]), log_proposals=False)
    yield r
    r.close()


@pytest.fixture
def built(monkeypatch):
    """The dicts ReaderCore builds (what the reader answered before results were typed)."""
    seen: list[dict] = []
    for name in ("query", "paths", "status"):
        original = getattr(ReaderCore, name)

        def spy(self, *args, _original=original, **kwargs):
            out = _original(self, *args, **kwargs)
            seen.append(out)
            return out
        monkeypatch.setattr(ReaderCore, name, spy)
    return seen


QUERIES = [
    ("how is the total price with tax computed", {}),
    ("apply tax to an amount", {"kind": "docs", "k": 3}),
    ("apply the regional tax", {"mode": "dense"}),
    ("regional taxes", {"mode": "lexical"}),
    ("shopcart.tax.lookup_rate", {"mode": "exact", "k": 3}),
    ("shopcart.cart.Cart.total", {}),
    ("tax rate for a region", {"mode": "bundles"}),
    ("shopcart.nothing.like_this", {}),
]


@pytest.mark.integration
@pytest.mark.neo4j
def test_answers_to_dict_is_the_readers_json(reader, built):
    seen_bridge = seen_bundles = seen_paths = seen_parent = False
    for text, kw in QUERIES:
        answer = reader.query(text, **kw)
        assert isinstance(answer, Answer)
        expected = built.pop()
        _same(answer, expected)
        assert list(answer) == list(expected)
        assert answer.query == text and answer.mode == kw.get("mode", "hybrid")
        assert answer.generation == 1 and answer.stale == []
        for h, e in zip(answer.hits, expected["hits"]):
            assert (h.file_path, h.start_line, h.symbol, h.cosine, h.score) == \
                (e["file_path"], e["start_line"], e["symbol"], e["cosine"], e["score"])
            seen_parent |= h.parent is not None
        seen_bridge |= bool(answer.bridge)
        seen_bundles |= bool(answer.bundles)
        seen_paths |= bool(answer.paths)
    assert seen_bridge and seen_bundles and seen_paths and seen_parent
    top = reader.query("shopcart.tax.lookup_rate", k=3)
    assert top.hits[0].symbol == "shopcart.tax.lookup_rate" == top["hits"][0]["symbol"]
    assert top.exact.identifier and top.exact.matched and top.confidence == "high"
    assert {"dense", "exact"} <= set(top.hits[0].channels)
    missing = reader.query("shopcart.nothing.like_this")
    assert missing.exact.identifier and not missing.exact.matched and missing.confidence == "low"
    bridged = reader.query("apply tax to an amount", kind="docs", k=3)
    assert any(b.symbol == "shopcart.tax.apply_tax" and b.relation == "MENTIONS" for b in bridged.bridge)


@pytest.mark.integration
@pytest.mark.neo4j
def test_paths_and_status_to_dict_are_the_readers_json(reader, built):
    paths = reader.paths("shopcart.cart.Cart.total", rel_types=["CALLS"], max_hops=3)
    assert isinstance(paths, PathsAnswer)
    _same(paths, built.pop())
    assert paths.from_name == "shopcart.cart.Cart.total" and paths.paths
    incoming = reader.paths("shopcart.tax.lookup_rate", to_name="shopcart.tax.apply_tax", direction="in")
    _same(incoming, built.pop())
    assert incoming.to_name == "shopcart.tax.apply_tax"
    status = reader.status()
    assert isinstance(status, Status)
    _same(status, built.pop())
    assert status.generation == 1 and status.stale == []
    assert status.sources["shop"]["fts"].state == "committed" == status["sources"]["shop"]["fts"]["state"]


@pytest.mark.integration
@pytest.mark.neo4j
def test_cli_json_is_to_dict(reader, capsys):
    """`mtrag query --json` / `paths --json` / `status --json` print to_dict() (timings aside)."""
    from mtrag_assets.app.cli import main
    assert main(["query", "shopcart.tax.lookup_rate", "--k", "3", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = reader.query("shopcart.tax.lookup_rate", k=3).to_dict()
    assert list(printed) == list(expected)
    assert printed == json.loads(json.dumps(expected | {"timings_ms": printed["timings_ms"]}))
    assert main(["paths", "--from", "shopcart.cart.Cart.total", "--max-hops", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == reader.paths("shopcart.cart.Cart.total", max_hops=3).to_dict()
    assert main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == reader.status().to_dict()
