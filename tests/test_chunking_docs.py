"""Doc chunking: headings per format, parent/child packing, stable ids, graph, references, CJK."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from mtrag_resources.ingest.chunking.docs import FORMAT_BY_SUFFIX, chunk_doc, format_for_path
from mtrag_resources.ingest.chunking.tokens import estimate_tokens, split_sentences
from mtrag_resources.core.models import stable_id
from tests.conftest import CJK_DOCS

pytestmark = pytest.mark.unit

# Chinese technical articles of the tests' own (tests/data/cjk): headings, long one-line paragraphs,
# a sentence longer than 64 tokens, and code identifiers inside Chinese sentences.
SEEDS = sorted(CJK_DOCS.glob("*.md"))


def parents(pf):
    return [c for c in pf.chunks if c.role == "parent"]


def children(pf):
    return [c for c in pf.chunks if c.role == "child"]


def refs_by_target(pf):
    return {r.target: r for r in pf.references}


# ---------------------------------------------------------------- tokens

def test_estimate_tokens_counts_cjk_words_and_punctuation():
    assert estimate_tokens("") == 0
    assert estimate_tokens("中文检索") == 4                   # one per ideograph
    assert estimate_tokens("hello world") == 2
    assert estimate_tokens("internationalization") == 1 + 20 // 6
    assert estimate_tokens("best_by_id") == 5                  # `_` is punctuation for WordPiece
    assert estimate_tokens("a.b()") == 5
    assert estimate_tokens("カタカナ 한국어") == 7


def test_split_sentences_english_and_cjk():
    text = "Call click.echo() here. Pi is 3.14 today! Is a.b.c split? No.\n1. item one"
    assert split_sentences(text) == [
        "Call click.echo() here.", "Pi is 3.14 today!", "Is a.b.c split?", "No.", "1. item one",
    ]
    zh = "向量库负责召回。图库负责结构！为什么？因为“证据。”best_by_id 保留；最后一句"
    assert split_sentences(zh) == [
        "向量库负责召回。", "图库负责结构！", "为什么？", "因为“证据。”", "best_by_id 保留；", "最后一句",
    ]
    assert split_sentences("e.g. this stays whole. Next") == ["e.g. this stays whole.", "Next"]


def test_format_by_suffix():
    assert FORMAT_BY_SUFFIX[".md"] == FORMAT_BY_SUFFIX[".myst"] == "markdown"
    assert FORMAT_BY_SUFFIX[".rst"] == "rst" and FORMAT_BY_SUFFIX[".htm"] == "html"
    assert format_for_path("docs/INDEX.HTML") == "html"
    assert format_for_path("LICENSE") == format_for_path("notes.cfg") == "text"


# ---------------------------------------------------------------- Markdown

MD = """\
# Guide

Intro paragraph.

## Install

Run the installer.

```bash
# this is a shell comment, not a heading
pip install thing
```

~~~
## also not a heading
~~~

### Linux

Use the package manager.

Setext Title
============

Under setext.

Sub Setext
----------

