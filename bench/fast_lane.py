"""The fast lane's two ways of recording a change in Dagster, measured in one warm process on a
built home (issue #15, item 2): each round appends one function to a file and publishes it

  run      through an in-process run of `build_source_and_publish` (what `mtrag build` does)
  direct   through fast_lane.run_batch (the assets and checks invoked directly) and then
           fast_lane.record (the same materializations and check evaluations as runless events)

alternating, so both see the same machine. Per round: seconds to the published generation,
seconds to record the lineage (direct), Dagster events written; the medians and their ratio.

  python bench/fast_lane.py --work bench/out/build-work --file flask/src/flask/helpers.py --source flask
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, mtrag_env, write_json  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=str(REPO / "bench/out/build-work"), help="a built bench work folder")
    ap.add_argument("--file", default="flask/src/flask/helpers.py", help="file (under corpus/) to append to")
    ap.add_argument("--source", default="flask")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(REPO / "bench/out/fast_lane.json"))
    args = ap.parse_args()
    work = Path(args.work).resolve()  # relative: the sources file and DAGSTER_HOME need absolute paths
    os.environ.update(mtrag_env(work / "home", work / "sources.yaml"))
    from mtrag_assets.app.build_command import load_specs
    from mtrag_assets.fast_lane import record, run_batch
    from mtrag_assets.runner import dagster_instance, run_build
    from mtrag_resources.core.config import Settings
    from mtrag_resources.stores.neo4j_server import launch_local_server

    settings = Settings.from_env()
    specs = load_specs(settings)
    launch_local_server(settings)
    run_build(settings, specs, log=lambda line: None)  # converge, and warm every import and store
    instance = dagster_instance(settings)
    target = work / "corpus" / args.file
    rows: dict[str, list[dict]] = {"run": [], "direct": []}
    for n in range(args.rounds):
        for way in ("run", "direct"):
            target.write_text(target.read_text() + f"\n\ndef fast_lane_bench_{way}_{n}_{int(time.time())}(v):\n"
                                                   "    return v\n")
            t0 = time.perf_counter()
            if way == "run":
                summary = run_build(settings, specs, only=[args.source], log=lambda line: None,
                                    extra_tags={"mtrag/plane": "bench"})
                published = time.perf_counter() - t0
                events = len(instance.all_logs(summary["runs"]["__publish__"]))
                rows[way].append({"published_s": round(published, 3), "events": events})
            else:
                batch = run_batch(settings, specs, [args.source], log=lambda line: None)
                published = time.perf_counter() - t0
                t1 = time.perf_counter()
                events = record(settings, specs, batch)
                rows[way].append({"published_s": round(published, 3), "record_s": round(time.perf_counter() - t1, 3),
                                  "events": events, "stages_s": batch.seconds})
            print(way, rows[way][-1], flush=True)
    result = {"rounds": rows, "load_average": os.getloadavg()}
    for way in rows:
        result[f"{way}_published_s"] = statistics.median(r["published_s"] for r in rows[way])
        result[f"{way}_events"] = statistics.median(r["events"] for r in rows[way])
    result["direct_record_s"] = statistics.median(r["record_s"] for r in rows["direct"])
    result["run_over_direct"] = round(result["run_published_s"] / result["direct_published_s"], 2)
    print({k: v for k, v in result.items() if k != "rounds"})
    write_json(args.out, result)


if __name__ == "__main__":
    main()
