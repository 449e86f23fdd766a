"""Dagster instance storage: SQLite (Dagster's default files under DAGSTER_HOME) vs PostgreSQL
(MTRAG_DAGSTER_PG_URL, the local server `mtrag postgres start` runs), on one small source: six
modules of the click 8.5.1 sdist as a folder source.

Per storage, each in a home of its own (the source ids differ, so the one Neo4j both use keeps
them apart):
  full_s          the first `mtrag build` (embeds everything; one run, build_source_and_publish)
  rebuild_s       `mtrag build --force`: every stage of the source again, the embeddings from the
                  cache, so what is left is Dagster's and the stores' own cost (ROUNDS rounds,
                  alternating storages; the fastest counts, every round in rebuild_rounds_s)
  events_per_run  events the last rebuild's run stored (and how many of each type)
  event_write_s   seconds per event write: EVENTS engine events reported one by one through the
                  instance (each is a committed INSERT), in a process of its own
  event_log_s_per_run  events_per_run x event_write_s: the event log's share of a rebuild

Usage: python bench/instance_storage.py [--out bench/out/instance_storage.json]
       [--work bench/out/instance-storage-work] [--rounds 3] [--events 500]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, fetch_sdist, mtrag_env, run_mtrag, write_json  # noqa: E402

MODULES = ["decorators.py", "exceptions.py", "formatting.py", "parser.py", "types.py", "utils.py"]

# Run inside an environment naming one instance: its last run's events, then the write cost.
EVENTS = r'''
import json, sys, time, uuid
import dagster as dg
from mtrag_assets.runner import dagster_instance
from mtrag_resources.core.config import Settings
n = int(sys.argv[1])
instance = dagster_instance(Settings.from_env())
last = instance.get_runs(limit=1)[0]
logs = instance.all_logs(last.run_id)
by_type = {}
for entry in logs:
    kind = entry.dagster_event.event_type_value if entry.dagster_event else "LOG"
    by_type[kind] = by_type.get(kind, 0) + 1
run = instance.add_run(dg.DagsterRun(job_name="bench_event_writes", run_id=str(uuid.uuid4())))
instance.report_engine_event("warm-up", run)
t0 = time.perf_counter()
for i in range(n):
    instance.report_engine_event(f"bench event {i}", run)
seconds = time.perf_counter() - t0
stored = len(instance.all_logs(run.run_id)) - 1
print(json.dumps({"storage": type(instance.run_storage).__name__, "job": last.job_name,
                  "events_per_run": len(logs), "events_by_type": by_type,
                  "event_write_s": seconds / n, "events_written": stored}))
'''


def instance_figures(env: dict, events: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", EVENTS, str(events)], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"event figures failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "bench" / "out" / "instance_storage.json"))
    ap.add_argument("--work", default=str(REPO / "bench" / "out" / "instance-storage-work"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--events", type=int, default=500)
    args = ap.parse_args()

    from mtrag_resources.core.config import Settings
    from mtrag_resources.stores.neo4j_server import Neo4jServer
    from mtrag_resources.stores.postgres_server import PostgresServer

    work = Path(args.work).resolve()  # relative: the sources file and DAGSTER_HOME need absolute paths
    pg = PostgresServer(Settings(home=work / "pg-home"))
    neo4j = Neo4jServer(Settings(home=work / "neo4j-home"))
    for server in (pg, neo4j):  # a previous run's servers, before their folders go
        server.stop()
    shutil.rmtree(work, ignore_errors=True)
    corpus = work / "corpus" / "click"
    sdist = fetch_sdist("click==8.5.1", work / "sdists")
    (corpus / "src" / "click").mkdir(parents=True)
    for name in MODULES:
        shutil.copy2(sdist / "src" / "click" / name, corpus / "src" / "click" / name)

    result: dict = {"corpus": {"sdist": "click==8.5.1", "files": [f"src/click/{m}" for m in MODULES]},
                    "rounds": args.rounds, "events_timed": args.events}
    started_neo4j = not os.environ.get("NEO4J_URI")
    try:
        t0 = time.perf_counter()
        pg_url = pg.start(timeout=120)
        result["postgres_start_s"] = round(time.perf_counter() - t0, 2)
        neo4j_uri = os.environ.get("NEO4J_URI") or neo4j.start(timeout=240)
        envs = {}
        for storage in ("sqlite", "postgres"):
            sources = work / f"sources-{storage}.yaml"
            sources.write_text("sources:\n"
                               f"  - {{id: click-{storage}, kind: code, path: {corpus}, include: ['src/**/*.py']}}\n")
            env = mtrag_env(work / f"home-{storage}", sources, NEO4J_URI=neo4j_uri)
            env.pop("MTRAG_DAGSTER_PG_URL", None)
            if storage == "postgres":
                env["MTRAG_DAGSTER_PG_URL"] = pg_url
            envs[storage] = env

        figures: dict = {s: {"rebuild_rounds_s": []} for s in envs}
        for storage, env in envs.items():
            wall, out, _ = run_mtrag(["build"], env)
            figures[storage]["full_s"] = round(wall, 2)
            print(f"{storage}: full build {wall:.1f} s", flush=True)
        for i in range(args.rounds):
            for storage, env in (envs.items() if i % 2 == 0 else reversed(envs.items())):
                wall, out, _ = run_mtrag(["build", "--force"], env)
                figures[storage]["rebuild_rounds_s"].append(round(wall, 2))
                print(f"{storage}: rebuild round {i + 1} {wall:.1f} s", flush=True)
        for storage, env in envs.items():
            f = figures[storage]
            f["rebuild_s"] = min(f["rebuild_rounds_s"])
            f.update(instance_figures(env, args.events))
            f["event_log_s_per_run"] = round(f["events_per_run"] * f["event_write_s"], 3)
            f["sqlite_files"] = sorted(str(p.relative_to(work)) for p in (work / f"home-{storage}" / "dagster_home").rglob("*.db"))
        result.update(figures)
        result["postgres_over_sqlite"] = {
            "rebuild": round(figures["postgres"]["rebuild_s"] / figures["sqlite"]["rebuild_s"], 3),
            "event_write": round(figures["postgres"]["event_write_s"] / figures["sqlite"]["event_write_s"], 3),
        }
    finally:
        pg.stop()
        if started_neo4j:
            neo4j.stop()

    for storage in ("sqlite", "postgres"):
        f = result.get(storage, {})
        if "event_write_s" in f:
            print(f"{storage:9s} full {f['full_s']:6.1f} s  rebuild {f['rebuild_s']:6.1f} s "
                  f"(rounds {f['rebuild_rounds_s']})  events/run {f['events_per_run']}  "
                  f"{f['event_write_s'] * 1000:.2f} ms/event  event log {f['event_log_s_per_run']:.2f} s/run")
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
