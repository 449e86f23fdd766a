"""Overlapping line windows: the fallback chunking for files that do not parse (or a language
without a parser). Window ids come from the window's index, so they are only as stable as the
line count before them; that is the price of not understanding the file."""
from __future__ import annotations

from mtrag_resources.core.models import Chunk, stable_id


def split_lines(text: str) -> list[str]:
    """Lines as parsers count them (ends kept). Not `str.splitlines`, which also breaks at form
    feeds and other separators that `ast` and tree-sitter treat as ordinary characters."""
    lines = text.split("\n")
    out = [line + "\n" for line in lines[:-1]]
    return out + [lines[-1]] if lines[-1] else out


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
) -> list[Chunk]:
    """Cut `text` into child chunks of `window` lines, each sharing `overlap` lines with the
    previous one. Whitespace-only windows are skipped (their index is still consumed)."""
    lines = split_lines(text)
    if not lines:
        return []
    step = max(1, window - max(0, overlap))
    chunks: list[Chunk] = []
    start = 0
    index = 0
    while True:
        index += 1
        piece = lines[start:start + window]
        body = "".join(piece)
        if body.strip():
            first, last = start + 1, start + len(piece)
            chunks.append(Chunk(
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
            ).finalize())
        if start + window >= len(lines):
            break
        start += step
    return chunks
