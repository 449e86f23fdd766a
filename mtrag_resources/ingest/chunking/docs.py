"""Heading-aware chunking of documentation (Markdown/MyST, reStructuredText, HTML, plain text).

Each format is first parsed into a flat list of units over a working text (the source itself,
or for HTML the extracted text): headings, paragraphs, code blocks and directive blocks, each
with character offsets. Everything after that is format-free: units are grouped into sections
(one parent chunk each), and a section's units are packed into passages (child chunks) of at most
`max_tokens`, splitting a unit only when it does not fit on its own.
"""
from __future__ import annotations

import bisect
import itertools
import os
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Callable

from mtrag_resources.ingest.chunking.doc_refs import extract_references
from mtrag_resources.ingest.sphinx_conf import interpreted_role
from mtrag_resources.ingest.chunking.tokens import estimate_tokens, sentence_spans
from mtrag_resources.core.models import Chunk, DocReference, GraphNode, GraphRelation, ParsedFile, sha256_hex, stable_id

FORMAT_BY_SUFFIX = {
    ".md": "markdown", ".markdown": "markdown", ".myst": "markdown",
    ".rst": "rst", ".html": "html", ".htm": "html", ".txt": "text", "": "text",
}
# A parent holds a whole section for context; past this it would crowd out the question and the
# other hits in an LLM prompt, and the children already cover the rest of the section.
PARENT_MAX_CHARS = 8000
SUMMARY_MAX_CHARS = 300


def format_for_path(path: str) -> str:
    """The chunker format for a file name; anything not listed is chunked as plain text."""
    return FORMAT_BY_SUFFIX.get(os.path.splitext(path)[1].lower(), "text")


@dataclass
class _Unit:
    kind: str        # heading | para | code | block (directive body) | meta (front matter)
    start: int       # offsets into the working text, end exclusive
    end: int
    level: int = 0   # heading level, 1 = top
    title: str = ""  # heading text


@dataclass
class _Section:
    heading: _Unit | None        # None for a preamble
    path: tuple[str, ...]
    parent: "_Section | None"
    units: list[_Unit] = field(default_factory=list)
    occurrence: int = 0


def _line_starts(text: str) -> list[int]:
    starts = [0]
    for i, ch in enumerate(text):
        if ch == "\n":
            starts.append(i + 1)
    return starts


# ---------------------------------------------------------------- Markdown / MyST

_FENCE_RE = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,}|:{3,})(?P<info>.*)$")
_ATX_RE = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT_RE = re.compile(r"^ {0,3}(?:=+|-{2,})[ \t]*$")
_NOT_SETEXT_TEXT_RE = re.compile(r"^(?: {4}|\t| {0,3}(?:[-*+>|]|\d+[.)])(?:\s|$))")
# MyST directives whose body is code; every other `{directive}` fence (eval-rst, note,
# currentmodule, versionadded...) holds text and references.
_CODE_DIRECTIVES = {"code-block", "code", "sourcecode", "code-cell", "literalinclude", "math"}


def _fence_kind(fence: str, info: str) -> str | None:
    """'code' or 'block' for a fence opener, None if the line opens no fence."""
    info = info.strip()
    if info.startswith("{") and "}" in info:
        name = info[1:info.index("}")].removeprefix("py:")
        return "code" if name in _CODE_DIRECTIVES else "block"
    if fence[0] == ":" or (fence[0] == "`" and "`" in info):
        return None  # colon fences are MyST-directive only; a backtick info string has no backticks
    return "code"


