"""Pure helpers for the FTS store: CJK pre-segmentation, the MATCH-expression builder and the
alias normaliser. No SQLite here; `fts_store.py` is the only module that builds SQL. One
tokenizer serves documents and queries, so both sides agree; user text never reaches MATCH syntax.
The tokenization and the two MATCH stages: docs/retrieval.md#lexical-search-tokens-and-match.
"""
from __future__ import annotations

import posixpath
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Iterable

from mtrag_resources.ingest.embed_text import has_case_parts, split_identifier

# Han (ext A, URO, compatibility, ext B..), kana, Hangul syllables.
_CJK_RANGES = (
    "\u3041-\u3096"      # hiragana
    "\u30a1-\u30fa"      # katakana (without the middle dot U+30FB)
    "\u30fc-\u30ff"      # prolonged sound mark, iteration marks, digraph
    "\u3400-\u4dbf"      # CJK ext A
    "\u4e00-\u9fff"      # CJK unified ideographs
    "\uac00-\ud7a3"      # Hangul syllables
    "\uf900-\ufaff"      # CJK compatibility ideographs
    "\U00020000-\U0003134f"  # CJK ext B..G
)
CJK_RE = re.compile(f"[{_CJK_RANGES}]+")
# A word: letters/digits/underscore that are not CJK.
_WORD = f"[^\\W{_CJK_RANGES}]+"
_WORD_RUN_RE = re.compile(_WORD)
_TOKEN_RE = re.compile(f"(?P<cjk>[{_CJK_RANGES}]+)|(?P<word>{_WORD})")
_SUBWORD_RE = re.compile(f"[^\\W_{_CJK_RANGES}]+")
_ASCII_SUBWORD_RE = re.compile("[A-Za-z0-9]+")

TRIGRAM_MIN = 3          # the trigram tokenizer cannot match anything shorter
MAX_TOKENS = 32
MAX_PIECES = 128

# Column order of both FTS tables, and the bm25 weights applied in that order.
FTS_COLUMNS = ("title", "summary", "text", "symbol")
BM25_WEIGHTS = {"title": 4.0, "summary": 2.0, "text": 1.0, "symbol": 4.0}


def is_cjk_char(ch: str) -> bool:
    return bool(CJK_RE.fullmatch(ch))


def cjk_bigrams(run: str) -> list[str]:
    """Overlapping bigrams of a CJK run; a 1-char run is its single character."""
    if len(run) <= 1:
        return [run] if run else []
    return [run[i:i + 2] for i in range(len(run) - 1)]


def subwords(word_run: str) -> list[str]:
    """The `fts_cjk` words of one non-CJK word run: case-folded (context-free, unlike lower()),
    then split on `_` and anything else that is not a letter or digit."""
    return _SUBWORD_RE.findall(word_run.casefold())


def segment_for_index(text: str | None) -> str:
    """The string stored in `fts_cjk` for one column: CJK runs -> bigrams + last char, word runs
    -> `subwords`. Space separated; unicode61 re-tokenizes it on the spaces. Queries go through
    the same split (`query_tokens`), so every query token's pieces occur contiguously here."""
    if not text:
        return ""
    out: list[str] = []

    def words(seg: str) -> None:
        if seg.isascii():   # fast path: ASCII case folding is per character, same result
            out.extend(_ASCII_SUBWORD_RE.findall(seg.lower()))
        else:
            for w in _WORD_RUN_RE.findall(seg):
                out.extend(subwords(w))

    pos = 0
    for m in CJK_RE.finditer(text):
        if m.start() > pos:
            words(text[pos:m.start()])
        run = m.group(0)
        if len(run) > 1:
            out.extend([run[i:i + 2] for i in range(len(run) - 1)])
        out.append(run[-1])
        pos = m.end()
    if pos < len(text):
        words(text[pos:])
    return " ".join(out)


