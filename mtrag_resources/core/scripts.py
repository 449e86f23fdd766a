"""Which writing system a text is in, as far as retrieval cares: CJK text needs an embedder that
reads it (all-MiniLM-L6-v2 turns most Han characters into [UNK]) and a bigram lexical index."""
from __future__ import annotations

import re

# Han (CJK Unified Ideographs + Extension A + compatibility), kana, Hangul syllables.
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]")
_WORD = re.compile(r"[^\W\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+")

# Each CJK character weighs about one word: a text counts as CJK when CJK characters are at least
# this share of (CJK characters + other words) and there are enough of them to carry meaning (a
# Chinese comment in English code stays English).
MIN_CJK_SHARE = 0.3
MIN_CJK_CHARS = 8
# A query is short: two CJK characters that are half of it suffice ("什么是 generation").
MIN_QUERY_CJK_SHARE = 0.5


def _cjk_counts(text: str) -> tuple[int, float]:
    """(CJK characters, their share of CJK characters + other words)."""
    cjk = len(_CJK.findall(text))
    total = cjk + len(_WORD.findall(text))
    return cjk, (cjk / total if total else 0.0)


def is_cjk_text(text: str) -> bool:
    cjk, share = _cjk_counts(text)
    return cjk >= MIN_CJK_CHARS and share >= MIN_CJK_SHARE


def is_cjk_query(text: str) -> bool:
    cjk, share = _cjk_counts(text)
    return cjk >= 2 and share >= MIN_QUERY_CJK_SHARE


def script_of(text: str) -> str:
    """'cjk' or '' (everything else)."""
    return "cjk" if is_cjk_text(text) else ""
