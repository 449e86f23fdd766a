"""Property-based tests (hypothesis) for the chunkers, the FTS query builder and the alias
normaliser. They extend tests/test_fts_store.py (MATCH well-formedness, idempotence, the ASCII
fast path) with properties it does not state: what any text does to a chunker, that only the
tokens of a query shape its plan, bounds on huge queries, and what a normal alias looks like."""
from __future__ import annotations

import ast
import hashlib
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtrag_resources.ingest.chunking.code import chunk_code
from mtrag_resources.ingest.chunking.docs import chunk_doc
from mtrag_resources.ingest.chunking.tokens import estimate_tokens
from mtrag_resources.stores.fts_query import MAX_PIECES, MAX_TOKENS, build_query, is_well_formed, normalize_alias

pytestmark = pytest.mark.unit

# Deterministic in CI: the examples derive from each test's name (derandomize), no example database
# carries failures from one run into the next, a fixed number of examples, no per-example deadline.
STABLE = {"derandomize": True, "database": None, "deadline": None}
FAST = settings(max_examples=120, suppress_health_check=[HealthCheck.too_slow], **STABLE)

# Characters that mean something to some parser: Markdown / rST / MyST / HTML / Python / C-like,
# line ends of every kind, a BOM, CJK and NUL. No lone surrogates: file text is decoded with
# errors="replace" (inventory.read_text), which never produces one.
SYNTAX = list("#=-~`*:._ \t\n\r{}[]()<>/\\\"'!|;,^+@$%&?aZ9") + [
    "```", ":::", "..", "::", "\r\n", "\ufeff", "\x00", "\x0c", "\u2028", "税率", "中文", "é",
    "def ", "class ", "    ", "return ", "if x:", "function f(", "fn main() {", "}", "# Title", "Title\n=====",
    ".. code-block:: python", "<h1>", "</h1>", "<pre>", "<script>", "```python", "::\n\n    ",
]
FILE_CHARS = st.characters(blacklist_categories=("Cs",))
ANY_TEXT = st.lists(st.sampled_from(SYNTAX), max_size=120).map("".join) | st.text(FILE_CHARS, max_size=400)
LINES = st.lists(st.sampled_from([
    "# Heading", "## Sub `code` here", "Text with a sentence. And another one!", "", "```", "```python",
    "    indented = 1", "def f(x):", "    return f(x)", "class C(Base):", "  def m(self): pass", ".. note::",
    "Title", "=====", "-----", "* item", "1. item", ":func:`click.echo`", "{py:class}`click.Group`",
    "<h2>Head</h2>", "<p>para</p>", "中文段落，包含税率。", "x" * 300, "word " * 80, "(" * 40, ")" * 40,
]), max_size=60).map("\n".join)
TEXTS = ANY_TEXT | LINES


def _code_lines(text: str) -> int:
    return text.removeprefix("\ufeff").count("\n") + 1


def _doc_lines(text: str) -> int:
    return text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n").count("\n") + 1


def _check_chunks(pf, n_lines: int) -> None:
    ids = [c.chunk_id for c in pf.chunks]
    assert len(ids) == len(set(ids)), "chunk ids must be unique within a file"
    by_id = {c.chunk_id: c for c in pf.chunks}
    for c in pf.chunks:
        assert 1 <= c.start_line <= c.end_line <= n_lines, (c.chunk_type, c.start_line, c.end_line, n_lines)
        assert c.role in ("parent", "child")
        assert c.content_hash == hashlib.sha256(c.text.encode("utf-8")).hexdigest()
        if c.parent_id is not None:
            assert c.parent_id in by_id, "a parent id names a chunk of the same file"
            parent = by_id[c.parent_id]
            assert parent.role == "parent"
            assert parent.start_line <= c.start_line and c.end_line <= parent.end_line, "child inside its parent"


