"""What kept SQLAlchemy engines (mtrag_assets/instance_engines.py) save on Dagster's SQLite storages,
measured in one process with both kinds of instance alternating on one DAGSTER_HOME:

  event_write_ms   one runless materialization reported (the run shard and the index shard)
  event_read_ms    the latest materialization of an asset read back (what a run does per input)
  run_s            an in-process run of a job shaped like `build_source_and_publish` (9 chained
                   assets, 6 checks) doing no work: Dagster's own cost per run

    python bench/instance_engines.py [--rounds 5] [--events 100] [--out bench/out/instance_engines.json]

Fastest round per kind counts; every round is in the JSON."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, write_json  # noqa: E402

STAGES = ["raw", "chunks", "graph", "embeddings", "qdrant", "fts", "neo4j", "links", "manifest"]
CHECKED = ["chunks", "graph", "embeddings", "qdrant", "fts", "neo4j"]


def job_like_a_build():
    import dagster as dg

    assets, checks = [], []
    for i, name in enumerate(STAGES):
        deps = [STAGES[i - 1]] if i else []

        @dg.asset(name=name, deps=deps)
        def stage(context):
            return dg.MaterializeResult(metadata={"rows": 1})

        assets.append(stage)
    for name in CHECKED:
        @dg.asset_check(asset=name, name=f"{name}_ok", blocking=True)
        def check():
            return dg.AssetCheckResult(passed=True)

        checks.append(check)
    return dg.Definitions(assets=assets, asset_checks=checks,
                          jobs=[dg.define_asset_job("build_like", selection="*")]).resolve_job_def("build_like")


def measure(instance, job, events: int) -> dict:
    import dagster as dg

    t0 = time.perf_counter()
    for i in range(events):
        instance.report_runless_asset_event(dg.AssetMaterialization(asset_key="bench_event", metadata={"i": i}))
    write = (time.perf_counter() - t0) / events
    t0 = time.perf_counter()
    for _ in range(events):
        instance.get_latest_materialization_event(dg.AssetKey("bench_event"))
    read = (time.perf_counter() - t0) / events
    t0 = time.perf_counter()
    assert job.execute_in_process(instance=instance).success
    return {"event_write_ms": round(write * 1000, 2), "event_read_ms": round(read * 1000, 2),
            "run_s": round(time.perf_counter() - t0, 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--events", type=int, default=100)
    ap.add_argument("--out", default=str(REPO / "bench/out/instance_engines.json"))
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="mtrag-bench-engines-")
    try:
        run_rounds(args, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)  # the shards of every round: nothing to keep


def run_rounds(args, home: str) -> None:
    os.environ["DAGSTER_HOME"] = home
    Path(home, "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    import dagster as dg
    from mtrag_assets.instance_engines import reuse_sqlite_engines

    job = job_like_a_build()
    rounds: dict[str, list[dict]] = {"per_use": [], "kept": []}
    warm = dg.DagsterInstance.get()
    measure(warm, job, 5)  # the shards exist and the modules are loaded before the clock
    for r in range(args.rounds):
        for kind in (("per_use", "kept") if r % 2 == 0 else ("kept", "per_use")):
            instance = dg.DagsterInstance.get()
            if kind == "kept":
                reuse_sqlite_engines(instance)
            rounds[kind].append(measure(instance, job, args.events))
            print(kind, rounds[kind][-1], flush=True)
    best = {kind: {k: min(r[k] for r in rs) for k in rs[0]} for kind, rs in rounds.items()}
    out = {"best": best, "rounds": rounds, "events": args.events,
           "ratio_kept_over_per_use": {k: round(best["kept"][k] / best["per_use"][k], 3) for k in best["kept"]}}
    print(out["best"], out["ratio_kept_over_per_use"])
    write_json(args.out, out)


if __name__ == "__main__":
    main()
