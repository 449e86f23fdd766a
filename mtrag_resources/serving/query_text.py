"""Rule-based query text handling (no LLM, no store clients).

* `preprocess_query`: seed 002 section 5.1 / 7.3. The query is embedded as is; a few keywords are
  pulled out by rule for the keyword bonus and the lexical channel, and hybrid is switched on for
  a mixed-language query, a query with numbers or a short one (docs/retrieval.md#query-keywords).
* `normalize_for_keyword`: the normalisation both sides of the keyword test go through.
* `identifiers_in`: code-like identifiers in free text, for the doc -> code bridge fallback.
"""
from __future__ import annotations

import re
import string
import unicodedata
from dataclasses import dataclass, field

from mtrag_resources.ingest.issue_keys import is_issue_key

#: A core query of at most this many words (English word = 1, every 2 CJK characters ~ 1 word,
#: rounded up) is a "short query". m-flow uses "hybrid lexical when <= 3 core words".
SHORT_QUERY_MAX_WORDS = 3

HYBRID_REASONS = ("mixed_lang", "number", "short_query")

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_RE = re.compile(f"[{_CJK}]")
_ASCII_LETTER_RE = re.compile(r"[A-Za-z]")

# English-ish token: letters/digits plus the joiners code and product names use (API, GPT-4,
# /chat/completions, click.echo, C++, C#). Must contain a letter.
_EN_TOKEN_RE = re.compile(r"[A-Za-z0-9_/.+#\-]*[A-Za-z][A-Za-z0-9_/.+#\-]*")

# Units that may follow a number. Longer alternatives first.
_UNITS = (
    "小时|分钟|毫秒|万亿|百万|千万|"
    "亿|万|千|百|元|块|角|分|秒|天|年|月|日|号|周|个|次|条|人|倍|%|％|"
    "ms|MB|GB|KB|TB|kb|mb|gb|tb|px|k|K|M|G|w|W|x|s|h"
)
_NUMBER_RE = re.compile(
    rf"(?<![A-Za-z0-9_.])\d+(?:[.,]\d+)*(?:\s?(?:{_UNITS})(?![A-Za-z]))?"
)
_NUMBER_FULL_RE = re.compile(rf"\d+(?:[.,]\d+)*(?:{_UNITS})?")

# Chinese question words / fillers. Multi-character phrases are removed wherever they occur;
# the ones that are also parts of ordinary words are handled by position (below).
_ZH_QUESTION_PHRASES = (
    "有没有", "有哪些", "有什么", "是什么", "是不是", "是否", "怎么样", "怎么办", "怎么", "怎样",
    "如何", "为什么", "为何", "哪些", "哪个", "哪里", "哪儿", "什么", "那个", "这个", "多少", "请问",
)
# single characters removed only at the very end of the query (sentence-final particles)
_ZH_FINAL_PARTICLES = "吗呢吧啊呀么"
# single characters removed only at the very start ("有" in "有X吗", "是" in "什么是X"; not in
# "没有", "所有", "但是")
_ZH_LEADING = "有是"

_EN_QUESTION_WORDS = frozenset(
    """what how which who whom whose where when why is are was were be been do does did the a an
    of to in on for at by with from can could should would will shall may might must i me my we
    you your it its this that these those there any some please tell explain show""".split()
)

_CJK_PUNCT = (
    "。，、；：？！“”‘’（）【】《》〈〉「」『』〔〕［］｛｝…—–～·・﹏﹑﹔﹖﹗"
    "　＂＇，．：；？！（）｀｜～＿"
)
_STRIP_CHARS = frozenset(string.punctuation + _CJK_PUNCT)


@dataclass(frozen=True)
class PreprocessedQuery:
    """What `preprocess_query` returns (seed 002 section 5.1)."""

    original: str
    vector_query: str                       # the text to embed
    keywords: list[str] = field(default_factory=list)
    hybrid_reason: str | None = None        # 'mixed_lang' | 'number' | 'short_query' | None
    use_hybrid: bool = False


def normalize_for_keyword(s: str) -> str:
    """Lowercase and drop whitespace and common punctuation (ASCII and CJK).

    NFKC first, so full-width letters and punctuation (``ＡＰＩ``, ``，``) fold to their ASCII
    forms. Any character whose Unicode category is punctuation (P*) is removed too. Used on both
    the keyword and the candidate text before the substring test of the keyword bonus.
    """
    s = unicodedata.normalize("NFKC", s).lower()
    out = []
    for ch in s:
        if ch.isspace() or ch in _STRIP_CHARS or unicodedata.category(ch).startswith("P"):
            continue
        out.append(ch)
    return "".join(out)