Deep text.
"""


def test_markdown_heading_paths_setext_and_fences():
    pf = chunk_doc("s", "docs/guide.md", MD, "markdown")
    syms = [c.symbol for c in parents(pf)]
    assert syms == [
        "Guide", "Guide > Install", "Guide > Install > Linux", "Setext Title", "Setext Title > Sub Setext",
    ]
    install = next(c for c in parents(pf) if c.symbol == "Guide > Install")
    assert "# this is a shell comment" in install.text and "## also not a heading" in install.text
    assert (install.start_line, install.end_line) == (5, 16)
    assert install.title == "Install" and install.summary == "Run the installer."
    kid = next(c for c in children(pf) if c.symbol == "Guide > Install > Linux")
    assert kid.parent_id == next(c.chunk_id for c in parents(pf) if c.symbol == kid.symbol)
    assert (kid.start_line, kid.end_line) == (18, 20)
    assert kid.locator == "docs/guide.md > Guide > Install > Linux:18-20"
    assert kid.language == "markdown" and kid.source_id == "s" and kid.content_hash


def test_graph_pages_sections_and_contains():
    pf = chunk_doc("s", "docs/guide.md", MD, "markdown")
    page = next(n for n in pf.nodes if n.label == "Page")
    assert page.node_id == "s:page:docs/guide.md" and page.name == "Guide"
    assert page.qualified_name == "docs/guide.md" and page.chunk_id == parents(pf)[0].chunk_id
    sec_ids = {n.qualified_name: n.node_id for n in pf.nodes if n.label == "Section"}
    linux = "s:section:docs/guide.md#Guide > Install > Linux"
    assert sec_ids["docs/guide.md#Guide > Install > Linux"] == linux
    edges = {(r.src_id, r.dst_id) for r in pf.relations}
    assert (page.node_id, "s:section:docs/guide.md#Guide") in edges
    assert (page.node_id, "s:section:docs/guide.md#Setext Title") in edges
    assert ("s:section:docs/guide.md#Guide > Install", linux) in edges
    assert (page.node_id, linux) not in edges and len(edges) == 5
    rel = next(r for r in pf.relations if r.dst_id == linux)
    assert rel.rel_type == "CONTAINS" and rel.confidence == "VERIFIED"
    assert rel.rel_id == stable_id("CONTAINS", rel.src_id, rel.dst_id)
    assert (rel.evidence_file, rel.evidence_start, rel.evidence_end) == ("docs/guide.md", 18, 18)
    assert rel.evidence_hash
    for c in pf.chunks:
        assert c.graph_ids == [sec_ids[f"docs/guide.md#{c.symbol}"]]


def test_ids_stable_when_a_section_is_inserted_before():
    before = chunk_doc("s", "a.md", MD, "markdown")
    inserted = MD.replace("## Install", "## Brand new\n\nNew words here.\n\n## Install")
    after = chunk_doc("s", "a.md", inserted, "markdown")
    old_ids = {c.chunk_id: c.symbol for c in before.chunks}
    new_ids = {c.chunk_id: c.symbol for c in after.chunks}
    assert old_ids and set(old_ids) <= set(new_ids)            # every old id survives
    assert set(new_ids) - set(old_ids) and all(new_ids[i] == "Guide > Brand new" for i in set(new_ids) - set(old_ids))
    # ...while the lines did move.
    linux_old = next(c for c in before.chunks if c.symbol.endswith("Linux") and c.role == "child")
    linux_new = next(c for c in after.chunks if c.chunk_id == linux_old.chunk_id)
    assert linux_new.start_line == linux_old.start_line + 4


def test_repeated_heading_paths_get_distinct_ids_and_node_suffix():
    pf = chunk_doc("s", "r.md", "# A\n\n## Notes\n\nx.\n\n## Notes\n\ny.\n", "markdown")
    notes = [c for c in parents(pf) if c.symbol == "A > Notes"]
    assert len(notes) == 2 and notes[0].chunk_id != notes[1].chunk_id
    ids = [n.node_id for n in pf.nodes if n.name == "Notes"]
    assert ids == ["s:section:r.md#A > Notes", "s:section:r.md#A > Notes#2"]


def test_preamble_section_and_plain_text_page():
    pf = chunk_doc("s", "p.md", "Some lead text.\n\n# Real Title\n\nBody.\n", "markdown")
    first = parents(pf)[0]
    assert first.title == "Real Title" and first.symbol == "Real Title" and "lead" in first.text
    assert [c.symbol for c in parents(pf)] == ["Real Title", "Real Title"]
    assert len({c.chunk_id for c in parents(pf)}) == 2
    txt = chunk_doc("s", "notes/readme.txt", "One para.\n\nTwo para.\n# not a heading\n", "text")
    assert [c.title for c in parents(txt)] == ["readme.txt"]
    assert [c.text for c in children(txt)] == ["One para.\n\nTwo para.\n# not a heading"]


def test_rst_label_above_title_is_not_a_preamble():
    pf = chunk_doc("s", "x.rst", ".. _intro:\n\nIntro\n=====\n\nText.\n", "rst")
    assert [(c.symbol, c.start_line) for c in parents(pf)] == [("Intro", 1)]


# ---------------------------------------------------------------- packing

def test_long_paragraph_split_on_sentences_within_bound():
    sentences = [f"Sentence number {i} talks about click.Context objects at length." for i in range(60)]
    text = "# Long\n\n" + " ".join(sentences) + "\n"
    pf = chunk_doc("s", "l.md", text, "markdown", max_tokens=64)
    kids = children(pf)
    assert len(kids) > 3
    for kid in kids:
        assert estimate_tokens(kid.text) <= 64
        assert kid.text.endswith("length.")                   # whole sentences only
    body = " ".join(k.text for k in kids).replace("# Long", "")
    assert " ".join(body.split()) == " ".join(sentences)
    assert kids[1].summary.startswith("Sentence number") and kids[1].summary.endswith("length.")


def test_code_block_whole_when_it_fits_and_split_by_lines_otherwise():
    small = "```python\n" + "\n".join(f"x{i} = {i}" for i in range(10)) + "\n```"
    big = "```python\n" + "\n".join(f"value_{i} = compute({i})" for i in range(200)) + "\n```"
    text = "# Code\n\n" + "word " * 40 + "\n\n" + small + "\n\n" + big + "\n"
    pf = chunk_doc("s", "c.md", text, "markdown", max_tokens=60)
    kids = children(pf)
    assert any(k.text == small for k in kids) or any(small in k.text for k in kids)
    big_parts = [k for k in kids if "value_" in k.text]
    assert len(big_parts) > 2
    for k in kids:
        assert estimate_tokens(k.text) <= 60
    for k in big_parts:   # split on line ends, never inside a line
        lines = [ln for ln in k.text.split("\n") if "value_" in ln or "compute" in ln]
        assert lines and all(re.fullmatch(r"value_\d+ = compute\(\d+\)", ln) for ln in lines)


def test_parent_truncated_with_warning():
    text = "# Big\n\n" + ("Many words in a sentence here. " * 400) + "\n"
    pf = chunk_doc("s", "b.md", text, "markdown")
    assert len(parents(pf)[0].text) == 8000 and pf.warnings
    assert all(estimate_tokens(k.text) <= 256 for k in children(pf))


# ---------------------------------------------------------------- reStructuredText

RST = """\
.. currentmodule:: click

