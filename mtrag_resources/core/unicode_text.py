"""Text that came from JSON, made safe to encode: JSON's `\\ud800` escapes decode to lone
surrogates, which no UTF-8 encoder (SQLite, Parquet, gzip, a socket) accepts. Each is replaced by
U+FFFD, as a UTF-8 decoder replaces a bad byte."""
from __future__ import annotations

import re

LONE_SURROGATE_RE = re.compile("[\ud800-\udfff]")
# A \\uD800-\\uDFFF escape in JSON text: only then can its decoded values hold a lone surrogate
# (a valid pair decodes to one character; the scan of the values is skipped when there is none).
_SURROGATE_ESCAPE_RE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def replace_lone_surrogates(text: str) -> str:
    return LONE_SURROGATE_RE.sub("\ufffd", text) if LONE_SURROGATE_RE.search(text) else text


def may_hold_surrogates(json_text: str) -> bool:
    """Whether JSON text decoded from `json_text` can hold a lone surrogate."""
    return _SURROGATE_ESCAPE_RE.search(json_text) is not None or LONE_SURROGATE_RE.search(json_text) is not None


def without_lone_surrogates(value):
    """A decoded JSON value with every string in it (keys too) through replace_lone_surrogates."""
    if isinstance(value, str):
        return replace_lone_surrogates(value)
    if isinstance(value, list):
        return [without_lone_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {replace_lone_surrogates(k): without_lone_surrogates(v) for k, v in value.items()}
    return value
