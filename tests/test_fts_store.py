"""FtsStore against real SQLite files (no mocks): CJK and identifier search, exact aliases,
idempotent and replacing writes, MATCH-injection safety, crash consistency, a reader in another
process, and property tests for the query builder and the alias normaliser."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtrag_resources.core.models import Chunk
from mtrag_resources.stores import fts_query
from mtrag_resources.stores.fts_query import (
    build_query,
    is_well_formed,
    normalize_alias,
    segment_for_index,
)
from mtrag_resources.stores.fts_store import FtsStore
from mtrag_resources.stores.contract import BEGIN, COMMITTED
from tests.conftest import CJK_DOCS

pytestmark = pytest.mark.unit  # SQLite files in tmp_path, a reader process: no service, no model

REPO = Path(__file__).resolve().parents[1]


def row(chunk_id, text, *, role="child", parent_id="p_file", title="", symbol="", summary="",
        file_path="src/shop/cart.py", chunk_type="function", source_kind="code", graph_ids=()):
    return {"chunk_id": chunk_id, "role": role, "parent_id": parent_id if role == "child" else None,
            "chunk_type": chunk_type, "file_path": file_path, "start_line": 1, "end_line": 9,
            "symbol": symbol, "title": title, "summary": summary, "text": text,
            "language": "python", "content_hash": fts_query.__name__ + chunk_id, "locator": "",
            "source_kind": source_kind, "graph_ids": list(graph_ids)}


def corpus() -> list[dict]:
    return [
        row("p_file", "class ShopCart:\n    ...\ndef lookup_rate(): ...", role="parent",
            chunk_type="file", symbol="shop.cart", title="cart.py"),
        row("c_tax", "def lookup_rate(region):\n    \"\"\"按地区返回税率。\"\"\"\n    return RATES[region]",
            symbol="shop.cart.lookup_rate", title="lookup_rate", summary="按地区返回税率",
            graph_ids=["fn:shop.cart.lookup_rate"]),
        row("c_cart", "class ShopCart:\n    def total(self): return sum(self.items)",
            symbol="shop.cart.ShopCart", title="ShopCart", chunk_type="class",
            graph_ids=["cls:shop.cart.ShopCart"]),
        row("c_pass", "def make_password(length=12):\n    return secrets.token_hex(length)",
            symbol="shop.auth.make_password", title="make_password", file_path="src/shop/auth.py",
            parent_id="p_auth"),
        row("p_auth", "auth module", role="parent", chunk_type="file", symbol="shop.auth",
            title="auth.py", file_path="src/shop/auth.py"),
        row("d_mem", "缓存层把热点数据放在内存里，避免重复读取磁盘。", source_kind="docs",
            chunk_type="section", title="缓存设计", symbol="设计 > 缓存", file_path="docs/cache.md",
            parent_id="p_doc"),
        row("d_auth", "所有请求先经过鉴权中间件，再进入业务处理。见 SHOP-42。", source_kind="docs",
            chunk_type="section", title="请求流程", symbol="设计 > 请求", file_path="docs/flow.md",
            parent_id="p_doc"),
        row("d_misc", "存储与内部接口的说明，税务相关内容见其他章节。", source_kind="docs",
            chunk_type="section", title="杂项", symbol="设计 > 杂项", file_path="docs/misc.md",
            parent_id="p_doc"),
        row("p_doc", "设计文档", role="parent", chunk_type="page", source_kind="docs",
            title="设计", file_path="docs/index.md"),
    ]


@pytest.fixture()
def store(tmp_path):
    s = FtsStore(tmp_path / "fts.sqlite")
    s.write_source("shop", "g1", "sha-1", corpus(), None)
    yield s
    s.close()


def ids(hits):
    return [h["chunk_id"] for h in hits]


# ---------------------------------------------------------------- lexical search
def test_trigram_alone_misses_two_char_chinese_but_store_finds_it(store):
    # The reason fts_cjk exists: trigram cannot match a 2-character term.
    raw = store._conn.execute("SELECT rowid FROM fts_trigram WHERE fts_trigram MATCH '\"税率\"'").fetchall()
    assert raw == []
    assert ids(store.search("税率"))[:1] == ["c_tax"]
    assert "d_misc" not in ids(store.search("税率"))     # has 税务, not 税率
    assert ids(store.search("内存")) == ["d_mem"]        # d_misc has 内部 and 存储, not 内存


@pytest.mark.parametrize("q,expect", [("鉴权中间件", "d_auth"), ("鉴权中间", "d_auth"),
                                      ("中间件", "d_auth"), ("热点数据", "d_mem"), ("缓存设计", "d_mem")])
def test_longer_chinese_terms(store, q, expect):
    assert ids(store.search(q))[0] == expect


def test_single_chinese_character_reaches_every_position(store):
    assert "d_auth" in ids(store.search("件"))   # last char of a run
    assert "d_mem" in ids(store.search("避"))    # first char of a bigram
    assert store.search("龘") == []


def test_long_chinese_sentence_falls_back_to_bigram_coverage(store):
    hits = store.search("如何计算税率")
    assert hits and hits[0]["chunk_id"] == "c_tax" and hits[0]["match"] == "any"


def test_chinese_articles_are_found_by_their_own_words(tmp_path):
    """The Chinese articles of tests/data/cjk, one row per paragraph: two-character words, longer
    phrases and identifiers inside Chinese sentences find exactly the paragraphs holding them."""
    rows, texts = [], {}
    for doc in sorted(CJK_DOCS.glob("*.md")):
        paragraphs = [p for p in doc.read_text(encoding="utf-8").split("\n\n") if not p.startswith("#")]
        for i, para in enumerate(paragraphs):
            texts[f"{doc.stem}-{i}"] = para
            rows.append(row(f"{doc.stem}-{i}", para, source_kind="docs", chunk_type="section",
                            file_path=doc.name, parent_id=None))
    s = FtsStore(tmp_path / "zh.sqlite")
    try:
        s.write_source("zh", "g", "h", rows, [])
        for q in ("税率", "二元组", "标记", "原子地移动", "倒排索引", "余弦相似度", "best_by_id", "lookup_rate"):
            holders = {cid for cid, text in texts.items() if q in text}
            hits = s.search(q, k=50)
            assert holders and {h["chunk_id"] for h in hits} == holders, q
            assert all(h["match"] == "all" for h in hits), q
    finally:
        s.close()


@pytest.mark.parametrize("q,expect", [("lookup_ra", "c_tax"), ("ShopCart", "c_cart"),
                                      ("shopcart", "c_cart"), ("make_pass", "c_pass"),
                                      ("opCar", "c_cart"), ("token_hex", "c_pass")])
def test_identifier_fragments_via_trigram(store, q, expect):
    hits = store.search(q)
    assert hits[0]["chunk_id"] == expect
    assert hits[0]["channel"] == "fts" and hits[0]["score"] > 0
    assert len(hits) == 1


def test_parents_are_not_search_hits_but_hydrate(store):
    # the parent p_file also contains "ShopCart" but only children are indexed
    assert "p_file" not in ids(store.search("ShopCart"))
    parents = store.parents_of(["c_cart", "c_pass", "p_file", "nope"])
    assert parents["c_cart"]["chunk_id"] == "p_file"
    assert parents["c_pass"]["chunk_id"] == "p_auth"
    assert "p_file" not in parents and "nope" not in parents


def test_title_and_symbol_outweigh_text(tmp_path):
    s = FtsStore(tmp_path / "w.sqlite")
    s.write_source("w", "g", "h", [
        row("in_text", "we call frobnicate here once", title="other"),
        row("in_title", "unrelated body words", title="frobnicate"),
        row("in_symbol", "unrelated body words", symbol="pkg.frobnicate"),
    ], [])
    hits = s.search("frobnicate")
    assert set(ids(hits)[:2]) == {"in_title", "in_symbol"} and ids(hits)[2] == "in_text"
    assert hits[0]["score"] >= hits[1]["score"] > hits[2]["score"]


def test_filters_by_kind_and_source(store):
    store.write_source("other", "g1", "x", [
        row("o1", "class ShopCart: other copy", symbol="o.ShopCart", source_kind="code",
            parent_id=None)], None)
    assert set(ids(store.search("ShopCart"))) == {"c_cart", "o1"}
    assert ids(store.search("ShopCart", source_ids=["other"])) == ["o1"]
    assert store.search("ShopCart", source_ids=[]) == []
    assert ids(store.search("税率", source_kind="docs")) == []
    assert ids(store.search("税率", source_kind="code")) == ["c_tax"]
    assert len(store.search("def", k=2)) == 2


@pytest.mark.parametrize("q", ["", "   ", "!!!", "()", "\"\"", "*", "___", "-", "{}", "：，。"])
def test_empty_or_punctuation_query_returns_nothing(store, q):
    assert store.search(q) == []


# (query, the search hits (chunk id, match stage), the exact-alias hits) on the `store` corpus.
# Operator characters are separators and operator words are words: a query finds the rows holding
# its words, in the strict stage when one row holds them all, else ranked by coverage ("any").
# The corpus holds no "or", "and", "not", "near", "drop", "table" or "chunks": queries made only
# of those, or only of operator characters, find nothing.
CART_ALL, CART_ANY = [("c_cart", "all")], [("c_cart", "any")]
NASTY = [
    ('"', [], []), ('""', [], []), ('ShopCart"', CART_ALL, ["c_cart"]), ('"ShopCart', CART_ALL, ["c_cart"]),
    ("a\\b", [], []), ("\\", [], []), ("ShopCart OR", CART_ANY, []), ("OR", [], []), ("AND", [], []),
    ("NOT", [], []), ("NEAR", [], []), ("NEAR(ShopCart total)", CART_ANY, []), ("ShopCart*", CART_ALL, []),
    ("*ShopCart", CART_ALL, []), ("(ShopCart", CART_ALL, []), ("ShopCart)", CART_ALL, []),
    ("{title symbol}: ShopCart", CART_ANY, []), ("title:ShopCart", CART_ANY, []), ("^ShopCart", CART_ALL, []),
    ("-ShopCart", CART_ALL, []), ("ShopCart -total", CART_ALL, []), ("ShopCart + total", CART_ALL, []),
    ("'; DROP TABLE chunks; --", [], []), ("x\x00y", [], []), ("税率\"", [("c_tax", "all")], []),
    ("\"内存\" OR \"鉴权\"", [("d_mem", "any"), ("d_auth", "any")], []), ("ShopCart NOT total", CART_ANY, []),
    ("a OR b", [], []), ("shop.cart.ShopCart()", CART_ALL, ["c_cart"]), ("`ShopCart`", CART_ALL, ["c_cart"]),
    ("ShopCart\ud800", CART_ALL, ["c_cart"]),
]


@pytest.mark.parametrize("q,found,exact", NASTY, ids=[repr(q) for q, _, _ in NASTY])
def test_operator_characters_are_separators_and_operator_words_are_words(store, q, found, exact):
    before = store.counts("shop")
    assert [(h["chunk_id"], h["match"]) for h in store.search(q)] == found
    assert ids(store.exact(q)) == exact
    assert store.counts("shop") == before  # nothing a query says is executed


def test_operators_are_literal_words(tmp_path):
    s = FtsStore(tmp_path / "ops.sqlite")
    s.write_source("o", "g", "h", [
        row("both", "alpha gamma, this or that"),
        row("alpha_only", "alpha alone here"),
        row("gamma_only", "gamma alone here"),
        row("star", "alphabet soup"),
        row("words", "stand near and not far"),
    ], [])
    # an operator word alone is a word like any other: it finds the rows that hold it, and nothing else
    assert ids(s.search("OR")) == ["both"]
    assert ids(s.search("NEAR")) == ids(s.search("AND NOT")) == ["words"]
    assert s.search('"*()^-+{}:') == [] and s.search("OR AND NOT NEAR")[0]["match"] == "any"
    # OR is a word that must be present, not a disjunction
    assert ids(s.search("alpha OR gamma")) == ["both"]
    # NOT does not exclude; it is a required (absent) word, then OR fallback ranks by coverage
    hits = s.search("gamma NOT alpha")
    assert "both" in ids(hits) and hits[0]["match"] == "any"
    # quotes and parentheses are separators
    assert ids(s.search('"alpha" (gamma)')) == ["both"]
    # a column filter is not applied: "title:" is a word to match
    assert s.search("title:alpha")[0]["match"] == "any"
    assert ids(s.search("gamma alone")) == ["gamma_only"]


# ---------------------------------------------------------------- exact aliases
@pytest.mark.parametrize("q,expect,kind", [
    ("shop.cart.lookup_rate", "c_tax", "symbol"),
    ("`shop.cart.ShopCart`", "c_cart", "symbol"),
    (":py:class:`~shop.cart.ShopCart`", "c_cart", "symbol"),
    ("shop::cart::ShopCart", "c_cart", "symbol"),
    ("shop.cart.lookup_rate()", "c_tax", "symbol"),
    ("make_password", "c_pass", "short_symbol"),
    ("src/shop/auth.py", "p_auth", "file_path"),
    ("src\\shop\\auth.py", "p_auth", "file_path"),
    ("auth.py", "p_auth", "basename"),
    ("fn:shop.cart.lookup_rate", "c_tax", "graph_id"),
    ("cls:shop.cart.ShopCart", "c_cart", "graph_id"),
    ("shop-42", "d_auth", "issue_key"),
    ("shop", "p_doc", "source_id"),   # index.md is the preferred entry point
])
def test_exact_aliases(store, q, expect, kind):
    hits = store.exact(q)
    assert hits[0]["chunk_id"] == expect and hits[0]["alias_kind"] == kind
    assert hits[0]["match"] == "exact"


def test_exact_last_part_for_qualified_queries(store):
    hits = store.exact("shop.make_password")   # re-exported name, not the defining module
    assert ids(hits) == ["c_pass"] and hits[0]["match"] == "last_part"
    assert store.exact("nothing.here") == []
    assert store.exact("src/shop/nothing.py") == []   # a path never falls back to its last part
    assert store.exact("") == [] and store.exact("``") == []


def test_exact_restricted_to_sources(store):
    """A scoped query asks the alias table itself for its sources (a bound `IN (...)`), exact and
    last-part matches alike; an id with SQL in it is a value, not SQL."""
    store.write_source("fork", "g1", "x", [
        row("f_tax", "def lookup_rate(region): ...", symbol="shop.cart.lookup_rate", parent_id=None),
        row("f_pass", "def make_password(): ...", symbol="shop.auth.make_password", parent_id=None)], None)
    assert set(ids(store.exact("shop.cart.lookup_rate"))) == {"c_tax", "f_tax"}
    assert ids(store.exact("shop.cart.lookup_rate", source_ids=["fork"])) == ["f_tax"]
    assert ids(store.exact("shop.cart.lookup_rate", source_ids=["shop"])) == ["c_tax"]
    assert set(ids(store.exact("shop.cart.lookup_rate", source_ids=["shop", "fork"]))) == {"c_tax", "f_tax"}
    last = store.exact("shop.make_password", source_ids=["fork"])  # the last-part fallback, scoped too
    assert ids(last) == ["f_pass"] and last[0]["match"] == "last_part"
    assert store.exact("shop.cart.lookup_rate", source_ids=[]) == []
    assert store.exact("shop.cart.lookup_rate", source_ids=["x') OR 1=1 --"]) == []
    assert ids(store.search("lookup_rate", source_ids=["fork"])) == ["f_tax"]


def test_accepts_chunk_dataclasses_and_round_trips_columns(tmp_path):
    s = FtsStore(tmp_path / "dc.sqlite")
    c = Chunk(chunk_id="k1", parent_id=None, role="child", chunk_type="function",
              file_path="a/b.py", start_line=3, end_line=7, title="f", summary="s",
              symbol="a.b.f", language="python", text="def f(): pass", source_id="dc",
              source_kind="code", cas_uri="cas://abc", graph_ids=["g:1", "g:2"]).finalize()
    s.write_source("dc", "g", "h", [c], None)
    got = s.get_chunks(["k1", "missing"])
    assert set(got) == {"k1"}
    assert got["k1"]["graph_ids"] == ["g:1", "g:2"] and got["k1"]["cas_uri"] == "cas://abc"
    assert got["k1"]["start_line"] == 3 and got["k1"]["locator"] == "a/b.py:3-7 (a.b.f)"
    assert ids(s.exact("g:2")) == ["k1"]
    with pytest.raises(ValueError):
        s.write_source("other", "g", "h", [c], None)   # row of another source


# ---------------------------------------------------------------- writes
def test_idempotent_rewrite_is_skipped(store):
    before = store.counts("shop")
    meta = store.meta("shop")
    stats = store.write_source("shop", "g1", "sha-1", corpus(), None)
    assert stats["skipped"] is True
    assert store.counts("shop") == before
    assert store.meta("shop")["updated_at"] == meta["updated_at"]
    # same generation, other input sha: rewritten
    stats2 = store.write_source("shop", "g1", "sha-2", corpus(), None)
    assert stats2["skipped"] is False and store.counts("shop") == before
    assert stats2["child_rows"] == 6 and stats2["parent_rows"] == 3 and stats2["bytes"] > 0
    store.integrity_check()


def test_replace_removes_deleted_chunks(store):
    rows = [r for r in corpus() if r["chunk_id"] != "c_pass"]
    stats = store.write_source("shop", "g2", "sha-2", rows, None)
    assert stats["child_rows"] == 5
    assert store.search("make_pass") == []
    assert store.exact("shop.auth.make_password") == []
    assert "c_pass" not in store.get_chunks(["c_pass", "c_tax"])
    assert store.counts("shop")["fts_cjk_rows"] == 5
    assert store.marker("shop").generation == "g2" and store.marker("shop").committed
    # a changed text is searchable under the new words only
    rows = [dict(r, text="def lookup_rate(): return VAT") if r["chunk_id"] == "c_tax" else r
            for r in rows]
    store.write_source("shop", "g3", "sha-3", rows, None)
    assert "c_tax" in ids(store.search("VAT"))
    assert "c_tax" not in ids(store.search("RATES"))
    store.integrity_check()


def test_partial_change_keeps_unchanged_rows_and_moves_changed_ones(store):
    rows = corpus()
    rows[2] = dict(rows[2], text="class ShopCart:\n    def checkout(self): pay()")   # c_cart changed
    rows[5] = dict(rows[5], role="parent", parent_id=None)                            # d_mem: now a parent
    rows.append(row("c_new", "def refund_order(): ...", symbol="shop.cart.refund_order"))
    stats = store.write_source("shop", "g2", "sha-2", rows, None)
    assert (stats["kept_rows"], stats["inserted_rows"], stats["deleted_rows"]) == (7, 3, 2)
    assert ids(store.search("checkout")) == ["c_cart"] and store.search("total") == []
    assert ids(store.search("refund_ord")) == ["c_new"]
    assert store.search("内存") == []                      # parents are not indexed
    assert store.get_chunks(["d_mem"])["d_mem"]["role"] == "parent"
    assert ids(store.search("税率")) == ["c_tax"]          # kept rows still found
    c = store.counts("shop")
    assert (c["child_rows"], c["parent_rows"], c["fts_cjk_rows"]) == (6, 4, 6)
    store.integrity_check()


def test_delete_source(store):
    store.delete_source("shop")
    assert store.counts("shop")["child_rows"] == 0 and store.counts("shop")["alias_rows"] == 0
    assert store.marker("shop") is None and store.meta("shop") is None
    assert store.search("ShopCart") == [] and store.exact("auth.py") == []
    store.integrity_check()


def _assert_old_state_intact(store, before):
    assert store.counts("shop") == before
    assert store.meta("shop")["generation"] == "g1"
    assert ids(store.search("make_pass")) == ["c_pass"]
    assert ids(store.exact("shop.cart.ShopCart")) == ["c_cart"]
    store.integrity_check()


def test_failure_inside_transaction_leaves_begin_and_old_rows(store, monkeypatch):
    before = store.counts("shop")
    calls = {"n": 0}
    real = fts_query.segment_for_index

    def flaky(text):
        calls["n"] += 1
        if calls["n"] > 5:
            raise RuntimeError("disk on fire")
        return real(text)

    monkeypatch.setattr(fts_query, "segment_for_index", flaky)
    # every row changes, so every child is re-segmented (unchanged rows would be kept as is)
    new_rows = [dict(r, text=r["text"] + " v2") for r in corpus() if r["chunk_id"] != "c_pass"]
    with pytest.raises(sqlite3.Error):   # a Python UDF error surfaces as an sqlite3 error
        store.write_source("shop", "g2", "sha-2", new_rows, None)
    assert calls["n"] > 5
    mk = store.marker("shop")
    assert (mk.generation, mk.state) == ("g2", BEGIN)
    _assert_old_state_intact(store, before)

    monkeypatch.setattr(fts_query, "segment_for_index", real)
    stats = store.write_source("shop", "g2", "sha-2", new_rows, None)
    assert not stats["skipped"] and stats["child_rows"] == 5
    mk = store.marker("shop")
    assert (mk.generation, mk.state) == ("g2", COMMITTED)
    assert store.search("make_pass") == []


def test_constraint_violation_leaves_begin_and_next_write_converges(store, tmp_path):
    before = store.counts("shop")
    bad = corpus() + [row("c_bad", "oops", role="bogus")]
    with pytest.raises(sqlite3.IntegrityError):
        store.write_source("shop", "g2", "sha-2", bad, None)
    assert store.marker("shop") .state == BEGIN
    _assert_old_state_intact(store, before)
    dup = corpus() + [corpus()[1]]             # duplicate chunk_id
    with pytest.raises(sqlite3.IntegrityError):
        store.write_source("shop", "g2", "sha-2", dup, None)
    _assert_old_state_intact(store, before)
    # rewriting the old input is NOT skipped while the marker is open, and closes it
    stats = store.write_source("shop", "g1", "sha-1", corpus(), None)
    assert stats["skipped"] is False
    assert store.marker("shop") .state == COMMITTED and store.counts("shop") == before
    # a second store on the same file sees the same committed state
    other = FtsStore(store.path)
    assert other.marker("shop").committed and other.counts("shop") == before
    other.close()


# ---------------------------------------------------------------- reader in another process
READER = textwrap.dedent("""
    import json, os, sys, time
    from mtrag_resources.stores.fts_store import FtsStore
    path, expected_json, stop_file, ready_file, seen_file = sys.argv[1:]
    expected = json.loads(expected_json)
    store = FtsStore(path, readonly=True, busy_timeout_ms=100)
    errors, seen, n = [], {}, 0
    open(ready_file, "w").close()
    deadline = time.monotonic() + 300  # only so that a lost test cannot leave it running
    while not os.path.exists(stop_file) and time.monotonic() < deadline:
        try:
            c = store.counts("src")
            exp = expected.get(c["generation"])
            got = [c["child_rows"], c["parent_rows"], c["alias_rows"], c["fts_cjk_rows"]]
            if exp is None or got != exp["counts"]:
                errors.append(["counts", c])
            seen[c["generation"]] = seen.get(c["generation"], 0) + 1
            for gen, e in expected.items():
                hits = store.search(e["token"], k=100000)
                if len(hits) not in (0, e["counts"][0]):
                    errors.append(["partial search", gen, len(hits)])
                ex = store.exact(e["symbol"])
                if len(ex) not in (0, 1):
                    errors.append(["exact", gen, len(ex)])
            n += 1
            if n >= 5 and set(seen) == set(expected) and not os.path.exists(seen_file):
                open(seen_file, "w").close()  # tells the writer it may stop
        except Exception as exc:
            errors.append(["exception", repr(exc)])
    print(json.dumps({"n": n, "errors": errors[:20], "seen": seen}))
