"""A backfill of unchanged partitions launched the way the UI launches one (issue #54, item 5):
a tiny home is built, `dagster dev -w workspace.yaml` (webserver + daemon) runs over it, and the
GraphQL mutation the UI's "Materialize all..." sends (`launchPartitionBackfill` with the
partitioned assets and every source partition) is posted to the webserver; the daemon's backfill
and run queue launch one run per partition. Nothing changed since the build, so each run is the
stages' no-change path. Per variant: seconds per partition, and where they go, from the run
records and their events:

- queued_s: run created -> launched (queue, the daemon's tick);
- worker_start_s: launched -> RUN_START (a run worker process starts and loads the code location);
- steps_s: RUN_START -> the last step's end; step_process_s: the sum over steps of a step's
  launch -> its STEP_START (a step process starting and importing, multiprocess only; steps
  overlap, so the sum can exceed steps_s); step_work_s: the sum of STEP_START -> STEP_SUCCESS
  (the stages' no-change path itself);
- tail_s: the last step's end -> RUN_SUCCESS.

Variants: `multiprocess` (the executor a UI launch got before, selected here through the
backfill's run config) and `default` (what a launch without run config gets now: in process,
mtrag_assets/jobs.py IN_PROCESS_BY_DEFAULT). At the end `dagster dev` is
sent SIGINT, as Ctrl-C does, and the seconds to its exit are recorded.

  python bench/backfill.py --work bench/out/backfill-work --out bench/out/backfill.json
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, mtrag_env, run_mtrag, stop_group, stop_neo4j, wipe_work, write_json  # noqa: E402

BIN = Path(sys.executable).parent
PARTITIONED = ["raw_source", "cas_chunks", "canonical_graph", "embedding_cache", "qdrant_collection", "fts_db",
               "neo4j_graph"]
LAUNCH = """mutation($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""
STATUS = """query($id: String!) { partitionBackfillOrError(backfillId: $id) {
  __typename ... on PartitionBackfill { status } ... on PythonError { message } } }"""
LOCATIONS = "{ workspaceOrError { ... on Workspace { locationEntries { loadStatus } } } }"
VARIANTS = {"multiprocess": {"execution": {"config": {"multiprocess": {}}}}, "default": None}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(base: str, query: str, variables: dict | None = None) -> dict:
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    req = urllib.request.Request(f"{base}/graphql", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        answer = json.load(resp)
    if answer.get("errors"):
        raise RuntimeError(f"GraphQL errors: {answer['errors']}")
    return answer["data"]


def wait_loaded(base: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dagster dev exited ({proc.returncode})")
        try:
            entries = graphql(base, LOCATIONS)["workspaceOrError"]["locationEntries"]
            if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                return
        except (OSError, KeyError, TypeError, RuntimeError):
            pass
        time.sleep(1)
    raise RuntimeError("the code location did not load")


def launch_backfill(base: str, partitions: list[str], run_config: dict | None) -> str:
    params = {"assetSelection": [{"path": [key]} for key in PARTITIONED], "partitionNames": partitions,
              "fromFailure": False, "tags": [{"key": "mtrag/trigger", "value": "bench_backfill"}]}
    if run_config is not None:
        params["runConfigData"] = run_config
    answer = graphql(base, LAUNCH, {"params": params})["launchPartitionBackfill"]
    if answer["__typename"] != "LaunchBackfillSuccess":
        raise RuntimeError(f"backfill not launched: {answer}")
    return answer["backfillId"]


def wait_backfill(base: str, backfill_id: str, timeout: float = 900) -> tuple[str, float]:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        status = graphql(base, STATUS, {"id": backfill_id})["partitionBackfillOrError"]["status"]
        if status in ("COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"):
            return status, time.monotonic() - t0
        time.sleep(0.5)
    raise RuntimeError(f"backfill {backfill_id} not done after {timeout} s")


def run_breakdown(instance, run) -> dict:
    """Where one run's seconds went, from its record and its events (see the module docstring)."""
    import dagster as dg
    record = instance.get_run_record_by_id(run.run_id)
    events = instance.get_records_for_run(run.run_id, limit=100000).records
    at: dict[str, float] = {}
    step_launch: dict[str, float] = {}
    step_start: dict[str, float] = {}
    step_work, step_process, last_step_end = 0.0, 0.0, None
    for rec in events:
        entry = rec.event_log_entry
        event = entry.dagster_event
        if event is None:
            continue
        kind, ts, step = event.event_type.name, entry.timestamp, entry.step_key  # RUN_START's value is PIPELINE_START
        if kind in ("RUN_STARTING", "RUN_START", "RUN_SUCCESS", "RUN_FAILURE") and kind not in at:
            at[kind] = ts
        elif kind == "STEP_WORKER_STARTING" and step:
            step_launch.setdefault(step, ts)
        elif kind == "STEP_START":
            step_start[step] = ts
            if step in step_launch:
                step_process += ts - step_launch[step]
        elif kind in ("STEP_SUCCESS", "STEP_FAILURE", "STEP_SKIPPED") and step in step_start:
            step_work += ts - step_start[step]
            last_step_end = max(last_step_end or ts, ts)
    created = record.create_timestamp.timestamp()
    end = at.get("RUN_SUCCESS") or at.get("RUN_FAILURE") or record.end_time
    launched, started = at.get("RUN_STARTING", created), at.get("RUN_START")
    return {"partition": run.tags.get("dagster/partition"), "status": run.status.value,
            "total_s": round(end - created, 2), "queued_s": round(launched - created, 2),
            "worker_start_s": round(started - launched, 2) if started else None,
            "steps_s": round(last_step_end - started, 2) if started and last_step_end else None,
            "step_process_s": round(step_process, 2), "step_work_s": round(step_work, 2),
            "tail_s": round(end - last_step_end, 2) if last_step_end else None,
            "steps": len(step_start), "executor": "in_process" if not step_launch else "multiprocess",
            "launched_to_end_s": round(end - launched, 2), "ok": run.status == dg.DagsterRunStatus.SUCCESS}


def measure(base: str, env: dict, partitions: list[str], name: str) -> dict:
    import dagster as dg
    os.environ["DAGSTER_HOME"] = env["DAGSTER_HOME"]
    instance = dg.DagsterInstance.get()
    backfill_id = launch_backfill(base, partitions, VARIANTS[name])
    status, wall = wait_backfill(base, backfill_id)
    runs = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
    rows = [run_breakdown(instance, run) for run in runs]
    keys = ("total_s", "queued_s", "worker_start_s", "steps_s", "step_process_s", "step_work_s", "tail_s",
            "launched_to_end_s")
    mean = {k: round(sum(r[k] or 0 for r in rows) / max(len(rows), 1), 2) for k in keys}
    return {"backfill_id": backfill_id, "status": status, "wall_s": round(wall, 2), "runs": rows,
            "s_per_partition": round(wall / len(partitions), 2), "mean_per_run": mean}


def stop_with_sigint(proc: subprocess.Popen, timeout: float = 90) -> float | None:
    """Ctrl-C in a terminal: SIGINT to the whole process group; seconds until `dagster dev` exits."""
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
        return round(time.monotonic() - t0, 2)
    except subprocess.TimeoutExpired:
        return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=str(REPO / "bench/out/backfill-work"))
    ap.add_argument("--out", default=str(REPO / "bench/out/backfill.json"))
    ap.add_argument("--variants", default="multiprocess,default")
    args = ap.parse_args()
    work = Path(args.work).resolve()
    wipe_work(work)
    from tests.corpus import write_corpus
    paths = write_corpus(work / "corpus")
    env = mtrag_env(work / "home", paths["sources"], MTRAG_BUILD_SERVER="off")
    t0 = time.perf_counter()
    build_s, _, _ = run_mtrag(["build"], env)
    again_s, _, _ = run_mtrag(["build"], env)  # the no-change build, for comparison
    partitions = sorted(s.id for s in __import__("mtrag_resources.ingest.sources", fromlist=["x"])
                        .load_sources(Path(paths["sources"])))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(work / "dagster_dev.log", "wb")
    # SIGINT at default for the group (a shell's background job would otherwise ignore it).
    dev = subprocess.Popen([str(BIN / "dagster"), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
                           cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    result: dict = {"partitions": partitions, "first_build_s": round(build_s, 2),
                    "no_change_mtrag_build_s": round(again_s, 2), "variants": {}}
    try:
        wait_loaded(base, dev)
        result["dagster_dev_ready_s"] = round(time.perf_counter() - t0 - build_s - again_s, 2)
        for name in args.variants.split(","):
            print(f"backfill ({name}) of {partitions} ...", flush=True)
            result["variants"][name] = measure(base, env, partitions, name)
            print(json.dumps(result["variants"][name]["mean_per_run"]), flush=True)
        result["sigint_exit_s"] = stop_with_sigint(dev)
    finally:
        stop_group(dev, grace_s=5)
        log.close()
        stop_neo4j(env)
    write_json(args.out, result)


if __name__ == "__main__":
    main()
