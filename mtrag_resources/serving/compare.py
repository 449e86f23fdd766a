"""`mtrag compare A B`: the same queries through the same reader code against two published
generations (the live home, or a shadow home), side by side: per query the rank of each expected
item on each side, the overlap of the two top k and the latency; overall recall@k, MRR and p50/p95
latency, and the queries that got worse on B, worst first. docs/shadow.md#commands."""
from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from mtrag_resources.core.atomic import write_text_atomic
from mtrag_resources.core.config import Settings
from mtrag_resources.core.profiles import applied
from mtrag_resources.publish.golden import GoldenFile, GoldenQuery
from mtrag_resources.publish.manifest import load_current
from mtrag_resources.serving.reader import ReaderCore


@dataclass
class Side:
    """One generation to query: its name (`live` or a profile's), its home, the environment its
    reader runs under (a profile's embedder and ranker) and its fusion weights."""
    name: str
    home: Path
    env: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)


@dataclass
class Answered:
    hits: list[dict]
    ms: float
    stale: list[dict] = field(default_factory=list)  # the channels the answer left out, and why


def run_side(side: Side, queries: tuple[GoldenQuery, ...]) -> tuple[int | None, dict[str, Answered]]:
    """(generation, query id -> its hits and latency) of one side. The first query is asked once,
    untimed, before the timed ones: it opens the stores and loads the embedder."""
    with applied(side.env):
        settings = Settings(home=side.home)
        generation = (load_current(settings.manifest_dir) or {}).get("generation")
        core = ReaderCore(settings, weights=side.weights, proposals=False)
        try:
            if queries:  # hybrid: every channel opens and the embedder loads, whatever the first query's mode
                core.query(queries[0].query, k=queries[0].k, mode="hybrid")
            answers = {}
            for q in queries:
                t0 = time.perf_counter()
                answer = core.query(q.query, k=q.k, kind=q.kind, mode=q.mode)
                answers[q.id] = Answered(answer["hits"], (time.perf_counter() - t0) * 1000, answer.get("stale") or [])
        finally:
            core.close()
    return generation, answers


def compare(a: Side, b: Side, golden: GoldenFile) -> dict:
    """The report: {a, b, queries: [per query row], summary: {name: ...}, worse: [query ids]}; the
    two sides have different names."""
    gen_a, ans_a = run_side(a, golden.queries)
    gen_b, ans_b = run_side(b, golden.queries)
    rows = [_row(q, ans_a[q.id], ans_b[q.id]) for q in golden.queries]
    worse = sorted((r for r in rows if r["delta"] < 0), key=lambda r: (r["delta"], r["id"]))
    return {"a": {"name": a.name, "home": str(a.home), "generation": gen_a, "weights": a.weights,
                  "stale": _stale(ans_a)},
            "b": {"name": b.name, "home": str(b.home), "generation": gen_b, "weights": b.weights,
                  "stale": _stale(ans_b)},
            "queries_file": str(golden.path), "queries": rows,
            "summary": {a.name: _summary(rows, "a"), b.name: _summary(rows, "b")},
            "worse": [r["id"] for r in worse]}


def _row(q: GoldenQuery, a: Answered, b: Answered) -> dict:
    rank_a, rank_b = q.rank(a.hits), q.rank(b.hits)
    top_a = {h["chunk_id"] for h in a.hits[: q.k]}
    top_b = {h["chunk_id"] for h in b.hits[: q.k]}
    miss = q.k + 1  # a miss ranks below anything found
    return {"id": q.id, "query": q.query, "k": q.k,
            "expected": [{**e.as_dict(), "rank_a": _rank_of(e, a.hits, q.k), "rank_b": _rank_of(e, b.hits, q.k)}
                         for e in q.expect],
            "rank_a": rank_a, "rank_b": rank_b,
            "delta": (rank_a or miss) - (rank_b or miss),  # > 0: B ranks it higher; < 0: B is worse
            "overlap": round(len(top_a & top_b) / max(1, len(top_a | top_b)), 3),
            "ms_a": round(a.ms, 2), "ms_b": round(b.ms, 2)}


