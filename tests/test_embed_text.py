"""The embedding text of code chunks and identifier splitting (ingest/embed_text.py), the camelCase
words of the FTS index of code rows, declaration-only chunks and overload folding in the chunker,
and the fusion step that ranks declarations below their implementations. No store, no model."""
from __future__ import annotations

import textwrap

import pytest

from mtrag_resources.core.models import sha256_hex, vector_hash
from mtrag_resources.ingest.chunking.code import chunk_code
from mtrag_resources.ingest.embed_text import (
    code_embed_text,
    has_case_parts,
    identifier_words,
    local_name,
    split_identifier,
)
from mtrag_resources.serving.fusion import demote_declarations
from mtrag_resources.stores import fts_query
from mtrag_resources.stores.fts_query import build_query, case_words_for_index, is_well_formed
from mtrag_resources.stores.fts_store import FtsStore

pytestmark = pytest.mark.unit


# ---------------------------------------------------------------- identifier splitting
@pytest.mark.parametrize("name, words", [
    ("get_terminal_size", ["get", "terminal", "size"]),
    ("getTerminalSize", ["get", "terminal", "size"]),
    ("GetTerminalSize", ["get", "terminal", "size"]),
    ("camelCase", ["camel", "case"]),
    ("HTTPServerError", ["http", "server", "error"]),
    ("XMLHttpRequest", ["xml", "http", "request"]),
    ("getHTTP", ["get", "http"]),
    ("IOError", ["io", "error"]),
    ("utf8Decode", ["utf8", "decode"]),
    ("base64Encode", ["base64", "encode"]),
    ("Int32Array", ["int32", "array"]),
    ("sha256", ["sha256"]),
    ("MAX_TOKENS", ["max", "tokens"]),
    ("__init__", ["init"]),
    ("_LazyFile", ["lazy", "file"]),
    ("click.termui.get_terminal_size", ["click", "termui", "get", "terminal", "size"]),
    ("click.core.Context.invoke", ["click", "core", "context", "invoke"]),
    ("web/src/cart.ts", ["web", "src", "cart", "ts"]),
    ("std::collections::HashMap", ["std", "collections", "hash", "map"]),
    ("$scope.fooBar", ["scope", "foo", "bar"]),
    ("straße", ["straße"]),
    ("ÄpfelBaum", ["äpfel", "baum"]),
    ("变量Name", ["变量", "name"]),
    ("", []),
    ("___", []),
])
def test_split_identifier(name, words):
    assert split_identifier(name) == words
    assert identifier_words(name) == " ".join(words)


def test_has_case_parts_only_for_mixed_case_words():
    assert has_case_parts("getTerminalSize") and has_case_parts("HTTPServer") and has_case_parts("IOError")
    assert not any(has_case_parts(w) for w in ("terminal", "Context", "HTTP", "MAX", "sha256", "x"))


def test_local_name_is_relative_to_the_module():
    assert local_name("click.core.Context.invoke", "click.core") == "Context.invoke"
    assert local_name("click.core", "") == "click.core"
    assert local_name("other.f", "click.core") == "other.f"
    assert local_name("click.core_x.f", "click.core") == "click.core_x.f"  # a prefix, not the module


# ---------------------------------------------------------------- the template
def test_code_embed_text_is_the_name_words_then_the_source():
    src = "    def invoke(self, callback):\n        \"\"\"Invoke a callback.\"\"\"\n        return callback()\n"
    text = code_embed_text("click.core.Context.invoke", "click.core", "\n" + src + "\n\n")
    assert text == "context invoke\n" + src
    assert code_embed_text("pkg.getTerminalSize", "pkg", "x") == "get terminal size\nx\n"
    assert code_embed_text("", "", "x = 1\n") == "x = 1\n"  # no name: the source alone


PY = textwrap.dedent('''\
    """Terminal helpers."""
    import typing as t


    class Screen:
        """A screen."""

        @t.overload
        def size(self, unit: int) -> int: ...
        # the text form
        @t.overload
        def size(self, unit: str) -> str: ...

        def size(self, unit):
            """Return the terminal size in `unit`."""
            return measure(unit)

        def on_resize(self):
            """Called after a resize; override it."""

        @property
        def width(self) -> int:
            return self.size(1)

        def close(self):
            raise NotImplementedError()


    def getTerminalSize() -> tuple:
        """The size as (columns, rows)."""
        return (80, 24)


    @t.overload
    def lone(x: int) -> int: ...
    ''')


def _children(parsed):
    return {(c.chunk_type, c.symbol): c for c in parsed.chunks if c.role == "child"}