""")


def _gen_rows(token: str, n: int) -> list[dict]:
    rows = [row(f"p{i}", f"parent {i}", role="parent", chunk_type="file",
                file_path=f"src/m{i}.py", symbol=f"m{i}") for i in range(n // 10)]
    rows += [row(f"{token}_{i}", f"def f{i}(): return '{token} 数据{i}' " + "lorem ipsum " * 15,
                 parent_id=f"p{i % (n // 10)}", symbol=f"m{i % (n // 10)}.{token}_fn{i}",
                 file_path=f"src/m{i % (n // 10)}.py") for i in range(n)]
    return rows


def test_reader_in_other_process_never_sees_half_a_source(tmp_path):
    path = tmp_path / "shared.sqlite"
    writer = FtsStore(path)
    gens = {"gA": ("alphatoken", 1500), "gB": ("betatoken", 1000)}
    expected = {}
    for gen, (tok, n) in gens.items():      # learn the complete counts of each generation
        writer.write_source("src", gen, gen, _gen_rows(tok, n), None)
        c = writer.counts("src")
        expected[gen] = {"token": tok, "symbol": f"m0.{tok}_fn0",
                         "counts": [c["child_rows"], c["parent_rows"], c["alias_rows"], c["fts_cjk_rows"]]}
    stop, ready, seen = tmp_path / "stop", tmp_path / "ready", tmp_path / "seen-both"
    proc = subprocess.Popen([sys.executable, "-c", READER, str(path), json.dumps(expected),
                             str(stop), str(ready), str(seen)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(6000):  # up to ~2 minutes, only so that a hung reader cannot hang the test
            if ready.exists() or proc.poll() is not None:
                break
            time.sleep(0.02)
        assert ready.exists(), proc.stderr.read()
        # The store holds gB now; the reader can only see gA through one of these writes. Write
        # until it has seen both (each write replaces the whole source), at least 8 times.
        writes = 0
        while writes < 8 or not seen.exists():
            assert writes < 2000 and proc.poll() is None, "the reader never saw both generations"
            for gen, (tok, n) in gens.items():
                writer.write_source("src", gen, f"{gen}-{writes}", _gen_rows(tok, n), None)
                writes += 1
    finally:
        stop.touch()
        out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["errors"] == []
    assert report["n"] >= 5
    assert set(report["seen"]) == {"gA", "gB"}, report   # the reader overlapped the writes
    writer.close()


# ---------------------------------------------------------------- properties
QUERY_TEXT = st.text(alphabet=st.sampled_from(list('aZ_9 "\'\\*():^-+{}.,NEAROTD税率内存鉴权中间件\t\n')),
                     max_size=40) | st.text(max_size=60)


@pytest.fixture(scope="module")
def prop_store(tmp_path_factory):
    s = FtsStore(tmp_path_factory.mktemp("prop") / "p.sqlite")
    s.write_source("shop", "g1", "sha-1", corpus(), None)
    yield s
    s.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(q=QUERY_TEXT)
def test_query_builder_any_text(prop_store, q):
    plan = build_query(q)
    exprs = [plan.all_trigram, plan.all_trigram_filter, plan.all_cjk, plan.any_trigram, plan.any_cjk]
    for e in exprs:
        if e is not None:
            assert is_well_formed(e), e
    if plan.empty:
        assert all(e is None for e in exprs)
    conn = prop_store._conn
    for table, e in [("fts_trigram", plan.all_trigram), ("fts_trigram", plan.any_trigram),
                     ("fts_cjk", plan.all_trigram_filter), ("fts_cjk", plan.all_cjk),
                     ("fts_cjk", plan.any_cjk)]:
        if e is not None:
            conn.execute(f"SELECT rowid FROM {table} WHERE {table} MATCH ? LIMIT 5", (e,)).fetchall()
    hits = prop_store.search(q)
    assert all(h["channel"] == "fts" for h in hits)
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    prop_store.exact(q)


@settings(max_examples=500, deadline=None)
@given(x=st.text(max_size=60) | st.text(alphabet=st.sampled_from(list("`'\"~():#/\\ .aB_,;!?ß\u212a")),
                                         max_size=30))
def test_normalize_alias_idempotent(x):
    n = normalize_alias(x)
    assert normalize_alias(n) == n


@settings(max_examples=200, deadline=None)
@given(x=st.text(max_size=60))
def test_query_run_inside_indexed_text_is_found(x):
    """Any CJK run of >= 2 chars taken from an indexed text matches as a bigram phrase."""
    runs = fts_query.CJK_RE.findall(x)
    seg = segment_for_index(x).split(" ")
    for r in runs:
        if len(r) >= 2:
            bigrams = fts_query.cjk_bigrams(r)
            n = len(bigrams)
            assert any(seg[i:i + n] == bigrams for i in range(len(seg)))


def test_normalize_alias_examples():
    assert normalize_alias("  `~click.Group.command()` ") == "click.group.command"
    assert normalize_alias(":func:`click.echo`") == "click.echo"
    assert normalize_alias("std::vec::Vec") == "std.vec.vec"
    assert normalize_alias("Foo#bar") == "foo.bar"
    assert normalize_alias("src\\Pkg\\Mod.py") == "src/pkg/mod.py"
    assert normalize_alias("click.echo.") == "click.echo"


SELF_TEXT = st.text(alphabet=st.sampled_from(list(
    "abcXYZ019_ -.:()\"'*^{}\\/\n\tßéÄΣσςİ税率内存鉴权中间件数据的。，ーカナ한국")), min_size=1, max_size=40)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(x=SELF_TEXT)
def test_any_text_finds_itself_in_the_strict_stage(tmp_path_factory, x):
    """Index/query agreement: a query equal to a chunk's text always matches it with every token."""
    s = FtsStore(tmp_path_factory.mktemp("self") / "s.sqlite")
    s.write_source("s", "g", "h", [row("me", x), row("other", "zzzz unrelated")], [])
    hits = s.search(x)
    s.close()
    if build_query(x).empty:
        assert hits == []
    else:
        assert hits and hits[0]["chunk_id"] == "me" and hits[0]["match"] == "all", hits