@FAST
@given(text=TEXTS, language=st.sampled_from(["python", "javascript", "typescript", "go", "rust", "java", "c"]))
def test_chunk_code_any_text(text, language):
    pf = chunk_code("src", "pkg/mod.x", text, language)
    _check_chunks(pf, _code_lines(text))
    if not text.strip():
        assert pf.chunks == []


@FAST
@given(text=TEXTS, fmt=st.sampled_from(["markdown", "rst", "html", "text"]),
       max_tokens=st.sampled_from([16, 64, 256]))
def test_chunk_doc_any_text(text, fmt, max_tokens):
    pf = chunk_doc("docs", "guide/page.x", text, fmt, max_tokens=max_tokens)
    _check_chunks(pf, _doc_lines(text))  # HTML spans are lines of the markup, counted the same way
    for c in pf.chunks:
        if c.role == "child":
            assert estimate_tokens(c.text) <= max_tokens, (len(c.text), estimate_tokens(c.text))
            assert c.text.strip(), "no empty passages"


# ------------------------------------------------------------------------------ Python: ast path and fallback
#
# Generated modules are valid Python by construction (each is checked with ast.parse), and the
# generator knows every definition it wrote: (chunk type, qualified name, first line, last line).
# Functions inside functions fold into the enclosing one, so only module-level functions, classes
# (nested too) and the methods of classes are chunks of their own.

NAMES = st.sampled_from(["total", "rate", "apply_tax", "items", "Cart", "_private", "x1", "税率", "λ"])
EXPRS = st.sampled_from(["1", "x", "x + 1", "f(x)", "'s'", "[1, 2]", "None", "{'a': (1, 2)}", "lambda y: y",
                         '"税率 # not a comment"', "x.y(z=1)", "not x", "a if b else c", "f'{x}'"])
SIMPLE = st.one_of(EXPRS.map(lambda e: f"x = {e}"), EXPRS, st.just("pass"), st.just("import os"),
                   st.just("from .rates import RATES"), st.just("# a comment"), st.just(""),
                   EXPRS.map(lambda e: f"assert {e}"))


@st.composite
def python_module(draw, max_depth: int = 3):
    """(source, [(chunk_type, qualname, start_line, end_line)]) for a random valid module."""
    lines: list[str] = []
    defs: list[tuple[str, str, int, int]] = []

    def block(indent: int, depth: int, scope: str, prefix: str) -> None:
        """A body of 1-4 statements; scope: module, class or function (whose defs fold into it)."""
        start = len(lines)
        for _ in range(draw(st.integers(1, 4))):
            kind = draw(st.sampled_from(["simple", "simple", "def", "class", "if"] if depth < max_depth
                                        else ["simple"]))
            pad = "    " * indent
            if kind == "simple":
                line = draw(SIMPLE)
                lines.append(pad + line if line else "")
            elif kind == "if":
                lines.append(f"{pad}if x:")
                block(indent + 1, depth + 1, scope, prefix)
            else:
                name = draw(NAMES)
                first = len(lines) + 1
                if kind == "def":
                    for deco in draw(st.lists(st.sampled_from(["@staticmethod", "@cache", "@app.get('/x')"]),
                                              max_size=2)):
                        lines.append(pad + deco)
                    asynchronous = draw(st.booleans())
                    lines.append(f"{pad}{'async ' if asynchronous else ''}def {name}(a, b=1, *args, **kw):")
                    if draw(st.booleans()):
                        lines.append(pad + '    """One line of docs: 返回税率."""')
                    block(indent + 1, depth + 1, "function", prefix + name + ".")
                    ctype = "method" if scope == "class" else "function"
                else:
                    lines.append(f"{pad}class {name}({draw(st.sampled_from(['', 'Base', 'abc.ABC']))}):")
                    block(indent + 1, depth + 1, "function" if scope == "function" else "class", prefix + name + ".")
                    ctype = "class"
                if scope != "function":  # a definition ends at its last statement, not a comment
                    last = max(i for i in range(first, len(lines) + 1) if _is_code(lines[i - 1]))
                    defs.append((ctype, prefix + name, first, last))
        if not any(_is_code(ln) for ln in lines[start:]):
            lines.append("    " * indent + "pass")  # a body needs a statement

    block(0, 0, "module", "")
    text = "\n".join(lines) + "\n"
    ast.parse(text)  # the generator's promise: valid Python
    return text, defs


