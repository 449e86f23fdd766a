"""Nothing silently unsearchable (issue #14): every non-whitespace character of an indexed file is
in the text of some child chunk (the chunks that are embedded and FTS-indexed) whose line span
holds it; too-large files are reported with their size instead of vanishing."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtrag_resources.core.models import stable_id
from mtrag_resources.ingest.chunking.code import MODULE_SPAN_MAX_LINES, chunk_code
from mtrag_resources.ingest.chunking.definitions import OUTLINE_MAX_CHARS
from mtrag_resources.ingest.chunking.docs import _parse_html, chunk_doc
from mtrag_resources.ingest.chunking.pdf import chunk_pdf_text, pdf_units
from mtrag_resources.ingest.pdf import OutlineEntry, PdfText
from mtrag_resources.ingest.chunking.windows import CHAR_OVERLAP, WINDOW_MAX_CHARS
from tests.test_properties import STABLE, TEXTS, python_module

pytestmark = pytest.mark.unit

COVER = settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                 **STABLE)


def _prefix_in(piece: str, texts: list[str]) -> int:
    """Length of the longest prefix of `piece` inside one of `texts` (monotone: binary search)."""
    best = 0
    for t in texts:
        lo, hi = best, min(len(piece), len(t))
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if piece[:mid] in t:
                lo = mid
            else:
                hi = mid - 1
        best = lo
    return best


def uncovered(text: str, chunks) -> list[tuple[int, str]]:
    """(line, rest of a word) for every non-whitespace run of `text` that the children spanning its
    line do not hold; a run longer than one child (a minified line) may be spread over several."""
    lines = text.split("\n")
    spanning: list[list[str]] = [[] for _ in lines]
    for c in chunks:
        if c.role == "child":
            for n in range(c.start_line, min(c.end_line, len(lines)) + 1):
                spanning[n - 1].append(c.text)
    gaps = []
    for n, line in enumerate(lines, start=1):
        for word in line.split():
            pos = 0
            while pos < len(word):
                k = _prefix_in(word[pos:], spanning[n - 1])
                if not k:
                    gaps.append((n, word[pos:pos + 80]))
                    break
                pos += k
    return gaps


def assert_covered(text: str, pf, code: bool = True) -> None:
    seen = text.removeprefix("\ufeff")
    if not code:
        seen = seen.replace("\r\n", "\n").replace("\r", "\n")
    assert not uncovered(seen, pf.chunks), uncovered(seen, pf.chunks)[:5]
    assert not any("not searchable" in w for w in pf.warnings), pf.warnings
    ids = [c.chunk_id for c in pf.chunks]
    assert len(ids) == len(set(ids))
    for c in pf.chunks:  # windows are bounded: no child is a megabyte of one minified line
        if c.role == "child" and c.chunk_type in ("module", "window"):
            assert len(c.text) <= WINDOW_MAX_CHARS, (c.chunk_type, len(c.text))


# ------------------------------------------------------------------------------ generators
# Words are numbered, so a word found in a child is that word, not a look-alike elsewhere.

@st.composite
def long_python(draw):
    """A generated module plus any of: a block of assignments past one window, a line longer
    than a window, a class whose own body is past the outline's cap, comments among them."""
    text, _ = draw(python_module())
    parts = [text]
    if draw(st.booleans()):
        n, value = draw(st.integers(50, 400)), draw(st.sampled_from(["None", "[]", repr("v" * 30)]))
        parts.append("".join(f"SETTING_{i} = {value}  # s{i}\n" for i in range(n)))
    if draw(st.booleans()):
        size = draw(st.integers(WINDOW_MAX_CHARS, 3 * WINDOW_MAX_CHARS))
        sep = draw(st.sampled_from(["", " ", ", "]))
        parts.append("BLOB = [" + sep.join(f"w{i}" for i in range(size // 4)) + "]\n")
    if draw(st.booleans()):
        fields = draw(st.integers(100, 400))
        body = "".join(f"    # field f{i}\n    f{i}: int = {i}\n" if i % 3 == 0 else f"    f{i} = {i}\n"
                       for i in range(fields))
        parts.append(f"class Big:\n    \"\"\"Many fields.\"\"\"\n{body}    def m(self):\n        return 1\n")
    order = draw(st.permutations(parts))
    return "\n".join(order)


HEADINGS = {
    "markdown": lambda t, level: f"{'#' * level} {t}",
    "rst": lambda t, level: f"{t}\n{'=-~'[level - 1] * max(3, len(t))}",
}


@st.composite
def long_doc(draw):
    """(text, format): headings (some with nothing under them), prose, code and long lines."""
    fmt = draw(st.sampled_from(["markdown", "rst", "text"]))
    blocks, word = [], 0
    for b in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["heading", "heading", "para", "para", "code", "long"]))
        if kind == "heading" and fmt != "text":
            blocks.append(HEADINGS[fmt](f"Head{b}", draw(st.integers(1, 3))))
        elif kind == "code":
            blocks.append("```\n" + "\n".join(f"call_{b}_{i}(x)" for i in range(draw(st.integers(1, 30)))) + "\n```")
        elif kind == "long":  # one line of many sentences, or one endless word
            n = draw(st.integers(50, 800))
            blocks.append(" ".join(f"word{word + i}." for i in range(n)) if draw(st.booleans())
                          else "".join(f"x{word + i}" for i in range(n)))
            word += n
        else:
            n = draw(st.integers(1, 40))
            blocks.append(" ".join(f"w{word + i}" + ("." if i % 7 == 6 else "") for i in range(n)))
            word += n
    return "\n\n".join(blocks) + "\n", fmt


@st.composite
def minified_js(draw):
    """One line: functions, classes, variables and an IIFE, no newline anywhere."""
    parts = []
    for i in range(draw(st.integers(20, 600))):
        parts.append(draw(st.sampled_from([
            f"function f{i}(a){{return a+{i}}}", f"var v{i}={i};", f"class C{i}{{m{i}(){{return {i}}}}}",
            f"!function(){{window.g{i}={i}}}();", f"const h{i}=(x)=>x*{i};", f"o{i}.p{i}=\"s{i}\";"])))
    return "".join(parts)


# ------------------------------------------------------------------------------ properties

@COVER
@given(text=long_python())
def test_every_byte_of_a_python_file_is_in_a_child(text):
    assert_covered(text, chunk_code("s", "pkg/m.py", text, "python"))


@COVER
@given(text=TEXTS, language=st.sampled_from(["python", "javascript", "typescript", "go", "rust", "java", "c"]))
def test_every_byte_of_any_code_text_is_in_a_child(text, language):
    assert_covered(text, chunk_code("s", "pkg/mod.x", text, language))


@COVER
@given(doc=long_doc(), max_tokens=st.sampled_from([16, 64, 256]))
def test_every_byte_of_a_doc_is_in_a_child(doc, max_tokens):
    text, fmt = doc
    assert_covered(text, chunk_doc("d", "guide/page.x", text, fmt, max_tokens=max_tokens), code=False)


@COVER
@given(text=TEXTS, fmt=st.sampled_from(["markdown", "rst", "text"]), max_tokens=st.sampled_from([16, 256]))
def test_every_byte_of_any_doc_text_is_in_a_child(text, fmt, max_tokens):
    assert_covered(text, chunk_doc("d", "guide/page.x", text, fmt, max_tokens=max_tokens), code=False)


# ------------------------------------------------------------------------------ extracted text (HTML, PDF)
# An HTML file's searchable text is what the parser extracts (tags, scripts and boilerplate gone,
# entities decoded) and a PDF's is its text layer: every word of it must be in some child.

def words_not_in_children(extracted: str, chunks) -> list[str]:
    texts = [c.text for c in chunks if c.role == "child"]
    gaps = []
    for word in extracted.split():
        pos = 0
        while pos < len(word):
            k = _prefix_in(word[pos:], texts)
            if not k:
                gaps.append(word[pos:pos + 80])
                break
            pos += k
    return gaps


DROPPED = ("<script>var dropped_s = 1;</script>", "<style>.dropped_c { x: 1 }</style>",
           "<nav><a href='#'>dropped_n</a></nav>", "<footer><p>dropped_f</p></footer>",
           "<div role='navigation'><div>dropped_r</div></div>")


@st.composite
def long_html(draw):
    """An HTML page: headings h1-h6 (some empty sections), paragraphs with entities, inline code and
    line breaks, <pre> blocks, lists, long lines; and blocks that are dropped (scripts, styles,
    navigation, footers), whose words (`dropped_*`) must be in no chunk."""
    blocks, word = [], 0
    for b in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["heading", "heading", "para", "para", "pre", "list", "long", "dropped"]))
        if kind == "heading":
            level = draw(st.integers(1, 6))
            blocks.append(f"<h{level}>Head{b} &amp; co</h{level}>")
        elif kind == "pre":
            lines = "\n".join(f"call_{b}_{i}(x) &lt; {i}" for i in range(draw(st.integers(1, 30))))
            blocks.append(f"<pre><code>{lines}\n</code></pre>")
        elif kind == "list":
            blocks.append("<ul>" + "".join(f"<li>item{word + i}</li>" for i in range(draw(st.integers(1, 8)))) + "</ul>")
            word += 8
        elif kind == "long":
            n = draw(st.integers(50, 800))
            blocks.append("<p>" + (" ".join(f"word{word + i}." for i in range(n)) if draw(st.booleans())
                                   else "".join(f"x{word + i}" for i in range(n))) + "</p>")
            word += n
        elif kind == "dropped":
            blocks.append(draw(st.sampled_from(DROPPED)))
        else:
            n = draw(st.integers(1, 40))
            parts = [f"w{word + i}" + ("." if i % 7 == 6 else "") for i in range(n)]
            if n > 3:
                parts[1] = f"<code>ident_{word}</code>"
                parts[2] = f"caf&eacute;{word}<br>"
            blocks.append("<p>" + " ".join(parts) + "</p>")
            word += n
    return "<html><head><title>T</title></head><body>\n" + "\n".join(blocks) + "\n</body></html>\n"


