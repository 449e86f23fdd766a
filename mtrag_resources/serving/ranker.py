"""A learned order for the head of the fused list: LightGBM (lambdarank) over the channels'
features of each candidate.

Weighted RRF only sees ranks, so a candidate the lexical channel ranks first because its text is
long weighs as much as one whose name is the question's words. The ranker sees, per candidate,
each channel's rank, the true cosine, how many of the question's words its name and text hold,
what kind of chunk it is (function, method, class, module, doc passage), whether it is private,
a test or a declaration, and its length. It reorders the first `HEAD` candidates of the fusion;
the rest keep their order. The model file (`data/ranker.txt`) is trained by
`bench/ranker/train.py` on questions made from docstrings of other packages than the ones it is
measured on; no model file (or MTRAG_RANKER=off) leaves the fused order as it is.
"""
from __future__ import annotations

import math
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from mtrag_resources.core.config import env

MODEL = Path(__file__).with_name("data") / "ranker.txt"
HEAD = 30  # candidates the model reorders: beyond them RRF's order stands
CHANNELS = ("dense", "fts", "fts_en", "exact", "dense_ml")
CHUNK_TYPES = ("function", "method", "class", "module")
ABSENT_RANK = 100.0

_WORD_RE = re.compile(r"[A-Za-z][a-z]+|[A-Z]+(?![a-z])|\d+")
_STOP = frozenset("""a an the of to in on for at by with from and or is are be it its this that these those
how do does i me my we you your what which when where why can could should would will there any some
if then else not no into as use used using get set""".split())

FEATURES = (
    "position", "fused_score", "fused_share", *(f"rank_{c}" for c in CHANNELS), "channels",
    "cosine", "cosine_gap", "name_overlap", "name_cover", "path_overlap", "text_overlap",
    *(f"type_{t}" for t in CHUNK_TYPES), "is_docs", "is_private", "is_dunder", "is_test",
    "is_declaration", "log_chars", "query_words",
)


def words(text: str) -> list[str]:
    """Lower-cased word parts of prose or identifiers (`get_terminal_size` and `getTerminalSize`
    alike), stop words and one-letter parts dropped, a plural `s` folded."""
    out = []
    for w in _WORD_RE.findall(text or ""):
        w = w.lower()
        if len(w) > 1 and w not in _STOP:
            out.append(w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w)
    return out


def _share(part: set[str], whole: set[str]) -> float:
    return len(part & whole) / len(whole) if whole else 0.0


def candidate_features(query_words: set[str], position: int, fused_score: float, top_score: float,
                       per_channel: Mapping[str, Mapping], row: Mapping, cosine: float | None,
                       top_cosine: float) -> list[float]:
    """One candidate's feature vector, in FEATURES order."""
    symbol = str(row.get("symbol") or "")
    last = re.split(r"::|[.#]", symbol)[-1] if symbol else ""
    name = set(words(last or row.get("title") or ""))
    path = set(words(symbol)) | set(words(str(row.get("file_path") or "")))
    text = str(row.get("text") or "")
    body = set(words(text[:4000]))
    chunk_type = row.get("chunk_type") or ""
    file_path = str(row.get("file_path") or "").lower()
    return [
        float(position), fused_score, fused_score / top_score if top_score else 0.0,
        *(float(per_channel[c]["rank"]) if c in per_channel else ABSENT_RANK for c in CHANNELS),
        float(len(per_channel)),
        cosine if cosine is not None else -1.0,
        (top_cosine - cosine) if cosine is not None else 1.0,
        _share(name, query_words), _share(query_words, name) if name else 0.0,
        _share(path, query_words), _share(body, query_words),
        *(1.0 if chunk_type == t else 0.0 for t in CHUNK_TYPES),
        1.0 if row.get("source_kind") in ("docs", "issues") else 0.0,
        1.0 if last.startswith("_") and not last.startswith("__") else 0.0,
        1.0 if last.startswith("__") and last.endswith("__") else 0.0,
        1.0 if "test" in file_path else 0.0,
        1.0 if row.get("declaration") else 0.0,
        math.log1p(len(text)),
        float(len(query_words)),
    ]


def head_features(query: str, fused: Sequence[tuple[str, float, dict]], rows: Mapping[str, Mapping],
                  cosines: Mapping[str, float]) -> tuple[list[str], list[list[float]]]:
    """(candidate ids, feature rows) of the fused list's first HEAD candidates that have a row."""
    head = [(cid, score, ch) for cid, score, ch in fused[:HEAD] if rows.get(cid) is not None]
    qwords = set(words(query))
    top_score = head[0][1] if head else 0.0
    known = [cosines[c] for c, _, _ in head if cosines.get(c) is not None]
    top_cosine = max(known) if known else 0.0
    return ([cid for cid, _, _ in head],
            [candidate_features(qwords, i, score, top_score, ch, rows[cid], cosines.get(cid), top_cosine)
             for i, (cid, score, ch) in enumerate(head)])


class Ranker:
    """The model of `path`, loaded on first use; `order` returns the head's ids best first."""

    def __init__(self, path: Path = MODEL) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._booster = None
        self.enabled = env("MTRAG_RANKER", "on") != "off" and path.is_file()

    def _model(self):
        with self._lock:
            if self._booster is None:
                import lightgbm
                self._booster = lightgbm.Booster(model_file=str(self.path))
            return self._booster

    def reorder(self, query: str, fused: list[tuple[str, float, dict]], rows: Mapping[str, Mapping],
                cosines: Mapping[str, float]) -> list[tuple[str, float, dict]]:
        """The fused list with its head in the model's order (ties keep the fused order)."""
        ids, feats = head_features(query, fused, rows, cosines)
        if not self.enabled or len(ids) < 2:
            return fused
        scores = self._model().predict(feats)
        order = sorted(range(len(ids)), key=lambda i: (-scores[i], i))
        by_id = {cid: entry for cid, entry in ((e[0], e) for e in fused[:HEAD])}
        head = [by_id[ids[i]] for i in order]
        moved = set(ids)
        return head + [e for e in fused if e[0] not in moved]