==========
User Guide
==========

Welcome.

Commands
========

Use :func:`~click.command` or :py:class:`the group <click.Group>` and ``Context.invoke()``.
Run ``pip install click`` and see `echo`.

Nested
------

.. autofunction:: click.echo

Example::

    x = `not_a_ref`
    :func:`also_not`

Options
=======

.. currentmodule:: click.testing

.. autoclass:: CliRunner
   :members:

:meth:`invoke` text.
"""


def test_rst_heading_paths_and_levels():
    pf = chunk_doc("s", "guide.rst", RST, "rst")
    assert [c.symbol for c in parents(pf)] == [
        "User Guide", "User Guide > Commands", "User Guide > Commands > Nested", "User Guide > Options",
    ]
    assert parents(pf)[0].start_line == 1  # the currentmodule directive joins the first section
    nested = next(c for c in children(pf) if c.symbol.endswith("Nested"))
    assert "Example::" in nested.text and ":func:`also_not`" in nested.text


def test_rst_references_roles_directives_and_literals():
    """Without an object default role (conf.py's) backticks are literals: ``Context.invoke()`` and
    `echo` name nothing; under `py:obj` the interpreted text `echo` is a reference, ``...`` never."""
    pf = chunk_doc("s", "guide.rst", RST, "rst")
    got = [(r.ref_kind, r.role, r.target, r.module_context) for r in pf.references]
    assert got == [
        ("role", "func", "click.command", "click"),
        ("role", "class", "click.Group", "click"),
        ("directive", "autofunction", "click.echo", "click"),
        ("directive", "autoclass", "CliRunner", "click.testing"),
        ("role", "meth", "invoke", "click.testing"),
    ]
    obj = chunk_doc("s", "guide.rst", RST, "rst", default_role="py:obj")
    assert [(r.ref_kind, r.role, r.target) for r in obj.references][2] == ("role", "obj", "echo")
    assert len(obj.references) == len(pf.references) + 1
    by = refs_by_target(pf)
    assert by["click.command"].matched_text == ":func:`~click.command`"
    assert by["click.Group"].matched_text == ":py:class:`the group <click.Group>`"
    assert by["click.command"].line == 12 and by["CliRunner"].line == 30
    nested = next(c for c in children(pf) if c.symbol.endswith("Nested"))
    assert by["click.echo"].chunk_id == nested.chunk_id
    assert all(r.source_id == "s" and r.file_path == "guide.rst" for r in pf.references)


# ---------------------------------------------------------------- MyST (a click-docs-like excerpt)

MYST = """\
(api)=

# API

```{currentmodule} click
```

This part of the documentation lists the full API reference.

## Decorators

```{eval-rst}
.. autofunction:: command
```

```{autofunction} click.group
```

## Utilities

Use {func}`~click.echo` rather than `print()`; see {meth}`invoke <Context.invoke>`
and {class}`Context`. The `make_pass_decorator` helper and ``click.get_current_context()``
are identifiers; `pip install click`, `--help`, `pyproject.toml`, `None` and `a sentence here` are not.
Roles like {ref}`arguments` or {doc}`options` are not code.

```{note}
Call {func}`open_file` for files; `click.File` is a type.
```

```python
# no heading here and no `ref_in_code`
@click.command()
def hello():
    click.echo(f"{func}`x` `y`")
```

```{code-block} python
`nor_here`
```
"""


def test_myst_directives_roles_and_code_spans():
    """MyST inline code is a literal whatever the default role; where code spans do name code
    (code_spans: an issue tracker's Markdown) only identifier-like ones count."""
    pf = chunk_doc("click", "docs/api.md", MYST, "markdown", default_role="py:obj")
    assert [c.symbol for c in parents(pf)] == ["API", "API > Decorators", "API > Utilities"]
    assert [(r.ref_kind, r.role, r.target) for r in pf.references] == [
        ("directive", "autofunction", "command"),
        ("directive", "autofunction", "click.group"),
        ("role", "func", "click.echo"),
        ("role", "meth", "Context.invoke"),
        ("role", "class", "Context"),
        ("role", "func", "open_file"),
    ]
    spans = chunk_doc("click", "docs/api.md", MYST, "markdown", code_spans=True)
    got = [(r.ref_kind, r.role, r.target) for r in spans.references]
    assert got == [
        ("directive", "autofunction", "command"),
        ("directive", "autofunction", "click.group"),
        ("role", "func", "click.echo"),
        ("code_span", "", "print"),
        ("role", "meth", "Context.invoke"),
        ("role", "class", "Context"),
        ("code_span", "", "make_pass_decorator"),
        ("code_span", "", "click.get_current_context"),
        ("role", "func", "open_file"),
        ("code_span", "", "click.File"),
    ]
    assert {r.module_context for r in pf.references} == {"click"}
    cmd = refs_by_target(pf)["command"]
    assert cmd.matched_text == ".. autofunction:: command" and cmd.line == 13
    decorators = next(c for c in children(pf) if c.symbol == "API > Decorators")
    assert cmd.chunk_id == decorators.chunk_id
    assert refs_by_target(pf)["click.echo"].matched_text == "{func}`~click.echo`"


def test_myst_module_context_changes_and_resets():
    text = "# A\n\n{func}`first`\n\n```{currentmodule} pkg.sub\n```\n\n{func}`second`\n\n" \
           "```{eval-rst}\n.. currentmodule:: None\n```\n\n{func}`third`\n"
    pf = chunk_doc("s", "m.md", text, "markdown")
    assert [(r.target, r.module_context) for r in pf.references] == [
        ("first", ""), ("second", "pkg.sub"), ("third", ""),
    ]


# ---------------------------------------------------------------- HTML

HTML = """\
<html>
<head><title>Ignored title</title>
<style>h1 { color: red; }</style>
<script>var x = "<h2>fake</h2>";</script>
</head>
<body>
<h1>Click Docs<a class="headerlink" href="#x">¶</a></h1>
<p>Intro text about
<code>click.echo</code> usage.</p>
<h2>Options</h2>
<p>Options are
added with decorators.</p>
<pre>
@click.option("--n")
def f(n): pass
</pre>
<h3>Types &amp; Choices<a class="headerlink" href="#t">#</a></h3>
<ul><li>First item.</li><li>Second item.</li></ul>
</body>
</html>
"""


def test_html_headings_text_and_lines():
    pf = chunk_doc("s", "site/index.html", HTML, "html")
    assert [c.symbol for c in parents(pf)] == [
        "Click Docs", "Click Docs > Options", "Click Docs > Options > Types & Choices",
    ]
    joined = "\n".join(c.text for c in pf.chunks)
    assert "color: red" not in joined and "fake" not in joined and "Ignored title" not in joined
    options = next(c for c in children(pf) if c.symbol == "Click Docs > Options")
    assert "Options are added with decorators." in options.text
    assert '@click.option("--n")\ndef f(n): pass' in options.text
    assert (options.start_line, options.end_line) == (10, 15)
    types = next(c for c in children(pf) if c.symbol.endswith("Choices"))
    assert "First item.\n\nSecond item." in types.text and types.start_line == 17
    ref = pf.references[0]
    assert (ref.ref_kind, ref.target, ref.line) == ("code_span", "click.echo", 9)
    assert len(pf.references) == 1  # code inside <pre> is no reference


# ---------------------------------------------------------------- Chinese documents

_SENT_END = "。！？；．.!?"
_CLOSE = "\"'”’」』）)]"
_WORD = re.compile(r"[A-Za-z0-9_]")


def _sentence_of(text: str, offset: int) -> str:
    """The sentence (by split_sentences) of the paragraph holding `offset` that contains it."""
    start = text.rfind("\n\n", 0, offset) + 2 if "\n\n" in text[:offset] else 0
    stop = text.find("\n\n", offset)
    para = text[start:stop if stop >= 0 else len(text)]
    pos = 0
    for s in split_sentences(para):
        at = para.find(s, pos)
        if at <= offset - start <= at + len(s):
            return s
        pos = at + len(s)
    return para


@pytest.mark.parametrize("max_tokens", [256, 64])
@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: p.stem)
def test_chinese_seed_boundaries(seed: Path, max_tokens: int):
    text = seed.read_text(encoding="utf-8")
    pf = chunk_doc("seeds", seed.name, text, "text", max_tokens=max_tokens)
    kids = children(pf)
    assert len(parents(pf)) == 1 and parents(pf)[0].title == seed.name
    norm = lambda s: re.sub(r"\s+", "", s)  # noqa: E731
    assert norm("".join(k.text for k in kids)) == norm(text)     # nothing lost, nothing doubled
    pos = 0
    for kid in kids:
        assert estimate_tokens(kid.text) <= max_tokens
        start = text.index(kid.text, pos)
        end = pos = start + len(kid.text)
        lines = text[:start].count("\n") + 1, text[:end].count("\n") + 1
        assert (kid.start_line, kid.end_line) == lines
        # Never inside an identifier like best_by_id / edge_hit_map.
        assert not (start > 0 and _WORD.match(text[start - 1]) and _WORD.match(text[start]))
        assert not (end < len(text) and _WORD.match(text[end - 1]) and _WORD.match(text[end]))
        rest = text[end:]
        if not rest.strip() or re.match(r"[ \t]*\n[ \t]*\n", rest):
            continue  # ends a paragraph
        # Mid-paragraph ends fall on sentence punctuation unless that sentence alone overflows.
        if kid.text.rstrip(_CLOSE)[-1:] not in _SENT_END:
            assert estimate_tokens(_sentence_of(text, end - 1)) > max_tokens
    for ident in IDENTIFIERS:
        assert text.count(ident) == sum(k.text.count(ident) for k in kids)
    if seed.name == "vector_search.md":
        assert text.count("best_by_id") > 0 and text.count("edge_hit_map") > 0


IDENTIFIERS = ("best_by_id", "edge_hit_map", "lookup_rate", "apply_tax", "ShopCart", "write_source")


@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: p.stem)
def test_chinese_markdown_headings_and_passages(seed: Path):
    """The same documents as Markdown: one parent per heading, named by its Chinese heading path,
    and passages that keep every character of the body within the token bound."""
    text = seed.read_text(encoding="utf-8")
    pf = chunk_doc("docs", seed.name, text, "markdown", max_tokens=64)
    headings = [(i, ln.lstrip("#").strip(), ln.count("#", 0, ln.index(" "))) for i, ln in
                enumerate(text.splitlines(), 1) if ln.startswith("#")]
    top = headings[0][1]
    assert [(c.start_line, c.title) for c in parents(pf)] == [(i, h) for i, h, _ in headings]
    assert [c.symbol for c in parents(pf)] == [top] + [f"{top} > {h}" for _, h, level in headings[1:]]
    norm = lambda s: re.sub(r"\s+", "", s)  # noqa: E731
    assert norm("".join(k.text for k in children(pf))) == norm(text)  # a section's first passage has its heading
    assert all(estimate_tokens(k.text) <= 64 for k in children(pf))
    by_id = {c.chunk_id: c for c in pf.chunks}
    for kid in children(pf):
        owner = by_id[kid.parent_id]
        assert owner.start_line <= kid.start_line <= kid.end_line <= owner.end_line
        assert kid.symbol == owner.symbol


def test_seed_corpus_is_present():
    # The tests above are parametrised over these files; an empty set must fail, not skip.
    assert len(SEEDS) >= 3, f"no Chinese documents under {CJK_DOCS}"
    texts = {p.name: p.read_text(encoding="utf-8") for p in SEEDS}
    paragraphs = [para for t in texts.values() for para in t.split("\n\n")]
    sentences = [s for para in paragraphs for s in split_sentences(para)]
    # What the boundary test needs to meet: a paragraph split at sentence ends even at 256 tokens,
    # a sentence split inside itself at 64, and every identifier it watches.
    assert max(map(estimate_tokens, paragraphs)) > 256
    assert max(map(estimate_tokens, sentences)) > 64
    assert all(any(ident in t for t in texts.values()) for ident in IDENTIFIERS)
    assert all(sum(map(fts_cjk_chars, t)) > 300 for t in texts.values())  # Chinese, not English


def fts_cjk_chars(ch: str) -> int:
    return int("\u4e00" <= ch <= "\u9fff")
