"""Golden queries: the maintainer's queries with the items each must find, and the quality gate
that holds a candidate generation to them before `index_manifest` moves CURRENT. This module holds
what the publish protocol decides with the ranks: the file (`golden.yaml`, MTRAG_GOLDEN), recall,
the verdict, the manifest's `quality` record and the persisted refusal `mtrag status` shows; the
reader runs the queries (`mtrag_resources.serving.golden`). The file's format and the gate's rule:
docs/retrieval.md#golden-queries and the header of data/golden.yaml."""
from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mtrag_resources.core.atomic import write_text_atomic
from mtrag_resources.core.errors import ConfigError, PublishError

DEFAULT_MIN_RECALL = 0.0
DEFAULT_MAX_DROP = 0.05
# The reader's query modes and kinds (mtrag_resources.serving.requests; publish may not import
# serving, a unit test holds the two lists equal).
MODES = ("hybrid", "dense", "lexical", "exact", "bundles")
KINDS = ("code", "docs", "issues")
MAX_K = 100
_EPS = 1e-9

_TOP_KEYS = {"quality_gate", "queries"}
_GATE_KEYS = {"min_recall", "max_drop"}
_QUERY_KEYS = {"id", "query", "kind", "mode", "expect", "k"}
_EXPECT_KEYS = {"source", "file_path", "symbol"}


class GoldenConfigError(ConfigError):
    """The golden query file is malformed: the message names the file and the query."""


@dataclass(frozen=True)
class Expected:
    source: str
    file_path: str
    symbol: str | None = None

    def matches(self, hit: dict) -> bool:
        return (hit.get("source_id") == self.source and hit.get("file_path") == self.file_path
                and (self.symbol is None or hit.get("symbol") == self.symbol))

    def as_dict(self) -> dict:
        return {"source": self.source, "file_path": self.file_path,
                **({"symbol": self.symbol} if self.symbol is not None else {})}


@dataclass(frozen=True)
class GoldenQuery:
    id: str
    query: str
    k: int
    expect: tuple[Expected, ...]
    kind: str | None = None
    mode: str = "hybrid"

    @property
    def digest(self) -> str:
        """What the query asks and expects: an edited query is compared with nothing before it."""
        body = {"query": self.query, "kind": self.kind, "mode": self.mode, "k": self.k,
                "expect": sorted(json.dumps(e.as_dict(), sort_keys=True) for e in self.expect)}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]

    def rank(self, hits: list[dict]) -> int | None:
        """The best rank (1-based) among the top k hits of any expected item, else None."""
        for hit in hits[: self.k]:
            if any(e.matches(hit) for e in self.expect):
                return int(hit.get("rank") or hits.index(hit) + 1)
        return None


@dataclass(frozen=True)
class GoldenFile:
    path: Path
    queries: tuple[GoldenQuery, ...]
    min_recall: float = DEFAULT_MIN_RECALL
    max_drop: float = DEFAULT_MAX_DROP

    @property
    def digest(self) -> str:
        body = [self.min_recall, self.max_drop, [(q.id, q.digest) for q in self.queries]]
        return hashlib.sha256(json.dumps(body).encode()).hexdigest()[:16]

    def unknown_sources(self, source_ids) -> None:
        """Refuse expectations naming a source that is not configured (a typo never recalls)."""
        known = set(source_ids)
        for q in self.queries:
            for i, e in enumerate(q.expect):
                if e.source not in known:
                    raise GoldenConfigError(f"{self.path}: query {q.id!r}: expect[{i}].source {e.source!r} is not a "
                                            f"configured source; known: {sorted(known)}")


# ------------------------------------------------------------------------------------- the file