@COVER
@given(html=long_html(), max_tokens=st.sampled_from([16, 64, 256]))
def test_every_byte_of_an_html_files_text_is_in_a_child(html, max_tokens):
    extracted = _parse_html(html)[0]
    pf = chunk_doc("d", "site/page.html", html, "html", max_tokens=max_tokens)
    assert not words_not_in_children(extracted, pf.chunks), words_not_in_children(extracted, pf.chunks)[:5]
    assert "dropped_" not in extracted and not any("dropped_" in c.text for c in pf.chunks)
    assert "&amp;" not in extracted and "&eacute;" not in extracted  # entities decoded
    assert len({c.chunk_id for c in pf.chunks}) == len(pf.chunks)


@st.composite
def pdf_text(draw):
    """A PDF's text layer: pages of numbered words (some empty, some with long lines), an outline
    whose titles are on their page, missing from it, or repeated."""
    pages, word = [], 0
    for _ in range(draw(st.integers(1, 8))):
        lines = []
        for _ in range(draw(st.integers(0, 30))):
            n = draw(st.integers(1, 60))
            lines.append(" ".join(f"p{word + i}" for i in range(n)))
            word += n
        pages.append("\n".join(lines))
    outline = []
    for i in range(draw(st.integers(0, 6))):
        page = draw(st.integers(0, len(pages) - 1))
        present = draw(st.booleans()) and pages[page]
        title = pages[page].split()[draw(st.integers(0, len(pages[page].split()) - 1))] if present else f"Chapter {i}"
        outline.append(OutlineEntry(title, draw(st.integers(1, 3)), page))
    return PdfText(pages, sorted(outline, key=lambda e: e.page))