def _is_code(line: str) -> bool:
    return bool(line.strip()) and not line.lstrip().startswith("#")


BAD_LINES = st.sampled_from(["x = = 1", "def (:", "class :", "1 +* 2", "import", "lambda :: 1", "return return"])


def _defs_in(pf) -> list[tuple[str, str, int, int]]:
    return sorted((c.chunk_type, c.symbol.removeprefix("pkg.m."), c.start_line, c.end_line) for c in pf.chunks
                  if c.role == "child" and c.chunk_type in ("function", "method", "class"))


@FAST
@given(module=python_module())
def test_valid_python_takes_the_ast_path(module):
    """Every definition the generator wrote is a chunk with its exact span; no line windows."""
    text, defs = module
    pf = chunk_code("s", "pkg/m.py", text, "python")
    assert not any("fell back" in w for w in pf.warnings), pf.warnings
    assert "window" not in {c.chunk_type for c in pf.chunks}
    assert _defs_in(pf) == sorted(defs)
    _check_chunks(pf, _code_lines(text))
    [file_chunk] = [c for c in pf.chunks if c.chunk_type == "file"]
    assert (file_chunk.start_line, file_chunk.end_line) == (1, len(text.splitlines()))


@FAST
@given(module=python_module())
def test_chunk_ids_do_not_depend_on_line_numbers(module):
    """Blank lines inserted at the top shift every line, never an id (ids are structural)."""
    text = "def first():\n    return 1\n\n" + module[0]
    a = chunk_code("s", "m.py", text, "python")
    b = chunk_code("s", "m.py", "\n\n\n" + text, "python")
    assert not any("fell back" in w for w in a.warnings + b.warnings)
    assert [c.chunk_id for c in a.chunks] == [c.chunk_id for c in b.chunks]
    inner = [(x, y) for x, y in zip(a.chunks, b.chunks) if x.chunk_type not in ("file", "module")]
    assert inner and all(x.start_line + 3 == y.start_line and x.end_line + 3 == y.end_line for x, y in inner)


@FAST
@given(module=python_module(), bad=BAD_LINES, data=st.data())
def test_invalid_python_falls_back_to_line_windows(module, bad, data):
    """One broken line anywhere: the file is cut into overlapping line windows under the file chunk,
    with a warning that names the line; every line of the file is in a window, verbatim."""
    good, _ = module
    lines = good.splitlines() * data.draw(st.integers(1, 6), label="copies")  # often several windows
    at = data.draw(st.integers(0, len(lines)), label="insert before line")
    text = "\n".join(lines[:at] + [bad] + lines[at:]) + "\n"
    with pytest.raises(SyntaxError):
        ast.parse(text)
    pf = chunk_code("s", "pkg/m.py", text, "python")
    assert any(w.startswith(f"pkg/m.py: SyntaxError line {at + 1}:") and w.endswith("fell back to line windows")
               for w in pf.warnings), (at + 1, pf.warnings)
    _check_chunks(pf, _code_lines(text))
    [file_chunk] = [c for c in pf.chunks if c.role == "parent"]
    windows = [c for c in pf.chunks if c.role == "child"]
    assert file_chunk.chunk_type == "file" and {c.chunk_type for c in windows} == {"window"}
    assert all(w.parent_id == file_chunk.chunk_id and w.symbol == "pkg.m" for w in windows)
    all_lines = text.splitlines(keepends=True)
    covered = set()
    for w in windows:
        assert w.text == "".join(all_lines[w.start_line - 1:w.end_line])
        covered.update(range(w.start_line, w.end_line + 1))
    assert {i for i, ln in enumerate(all_lines, 1) if ln.strip()} <= covered
    assert windows[0].start_line == 1 or not "".join(all_lines[:windows[0].start_line - 1]).strip()
    assert {n.label for n in pf.nodes} <= {"File", "Module"}  # no definitions from a file that did not parse