def load_golden(path: Path) -> GoldenFile | None:
    """The golden file at `path`, validated; None where there is no file (no gate)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise GoldenConfigError(f"{path}: cannot read the golden query file: {exc}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise GoldenConfigError(f"{path}: not valid YAML: {exc}") from exc
    return parse_golden(doc, path)


def parse_golden(doc, path: Path) -> GoldenFile:
    def fail(msg: str):
        raise GoldenConfigError(f"{path}: {msg}")

    if not isinstance(doc, dict):
        fail("expected a mapping with `queries` (and optionally `quality_gate`), "
             f"got {type(doc).__name__}")
    extra = sorted(set(doc) - _TOP_KEYS, key=str)
    if extra:
        fail(f"unknown top-level key(s) {extra}; allowed: {sorted(_TOP_KEYS)}")
    gate = doc.get("quality_gate") or {}
    if not isinstance(gate, dict):
        fail(f"quality_gate must be a mapping {{min_recall, max_drop}}, got {type(gate).__name__}")
    extra = sorted(set(gate) - _GATE_KEYS, key=str)
    if extra:
        fail(f"quality_gate: unknown key(s) {extra}; allowed: {sorted(_GATE_KEYS)}")
    bounds = {}
    for key, default in (("min_recall", DEFAULT_MIN_RECALL), ("max_drop", DEFAULT_MAX_DROP)):
        value = gate.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            fail(f"quality_gate.{key} must be a number from 0 to 1, got {value!r}")
        bounds[key] = float(value)
    raw = doc.get("queries")
    if not isinstance(raw, list) or not raw:
        fail("`queries` must be a non-empty list of {id, query, k, expect, kind?, mode?}")
    queries, seen = [], set()
    for i, item in enumerate(raw):
        queries.append(_parse_query(item, i, path, seen))
    return GoldenFile(path=path, queries=tuple(queries), **bounds)


def _parse_query(item, index: int, path: Path, seen: set) -> GoldenQuery:
    if not isinstance(item, dict):
        raise GoldenConfigError(f"{path}: queries[{index}] must be a mapping, got {type(item).__name__}")
    qid = item.get("id")
    if not isinstance(qid, str) or not qid.strip():
        raise GoldenConfigError(f"{path}: queries[{index}] needs an `id` (a non-empty string), got {qid!r}")
    qid = qid.strip()

    def fail(msg: str):
        raise GoldenConfigError(f"{path}: query {qid!r}: {msg}")

    if qid in seen:
        fail("duplicate id (each query id must be unique)")
    seen.add(qid)
    extra = sorted(set(item) - _QUERY_KEYS, key=str)
    if extra:
        fail(f"unknown key(s) {extra}; allowed: {sorted(_QUERY_KEYS)}")
    text = item.get("query")
    if not isinstance(text, str) or not text.strip():
        fail(f"`query` must be a non-empty string, got {text!r}")
    kind = item.get("kind")
    if kind is not None and kind not in KINDS:
        fail(f"kind {kind!r} is not one of {list(KINDS)}")
    mode = item.get("mode", "hybrid")
    if mode not in MODES:
        fail(f"mode {mode!r} is not one of {list(MODES)}")
    k = item.get("k")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        fail(f"`k` must be an integer from 1 to {MAX_K}, got {k!r}")
    expect = item.get("expect")
    if not isinstance(expect, list) or not expect:
        fail("`expect` must be a non-empty list of {source, file_path, symbol?}")
    items = []
    for j, e in enumerate(expect):
        if not isinstance(e, dict):
            fail(f"expect[{j}] must be a mapping {{source, file_path, symbol?}}, got {type(e).__name__}")
        extra = sorted(set(e) - _EXPECT_KEYS, key=str)
        if extra:
            fail(f"expect[{j}]: unknown key(s) {extra}; allowed: {sorted(_EXPECT_KEYS)}")
        for key in ("source", "file_path"):
            if not isinstance(e.get(key), str) or not e[key].strip():
                fail(f"expect[{j}].{key} must be a non-empty string, got {e.get(key)!r}")
        symbol = e.get("symbol")
        if symbol is not None and (not isinstance(symbol, str) or not symbol.strip()):
            fail(f"expect[{j}].symbol must be a non-empty string when given, got {symbol!r}")
        items.append(Expected(e["source"].strip(), e["file_path"].strip(), symbol.strip() if symbol else None))
    return GoldenQuery(id=qid, query=text.strip(), k=k, expect=tuple(items), kind=kind, mode=mode)


# ---------------------------------------------------------------------------------- the verdict

def describe_rank(rank: int | None, k: int) -> str:
    return f"rank {rank}" if rank is not None else f"not in top {k}"


@dataclass
class Verdict:
    """What the gate decided about a candidate: `record` goes into its manifest as `quality`."""
    passed: bool
    record: dict
    reasons: list[str] = field(default_factory=list)
    regressed: list[dict] = field(default_factory=list)   # [{id, query, k, old_rank, new_rank}]


def judge(golden: GoldenFile, ranks: dict[str, int | None], published: dict | None) -> Verdict:
    """Hold the candidate's ranks (query id -> rank or None) to the gate, against the published
    manifest's `quality` record (None, or a manifest without one: only `min_recall` applies)."""
    before = ((published or {}).get("quality") or {}).get("per_query") or {}
    per_query, comparable = {}, []
    for q in golden.queries:
        rank = ranks.get(q.id)
        old = before.get(q.id)
        same = old is not None and old.get("digest") == q.digest
        per_query[q.id] = {"query": q.query, "k": q.k, "rank": rank, "recalled": rank is not None,
                           "previous_rank": old.get("rank") if same else None,
                           "status": _status(rank is not None, old.get("recalled") if same else None),
                           "digest": q.digest}
        if same:
            comparable.append((q, bool(old.get("recalled")), rank is not None, old.get("rank"), rank))
    n = len(golden.queries)
    recalled = sum(r["recalled"] for r in per_query.values())
    recall = recalled / n
    record = {"golden_file": str(golden.path), "golden_digest": golden.digest, "min_recall": golden.min_recall,
              "max_drop": golden.max_drop, "queries": n, "recalled": recalled, "recall": round(recall, 6),
              "baseline": None, "per_query": per_query, "accepted_drop": None}
    reasons, regressed = [], []
    if recall + _EPS < golden.min_recall:
        reasons.append(f"golden recall {recall:.3f} ({recalled}/{n}) is below quality_gate.min_recall "
                       f"{golden.min_recall:.3f}")
    if comparable:
        m = len(comparable)
        was = sum(c[1] for c in comparable) / m
        now = sum(c[2] for c in comparable) / m
        drop = was - now
        record["baseline"] = {"generation": (published or {}).get("generation"), "queries": m,
                              "recall_before": round(was, 6), "recall_after": round(now, 6),
                              "drop": round(drop, 6)}
        regressed = [{"id": q.id, "query": q.query, "k": q.k, "old_rank": old_rank, "new_rank": new_rank}
                     for q, was_ok, now_ok, old_rank, new_rank in comparable if was_ok and not now_ok]
        if drop > golden.max_drop + _EPS:
            reasons.append(f"golden recall {now:.3f} over the {m} queries the published generation "
                           f"{record['baseline']['generation']} was measured on is {drop:.3f} below its "
                           f"{was:.3f} (quality_gate.max_drop {golden.max_drop:.3f})")
    if reasons and not regressed:
        # below the floor with nothing to compare: name the queries that miss
        regressed = [{"id": q.id, "query": q.query, "k": q.k, "old_rank": per_query[q.id]["previous_rank"],
                      "new_rank": None} for q in golden.queries if not per_query[q.id]["recalled"]]
    return Verdict(passed=not reasons, record=record, reasons=reasons, regressed=regressed)