@COVER
@given(pdf=pdf_text(), max_tokens=st.sampled_from([16, 64, 256]))
def test_every_byte_of_a_pdfs_text_layer_is_in_a_child_of_its_page(pdf, max_tokens):
    pf = chunk_pdf_text("d", "docs/m.pdf", pdf, "0" * 64, max_tokens=max_tokens)
    kids = [c for c in pf.chunks if c.role == "child"]
    for number, text in enumerate(pdf.pages, start=1):
        on_page = [c for c in kids if c.page == number]
        assert not words_not_in_children(text, on_page), (number, words_not_in_children(text, on_page)[:5])
    work, _, page_of = pdf_units(pdf)
    for c in kids:  # a child's text is on its page alone
        start = work.index(c.text)
        assert page_of(start) == page_of(start + len(c.text) - 1) == c.page
    assert len({c.chunk_id for c in pf.chunks}) == len(pf.chunks)


@settings(max_examples=20, suppress_health_check=[HealthCheck.too_slow], **STABLE)
@given(js=minified_js(), python_line=st.integers(200, 3000), newline=st.booleans())
def test_every_byte_of_a_one_line_file_is_in_a_child(js, python_line, newline):
    end = "\n" if newline else ""
    assert_covered(js + end, chunk_code("s", "web/app.min.js", js + end, "javascript"))
    one_line = "; ".join(f"A{i} = {i}" for i in range(python_line)) + end  # assignments on one line
    assert_covered(one_line, chunk_code("s", "pkg/flat.py", one_line, "python"))
    assert_covered(js + end, chunk_doc("d", "notes/min.txt", js + end, "text"), code=False)