def _parse_markdown(text: str) -> list[_Unit]:
    lines = text.split("\n")
    starts = _line_starts(text)
    units: list[_Unit] = []
    para: list[int] = []  # first and last line of the open paragraph

    def span(a: int, b: int) -> tuple[int, int]:
        return starts[a], starts[b] + len(lines[b])

    def flush() -> None:
        if para:
            units.append(_Unit("para", *span(para[0], para[1])))
            para.clear()

    i = 0
    if lines[0].strip() == "---":  # YAML front matter: its `---` closer is no setext underline
        close = next((j for j in range(1, len(lines)) if lines[j].strip() in ("---", "...")), None)
        if close is not None:
            units.append(_Unit("meta", *span(0, close)))
            i = close + 1
    while i < len(lines):
        line = lines[i]
        fence = _FENCE_RE.match(line)
        kind = fence and _fence_kind(fence.group("fence"), fence.group("info"))
        if kind:
            flush()
            mark = fence.group("fence")
            close_re = re.compile(rf"^ {{0,3}}{re.escape(mark[0])}{{{len(mark)},}}[ \t]*$")
            j = next((k for k in range(i + 1, len(lines)) if close_re.match(lines[k])), len(lines) - 1)
            units.append(_Unit(kind, *span(i, j)))
            i = j + 1
            continue
        atx = _ATX_RE.match(line)
        if not line.strip():
            flush()
        elif atx and atx.group(2):
            flush()
            units.append(_Unit("heading", *span(i, i), level=len(atx.group(1)), title=atx.group(2).strip()))
        elif _SETEXT_RE.match(line) and para and not _NOT_SETEXT_TEXT_RE.match(lines[para[0]]):
            title = " ".join(lines[k].strip() for k in range(para[0], i))
            level = 1 if line.strip()[0] == "=" else 2
            units.append(_Unit("heading", *span(para[0], i), level=level, title=title))
            para.clear()
        elif para:
            para[1] = i
        else:
            para[:] = [i, i]
        i += 1
    flush()
    return units


# ---------------------------------------------------------------- reStructuredText

_ADORN_RE = re.compile(r"^([!-/:-@\[-`{-~])\1+[ \t]*$")
_RST_CODE_RE = re.compile(r"^\.\.[ \t]+(?:code-block|code|sourcecode|doctest|testcode|parsed-literal)::")


def _rst_title(lines: list[str], i: int) -> tuple[str, int, tuple[str, bool]] | None:
    """(title, number of lines, adornment style) for a section title starting at line i."""
    line = lines[i]
    over = _ADORN_RE.match(line)
    if over and i + 2 < len(lines) and lines[i + 1].strip():
        under = _ADORN_RE.match(lines[i + 2])
        title = lines[i + 1].strip()
        if under and under.group(1) == over.group(1) and len(line.rstrip()) >= len(title):
            return title, 3, (over.group(1), True)
    if over or not line.strip() or line[0].isspace() or line.startswith(".. ") or i + 1 >= len(lines):
        return None
    under = _ADORN_RE.match(lines[i + 1])
    if under and len(lines[i + 1].rstrip()) >= len(line.rstrip()):
        return line.strip(), 2, (under.group(1), False)
    return None


def _parse_rst(text: str) -> list[_Unit]:
    lines = text.split("\n")
    starts = _line_starts(text)
    styles: list[tuple[str, bool]] = []  # rST levels follow the order adornment styles first appear
    units: list[_Unit] = []
    para: list[int] = []

    def end_of(b: int) -> int:
        return starts[b] + len(lines[b])

    def flush() -> None:
        if not para:
            return
        a, b = para
        para.clear()
        prev = units[-1] if units else None
        # An indented paragraph after a directive or a `::` paragraph is that block's body:
        # keep them together so a directive or a literal block is never cut from its content.
        if lines[a][:1].isspace() and prev and prev.kind != "heading":
            prev_text = text[prev.start:prev.end]
            directive = prev_text.startswith("..")
            literal = not directive and prev_text.rstrip().endswith("::")  # `Example::` + code
            if prev.kind in ("code", "block") or directive or literal:
                if prev.kind == "para":
                    prev.kind = "code" if literal or _RST_CODE_RE.match(prev_text) else "block"
                prev.end = end_of(b)
                return
        units.append(_Unit("para", starts[a], end_of(b)))

    i = 0
    while i < len(lines):
        title = _rst_title(lines, i)
        after_break = i == 0 or not lines[i - 1].strip() or (units and units[-1].kind == "heading"
                                                            and units[-1].end == end_of(i - 1))
        if title and after_break:
            flush()
            if title[2] not in styles:
                styles.append(title[2])
            n = title[1]
            units.append(_Unit("heading", starts[i], end_of(i + n - 1),
                               level=styles.index(title[2]) + 1, title=title[0]))
            i += n
            continue
        if not lines[i].strip():
            flush()
        elif para:
            para[1] = i
        else:
            para[:] = [i, i]
        i += 1
    flush()
    return units


# ---------------------------------------------------------------- plain text

def _parse_text(text: str) -> list[_Unit]:
    """No headings in plain text: paragraphs (blank-line separated) are the units."""
    return [_Unit("para", m.start(), m.end()) for m in re.finditer(r"\S(?:.*\S)?(?:\n[ \t]*\S.*)*", text)]