def _status(now: bool, before: bool | None) -> str:
    if before is None:
        return "recalled" if now else "missed"   # nothing to compare with
    if before and not now:
        return "regressed"
    if now and not before:
        return "fixed"
    return "recalled" if now else "missed"


def regression_lines(regressed: list[dict]) -> list[str]:
    return [f"{r['id']}: {describe_rank(r['old_rank'], r['k'])} -> {describe_rank(r['new_rank'], r['k'])} "
            f"(query {r['query']!r})" for r in regressed]


def refusal_lines(verdict: Verdict) -> list[str]:
    """Why the gate refused, then the queries that regressed (old rank -> new rank)."""
    return verdict.reasons + ["regressed queries (old rank -> new rank):" if verdict.regressed else
                              "no single query regressed"] + ["  " + l for l in regression_lines(verdict.regressed)]


class QualityRefused(PublishError):
    """The candidate generation's golden recall fell through the quality gate."""

    def __init__(self, verdict: Verdict, candidate: int, published: int | None, golden_file: Path):
        self.verdict, self.candidate, self.published = verdict, candidate, published
        current = f"CURRENT still names generation {published}" if published is not None else \
            "nothing is published yet"
        super().__init__(f"generation {candidate} not published by the golden-query gate ({golden_file}); {current}:\n  "
                         + "\n  ".join(refusal_lines(verdict))
                         + "\n  fix the change or the golden file, or publish anyway with `mtrag build --accept-quality-drop`")


def accepted_record(verdict: Verdict) -> dict:
    """What the manifest records when the maintainer publishes a refused candidate anyway."""
    return {"accepted_at": _now(), "how": "mtrag build --accept-quality-drop", "reasons": verdict.reasons,
            "regressed": verdict.regressed}


# ---------------------------------------------------------------------------------- the refusal

def record_refusal(path: Path, exc: QualityRefused, run_id: str = "") -> dict:
    """Persist why the last candidate was refused (shown by `mtrag status` until a later publish)."""
    refusal = {"refused_at": _now(), "run_id": run_id, "candidate_generation": exc.candidate,
               "published_generation": exc.published, "golden_file": exc.verdict.record["golden_file"],
               "recall": exc.verdict.record["recall"], "baseline": exc.verdict.record["baseline"],
               "reasons": exc.verdict.reasons, "regressed": exc.verdict.regressed}
    write_text_atomic(Path(path), json.dumps(refusal, indent=1, sort_keys=True))
    return refusal


def load_refusal(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def clear_refusal(path: Path) -> None:
    Path(path).unlink(missing_ok=True)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()