# ------------------------------------------------------------------------------ explicit cases

def _global_settings(n: int = 200) -> str:
    """A module like django/conf/global_settings.py: 25,000 chars of commented assignments."""
    out = ['"""Default settings. Override these with settings in the module named by DJANGO_SETTINGS_MODULE."""\n',
           "\n\ndef gettext_noop(s):\n    return s\n\n\n"]
    for i in range(n):
        out.append(f"# Setting number {i}: what it does and why it defaults to this value.\n")
        out.append(f"SETTING_{i} = {{'name': 'value_{i}', 'items': [{i}, {i + 1}]}}\n\n")
    return "".join(out)


def test_a_25000_char_settings_module_is_windowed_whole():
    text = _global_settings()
    assert 25_000 <= len(text) < 27_000
    pf = chunk_code("django", "django/conf/global_settings.py", text, "python")
    assert_covered(text, pf)
    modules = [c for c in pf.chunks if c.chunk_type == "module"]
    assert len(modules) > 6 and all(len(c.text) <= WINDOW_MAX_CHARS for c in modules)
    assert all(c.role == "child" and c.symbol == "django.conf.global_settings" and c.parent_id == pf.chunks[0].chunk_id
               for c in modules)
    # every assignment, verbatim, in a window that spans its line; windows overlap by lines
    lines = text.splitlines(keepends=True)
    for n, line in enumerate(lines, start=1):
        if line.startswith("SETTING_"):
            assert any(c.start_line <= n <= c.end_line and line in c.text for c in modules), n
    # the docstring is a part of its own (a function lies between it and the settings); the
    # settings' windows overlap by lines, and no part spans more lines than it may
    assert modules[0].end_line < 4 < modules[1].start_line
    assert all(b.start_line <= a.end_line for a, b in zip(modules[1:], modules[2:]))
    assert all(c.end_line - c.start_line < MODULE_SPAN_MAX_LINES for c in modules)
    # part 1 keeps the id of the one module chunk a short module has; the others add their index
    base = ("django", "django/conf/global_settings.py", "module", "child", "django.conf.global_settings", 1)
    assert [c.chunk_id for c in modules] == [stable_id(*base)] + [stable_id(*base, i) for i in range(2, len(modules) + 1)]
    short = chunk_code("django", "django/conf/global_settings.py", _global_settings(3), "python")
    assert [c.chunk_id for c in short.chunks if c.chunk_type == "module"] == [stable_id(*base)]
    assert not any("not searchable" in w for w in pf.warnings)


def test_window_ids_and_texts_survive_an_unrelated_edit():
    text = _global_settings()
    pf = chunk_code("s", "conf.py", text, "python")
    edited = chunk_code("s", "conf.py", text.replace("    return s\n", "    return s.strip()  # edited\n"), "python")
    windows = [(c.chunk_id, c.content_hash) for c in pf.chunks if c.chunk_type == "module"]
    assert windows == [(c.chunk_id, c.content_hash) for c in edited.chunks if c.chunk_type == "module"]
    grown = chunk_code("s", "conf.py", text + "\n\ndef added():\n    return 2\n", "python")
    assert windows == [(c.chunk_id, c.content_hash) for c in grown.chunks if c.chunk_type == "module"]


def test_a_line_longer_than_a_window_is_cut_with_overlap():
    words = "".join(f"t{i:05d}" for i in range(3_000))  # 18,000 chars, no space to cut at
    text = f"DATA = '{words}'\n"
    pf = chunk_code("s", "blob.py", text, "python")
    pieces = [c.text for c in pf.chunks if c.chunk_type == "module"]
    assert len(pieces) == 5 and all(len(p) <= WINDOW_MAX_CHARS for p in pieces)
    assert all(a[-CHAR_OVERLAP:] == b[:CHAR_OVERLAP] for a, b in zip(pieces, pieces[1:]))
    assert pieces[0].startswith("DATA = '") and pieces[-1].endswith("'\n")
    # any run of up to CHAR_OVERLAP chars is whole in some piece, wherever the cuts fall
    for start in range(0, len(text) - CHAR_OVERLAP, 997):
        assert any(text[start:start + CHAR_OVERLAP] in p for p in pieces), start