# ---------------------------------------------------------------- HTML

# Dropped with their content: code and styling, and a site's boilerplate around the document
# (navigation bars, footers; in Sphinx and other generators also the blocks whose ARIA role says
# so: `<div class="sphinxsidebar" role="navigation">`, `<div class="footer" role="contentinfo">`).
_HTML_SKIP = {"script", "style", "noscript", "template", "title", "svg", "nav", "footer"}
_HTML_BOILERPLATE_ROLES = {"navigation", "contentinfo", "banner", "search"}
_HTML_BLOCK = {
    "p", "div", "section", "article", "header", "aside", "main", "li", "ul", "ol",
    "dl", "dt", "dd", "table", "thead", "tbody", "tr", "td", "th", "blockquote", "figure",
    "figcaption", "form", "hr", "body", "caption", "details", "summary",
}
_HEADING_TAGS = {"h1", "h2", "h3", "h4", "h5", "h6"}


class _HTMLText(HTMLParser):
    """Extracts block-structured text from HTML, keeping for each piece the source line it came
    from (`anchors`), so chunk line numbers point back into the HTML file."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.size = 0
        self.anchors: list[tuple[int, int]] = []  # (offset in extracted text, source line)
        self.units: list[_Unit] = []
        self.skipping: list[str] = []  # tags whose content is dropped (script, headerlink <a>)
        self.pre = 0
        self.kind, self.level = "para", 0
        self.segs: list[tuple[str, int]] = []    # (text, source line) of the open block
        self.title: list[str] = []               # the <title> text (names a page without headings)

    def _open(self, kind: str, level: int = 0) -> None:
        self._close()
        self.kind, self.level = kind, level

    def _close(self) -> None:
        segs, kind, level = self.segs, self.kind, self.level
        self.segs, self.kind, self.level = [], "para", 0
        raw = "".join(t for t, _ in segs)
        stripped = raw.lstrip("\n") if kind == "code" else raw.lstrip()
        lead, body = len(raw) - len(stripped), stripped.rstrip()
        if not body:
            return
        if self.size:
            self.parts.append("\n\n")
            self.size += 2
        start, pos = self.size, -lead
        for text, line in segs:
            self.anchors.append((start + min(max(pos, 0), len(body)), line))
            pos += len(text)
        self.parts.append(body)
        self.size += len(body)
        title = body.replace("`", "").rstrip("¶ ").strip() if kind == "heading" else ""
        self.units.append(_Unit(kind, start, self.size, level, title))

    def _text(self, data: str) -> None:
        line = self.getpos()[0]
        for k, seg in enumerate(data.split("\n")):
            if self.pre:
                seg = ("\n" if k else "") + seg
            else:  # collapse whitespace like a browser, source newlines included
                seg = re.sub(r"\s+", " ", (" " if k else "") + seg)
                if seg.startswith(" ") and self.segs and self.segs[-1][0].endswith(" "):
                    seg = seg[1:]
            if seg:
                self.segs.append((seg, line + k))

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if self.skipping:
            if tag == self.skipping[-1]:  # same-name nesting, so the right end tag pops it
                self.skipping.append(tag)
            return
        attr = dict(attrs)
        headerlink = tag == "a" and "headerlink" in (attr.get("class") or "")
        boilerplate = (attr.get("role") or "").strip().lower() in _HTML_BOILERPLATE_ROLES
        if tag in _HTML_SKIP or headerlink or boilerplate:  # a headerlink's text is a "¶" or "#" glyph
            if tag in _HTML_VOID:
                return  # no end tag will pop it
            self.skipping.append(tag)
        elif tag in _HEADING_TAGS:
            self._open("heading", int(tag[1]))
        elif tag == "pre":
            self._open("code")
            self.pre += 1
        elif tag in _HTML_BLOCK:
            if not self.pre and self.kind != "heading":  # a <div> inside an <h2> stays the heading
                self._open("para")
        elif tag == "br":
            self._text("\n")
        elif tag in ("code", "tt") and not self.pre:
            self._text("`")  # keeps inline code visible to the code-span reference finder

    def handle_endtag(self, tag: str) -> None:
        if self.skipping:
            if tag == self.skipping[-1]:
                self.skipping.pop()
            return
        elif tag in _HEADING_TAGS or tag == "pre" or (tag in _HTML_BLOCK and not self.pre
                                                      and self.kind != "heading"):
            if tag == "pre":
                self.pre = max(0, self.pre - 1)
            self._close()
        elif tag in ("code", "tt") and not self.pre:
            self._text("`")

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self._text(data)
        elif self.skipping == ["title"]:
            self.title.append(data)


_HTML_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


def _parse_html(source: str) -> tuple[str, list[_Unit], Callable[[int], int], str]:
    """(extracted text, its units, offset -> line of the HTML source, the <title> text)."""
    parser = _HTMLText()
    parser.feed(source)
    parser.close()
    parser._close()
    offsets = [o for o, _ in parser.anchors]

    def line_of(offset: int) -> int:
        i = bisect.bisect_right(offsets, offset) - 1
        return parser.anchors[i][1] if i >= 0 else 1

    return "".join(parser.parts), parser.units, line_of, " ".join("".join(parser.title).split())


# ---------------------------------------------------------------- sections and passages

_PREAMBLE_MARKUP_RE = re.compile(r"^[ \t]*(?:\.\.[ \t]|\(\S+\)=[ \t]*$|%|(?:`{3,}|~{3,}|:{3,})(?:[ \t]*$|\{))")


def _is_markup(text: str, unit: _Unit) -> bool:
    """Front matter, rST labels/directives, MyST targets: markup, not a preamble of its own."""
    lines = [ln for ln in text[unit.start:unit.end].split("\n") if ln.strip()]
    if unit.kind == "meta":
        return True
    if unit.kind == "block":  # e.g. ```{currentmodule} click``` with no body
        return len(lines) <= 2
    return all(_PREAMBLE_MARKUP_RE.match(ln) for ln in lines)


def _sections(text: str, units: list[_Unit]) -> list[_Section]:
    sections: list[_Section] = []
    stack: list[_Section] = []
    pre: list[_Unit] = []
    for unit in units:
        if unit.kind == "heading":
            while stack and stack[-1].heading.level >= unit.level:
                stack.pop()
            parent = stack[-1] if stack else None
            sec = _Section(unit, (parent.path if parent else ()) + (unit.title,), parent, [unit])
            sections.append(sec)
            stack.append(sec)
        elif sections:
            sections[-1].units.append(unit)
        else:
            pre.append(unit)
    if pre:
        if sections and all(_is_markup(text, u) for u in pre):
            sections[0].units[:0] = pre  # e.g. `.. _label:` above the title belongs to it
        else:
            sections.insert(0, _Section(None, (), None, pre))
    seen: dict[tuple[str, ...], int] = {}
    for sec in sections:
        sec.occurrence = seen.get(sec.path, 0)
        seen[sec.path] = sec.occurrence + 1
    return sections


_WORDISH = re.compile(r"[A-Za-z0-9_.]")
_SOFT_BREAK = set(" \t\n，、,：:")


def _hard_split(text: str, start: int, end: int, max_tokens: int) -> list[tuple[int, int]]:
    """Character split of one over-long sentence or line, never inside an identifier-like word
    when a boundary exists, preferring a space or comma in the last third."""
    out: list[tuple[int, int]] = []
    pos = start
    while pos < end:
        # Whitespace is free in the estimate, so a token spans at most a few dozen chars in any
        # real text; the cap keeps the search linear on a megabyte-long "sentence".
        lo, hi = pos + 1, min(end, pos + 64 * max_tokens)
        while lo < hi:  # longest prefix within the bound; the estimate grows with the prefix
            mid = (lo + hi + 1) // 2
            if estimate_tokens(text[pos:mid]) <= max_tokens:
                lo = mid
            else:
                hi = mid - 1
        cut = lo
        if cut < end:
            floor = pos + (cut - pos) * 2 // 3
            soft = next((k for k in range(cut, floor, -1) if text[k - 1] in _SOFT_BREAK), None)
            hard = next((k for k in range(cut, pos, -1)
                         if not (_WORDISH.match(text[k - 1]) and _WORDISH.match(text[k]))), None)
            cut = soft or hard or cut
        out.append(_trim(text, pos, cut))
        # A cut inside one endless word (a hash, base64, a URL): the next piece repeats the last
        # quarter of this one, so a substring across the cut is still whole in some passage.
        pos = cut if cut >= end or cut == soft or cut == hard else max(pos + 1, cut - (cut - pos) // 4)
    return [s for s in out if s[1] > s[0]]


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _line_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    spans, pos = [], start
    for line in text[start:end].split("\n"):
        s, e = _trim(text, pos, pos + len(line))
        if e > s:
            spans.append((s, e))
        pos += len(line) + 1
    return spans


def _pieces(text: str, unit: _Unit, max_tokens: int) -> list[tuple[int, int]]:
    """A unit as spans that each fit: whole; else sentences (prose) or lines (code, directive
    bodies); a sentence that is still too long goes by lines, then by characters."""
    if estimate_tokens(text[unit.start:unit.end]) <= max_tokens:
        return [(unit.start, unit.end)]
    if unit.kind == "para":
        spans = [(unit.start + s, unit.start + e) for s, e in sentence_spans(text[unit.start:unit.end])]
    else:
        spans = _line_spans(text, unit.start, unit.end)
    out: list[tuple[int, int]] = []
    for s, e in spans:
        if estimate_tokens(text[s:e]) <= max_tokens:
            out.append((s, e))
            continue
        for ls, le in (_line_spans(text, s, e) if unit.kind == "para" else [(s, e)]):
            fits = estimate_tokens(text[ls:le]) <= max_tokens
            out.extend([(ls, le)] if fits else _hard_split(text, ls, le, max_tokens))
    return out


def _pack(text: str, pieces: list[tuple[int, int]], max_tokens: int) -> list[tuple[int, int]]:
    """Greedy: extend the open passage with the next piece while the whole span fits."""
    passages: list[tuple[int, int]] = []
    for s, e in pieces:
        if passages and estimate_tokens(text[passages[-1][0]:e]) <= max_tokens:
            passages[-1] = (passages[-1][0], e)
        else:
            passages.append((s, e))
    return passages


def _first_sentence(text: str) -> str:
    spans = sentence_spans(text)
    return " ".join(text[spans[0][0]:spans[0][1]].split())[:SUMMARY_MAX_CHARS] if spans else ""


def _summary(text: str, units: list[_Unit], start: int, end: int, fallback: str) -> str:
    """First sentence of the first prose paragraph in [start, end); else the fallback (the
    heading), since the first line of a code or directive block makes a poor summary."""
    for u in units:
        if u.kind != "para" or u.start >= end or u.end <= start:
            continue
        sentence = _first_sentence(text[max(u.start, start):min(u.end, end)])
        if sentence:
            return sentence
    return fallback[:SUMMARY_MAX_CHARS]


# ---------------------------------------------------------------- the chunker

def text_lines(text: str) -> Callable[[int], int]:
    """offset -> 1-based line number of `text`."""
    line_starts = _line_starts(text)
    return lambda offset: bisect.bisect_right(line_starts, offset)


def chunk_doc(source_id: str, file_path: str, text: str, fmt: str, max_tokens: int = 256, *,
              default_role: str = "", code_spans: bool = False) -> ParsedFile:
    """Section parents, passage children, Page/Section graph and code references for one doc.
    `default_role` (its Sphinx project's) and `code_spans`: as chunk_units takes them."""
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    page_title = None
    if fmt == "html":
        work, units, line_of, page_title = _parse_html(text)
    else:
        work = text
        units = {"markdown": _parse_markdown, "rst": _parse_rst}.get(fmt, _parse_text)(text)
        line_of = text_lines(text)
    return chunk_units(source_id, file_path, fmt, work, units, line_of, sha256_hex(text), max_tokens,
                       page_title=page_title, default_role=default_role, code_spans=code_spans)


@dataclass(frozen=True)
class _Doc:
    """One document being chunked: where its chunks come from, and how an offset of its working
    text is reported (a line, or a PDF's page)."""
    source_id: str
    file_path: str
    fmt: str
    work: str
    line_of: Callable[[int], int]
    page_of: Callable[[int], int] | None
    page_title: str
    max_tokens: int

    def where(self, s: int, e: int) -> str:
        if self.page_of is None:
            return f"{self.line_of(s)}-{self.line_of(e - 1)}"
        first, last = self.page_of(s), self.page_of(max(e - 1, s))
        return f"p. {first}" if first == last else f"p. {first}-{last}"

    def names(self, sec: _Section, key: str) -> tuple[str, str]:
        """A section's (symbol, title)."""
        return key or self.page_title, sec.heading.title if sec.heading else self.page_title


def chunk_units(source_id: str, file_path: str, fmt: str, work: str, units: list[_Unit],
                line_of: Callable[[int], int], digest: str, max_tokens: int = 256, *,
                page_title: str | None = None, page_of: Callable[[int], int] | None = None,
                default_role: str = "", code_spans: bool = False) -> ParsedFile:
    """The format-free part of chunking a document: `units` (headings, paragraphs, code) over the
    working text `work` grouped into sections (parents) and packed into passages (children).
    `line_of` maps an offset of `work` to the line chunks report; `digest` is the Page node's
    content hash (of the file); `page_title` names a document without headings (else its first
    heading, else its file name). `page_of` (PDF): offset -> 1-based page; passages then never
    span two pages, each chunk records its `page`, and locators name pages instead of lines.
    `default_role`: the Sphinx project's (conf.py); where it is an object role, rST interpreted text
    is a reference. `code_spans`: code spans are references, as in markup with no roles (an issue
    tracker's; HTML, whose only code markup is <code>); elsewhere they are literals."""
    out = ParsedFile()
    if not units:
        return out
    headings = [u for u in units if u.kind == "heading" and u.end > u.start]  # not a PDF's "Page 3"
    page_title = (headings[0].title if headings else page_title) or os.path.basename(file_path) or file_path
    doc = _Doc(source_id, file_path, fmt, work, line_of, page_of, page_title, max_tokens)
    page_id = f"{source_id}:page:{file_path}"
    page = GraphNode(page_id, "Page", page_title, file_path, source_id, file_path,
                     1, line_of(len(work) - 1) if work else 1, "", digest)
    out.nodes.append(page)
    node_ids: dict[int, str] = {}
    passage_spans: list[tuple[int, int, str]] = []  # for locating references
    section_spans: list[tuple[int, str]] = []
    for sec in _sections(work, units):
        key = " > ".join(sec.path)
        suffix = f"#{sec.occurrence + 1}" if sec.occurrence else ""
        node_id = node_ids[id(sec)] = f"{source_id}:section:{file_path}#{key}{suffix}"
        parent = _add_section(doc, sec, key, node_id, node_ids[id(sec.parent)] if sec.parent else page_id, out)
        section_spans.append((sec.units[0].start, parent.chunk_id))
        if not page.chunk_id:
            page.chunk_id = parent.chunk_id
        passage_spans += _add_passages(doc, sec, key, node_id, parent, out)
    _add_references(doc, units, out, passage_spans, section_spans, default_role, code_spans)
    return out


def _add_section(doc: _Doc, sec: _Section, key: str, node_id: str, container_id: str, out: ParsedFile) -> Chunk:
    """A section's parent chunk, its Section node and the CONTAINS relation from its container
    (the enclosing section, or the page); returns the parent."""
    work, file_path, source_id, line_of = doc.work, doc.file_path, doc.source_id, doc.line_of
    symbol, title = doc.names(sec, key)
    start, end = sec.units[0].start, sec.units[-1].end
    first, last = line_of(start), line_of(end - 1)
    parent_text = work[start:end]
    if len(parent_text) > PARENT_MAX_CHARS:
        out.warnings.append(f"{file_path}: section {symbol!r} truncated to {PARENT_MAX_CHARS} chars in its parent")
        parent_text = parent_text[:PARENT_MAX_CHARS]
    parent = Chunk(
        chunk_id=stable_id(source_id, file_path, "section", key, sec.occurrence, 0),
        parent_id=None, role="parent", chunk_type="section", file_path=file_path,
        start_line=first, end_line=last, title=title,
        summary=_summary(work, sec.units, start, end, title),
        symbol=symbol, language=doc.fmt, text=parent_text,
        locator=f"{file_path} > {symbol}:{doc.where(start, end)}", source_id=source_id,
        source_kind="docs", graph_ids=[node_id], page=doc.page_of(start) if doc.page_of else 0,
    ).finalize()
    out.chunks.append(parent)
    out.nodes.append(GraphNode(node_id, "Section", title, f"{file_path}#{key}", source_id, file_path,
                               first, last, parent.chunk_id, parent.content_hash))
    # a heading that is no text of the document (a PDF page's "Page 3") has its section as evidence
    has_heading = sec.heading is not None and sec.heading.end > sec.heading.start
    ev_start, ev_end = (sec.heading.start, sec.heading.end) if has_heading else (start, end)
    evidence = work[ev_start:ev_end]
    out.relations.append(GraphRelation(
        stable_id("CONTAINS", container_id, node_id), "CONTAINS", container_id, node_id, "VERIFIED", [],
        file_path, line_of(ev_start), line_of(ev_end - 1), sha256_hex(evidence),
        evidence[:300], source_id,
    ))
    return parent


def _add_passages(doc: _Doc, sec: _Section, key: str, node_id: str, parent: Chunk,
                  out: ParsedFile) -> list[tuple[int, int, str]]:
    """A section's passages (child chunks); returns each one's (start, end, chunk id).
    A section that is only a heading still gets a passage (its heading): parents are not
    searched, and nothing of a file may be left out of every child."""
    work, page_of, max_tokens = doc.work, doc.page_of, doc.max_tokens
    symbol, title = doc.names(sec, key)
    pieces = [p for u in sec.units if u.end > u.start for p in _pieces(work, u, max_tokens)]
    if page_of is not None:  # a passage comes from one page: its `page` is where all of it is
        runs = [list(run) for _, run in itertools.groupby(pieces, key=lambda p: page_of(p[0]))]
        passages = [p for run in runs for p in _pack(work, run, max_tokens)]
    else:
        passages = _pack(work, pieces, max_tokens)
    spans = []
    for idx, (s, e) in enumerate(passages):
        child = Chunk(
            chunk_id=stable_id(doc.source_id, doc.file_path, "passage", key, sec.occurrence, idx),
            parent_id=parent.chunk_id, role="child", chunk_type="passage", file_path=doc.file_path,
            start_line=doc.line_of(s), end_line=doc.line_of(e - 1), title=title,
            summary=_summary(work, sec.units, s, e, title),
            symbol=symbol, language=doc.fmt, text=work[s:e],
            locator=f"{doc.file_path} > {symbol}:{doc.where(s, e)}", source_id=doc.source_id,
            source_kind="docs", graph_ids=[node_id], page=page_of(s) if page_of else 0,
        ).finalize()
        out.chunks.append(child)
        spans.append((s, e, child.chunk_id))
    return spans


def _add_references(doc: _Doc, units: list[_Unit], out: ParsedFile, passage_spans: list[tuple[int, int, str]],
                    section_spans: list[tuple[int, str]], default_role: str, code_spans: bool) -> None:
    """The document's references, each located in the passage (or heading-only section) it is in."""
    p_starts = [s for s, _, _ in passage_spans]
    s_starts = [s for s, _ in section_spans]

    def locate(offset: int) -> tuple[str, int]:
        i = bisect.bisect_right(p_starts, offset) - 1
        if i >= 0 and offset < passage_spans[i][1]:
            return passage_spans[i][2], doc.line_of(offset)
        j = max(bisect.bisect_right(s_starts, offset) - 1, 0)  # a heading-only section
        return section_spans[j][1], doc.line_of(offset)

    # Fenced (Markdown) and <pre> (HTML) code is skipped whole; rST literal blocks are found by
    # extract_references itself, since a "code" unit there also holds its `Example::` paragraph.
    fmt = doc.fmt
    code = [(u.start, u.end) for u in units if u.kind == "code"] if fmt != "rst" else []
    out.references = extract_references(doc.work, doc.file_path, locate, source_id=doc.source_id, skip=code,
                                        interpreted_role=interpreted_role(default_role) if fmt == "rst" else None,
                                        code_spans=code_spans or fmt == "html")


# Markdown's ATX headings, MyST roles and fences with an info string; a bare run of backticks or
# tildes is as likely an rST title's adornment.
_MARKDOWN_HINT_RE = re.compile(r"^ {0,3}(?:#{1,6} |(?:`{3,}|~{3,}|:{3,})[ \t]*[\w{])|\{[\w:.+-]+\}`", re.M)


def pasted_references(text: str, default_role: str = "") -> list[DocReference]:
    """The references a pasted doc section makes, by the rules chunk_doc follows for its file:
    roles and autodoc directives (in the `currentmodule` the text sets, if any), rST interpreted
    text where `default_role` (its project's) is an object role; never a literal, nor a name in its
    code blocks. A text with Markdown's headings or fences, or MyST roles, is Markdown; else rST."""
    text = text.replace("\r\n", "\n")
    markdown = bool(_MARKDOWN_HINT_RE.search(text))
    code = [(u.start, u.end) for u in _parse_markdown(text) if u.kind == "code"] if markdown else []
    return extract_references(text, "", lambda offset: ("", 0), skip=code,
                              interpreted_role=None if markdown else interpreted_role(default_role))
