"""Chunking of PDF documents: the text layer (ingest/pdf.py) as sections and passages, with page
numbers as locators.

The working text is the pages' texts in order, a blank line between two pages. Sections come from
the outline (bookmarks) when the PDF has one: each entry is a heading at its depth, found on its
page (the line that holds its title, a leading number allowed) or, when the page's text does not
have it, written as a line of its own at that point, so the section starts there. Without an
outline every page with text is a section, `Page N`. Then the format-free chunker of
`docs.py` groups and packs them, with the rule that a passage never spans two pages: each child
records its `page` (1-based), its locator names it (`manual.pdf > Install:p. 2`), and
start_line/end_line count lines of the working text. Every character of the extracted text is in
some child."""
from __future__ import annotations

import bisect
import re
from typing import Callable

from mtrag_resources.core.models import ParsedFile, sha256_hex
from mtrag_resources.ingest.chunking.docs import _Unit, chunk_units, text_lines
from mtrag_resources.ingest.pdf import PDF_LANGUAGE, OutlineEntry, PdfText, extract

PAGE_BREAK = "\n\n"
_PARA_RE = re.compile(r"\S(?:.*\S)?(?:\n[ \t]*\S.*)*")  # docs._parse_text's paragraphs: blank-line separated
_NUMBERING = r"(?:(?:[0-9]+|[IVXLivxl]+|[A-Z])(?:\.[0-9]+)*[.)]?[ \t]+)?"  # "2.1 ", "IV. ", "A) "


def chunk_pdf(source_id: str, file_path: str, data: bytes, max_tokens: int = 256) -> ParsedFile:
    """Chunks of a PDF's bytes; raises ingest.pdf.PdfSkip when it gives no text."""
    pdf = extract(data, file_path)
    out = chunk_pdf_text(source_id, file_path, pdf, sha256_hex(data), max_tokens)
    out.warnings[:0] = pdf.warnings
    return out


def chunk_pdf_text(source_id: str, file_path: str, pdf: PdfText, digest: str, max_tokens: int = 256) -> ParsedFile:
    work, units, page_of = pdf_units(pdf)
    title = None if pdf.outline else pdf.title or None
    return chunk_units(source_id, file_path, PDF_LANGUAGE, work, units, text_lines(work), digest, max_tokens,
                       page_title=title, page_of=page_of)


def pdf_units(pdf: PdfText) -> tuple[str, list[_Unit], Callable[[int], int]]:
    """(working text, units over it, offset -> 1-based page)."""
    by_page: dict[int, list[OutlineEntry]] = {}
    for entry in pdf.outline:  # document order within a page; pages in page order
        by_page.setdefault(entry.page, []).append(entry)
    parts: list[str] = []
    units: list[_Unit] = []
    starts: list[int] = []   # offset of each page's text in the working text
    numbers: list[int] = []  # its 1-based page number
    size = 0
    for index, text in enumerate(pdf.pages):
        entries = by_page.get(index, [])
        if not text and not entries:
            continue  # a page without text (an image, a blank page) has no passage
        text, headings = _place_headings(text, entries)
        if parts:
            parts.append(PAGE_BREAK)
            size += len(PAGE_BREAK)
        starts.append(size)
        numbers.append(index + 1)
        page_units: list[_Unit] = []
        if not pdf.outline:  # one section per page, named by its number (no text of the document)
            page_units.append(_Unit("heading", size, size, level=1, title=f"Page {index + 1}"))
        cursor = 0
        for s, e, level, title in headings:
            page_units.extend(_paragraphs(text, cursor, s, size))
            page_units.append(_Unit("heading", size + s, size + e, level=level, title=title))
            cursor = e
        page_units.extend(_paragraphs(text, cursor, len(text), size))
        units.extend(page_units)
        parts.append(text)
        size += len(text)

    def page_of(offset: int) -> int:
        i = bisect.bisect_right(starts, offset) - 1
        return numbers[max(i, 0)] if numbers else 1

    return "".join(parts), units, page_of


def _paragraphs(text: str, start: int, end: int, base: int) -> list[_Unit]:
    return [_Unit("para", base + start + m.start(), base + start + m.end()) for m in _PARA_RE.finditer(text[start:end])]


def _place_headings(text: str, entries: list[OutlineEntry]) -> tuple[str, list[tuple[int, int, int, str]]]:
    """The page's text (with the titles it lacks written in) and its headings as (start, end,
    level, title), in order. A title is looked for from the end of the previous heading on: first
    as the start of a line (after a section number), then anywhere; the heading is then the whole
    line(s) holding it."""
    headings: list[tuple[int, int, int, str]] = []
    cursor = 0
    for entry in entries:
        found = _find_title(text, entry.title, cursor)
        if found is None:  # written as its own line where the search stopped
            if cursor == 0:
                text = f"{entry.title}\n{text}" if text else entry.title
                found = (0, len(entry.title))
            else:
                text = f"{text[:cursor]}\n{entry.title}{text[cursor:]}"
                found = (cursor + 1, cursor + 1 + len(entry.title))
        headings.append((*found, entry.level, entry.title))
        cursor = found[1]
    return text, headings


def _find_title(text: str, title: str, start: int) -> tuple[int, int] | None:
    words = title.split()
    if not words or start >= len(text):
        return None
    body = r"\s+".join(re.escape(w) for w in words)
    m = (re.compile(rf"(?im)^[ \t]*{_NUMBERING}{body}").search(text, start)
         or re.compile(body, re.IGNORECASE).search(text, start))
    if m is None:
        return None
    line_start = text.rfind("\n", 0, m.start()) + 1
    line_end = text.find("\n", m.end())
    line_end = len(text) if line_end < 0 else line_end
    s = max(line_start, start)
    while s < m.start() and text[s].isspace():
        s += 1
    return s, line_end