def test_class_body_past_the_outline_cap_goes_into_more_class_children():
    fields = "".join(f"    #: doc of field_{i}\n    field_{i} = models.CharField(max_length={i})\n" for i in range(150))
    text = f"class Model(Base):\n    \"\"\"Fields.\"\"\"\n{fields}\n    def save(self):\n        return 1\n"
    pf = chunk_code("s", "app/models.py", text, "python")
    assert_covered(text, pf)
    classes = [c for c in pf.chunks if c.chunk_type == "class" and c.role == "child"]
    [parent] = [c for c in pf.chunks if c.chunk_type == "class" and c.role == "parent"]
    assert len(classes) > 1 and len(classes[0].text) <= OUTLINE_MAX_CHARS + 10
    assert "#: doc of field_0" in classes[0].text and "def save(self):" in next(
        c.text for c in pf.chunks if c.chunk_type == "method")  # a member is in its own child
    assert parent.parent_id == pf.chunks[0].chunk_id  # the class parent and its children hang from the file
    assert all(c.parent_id == parent.parent_id and c.symbol == "app.models.Model" and c.embed_text for c in classes)
    assert "field_149 = models.CharField(max_length=149)" in classes[-1].text
    # a short class has exactly one class child: its outline, comments included
    small = chunk_code("s", "app/models.py", "class M:\n    # why\n    x = 1\n    if X:\n        y = 2\n", "python")
    [outline] = [c for c in small.chunks if c.chunk_type == "class" and c.role == "child"]
    assert "# why" in outline.text and "y = 2" in outline.text


def test_a_heading_only_section_gets_a_passage():
    pf = chunk_doc("d", "guide.md", "# Guide\n\n## Empty chapter\n\n## Install\n\nRun pip.\n", "markdown")
    passages = {c.symbol: c.text for c in pf.chunks if c.role == "child"}
    assert passages == {"Guide": "# Guide", "Guide > Empty chapter": "## Empty chapter",
                        "Guide > Install": "## Install\n\nRun pip."}


# ------------------------------------------------------------------------------ too large to index

def test_a_file_over_max_file_bytes_is_reported_with_its_size(tmp_path, monkeypatch):
    from mtrag_resources.core.config import Settings
    from mtrag_resources.ingest.sources import load_sources
    from mtrag_resources.stages.raw_source import build_raw_source
    src = tmp_path / "src"
    src.mkdir()
    (src / "small.py").write_text("x = 1\n")
    (src / "big.py").write_text("y = 2\n" * 500)  # 3,000 bytes
    for i in range(60):  # more skipped files than `skipped_reasons` lists
        (src / f"data{i:02d}.bin").write_bytes(b"\0")
    sources = tmp_path / "sources.yaml"
    sources.write_text("sources:\n  - {id: s, kind: code, path: src, include: ['**'], max_file_bytes: 1000}\n")
    monkeypatch.setenv("MTRAG_HOME", str(tmp_path / "home"))
    settings_ = Settings(home=tmp_path / "home", sources=sources).ensure()
    [spec] = load_sources(sources)
    result = build_raw_source(settings_, spec)
    big = next(f for f in result.value.files if f.path == "big.py")
    assert (big.status, big.size, big.reason) == ("skipped", 3000, "larger than max_file_bytes (3000 > 1000)")
    assert result.metadata["skipped_too_large"] == {"big.py": 3000}
    assert result.metadata["files"] == 1 and result.metadata["skipped"] == 61
    on_disk = json.loads(next((tmp_path / "home").rglob("inventory.json")).read_text())
    assert {"path": "big.py", "size": 3000, "status": "skipped"}.items() <= next(
        f for f in on_disk["files"] if f["path"] == "big.py").items()


def test_a_module_chunk_spans_only_the_lines_it_holds():
    """A module header and a comment 300 lines further down (between two functions) are not one
    chunk claiming lines 1-300: each part spans the lines it holds."""
    body = "".join(f"    x{i} = {i}\n" for i in range(140))
    text = ('"""A module: its docstring and imports."""\nimport os\n\n\ndef first():\n' + body
            + "\n\n# a comment between two functions\n\n\ndef second():\n" + body + "\n\nLAST = 1\n")
    pf = chunk_code("s", "pkg/far.py", text, "python")
    assert_covered(text, pf)
    modules = [c for c in pf.chunks if c.chunk_type == "module"]
    assert [c.start_line for c in modules] == [1, text[:text.index("# a comment")].count("\n") + 1,
                                                text.count("\n")]
    assert all(c.end_line - c.start_line < 5 for c in modules)