def case_words_for_index(text: str | None) -> str:
    """The words of every camelCase or acronym identifier in `text` (`getTerminalSize` ->
    `get terminal size`, `HTTPServer` -> `http server`), space separated; "" when there is none.
    Appended to `segment_for_index` for code rows, so "terminal size" finds `getTerminalSize` in
    `fts_cjk` (snake_case and dotted names are split there already) while the identifier's own
    pieces stay where they are for the phrase of a query that writes it."""
    if not text:
        return ""
    out: list[str] = []
    for piece in _SUBWORD_RE.findall(text):
        if not piece.islower() and has_case_parts(piece):
            out.extend(split_identifier(piece))
    return " ".join(out)


def fts_string(s: str) -> str:
    """`s` as an FTS5 string literal: wrapped in double quotes, inner quotes doubled."""
    return '"' + s.replace('"', '""') + '"'


@dataclass(frozen=True)
class Token:
    text: str        # as written in the query (the FTS tokenizers fold case themselves)
    kind: str        # "word" | "cjk"

    @property
    def long(self) -> bool:
        return len(self.text) >= TRIGRAM_MIN


def query_tokens(query: str | None) -> list[Token]:
    """Distinct query tokens (case-insensitively) in order of first appearance, at most
    MAX_TOKENS. Word tokens keep `_` (`lookup_ra` is one trigram substring)."""
    if not query:
        return []
    seen: set[tuple[str, str]] = set()
    out: list[Token] = []
    for m in _TOKEN_RE.finditer(query):
        kind = "cjk" if m.group("cjk") else "word"
        text = m.group(0)
        if kind == "word" and not subwords(text):
            continue  # only underscores: nothing either index could match
        key = (kind, text.casefold())
        if key in seen:
            continue
        seen.add(key)
        out.append(Token(text, kind))
        if len(out) >= MAX_TOKENS:
            break
    return out


def _cjk_piece(tok: Token) -> str:
    """The strict `fts_cjk` piece for one token: a word, a word phrase, a bigram phrase, or a
    single CJK char as a prefix query (it is the first char of a bigram or the last of a run)."""
    if tok.kind == "cjk":
        if len(tok.text) == 1:
            return fts_string(tok.text) + "*"
        return fts_string(" ".join(cjk_bigrams(tok.text)))
    return fts_string(" ".join(subwords(tok.text)))


def _cjk_any_pieces(tok: Token) -> list[str]:
    if tok.kind == "cjk":
        if len(tok.text) == 1:
            return [fts_string(tok.text) + "*"]
        return [fts_string(b) for b in cjk_bigrams(tok.text)]
    return [fts_string(w) for w in subwords(tok.text)]


def _unique(pieces: Iterable[str]) -> tuple[str, ...]:
    uniq: list[str] = []
    for p in pieces:
        if p not in uniq:
            uniq.append(p)
        if len(uniq) >= MAX_PIECES:
            break
    return tuple(uniq)


def _join(pieces: Iterable[str], op: str) -> str | None:
    uniq = _unique(pieces)
    return f" {op} ".join(uniq) if uniq else None


@dataclass(frozen=True)
class QueryPlan:
    """MATCH expressions for one query. Any of them may be None (nothing to ask that index)."""

    tokens: tuple[Token, ...] = ()
    all_trigram: str | None = None       # long tokens as substring phrases, ANDed
    all_trigram_filter: str | None = None  # short tokens, required via fts_cjk (rowid filter)
    all_cjk: str | None = None           # every token as word / phrase, ANDed
    any_trigram: str | None = None       # long non-CJK tokens ORed
    any_cjk: str | None = None           # words and single bigrams ORed
    notes: list[str] = field(default_factory=list)
    any_trigram_terms: tuple[str, ...] = ()  # the pieces any_trigram ORs
    any_cjk_terms: tuple[str, ...] = ()      # the pieces any_cjk ORs

    @property
    def empty(self) -> bool:
        return not self.tokens


def build_query(query: str | None) -> QueryPlan:
    toks = query_tokens(query)
    if not toks:
        return QueryPlan()
    long_toks = [t for t in toks if t.long]
    short_toks = [t for t in toks if not t.long]
    all_trigram = _join((fts_string(t.text) for t in long_toks), "AND")
    all_trigram_filter = _join((_cjk_piece(t) for t in short_toks), "AND") if all_trigram else None
    all_cjk = _join((_cjk_piece(t) for t in toks), "AND")
    any_trigram_terms = _unique(fts_string(t.text) for t in long_toks if t.kind == "word")
    any_cjk_terms = _unique(p for t in toks for p in _cjk_any_pieces(t))
    return QueryPlan(tuple(toks), all_trigram, all_trigram_filter, all_cjk,
                     " OR ".join(any_trigram_terms) or None, " OR ".join(any_cjk_terms) or None,
                     any_trigram_terms=any_trigram_terms, any_cjk_terms=any_cjk_terms)


