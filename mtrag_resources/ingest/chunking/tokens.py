"""Model-free token estimates and a CJK-aware sentence splitter for doc chunking.

The estimate errs high against BERT WordPiece (what all-MiniLM uses) so a chunk that passes the
bound here also fits the embedder's window: WordPiece emits every CJK ideograph and every ASCII
punctuation char (including `_`) as its own token, and splits long words into ~6-char pieces.
"""
from __future__ import annotations

import re

# Hiragana/Katakana, CJK ideographs (+ext A, compatibility, ext B..), Hangul syllables and jamo.
CJK_CHARS = (
    "\u1100-\u11ff\u3040-\u30ff\u31f0-\u31ff\u3130-\u318f\u3400-\u4dbf"
    "\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0002ffff"
)
# A word is a run of letters/digits that are not CJK; `_` is excluded because WordPiece treats it
# as punctuation (so `best_by_id` costs 5, not 2).
_TOKEN_RE = re.compile(rf"(?P<cjk>[{CJK_CHARS}])|(?P<word>(?:(?![{CJK_CHARS}_])\w)+)|\S")


def estimate_tokens(text: str) -> int:
    """Upper-ish WordPiece estimate: CJK char = 1, word = 1 + len // 6, punctuation char = 1."""
    total = 0
    for m in _TOKEN_RE.finditer(text):
        word = m.group("word")
        total += 1 + len(word) // 6 if word else 1
    return total


# Sentence ends. English: . ! ? (possibly repeated) plus closing quotes/brackets, then whitespace
# or the end, so `a.b.c` and `3.14` never split. CJK: 。！？；．, which need no following space.
_CLOSERS = "\"'”’」』）)\\]"
_SENT_END_RE = re.compile(
    rf"(?:[.!?]+[{_CLOSERS}]*(?=\s|$))|(?:[。！？；．]+[{_CLOSERS}]*)"
)
# Periods that end abbreviations or list markers rather than sentences.
_NO_BREAK_BEFORE_RE = re.compile(r"(?:\b(?:e\.g|i\.e|vs|cf|Mr|Mrs|Dr)|^\s*\d{1,3}|^\s*[A-Za-z])$")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) offsets of each sentence, whitespace trimmed, in order."""
    spans: list[tuple[int, int]] = []
    start = 0
    for m in _SENT_END_RE.finditer(text):
        if m.group(0)[0] == ".":
            line_start = text.rfind("\n", 0, m.start()) + 1
            if _NO_BREAK_BEFORE_RE.search(text[max(line_start, start):m.start()]):
                continue
        _add_span(text, start, m.end(), spans)
        start = m.end()
    _add_span(text, start, len(text), spans)
    return spans


def _add_span(text: str, start: int, end: int, spans: list[tuple[int, int]]) -> None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if end > start:
        spans.append((start, end))


def split_sentences(text: str) -> list[str]:
    """Sentences with their end punctuation kept, whitespace trimmed; nothing else dropped."""
    return [text[s:e] for s, e in sentence_spans(text)]
