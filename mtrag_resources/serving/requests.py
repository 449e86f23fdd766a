"""What a query or a paths request may ask for, and the error that says what was wrong with it."""
from __future__ import annotations

from mtrag_resources.core.errors import MtragError
from mtrag_resources.core.unicode_text import replace_lone_surrogates

MODES = {"hybrid": ("dense", "fts", "exact"), "dense": ("dense",), "lexical": ("fts",),
         "exact": ("exact",), "bundles": ("dense", "fts", "exact")}
KINDS = ("code", "docs", "issues")
PATH_RELATIONS = ("CALLS", "INHERITS", "IMPORTS", "DEFINES", "CONTAINS", "MENTIONS", "IMPLEMENTS", "ROUTES_TO",
                  "REFERENCES")
# what a paths request follows when it names no relation: calls, and from a web endpoint
# (`GET /login`) to its handler (ROUTES_TO leaves Endpoint nodes only)
DEFAULT_PATH_RELATIONS = ("CALLS", "ROUTES_TO")
# A whole doc section is a valid query (the doc -> code bridge takes one pasted in); the embedders
# read what fits their window, the exact channel every identifier in it.
MAX_QUERY_BYTES = 16 * 1024
MAX_K = 100
# A scoped query (`--source ID`, `"sources": [...]`) names at most this many published sources.
MAX_SOURCES = 50


class QueryError(MtragError, ValueError):
    """A bad request: the message says which input and why (HTTP answers it with 400)."""

    exit_code = 2
    http_status = 400


def validate_text(text, name: str = "query") -> str:
    if not isinstance(text, str):
        raise QueryError(f"{name} must be a string")
    # a lone surrogate (JSON's `\ud800`, an argument that is not UTF-8) encodes nowhere: U+FFFD
    text = replace_lone_surrogates(text).strip()
    if not text:
        raise QueryError(f"{name} is empty")
    size = len(text.encode("utf-8"))
    if size > MAX_QUERY_BYTES:
        raise QueryError(f"{name} is {size} bytes of UTF-8; the limit is {MAX_QUERY_BYTES} bytes (16 KB)")
    if "\x00" in text:
        raise QueryError(f"{name} contains a NUL character")
    return text


class UnknownSource(QueryError):
    """A scoped query names a source id the published generation does not hold (HTTP 400,
    field `sources`; the CLI's exit 2)."""

    field = "sources"


def check_sources(sources) -> list[str] | None:
    """A query's source scope: None (every published source) or a list of 1 to MAX_SOURCES
    non-empty strings; duplicates are collapsed, keeping the first occurrence's place. Whether
    each id is published is `check_known_sources`'s question (it needs the manifest)."""
    if sources is None:
        return None
    if isinstance(sources, (str, bytes)) or not isinstance(sources, (list, tuple)):
        raise QueryError(f"sources must be a list of source ids, not {type(sources).__name__}")
    if not sources:
        raise QueryError("sources is empty: name at least one source id, or leave sources out for every source")
    if len(sources) > MAX_SOURCES:
        raise QueryError(f"sources names {len(sources)} ids; the limit is {MAX_SOURCES}")
    for i, sid in enumerate(sources):
        if not isinstance(sid, str):
            raise QueryError(f"sources[{i}] must be a string (a source id), not {type(sid).__name__}")
        if not sid.strip():
            raise QueryError(f"sources[{i}] is empty")
    return list(dict.fromkeys(sources))


def check_known_sources(sources: list[str], published) -> list[str]:
    """`sources` (checked by `check_sources`), refused with UnknownSource naming every id that
    `published` (the manifest's source ids) does not hold, and listing the ones it does."""
    unknown = [s for s in sources if s not in published]
    if unknown:
        shown = [s if len(s) <= 80 else s[:77] + "..." for s in unknown[:10]]
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        known = sorted(published)
        listed = f"{known[:MAX_SOURCES]}" + (f" and {len(known) - MAX_SOURCES} more" if len(known) > MAX_SOURCES else "")
        raise UnknownSource(f"sources: unknown source id(s) {shown}{more}; the published generation's sources "
                            f"are {listed}")
    return sources


def check_query(text, k, kind, mode, sources=None) -> str:
    """A query request's arguments, refused with the input and its allowed values; the text,
    stripped. The reader and the CLI (before it opens anything) both call it. `sources` is
    checked for its shape only (check_sources); the reader checks its ids against the manifest."""
    text = validate_text(text)
    if mode not in MODES:
        raise QueryError(f"mode {mode!r} is not one of {sorted(MODES)}")
    if kind is not None and kind not in KINDS:
        raise QueryError(f"kind {kind!r} is not one of {list(KINDS)}")
    if not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise QueryError(f"k must be an integer from 1 to {MAX_K}, got {k!r}")
    check_sources(sources)
    return text


def check_paths(from_name, to_name, rel_types, direction, max_hops, max_hops_limit: int = 6) -> tuple[str, str | None]:
    """A paths request's arguments, refused with the input and its allowed values; (from, to), stripped."""
    from_name = validate_text(from_name, "from")
    if to_name is not None:
        to_name = validate_text(to_name, "to")
    if direction not in ("out", "in"):
        raise QueryError(f"direction {direction!r} must be 'out' or 'in'")
    if not isinstance(max_hops, int) or not 1 <= max_hops <= max_hops_limit:
        raise QueryError(f"max_hops must be from 1 to {max_hops_limit}, got {max_hops!r}")
    bad = [r for r in (rel_types or []) if r not in PATH_RELATIONS]
    if bad:
        raise QueryError(f"unknown relation type(s) {bad}; allowed: {list(PATH_RELATIONS)}")
    return from_name, to_name


class UnknownSymbol(MtragError, LookupError):
    """`paths --from NAME` (or `--to`) names no symbol of the published generation; `field` is
    the request field that named it (`from` or `to`)."""

    exit_code = 1
    http_status = 404

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def check_known_symbols(reader, answer, names: dict[str, str | None], option_prefix: str = "") -> None:
    """After a paths request found no path: UnknownSymbol for the first of `names` (field ->
    symbol name, None: not given) that the published generation does not hold, with the nearest
    symbol names, rather than an empty answer that reads as "no verified path". Every interface
    (CLI, HTTP, MCP) says it alike; `option_prefix` "--" names the CLI's options."""
    if answer.get("paths") or answer.get("generation") is None:
        return
    for field, name in names.items():
        if name is None:
            continue
        found = reader.symbol_lookup(name)
        if found["known"] is False:
            nearest = ", ".join(found["nearest"]) or "none found"
            raise UnknownSymbol(f"{option_prefix}{field} {name.strip()!r}: no such symbol in generation "
                                f"{found['generation']}; nearest symbols: {nearest}", field)