# A well-formed expression as this module builds it: string literals (optionally with a trailing
# `*`) joined by a single operator. Used by tests and as a last-line assertion.
_LITERAL = r'"(?:[^"]|"")*"\*?'
MATCH_RE = re.compile(rf"^{_LITERAL}(?: (?:AND|OR) {_LITERAL})*$")


def is_well_formed(expr: str) -> bool:
    return bool(MATCH_RE.fullmatch(expr))


# --------------------------------------------------------------------------------------------
# Alias normalisation
# --------------------------------------------------------------------------------------------
_QUOTES = "`'\"\u2018\u2019\u201c\u201d"
_SPHINX_ROLE_RE = re.compile(r"^:[\w.:+-]*:(?=`)")   # :func:`x`, :py:meth:`x`
_WS_RE = re.compile(r"\s+")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")  # lone surrogates cannot be stored as UTF-8
_TRAILING_PUNCT = ".,;:!?"
# Already normal: no quotes, backticks, whitespace, `\`, `#`, `(`, `~`; ends in a word char, `/` or `-`.
_CLEAN_ASCII_RE = re.compile(r"[a-z0-9_./:-]*[a-z0-9_/-]")


def _normalize_once(s: str) -> str:
    s = unicodedata.normalize("NFKC", _SURROGATE_RE.sub("", s)).casefold()
    s = _WS_RE.sub(" ", s).strip()
    s = _SPHINX_ROLE_RE.sub("", s)
    s = s.strip(_QUOTES + " ")
    s = s.replace("\\", "/").replace("::", ".").replace("#", ".")
    while s.endswith("()"):
        s = s[:-2].rstrip()
    s = s.lstrip("~").rstrip(_TRAILING_PUNCT).strip()
    return s


def normalize_alias(alias: str | None) -> str:
    """The key `exact_aliases.alias_norm` is compared on; queries and aliases go through it alike.

    Steps, repeated until nothing changes (so the function is idempotent by construction):
    lone surrogates dropped; NFKC + casefold; whitespace runs collapsed to one space and
    trimmed; a leading Sphinx role (`:func:`, `:py:meth:`) dropped; surrounding backticks and
    straight/curly quotes stripped; backslashes become `/`; `::` (C++/Rust/Ruby) and `#`
    (Javadoc/Ruby method refs) become `.`; trailing `()` dropped; leading `~` (Sphinx short-name
    marker) dropped; trailing `.,;:!?` dropped. `/` is kept as is: file paths stay paths
    (`src/click/core.py`), and a query cannot say whether `a/b` is a path or a symbol, so it is
    never rewritten to `.`.
    """
    if not alias:
        return ""
    if alias.isascii():
        low = alias.lower()   # ASCII: NFKC is the identity and casefold == lower
        if "::" not in low and _CLEAN_ASCII_RE.fullmatch(low):
            return low        # nothing any step below would change
    return _normalize_slow(alias)


def _normalize_slow(alias: str) -> str:
    s = alias
    for _ in range(16):
        nxt = _normalize_once(s)
        if nxt == s:
            break
        s = nxt
    return s


def short_symbol(symbol_norm: str) -> str:
    """The last dotted part of a normalised qualified symbol ('' if it has no dots)."""
    if "." not in symbol_norm or "/" in symbol_norm:
        return ""
    return symbol_norm.rsplit(".", 1)[-1]


ISSUE_KEY_RE = re.compile(r"\b[A-Z][A-Z0-9]{1,9}-[0-9]{1,7}\b")
ALIAS_KINDS = ("symbol", "short_symbol", "file_path", "basename", "graph_id", "source_id",
               "title", "issue_key", "endpoint", "endpoint_path", "issue")