# ------------------------------------------------------------------------------ query builder

QUERY = st.lists(st.sampled_from(list('aZ_9 "\'`\\*():^-+{}[].,;NEAROTDSLCWHRM税率内存\t\n') +
                                  ["NEAR(", " OR ", " AND ", " NOT ", "*", "^", "{a b}:", "col:", "--",
                                   "/*", "*/", "';", "DROP TABLE", "MATCH (n)", "DETACH DELETE"]),
                 max_size=40).map("".join) | st.text(max_size=80)


@settings(max_examples=300, **STABLE)
@given(q=QUERY)
def test_only_the_tokens_of_a_query_shape_its_plan(q):
    """Operators, quotes, brackets and separators cannot change the plan: it is a function of the
    query's tokens alone, so no query text is ever an FTS5 operator."""
    plan = build_query(q)
    rebuilt = build_query(" ".join(t.text for t in plan.tokens))
    assert rebuilt.tokens == plan.tokens
    for name in ("all_trigram", "all_trigram_filter", "all_cjk", "any_trigram", "any_cjk"):
        assert getattr(rebuilt, name) == getattr(plan, name), name
    for t in plan.tokens:
        assert not re.search(r"[\s\"'`*():^{}\[\]]", t.text), t


@settings(max_examples=40, **STABLE)
@given(words=st.lists(st.text(alphabet="abcdefghij_税率内存", min_size=1, max_size=12), min_size=0, max_size=400))
def test_huge_queries_are_bounded(words):
    plan = build_query(" OR ".join(words) + ' "' * 50 + "(" * 100)
    assert len(plan.tokens) <= MAX_TOKENS
    for e in (plan.all_trigram, plan.all_trigram_filter, plan.all_cjk, plan.any_trigram, plan.any_cjk):
        if e is not None:
            assert is_well_formed(e)
            assert len(re.findall(r' (?:AND|OR) ', e)) < MAX_PIECES


# ------------------------------------------------------------------------------ aliases

IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}(\.[A-Za-z_][A-Za-z0-9_]{0,8}){0,3}", fullmatch=True)


@settings(max_examples=300, **STABLE)
@given(x=st.text(max_size=60) | st.text(alphabet=st.sampled_from(list("`'\"~():#/\\ .aB_,;!?ß\u212a\u2019")), max_size=30))
def test_normal_aliases_have_no_decoration(x):
    n = normalize_alias(x)
    assert n == n.strip()
    assert n == n.casefold() or not n.isascii()
    assert "\\" not in n and "#" not in n and "::" not in n
    assert not n.endswith("()") and not n.endswith(tuple(".,;!?"))
    assert not n.startswith(("`", "'", '"', "~")) and not n.endswith(("`", "'", '"'))


@settings(max_examples=300, **STABLE)
@given(x=IDENT, role=st.sampled_from(["", ":func:", ":py:meth:", ":class:"]), tilde=st.booleans(),
       parens=st.booleans(), quote=st.sampled_from(["`", "``", "'", '"', "\u2018"]), pad=st.sampled_from(["", " ", "\t"]))
def test_decorated_identifier_normalises_to_the_plain_one(x, role, tilde, parens, quote, pad):
    plain = x.lower()
    inner = ("~" if tilde else "") + x + ("()" if parens else "")
    decorated = pad + (f"{role}`{inner}`" if role else f"{quote}{inner}{quote}") + pad
    assert normalize_alias(decorated) == plain
    assert normalize_alias(x.replace(".", "::")) == plain
    assert normalize_alias(x.upper()) == normalize_alias(x)
