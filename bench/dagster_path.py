"""A change through the Dagster daemon (issue #15, item 5), measured: on a built home, a
`dagster-daemon` runs the code location's sensors; one function is appended to one source's file,
then the clock runs until (1) the `source_changes` sensor created its run, (2) the run started,
(3) it ended, (4) CURRENT names a new generation, (5) `mtrag query` in exact mode finds the
function. One changed source is one `build_source_and_publish` run, so the publish needs no
`publish_automation` tick; the sensor polls every CHANGE_POLL_S seconds, so (1) is up to that.

  python bench/dagster_path.py --work bench/out/build-work --file flask/src/flask/helpers.py --rounds 2
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, mtrag_env, stop_group, stop_neo4j, write_json  # noqa: E402

BIN = Path(sys.executable).parent
TIMEOUT_S = 600


def _current_generation(home: Path) -> int:
    from mtrag_resources.publish.manifest import load_current
    return (load_current(home / "08-manifest") or {}).get("generation") or 0


def _found(env: dict, name: str) -> bool:
    out = subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", "query", "--json", "--mode", "exact", name],
                         env=env, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        return False
    hits = json.loads(out.stdout).get("hits", [])
    return bool(hits) and hits[0].get("symbol", "").endswith(name)


def one_round(env: dict, home: Path, target: Path, n: int) -> dict:
    import dagster as dg
    os.environ["DAGSTER_HOME"] = env["DAGSTER_HOME"]
    instance = dg.DagsterInstance.get()
    before = {r.run_id for r in instance.get_runs(filters=dg.RunsFilter(tags={"mtrag/trigger": "source_changed"}))}
    generation = _current_generation(home)
    name = f"dagster_path_{n}_{int(time.time())}"
    target.write_text(target.read_text() + f'\n\ndef {name}(value):\n    """Appended by bench/dagster_path.py."""\n'
                                           "    return value\n")
    t0 = time.time()
    marks: dict = {}
    while time.time() - t0 < TIMEOUT_S:
        runs = [r for r in instance.get_runs(filters=dg.RunsFilter(tags={"mtrag/trigger": "source_changed"}))
                if r.run_id not in before]
        if runs:
            record = instance.get_run_record_by_id(runs[0].run_id)
            if "run_created_s" not in marks:
                marks["run_created_s"] = round(record.create_timestamp.timestamp() - t0, 2)
                marks["job"] = runs[0].job_name
            if record.start_time and "run_started_s" not in marks:
                marks["run_started_s"] = round(record.start_time - t0, 2)
            if record.end_time and "run_ended_s" not in marks:
                marks["run_ended_s"] = round(record.end_time - t0, 2)
                marks["run_status"] = record.dagster_run.status.value
        if _current_generation(home) > generation and "published_s" not in marks:
            marks["published_s"] = round(time.time() - t0, 2)
        if "published_s" in marks:
            if _found(env, name):
                marks["queryable_s"] = round(time.time() - t0, 2)
                return marks
        time.sleep(0.5)
    raise RuntimeError(f"no publish within {TIMEOUT_S} s: {marks}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=str(REPO / "bench/out/build-work"), help="a built bench work folder")
    ap.add_argument("--file", default="flask/src/flask/helpers.py", help="file (under corpus/) to append to")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "bench/out/dagster_path.json"))
    args = ap.parse_args()
    work = Path(args.work).resolve()  # relative: the sources file and DAGSTER_HOME need absolute paths
    home = work / "home"
    env = mtrag_env(home, work / "sources.yaml")
    # Runs the daemon launches do not start the local Neo4j (`mtrag build` does): start it here.
    subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", "neo4j", "start"], env=env, check=True,
                   capture_output=True)
    log = open(work / "daemon.log", "wb")
    daemon = subprocess.Popen([str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"], cwd=REPO, env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    rounds = []
    try:
        time.sleep(20)  # the daemon's code server loads; the sensors take their first ticks
        for n in range(args.rounds):
            print(f"round {n + 1} ...", flush=True)
            rounds.append(one_round(env, home, work / "corpus" / args.file, n))
            print(rounds[-1], flush=True)
    finally:
        stop_group(daemon)
        log.close()
        stop_neo4j(env)
    from mtrag_assets.sensors import CHANGE_POLL_S
    result = {"sensor_interval_s": CHANGE_POLL_S, "rounds": rounds,
              "queryable_s": min(r["queryable_s"] for r in rounds),
              "published_s": min(r["published_s"] for r in rounds)}
    print(result)
    write_json(args.out, result)


if __name__ == "__main__":
    main()