# Order in which exact() reports hits of different kinds for the same query. `issue` (an issue's own
# key, `#12`, at its first body passage) first: its other chunks have the key as their `symbol`, and
# chunks that mention a key (`issue_key`) come later.
ALIAS_KIND_RANK = {k: i for i, k in enumerate(
    ("issue", "symbol", "endpoint", "file_path", "graph_id", "issue_key", "source_id", "short_symbol", "basename",
     "endpoint_path", "title"))}
# Source kinds whose symbols are not dotted code names (a heading path, an issue key): no short_symbol.
_NOT_CODE_KINDS = ("docs", "issues")
_FILE_ANCHOR_TYPES = ("file", "module", "page", "document")
_MAX_TITLE_ALIAS = 200


def endpoint_aliases(nodes: list[dict], relations: list[dict]) -> list[tuple[str, str, str]]:
    """The web endpoints of a canonical graph as aliases of their handlers' chunks, as (alias,
    alias_kind, chunk_id): `GET /login` (kind endpoint) and `/login` (endpoint_path) for each
    ROUTES_TO edge whose handler has a chunk. Sorted, without repeats."""
    by_id = {n["node_id"]: n for n in nodes}
    out: set[tuple[str, str, str]] = set()
    for r in relations:
        src, dst = by_id.get(r["src_id"]), by_id.get(r["dst_id"])
        if r["rel_type"] != "ROUTES_TO" or src is None or dst is None or not dst.get("chunk_id"):
            continue
        out.add((src["name"], "endpoint", dst["chunk_id"]))
        path = src["name"].partition(" ")[2]
        if path:
            out.add((path, "endpoint_path", dst["chunk_id"]))
    return sorted(out)


def issue_aliases(rows: list[dict]) -> list[tuple[str, str, str]]:
    """The issues of an issue-tracker source as exact aliases, (alias, "issue", chunk_id): each
    issue's key (`owner/repo#12`, `PROJ-12`) and, for GitHub, `#12`, anchored at the issue's first
    body passage (a child: it is searched, so an exact hit also gets its cosine and FTS rank, and its
    parent, the issue's overview with its state, comes with it). Rows without `issue_key`: none."""
    first: dict[str, tuple] = {}
    for i, r in enumerate(rows):
        key = r.get("issue_key") or ""
        if not key or r.get("role") != "child":
            continue
        rank = (r.get("chunk_type") != "issue_body", int(r.get("start_line") or 0), i)
        if key not in first or rank < first[key][0]:
            first[key] = (rank, r["chunk_id"])
    out: set[tuple[str, str, str]] = set()
    for key, (_rank, chunk_id) in first.items():
        out.add((key, "issue", chunk_id))
        head, sep, number = key.rpartition("#")
        if sep and head and number.isdigit():
            out.add((f"#{number}", "issue", chunk_id))
    return sorted(out)


def derive_aliases(rows: list[dict], source_id: str = "") -> list[tuple[str, str, str]]:
    """The standard aliases of a chunk set, as (alias, alias_kind, chunk_id):

    * symbol (qualified) for every row with a symbol; short_symbol (last dotted part) for code
      rows (source_kind neither 'docs' nor 'issues') whose symbol is qualified;
    * title for rows whose title differs from the symbol (<= 200 chars);
    * file_path and basename once per file, anchored at the file's chunk (chunk_type file/module/
      page/document, else a row without parent, else the first row by line);
    * graph_id for each entry of graph_ids;
    * issue_key for every `ABC-123`-like key in the title or text of child rows (and of parents
      without children);
    * source_id once, anchored at the first file anchor (README/index/__init__ preferred).
    """
    out: list[tuple[str, str, str]] = []
    parents_with_children = {r.get("parent_id") for r in rows if r.get("role") == "child"}
    for r in rows:
        cid = r["chunk_id"]
        sym = (r.get("symbol") or "").strip()
        if sym:
            out.append((sym, "symbol", cid))
            if r.get("source_kind") not in _NOT_CODE_KINDS:
                short = short_symbol(normalize_alias(sym))
                if short:
                    out.append((sym.replace("::", ".").replace("#", ".").rsplit(".", 1)[-1],
                                "short_symbol", cid))
        title = (r.get("title") or "").strip()
        if title and len(title) <= _MAX_TITLE_ALIAS and normalize_alias(title) != normalize_alias(sym):
            out.append((title, "title", cid))
        for gid in r.get("graph_ids") or []:
            if gid:
                out.append((str(gid), "graph_id", cid))
        if r.get("role") == "child" or cid not in parents_with_children:
            keys = set(ISSUE_KEY_RE.findall(title)) | set(ISSUE_KEY_RE.findall(r.get("text") or ""))
            out.extend((k, "issue_key", cid) for k in sorted(keys))
    anchors = file_anchors(rows)
    for fp, r in sorted(anchors.items()):
        path = fp.replace("\\", "/")
        out.append((path, "file_path", r["chunk_id"]))
        base = posixpath.basename(path)
        if base and base != path:
            out.append((base, "basename", r["chunk_id"]))
    if source_id and anchors:
        out.append(source_alias(anchors, source_id))
    return out