@settings(max_examples=500, deadline=None)
@given(x=st.text(alphabet=st.sampled_from(list("aZ9_./:-~#()`'\" \\!?,;")), max_size=20))
def test_normalize_alias_fast_path_agrees_with_full_rules(x):
    assert normalize_alias(x) == fts_query._normalize_slow(x)


def test_snapshot_keeps_markers_and_rows_of_one_commit_while_a_writer_commits(tmp_path):
    """The reader gates on the markers, then reads rows: both must come from the same commit."""
    path = tmp_path / "fts.db"
    writer = FtsStore(path)
    writer.write_source("shop", "1", "sha-1", corpus())
    reader = FtsStore(path)
    try:
        with reader.snapshot():
            assert reader.markers()["shop"].generation == "1"
            changed = [dict(r, text=r["text"] + " concurrentword") for r in corpus()]
            writer.write_source("shop", "2", "sha-2", changed)  # commits while the snapshot is open
            assert reader.markers()["shop"].generation == "1"
            assert "concurrentword" not in reader.get_chunks(["c_tax"])["c_tax"]["text"]
            assert reader.search("concurrentword") == []
        assert reader.markers()["shop"].generation == "2"
        assert "concurrentword" in reader.get_chunks(["c_tax"])["c_tax"]["text"]
    finally:
        reader.close()
        writer.close()