def test_code_children_carry_an_embedding_text_that_differs_from_their_text():
    parsed = chunk_code("s", "src/term/screen.py", PY, "python")
    children = _children(parsed)
    fn = children[("function", "term.screen.getTerminalSize")]
    assert fn.embed_text == "get terminal size\n" + fn.text
    assert fn.embed_hash == sha256_hex(fn.embed_text) != fn.content_hash
    method = children[("method", "term.screen.Screen.width")]
    assert method.embed_text.startswith("screen width\n    @property\n    def width(self)")
    for c in parsed.chunks:  # parents and module-level code are embedded as their text
        if c.role == "parent" or c.chunk_type == "module":
            assert c.embed_text == "" and c.embed_hash == ""
    row = {"content_hash": fn.content_hash, "embed_hash": fn.embed_hash}
    assert vector_hash(row) == fn.embed_hash
    assert vector_hash({"content_hash": "c", "embed_hash": ""}) == "c" == vector_hash({"content_hash": "c"})


def test_overload_stubs_fold_into_their_implementation():
    parsed = chunk_code("s", "src/term/screen.py", PY, "python")
    sizes = [c for c in parsed.chunks if c.symbol == "term.screen.Screen.size"]
    assert len(sizes) == 1, "the stubs have no chunk of their own"
    (size,) = sizes
    assert not size.declaration
    assert size.start_line == PY.splitlines().index("    @t.overload") + 1
    assert size.text.lstrip().startswith("@t.overload") and "return measure(unit)" in size.text
    assert size.summary == "Return the terminal size in `unit`."
    # the embedder reads the implementation's own source, not the stubs
    assert "@t.overload" not in size.embed_text and size.embed_text.startswith("screen size\n    def size(self, unit):")
    nodes = [n.node_id for n in parsed.nodes if n.qualified_name == "term.screen.Screen.size"]
    assert nodes == ["s:method:term.screen.Screen.size"]  # one node, no `#3`
    assert any(c["caller_qn"] == "term.screen.Screen.size" and c["callee_expr"] == "measure" for c in parsed.calls)


def test_declaration_only_chunks_are_flagged():
    children = _children(chunk_code("s", "src/term/screen.py", PY, "python"))
    flagged = {sym for (kind, sym), c in children.items() if c.declaration}
    assert flagged == {"term.screen.Screen.on_resize", "term.screen.Screen.close", "term.screen.lone"}


def test_treesitter_bodiless_methods_are_declarations():
    java = textwrap.dedent('''\
        interface Shape {
            /** The area. */
            double area();
        }
        class Square implements Shape {
            public double area() { return side * side; }
            void noop() {}
        }
        ''')
    children = _children(chunk_code("s", "src/Shape.java", java, "java"))
    decl = {sym: c.declaration for (kind, sym), c in children.items() if kind == "method"}
    assert decl == {"src.Shape.Shape.area": True, "src.Shape.Square.area": False, "src.Shape.Square.noop": True}
    assert children[("method", "src.Shape.Square.area")].embed_text.startswith("square area\n")


# ---------------------------------------------------------------- FTS: camelCase words of code rows
def test_case_words_for_index():
    assert case_words_for_index("x = getTerminalSize(HTTPServer_x) + get_size + MAX_N") == \
        "get terminal size http server"
    assert case_words_for_index("all lower_case words and UPPER") == ""
    assert case_words_for_index("") == "" and case_words_for_index(None) == ""


def _row(chunk_id, text, symbol, source_kind="code", chunk_type="function"):
    return {"chunk_id": chunk_id, "role": "child", "parent_id": None, "chunk_type": chunk_type,
            "file_path": "src/a.py", "start_line": 1, "end_line": 3, "symbol": symbol, "title": symbol,
            "summary": "", "text": text, "language": "python", "content_hash": chunk_id, "locator": "",
            "source_kind": source_kind, "graph_ids": []}


@pytest.fixture()
def fts(tmp_path):
    store = FtsStore(tmp_path / "fts.sqlite")
    store.write_source("code", "g1", "sha", [
        _row("camel", "function getTerminalSize() { return [cols, rows]; }", "term.getTerminalSize"),
        _row("snake", "def get_terminal_size():\n    return 80, 24", "term.get_terminal_size"),
        _row("other", "def terminal_sizes_table(): ...", "term.terminal_sizes_table"),
        _row("call", "def layout():\n    w = getTerminalSize()[0]", "term.layout"),
    ], None)
    store.write_source("docs", "g1", "sha", [
        _row("doc", "The function getTerminalSize returns the size.", "Guide > Size", "docs", "section"),
    ], None)
    yield store
    store.close()


def _ids(hits):
    return [h["chunk_id"] for h in hits]