# The aliases of a file as a whole (anchored at one of its rows, file_anchors), not of one row.
FILE_ALIAS_KINDS = ("file_path", "basename")


def rows_to_rewrite(new_rows: list[dict], old_rows: list[dict], changed_ids: Iterable[str]) -> set[str]:
    """The chunk ids a delta of some files rewrites (row, FTS entries, own aliases): the rows that
    changed, and the parents whose having children changed, since derive_aliases gives a parent
    with children no issue keys. `new_rows` and `old_rows`: those files' rows now and before (role,
    parent_id, chunk_id)."""
    def with_children(rows: list[dict]) -> set:
        return {r.get("parent_id") for r in rows if r.get("role") == "child"}
    flipped = with_children(new_rows) ^ with_children(old_rows)
    return set(changed_ids) | {r["chunk_id"] for r in new_rows if r["chunk_id"] in flipped}


def delta_aliases(file_rows: list[dict], rewrite: set[str]) -> list[tuple[str, str, str]]:
    """The aliases a delta inserts for some files: the rewritten rows' own (derive_aliases over all
    the files' rows, so a parent sees its children; only rewritten rows need their text) and the
    files' own (FILE_ALIAS_KINDS, re-anchored). The source-wide ones are the caller's."""
    return [a for a in derive_aliases(file_rows) if a[2] in rewrite or a[1] in FILE_ALIAS_KINDS]


def file_anchors(rows: list[dict]) -> dict[str, dict]:
    """Each file's anchor row: its file/module/page/document chunk, else a row without parent,
    else its first row by line (no text needed)."""
    def anchor_rank(r: dict) -> tuple:
        return (0 if r.get("chunk_type") in _FILE_ANCHOR_TYPES else 1 if not r.get("parent_id") else 2,
                int(r.get("start_line") or 0), str(r.get("chunk_id")))

    anchors: dict[str, dict] = {}
    for r in rows:
        fp = r.get("file_path") or ""
        if fp:
            cur = anchors.get(fp)
            if cur is None or anchor_rank(r) < anchor_rank(cur):
                anchors[fp] = r
    return anchors


def source_alias(anchors: dict[str, dict], source_id: str) -> tuple[str, str, str]:
    """The source id as an alias of its entry file's anchor (README/index/__init__ preferred,
    then the shallowest path)."""
    return (source_id, "source_id", anchors[min(anchors, key=_entry_rank)]["chunk_id"])


def _entry_rank(fp: str) -> tuple:
    base = posixpath.basename(fp).lower()
    preferred = base.startswith(("readme", "index", "__init__"))
    return (0 if preferred else 1, fp.count("/"), fp)


def entry_alias(rows: list[dict], source_id: str) -> tuple[str, str, str] | None:
    """source_alias(file_anchors(rows), source_id), or None without a file: the entry file is
    chosen among the paths first and only its rows are ranked (ranking every row of a large
    source for one alias slowed each FTS delta)."""
    files = {r.get("file_path") or "" for r in rows}
    files.discard("")
    if not files:
        return None
    entry = min(files, key=_entry_rank)
    return source_alias(file_anchors([r for r in rows if r.get("file_path") == entry]), source_id)
