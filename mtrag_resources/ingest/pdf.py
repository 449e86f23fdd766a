"""PDF documents of docs sources: the text layer page by page and the outline (bookmarks), read
with pypdf. The original bytes stay in the CAS (raw_source); only the text and its structure go
on (`ingest/chunking/pdf.py` chunks them with page numbers as locators).

A PDF that cannot give text is skipped like a binary, with its reason, never indexed empty:
`encrypted` (it cannot be opened without a password), `no text layer (scanned?)` (no page has
extractable text), `unreadable PDF: <error>` (pypdf cannot parse it). The inventory decides this
when it first sees the file's content (`skip_reason`), so the verdict is in the snapshot, reused
while the file is unchanged. pypdf is imported on first use: a build without PDFs never loads it."""
from __future__ import annotations

import io
import logging
import re
from dataclasses import dataclass, field

PDF_LANGUAGE = "pdf"  # filetypes.DOC_FORMATS[".pdf"]: the category/language of a PDF entry
ENCRYPTED = "encrypted"
NO_TEXT_LAYER = "no text layer (scanned?)"
UNREADABLE = "unreadable PDF"
# A code source takes no PDF (its bytes are binary; only docs sources extract their text).
NOT_IN_DOCS = "binary file (PDF; read in docs sources only)"
SKIP_REASONS = (ENCRYPTED, NO_TEXT_LAYER, UNREADABLE)
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


class PdfSkip(Exception):
    """A PDF that gives no text; `reason` is its inventory skip reason."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def is_pdf_skip(reason: str) -> bool:
    """Whether an inventory reason is one of a PDF that gave no text (scanned, encrypted, unreadable)."""
    return reason == ENCRYPTED or reason == NO_TEXT_LAYER or reason.startswith(UNREADABLE + ":")


@dataclass(frozen=True)
class OutlineEntry:
    """One bookmark: its title, depth (1 = top) and the 0-based index of the page it points to."""
    title: str
    level: int
    page: int


@dataclass
class PdfText:
    """A PDF's text layer: `pages[i]` is the text of page i + 1 ("" for a page without text), the
    outline in document order, the document's metadata title ("" if none) and warnings (pages
    whose text could not be extracted, an outline that could not be read)."""
    pages: list[str]
    outline: list[OutlineEntry] = field(default_factory=list)
    title: str = ""
    warnings: list[str] = field(default_factory=list)


def _quiet_pypdf() -> None:
    # pypdf logs each repair of a damaged file ("EOF marker not found", ...) as a warning; the
    # verdict that matters is the skip reason or the parse warnings this module returns.
    logging.getLogger("pypdf").setLevel(logging.ERROR)


def _open(data: bytes):
    """A PdfReader over `data`, decrypted when an empty user password opens it; PdfSkip otherwise."""
    from pypdf import PdfReader
    _quiet_pypdf()
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            try:
                opened = reader.decrypt("")
            except Exception as exc:  # noqa: BLE001 - an unsupported cipher: unreadable, say which
                raise PdfSkip(f"{UNREADABLE}: {_why(exc)}") from None
            if not opened:
                raise PdfSkip(ENCRYPTED)
        len(reader.pages)  # the page tree: a file without one is not a PDF we can read
    except PdfSkip:
        raise
    except Exception as exc:  # noqa: BLE001 - pypdf raises many types on damaged files
        raise PdfSkip(f"{UNREADABLE}: {_why(exc)}") from None
    return reader


def _why(exc: Exception) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


def _clean(text: str) -> str:
    """A page's text with line ends normalised and control characters (NUL, form feed) removed."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL_RE.sub(" ", text).strip()


def _page_text(page) -> str:
    return _clean(page.extract_text() or "")


def skip_reason(data: bytes) -> str | None:
    """Why this PDF gives no text (ENCRYPTED, NO_TEXT_LAYER, `unreadable PDF: ...`), or None when
    some page has text. Stops at the first page that has text."""
    try:
        reader = _open(data)
        for page in reader.pages:
            try:
                if _page_text(page):
                    return None
            except Exception:  # noqa: BLE001 - one bad page; extract() reports it
                continue
    except PdfSkip as skip:
        return skip.reason
    except Exception as exc:  # noqa: BLE001 - a page tree that breaks while walked
        return f"{UNREADABLE}: {_why(exc)}"
    return NO_TEXT_LAYER


def extract(data: bytes, path: str = "") -> PdfText:
    """Every page's text and the outline; PdfSkip when the file gives no text at all."""
    reader = _open(data)
    where = f"{path}: " if path else ""
    pages: list[str] = []
    warnings: list[str] = []
    try:
        for n, page in enumerate(reader.pages, start=1):
            try:
                pages.append(_page_text(page))
            except Exception as exc:  # noqa: BLE001 - the other pages still count
                warnings.append(f"{where}page {n}: text not extractable ({_why(exc)})")
                pages.append("")
    except Exception as exc:  # noqa: BLE001
        raise PdfSkip(f"{UNREADABLE}: {_why(exc)}") from None
    if not any(pages):
        raise PdfSkip(NO_TEXT_LAYER)
    outline = _outline(reader, len(pages), warnings, where)
    try:
        title = " ".join(str((reader.metadata or {}).get("/Title") or "").split())
    except Exception:  # noqa: BLE001 - a damaged info dictionary has no title
        title = ""
    return PdfText(pages, outline, title, warnings)


def _outline(reader, n_pages: int, warnings: list[str], where: str) -> list[OutlineEntry]:
    """The bookmarks in document order with their depth; entries that point to no page of this
    document (an external link, a broken destination) or have no title are left out."""
    out: list[OutlineEntry] = []

    def walk(items, level: int) -> None:
        for item in items:
            if isinstance(item, list):
                walk(item, level + 1)
                continue
            title = " ".join(str(getattr(item, "title", "") or "").split())
            try:
                page = reader.get_destination_page_number(item)
            except Exception:  # noqa: BLE001
                page = None
            if title and page is not None and 0 <= page < n_pages:
                out.append(OutlineEntry(title, level, page))

    try:
        walk(reader.outline, 1)
    except Exception as exc:  # noqa: BLE001 - no outline then: one section per page
        warnings.append(f"{where}outline not readable ({_why(exc)}); one section per page")
        return []
    return out