def test_words_find_camel_and_snake_identifiers(fts):
    got = _ids(fts.search("terminal size", source_kind="code"))
    assert {"camel", "snake"} <= set(got[:3])
    with fts.snapshot() as conn:
        words = {r[0] for r in conn.execute(
            "SELECT c.chunk_id FROM fts_cjk f JOIN chunks c ON c.rid = f.rowid WHERE fts_cjk MATCH ?",
            (build_query("terminal size").all_cjk,))}
        assert words == {"camel", "snake", "call"}, "the word index itself finds camelCase identifiers"
        # docs rows are not split: their word index knows only the whole identifier
        seg = conn.execute("SELECT f.text FROM fts_cjk f JOIN chunks c ON c.rid = f.rowid "
                           "WHERE c.chunk_id = 'doc'").fetchone()[0]
    assert "getterminalsize" in seg.split() and "terminal" not in seg.split()
    fts.integrity_check()


def test_exact_identifier_queries_still_rank_the_symbol_first(fts):
    assert _ids(fts.exact("term.getTerminalSize"))[0] == "camel"
    assert _ids(fts.exact("getTerminalSize"))[0] == "camel"
    assert _ids(fts.search("getTerminalSize", source_kind="code"))[0] == "camel"
    assert _ids(fts.search("get_terminal_size", source_kind="code"))[0] == "snake"


@pytest.mark.parametrize("query", ['terminal" OR size', "getTerminalSize*", "NEAR(a b)", "x:y -z", "(",
                                   '"', "terminal ^size", "AND", "getTerminal\x00Size"])
def test_hostile_queries_stay_literal(fts, query):
    plan = build_query(query)
    for expr in (plan.all_trigram, plan.all_trigram_filter, plan.all_cjk, plan.any_trigram, plan.any_cjk):
        assert expr is None or is_well_formed(expr)
    fts.search(query)  # never an FTS syntax error


def test_code_segment_goes_through_the_module_segmenter(fts, monkeypatch):
    """Failure injection into fts_query.segment_for_index reaches code rows too."""
    calls = []
    real = fts_query.segment_for_index
    monkeypatch.setattr(fts_query, "segment_for_index", lambda text: calls.append(text) or real(text))
    fts.write_source("code", "g2", "sha2", [_row("x", "def fooBar(): pass", "m.fooBar")], None)
    assert "def fooBar(): pass" in calls


# ---------------------------------------------------------------- fusion: declarations below implementations
def _fused(*ids, exact_first=None):
    return [(cid, 1.0 / (i + 1), {"exact": {"rank": 1, "score": 1.0}} if cid == exact_first else {})
            for i, cid in enumerate(ids)]


ROWS = {
    "base.send": {"symbol": "pkg.base.Base.send", "chunk_type": "method", "declaration": True},
    "http.send": {"symbol": "pkg.http.HTTPAdapter.send", "chunk_type": "method", "declaration": False},
    "mock.send": {"symbol": "pkg.mock.MockAdapter.send", "chunk_type": "method", "declaration": False},
    "other": {"symbol": "pkg.other.run", "chunk_type": "function", "declaration": False},
    "doc": {"symbol": "Guide > send", "chunk_type": "section"},
    "base.init": {"symbol": "pkg.base.Base.__init__", "chunk_type": "method", "declaration": True},
    "http.init": {"symbol": "pkg.http.HTTPAdapter.__init__", "chunk_type": "method", "declaration": False},
}


def _order(fused, window=10):
    return [cid for cid, _, _ in demote_declarations(fused, ROWS.get, window)]


def test_an_implementation_moves_right_above_its_declaration():
    assert _order(_fused("base.send", "other", "doc", "http.send", "mock.send")) == \
        ["http.send", "base.send", "other", "doc", "mock.send"]
    # already below its implementation, or no implementation shown: unchanged
    assert _order(_fused("http.send", "base.send", "other")) == ["http.send", "base.send", "other"]
    assert _order(_fused("base.send", "other", "doc")) == ["base.send", "other", "doc"]


def test_demotion_keeps_scores_window_and_named_declarations():
    fused = _fused("base.send", "other", "http.send")
    out = demote_declarations(fused, ROWS.get, 10)
    assert sorted(out) == sorted(fused), "entries keep their scores and channels"
    assert _order(_fused("base.send", "other", "http.send"), window=2) == ["base.send", "other", "http.send"]
    assert _order(_fused("base.send", "http.send", exact_first="base.send")) == ["base.send", "http.send"]
    assert _order(_fused("base.init", "http.init")) == ["base.init", "http.init"], "dunders declare nothing"
    assert _order(_fused("unknown", "base.send", "http.send")) == ["unknown", "http.send", "base.send"]
