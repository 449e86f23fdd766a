"""Full builds of bench/build.py's corpus (click + flask) under two settings, alternating in one run:
each build a fresh home (its own Neo4j, stopped before the home goes), `mtrag build` in its own
process. Per setting: the full builds' seconds, their median, the neo4j_graph stages' seconds and
relationships/s, the embedding stages' seconds, and the CPU seconds of the build's process tree and
of the Neo4j server it started (boot included); the ratio of the medians B / A.

Usage: python bench/full_build_ab.py --a MTRAG_NEO4J_CDS=off --b MTRAG_NEO4J_CDS=on [--rounds 2]
       [--work bench/out/build-work] [--out bench/out/full_build_ab.json]
(run bench/build.py once first: it fetches the corpus into --work)
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.build import latest, local_neo4j_cpu, mtrag_build, run_measured  # noqa: E402
from bench.common import REPO, mtrag_env, write_json  # noqa: E402

SOURCES = ("click", "click-docs", "flask", "flask-docs")


def setting(text: str) -> dict:
    pairs = [p for p in text.split(",") if p]
    if not all("=" in p for p in pairs):
        raise SystemExit(f"{text!r}: expected NAME=VALUE[,NAME=VALUE...]")
    return dict(p.split("=", 1) for p in pairs)


def one_build(work: Path, label: str, n: int, extra: dict) -> dict:
    home = work / "ab" / f"{label}-{n}"
    shutil.rmtree(home, ignore_errors=True)
    env = mtrag_env(home, work / "sources.yaml", MTRAG_BUILD_SERVER="off", **extra)
    try:
        run = mtrag_build(env)
        neo4j_cpu = local_neo4j_cpu(home)  # before the reads below add to it
        neo = [latest(env, "neo4j_graph", s) for s in SOURCES]
        emb = [latest(env, "embedding_cache", s) for s in SOURCES]
        rels = sum(int(x.get("total_relationships") or 0) for x in neo)
        neo_s = sum(float(x.get("seconds") or 0) for x in neo)
        return {"setting": label, "full_s": run["wall"], "neo4j_s": round(neo_s, 2),
                "neo4j_rels_per_s": round(rels / neo_s) if neo_s else None,
                "embedding_s": round(sum(float(x.get("seconds") or 0) for x in emb), 2),
                "build_cpu_s": run["cpu_s"], "neo4j_cpu_s": neo4j_cpu}
    finally:
        run_measured([sys.executable, "-m", "mtrag_assets.app.cli", "neo4j", "stop"], env)
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True, type=setting)
    ap.add_argument("--b", required=True, type=setting)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--work", default=str(REPO / "bench/out/build-work"))
    ap.add_argument("--out", default=str(REPO / "bench/out/full_build_ab.json"))
    args = ap.parse_args()
    work = Path(args.work).resolve()
    if not (work / "sources.yaml").is_file():
        raise SystemExit(f"{work}/sources.yaml missing: run bench/build.py first")
    result: dict = {"a": args.a, "b": args.b, "builds": []}
    for n in range(args.rounds):
        for label in (("a", "b") if n % 2 == 0 else ("b", "a")):
            build = one_build(work, label, n, args.a if label == "a" else args.b)
            print(build, flush=True)
            result["builds"].append(build)
    for label in ("a", "b"):
        runs = [b for b in result["builds"] if b["setting"] == label]
        keys = ("full_s", "neo4j_s", "neo4j_rels_per_s", "embedding_s", "build_cpu_s", "neo4j_cpu_s")
        # neo4j_cpu_s is None where no local server ran (NEO4J_URI)
        result[f"{label}_median"] = {k: round(statistics.median(r[k] for r in runs), 3) for k in keys
                                     if all(r[k] is not None for r in runs)}
    result["ratio_b_over_a"] = {k: round(result["b_median"][k] / result["a_median"][k], 3)
                                for k in result["a_median"] if result["a_median"][k] and k in result["b_median"]}
    print({k: result[k] for k in ("a_median", "b_median", "ratio_b_over_a")})
    write_json(args.out, result)


if __name__ == "__main__":
    main()