def test_a_version_1_store_is_migrated_and_a_delta_finds_rows_by_chunk_id(tmp_path):
    """Schema 2: a store that version 1 wrote (exact_aliases indexed by source only) gets the
    (source, kind) and chunk_id indexes when a writer opens it, its rows kept; a delta's deletes
    find rows and aliases through chunk_id, visiting no other row of the source (django: ~50 ms a
    watch batch went to visiting 14k rows and 59k aliases)."""
    path = tmp_path / "fts.sqlite"
    with FtsStore(path) as s:
        s.write_source("shop", "g1", "sha-1", corpus(), None)
    conn = sqlite3.connect(path)
    conn.executescript("DROP INDEX exact_aliases_source_kind; DROP INDEX exact_aliases_chunk; "
                       "CREATE INDEX exact_aliases_source ON exact_aliases(source_id); PRAGMA user_version = 1;")
    conn.close()
    with FtsStore(path) as s:
        indexes = {r[1] for r in s._conn.execute("PRAGMA index_list(exact_aliases)")}
        assert {"exact_aliases_source_kind", "exact_aliases_chunk"} <= indexes
        assert "exact_aliases_source" not in indexes
        assert s._conn.execute("PRAGMA user_version").fetchone()[0] == 2
        assert s._conn.execute("SELECT count(*) FROM chunks").fetchone()[0] == len(corpus())
        statements: list[str] = []
        s._conn.set_trace_callback(statements.append)
        changed = dict(corpus()[1], text="def lookup_rate(region):\n    return 0")
        stats = s.write_source_delta("shop", "g2", "sha-2", ("g1", "sha-1"), ["c_tax"], [changed], [],
                                     ("source_id",), refiled_chunk_ids=["c_tax"])
        s._conn.set_trace_callback(None)
        assert stats is not None and ids(s.search("return 0")) == ["c_tax"]
        plans = {sql: [r[3] for r in s._conn.execute("EXPLAIN QUERY PLAN " + sql)]
                 for sql in statements if sql.startswith(("DELETE FROM exact_aliases", "INSERT INTO temp.mtrag_drop("))}
        assert len(plans) == 4  # the rows' ids, the source-wide kinds, the dropped rows' and the refiled file's aliases
        for sql, plan in plans.items():
            assert not any(step.startswith("SCAN") or "chunks_source_role" in step for step in plan), (sql, plan)
            assert "source_id=?)" not in " ".join(plan) or "alias_kind IN" in sql, (sql, plan)