def _dedupe(items: list[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for it in items:
        key = normalize_for_keyword(it)
        if it and key and key not in seen:
            seen.add(key)
            out.append(it)
    return out


def _numbers(text: str) -> list[str]:
    return [re.sub(r"\s+", "", m.group(0)) for m in _NUMBER_RE.finditer(text)]


def _strip_question_words(text: str) -> str:
    core = text
    for phrase in _ZH_QUESTION_PHRASES:
        core = core.replace(phrase, " ")
    core = "".join(" " if ch in _STRIP_CHARS else ch for ch in core)
    words = [w for w in core.split() if w.lower() not in _EN_QUESTION_WORDS]
    core = " ".join(words)
    while core and core[-1] in _ZH_FINAL_PARTICLES:
        core = core[:-1].rstrip()
    while core and core[0] in _ZH_LEADING:
        core = core[1:].lstrip()
    return core


def lexical_text(text: str) -> str:
    """The words of a question that the lexical channel should require: English question and
    function words dropped ("how do I prompt for a password" -> "prompt password"), so that a
    chunk quoting the question word for word is not the only one that holds every word. An
    identifier, or a question of nothing but such words, is searched as written."""
    if is_identifier_query(text):
        return text
    kept = [w for w in text.split() if w.strip(string.punctuation).lower() not in _EN_QUESTION_WORDS]
    return " ".join(kept) if kept else text


def _core_size(core: str) -> int:
    size = 0
    for word in core.split():
        cjk = len(_CJK_RE.findall(word))
        rest = _CJK_RE.sub(" ", word).split()
        size += len(rest) + (cjk + 1) // 2
    return size


def preprocess_query(text: str) -> PreprocessedQuery:
    """Seed 002 section 7.3: decide hybrid and extract keywords by rule (see module docstring)."""
    original = text
    vector_query = " ".join(unicodedata.normalize("NFKC", text).split())
    work = vector_query

    has_cjk = bool(_CJK_RE.search(work))
    english: list[str] = []
    numbers: list[str] = []
    if has_cjk and _ASCII_LETTER_RE.search(work):
        for m in _EN_TOKEN_RE.finditer(work):
            tok = m.group(0).strip("./-")
            if not tok:
                continue
            if _NUMBER_FULL_RE.fullmatch(tok):     # "40k", "3ms": a number with a unit
                continue
            if tok.lower() in _EN_QUESTION_WORDS:
                continue
            english.append(tok)
    # numbers are looked for outside the English tokens, so GPT-4 or utf8 yield no "4"/"8"
    masked = _EN_TOKEN_RE.sub(
        lambda m: m.group(0) if _NUMBER_FULL_RE.fullmatch(m.group(0)) else " " * len(m.group(0)),
        work,
    )
    numbers = _numbers(masked)

    english = _dedupe(english)
    numbers = _dedupe(numbers)
    if english:
        return PreprocessedQuery(original, vector_query, _dedupe(english + numbers), "mixed_lang", True)
    if numbers:
        return PreprocessedQuery(original, vector_query, numbers, "number", True)
    core = _strip_question_words(work)
    if core and 1 <= _core_size(core) <= SHORT_QUERY_MAX_WORDS:
        return PreprocessedQuery(original, vector_query, [core], "short_query", True)
    return PreprocessedQuery(original, vector_query, [], None, False)


# ---------------------------------------------------------------------------------------------
# identifiers in free text

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_CANDIDATE_RE = re.compile(
    rf"(?<![A-Za-z0-9_.])(?P<name>{_IDENT}(?:\.{_IDENT})*)(?![A-Za-z0-9_])(?P<call>\((?!s\))[^()\n]{{0,80}}\))?"
)
_CODE_SPAN_RE = re.compile(r"(`{1,2})([^`\n]+?)\1")
_CODE_SPAN_IDENT_RE = re.compile(rf"\s*({_IDENT}(?:\.{_IDENT})*)\s*(?:\(\s*\))?\s*")


def _is_code_like(name: str, is_call: bool) -> bool:
    if is_call:
        return True
    if "." in name:
        parts = name.split(".")
        return any(len(p) > 1 for p in parts)        # "e.g", "i.e" are prose
    if "_" in name:
        return any(c.isalnum() for c in name)
    # CamelCase: an upper-case letter after the first character, and some lower case
    return any(c.isupper() for c in name[1:]) and any(c.islower() for c in name)


def identifiers_in(text: str) -> list[str]:
    """Code-like identifiers found in free text (Chinese or English), deduped, in text order.

    Recognised: dotted names (``a.b.c``; not ``e.g``), snake_case names with ``_``, CamelCase
    names with an inner capital (``JSONDecoder``, ``MemoryGraph``; not ``Context`` or ``API``),
    calls ``name()`` / ``pkg.name(x)`` (returned without the parentheses), and any single
    identifier written as inline code (``\\`Context\\```, ````Context````) in Markdown / reST.
    Identifiers are ASCII; they are found inside CJK text without spaces around them
    (``用best_by_id合并`` -> ``best_by_id``).
    """
    found: list[tuple[int, str]] = []
    for m in _CODE_SPAN_RE.finditer(text):
        inner = _CODE_SPAN_IDENT_RE.fullmatch(m.group(2))
        if inner:
            found.append((m.start(2), inner.group(1)))
    for m in _CANDIDATE_RE.finditer(text):
        name = m.group("name")
        if _is_code_like(name, bool(m.group("call"))):
            found.append((m.start(), name))
    found.sort(key=lambda item: item[0])
    out: list[str] = []
    seen: set[str] = set()
    for _, name in found:
        if name not in seen:
            seen.add(name)
            out.append(name)
    return out


_WHOLE_IDENT_RE = re.compile(rf"\s*`?(?P<name>{_IDENT}(?:\.{_IDENT})*)(?P<call>\(\s*\))?`?\s*")


def is_identifier_query(text: str) -> bool:
    """Is the whole query one code identifier (`click.core.Context.invoke`, `get_terminal_size`,
    `MemoryGraph`, `prompt()`) or one issue key (`#12`, `PROJ-12`)? Plain words are not: "prompt"
    may be prose."""
    if is_issue_key(text.strip()):
        return True
    m = _WHOLE_IDENT_RE.fullmatch(text)
    return bool(m) and _is_code_like(m.group("name"), bool(m.group("call")))


_FENCE_RE = re.compile(r"^(```|~~~)[^\n]*\n.*?^\1[ \t]*$", re.M | re.S)


def prose_of(text: str) -> str:
    """Markdown text without its fenced code blocks (examples use names they are not about)."""
    return _FENCE_RE.sub("", text)
