"""Overlapping windows of lines: the fallback chunking for files that do not parse (or a language
without a parser), and the way any code that is too long for one child (module-level code, the
rest of a class body) is cut. Window ids come from the window's index, so they are only as stable
as the line count before them; that is the price of not understanding the file."""
from __future__ import annotations

from mtrag_resources.core.models import Chunk, stable_id
from mtrag_resources.ingest.chunking.definitions import OUTLINE_MAX_CHARS

# A window holds at most this many characters, so no child is unbounded (one minified line can be
# megabytes). A longer line is cut into pieces that share CHAR_OVERLAP characters, so a word or an
# identifier shorter than that is whole in some piece wherever the cut falls.
WINDOW_MAX_CHARS = OUTLINE_MAX_CHARS
CHAR_OVERLAP = 200


def split_lines(text: str) -> list[str]:
    """Lines as parsers count them (ends kept). Not `str.splitlines`, which also breaks at form
    feeds and other separators that `ast` and tree-sitter treat as ordinary characters."""
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    return out + [lines[-1]] if lines[-1] else out


def windows(
    items: list[tuple[int, str]],
    max_lines: int | None = None,
    overlap: int = 10,
    max_chars: int = WINDOW_MAX_CHARS,
    char_overlap: int = CHAR_OVERLAP,
) -> list[tuple[int, int, int, str]]:
    """(index, first line, last line, text) windows over `items`, (line number, line) pairs in
    order (not necessarily consecutive numbers). A window has at most `max_lines` items and
    `max_chars` characters and repeats the last `overlap` items of the one before (at most a quarter
    of it, so char-bound windows of few long lines still advance). A line longer than `max_chars`
    is cut into overlapping pieces first. Whitespace-only windows are left out but still count
    in `index` (1-based), so the index of every other window stays put."""
    step = max(1, max_chars - char_overlap)
    pieces = [(n, line[i:i + max_chars]) for n, line in items
              for i in (range(0, len(line) - char_overlap, step) if len(line) > max_chars else (0,))]
    out: list[tuple[int, int, int, str]] = []
    start = index = 0
    while start < len(pieces):
        index += 1
        end, size = start, 0
        while end < len(pieces) and (max_lines is None or end - start < max_lines) \
                and (end == start or size + len(pieces[end][1]) <= max_chars):
            size += len(pieces[end][1])
            end += 1
        body = "".join(text for _, text in pieces[start:end])
        if body.strip():
            out.append((index, pieces[start][0], pieces[end - 1][0], body))
        if end >= len(pieces):
            break
        start = max(start + 1, end - min(overlap, (end - start) // 4))
    return out


def line_windows(
    file_path: str,
    text: str,
    language: str,
    window: int = 60,
    overlap: int = 10,
    *,
    source_id: str = "",
    parent_id: str | None = None,
    symbol: str = "",
    max_windows: int | None = None,
) -> list[Chunk]:
    """Cut `text` into child chunks of at most `window` lines (and WINDOW_MAX_CHARS characters),
    each sharing `overlap` lines with the previous one; the first `max_windows` of them (the
    caller's chunk cap, chunking/limits.py, says what was left out)."""
    items = list(enumerate(split_lines(text), start=1))
    return [Chunk(
        chunk_id=stable_id(source_id, file_path, "window", "child", symbol, index),
        parent_id=parent_id,
        role="child",
        chunk_type="window",
        file_path=file_path,
        start_line=first,
        end_line=last,
        title=f"{file_path} lines {first}-{last}",
        summary="",
        symbol=symbol,
        language=language,
        text=body,
        source_id=source_id,
    ).finalize() for index, first, last, body in windows(items, window, overlap)[:max_windows]]
