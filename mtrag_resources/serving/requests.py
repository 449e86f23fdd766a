"""What a query or a paths request may ask for, and the error that says what was wrong with it."""
from __future__ import annotations

from mtrag_resources.core.errors import MtragError

MODES = {"hybrid": ("dense", "fts", "exact"), "dense": ("dense",), "lexical": ("fts",),
         "exact": ("exact",), "bundles": ("dense", "fts", "exact")}
KINDS = ("code", "docs")
PATH_RELATIONS = ("CALLS", "INHERITS", "IMPORTS", "DEFINES", "CONTAINS", "MENTIONS", "IMPLEMENTS")
# A whole doc section is a valid query (the doc -> code bridge takes one pasted in); the embedders
# read what fits their window, the exact channel every identifier in it.
MAX_QUERY_BYTES = 16 * 1024
MAX_K = 100


class QueryError(MtragError, ValueError):
    """A bad request: the message says which input and why (HTTP answers it with 400)."""

    exit_code = 2
    http_status = 400


def validate_text(text, name: str = "query") -> str:
    if not isinstance(text, str):
        raise QueryError(f"{name} must be a string")
    text = text.strip()
    if not text:
        raise QueryError(f"{name} is empty")
    size = len(text.encode("utf-8"))
    if size > MAX_QUERY_BYTES:
        raise QueryError(f"{name} is {size} bytes of UTF-8; the limit is {MAX_QUERY_BYTES} bytes (16 KB)")
    if "\x00" in text:
        raise QueryError(f"{name} contains a NUL character")
    return text