def _stale(answers: dict[str, Answered]) -> list[dict]:
    """The stale channels any answer of a side reported: a difference they explain is the
    infrastructure's (a graph server not running), not the profile's."""
    seen = {(e.get("source"), e.get("store"), e.get("reason")) for a in answers.values() for e in a.stale}
    return [{"source": s, "store": st, "reason": r} for s, st, r in sorted(seen, key=str)]


def _rank_of(expected, hits: list[dict], k: int) -> int | None:
    return next((int(h.get("rank") or i + 1) for i, h in enumerate(hits[:k]) if expected.matches(h)), None)


def _summary(rows: list[dict], side: str) -> dict:
    """recall and MRR over the queries that expect something (a query log's expect nothing: they
    show only overlap and latency), latency over all."""
    ranks = [r[f"rank_{side}"] for r in rows if r["expected"]]
    ms = sorted(r[f"ms_{side}"] for r in rows)
    n = len(ranks)
    return {"queries": len(rows), "judged": n,
            "recall": round(sum(r is not None for r in ranks) / n, 4) if n else None,
            "mrr": round(sum(1 / r for r in ranks if r) / n, 4) if n else None,
            "overlap": round(sum(r["overlap"] for r in rows) / len(rows), 4) if rows else None,
            "p50_ms": _percentile(ms, 50), "p95_ms": _percentile(ms, 95)}


def _percentile(values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile of sorted `values`."""
    if not values:
        return None
    return round(values[max(0, math.ceil(pct / 100 * len(values)) - 1)], 2)


def table(report: dict):
    """The per-query rows as a pandas DataFrame, the worst regressions first."""
    import pandas as pd
    a, b = report["a"]["name"], report["b"]["name"]
    frame = pd.DataFrame([{"id": r["id"], f"rank {a}": r["rank_a"], f"rank {b}": r["rank_b"], "delta": r["delta"],
                           "overlap": r["overlap"], f"ms {a}": r["ms_a"], f"ms {b}": r["ms_b"],
                           "query": r["query"][:60]} for r in report["queries"]])
    if frame.empty:
        return frame
    for column in (f"rank {a}", f"rank {b}"):
        frame[column] = frame[column].astype("Int64")  # a miss stays <NA>, not a float NaN
    return frame.sort_values(["delta", "overlap", "id"], kind="stable").reset_index(drop=True)


def summary_table(report: dict):
    import pandas as pd
    return pd.DataFrame.from_dict(report["summary"], orient="index")[
        ["queries", "judged", "recall", "mrr", "overlap", "p50_ms", "p95_ms"]]


def render(report: dict) -> str:
    """What the terminal shows: the summary, then the per-query table."""
    with _wide_pandas():
        return (f"{report['a']['name']} (generation {report['a']['generation']}) vs {report['b']['name']} "
                f"(generation {report['b']['generation']}), queries from {report['queries_file']}\n"
                + "".join(f"warning: {side['name']}: {e['store']} stale for {e['source']}: {e['reason']}\n"
                          for side in (report["a"], report["b"]) for e in side["stale"])
                + f"\n{summary_table(report).to_string()}\n\n{table(report).to_string(index=False)}\n"
                + (f"\nworse on {report['b']['name']}, worst first: {', '.join(report['worse'])}\n"
                   if report["worse"] else f"\nno query is worse on {report['b']['name']}\n"))


def markdown(report: dict) -> str:
    """The report as Markdown (pandas' to_markdown, through tabulate)."""
    a, b = report["a"], report["b"]
    return (f"# {a['name']} vs {b['name']}\n\n"
            f"- {a['name']}: generation {a['generation']} ({a['home']})\n"
            f"- {b['name']}: generation {b['generation']} ({b['home']})\n"
            f"- queries: {report['queries_file']}\n\n## Summary\n\n{summary_table(report).to_markdown()}\n\n"
            f"## Per query (worst first)\n\n{table(report).to_markdown(index=False)}\n")


def write(report: dict, out_dir: Path) -> dict[str, Path]:
    """`compare.json` and `compare.md` in `out_dir`."""
    out_dir = Path(out_dir)
    paths = {"json": out_dir / "compare.json", "markdown": out_dir / "compare.md"}
    write_text_atomic(paths["json"], json.dumps(report, indent=1, ensure_ascii=False))
    write_text_atomic(paths["markdown"], markdown(report))
    return paths


@contextlib.contextmanager
def _wide_pandas():
    import pandas as pd
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_rows", 500):
        yield
