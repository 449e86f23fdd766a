"""Cut-over and rollback under load (issue #56's targets: each under a second, no query stalled
over 200 ms). A built live home gets a shadow of a fusion-only profile (`mtrag build --profile`),
`mtrag serve` answers a steady stream of hybrid questions over HTTP, and `mtrag cutover NAME` then
`mtrag rollback` run beside it. Reports each command's wall time and its publish step, how long the
server took to answer from the new generation, and the latencies of the questions asked before, and
around each switch.

Usage: python bench/cutover.py --home HOME [--sources FILE] [--profile NAME] [--out bench/out/cutover.json]
  HOME must be published; the profile (default `bench-fusion`: fusion {dense: 0.5, fts: 2}, ranker on,
  its own local Neo4j) is added to profiles.yaml beside the sources file if that file has none.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, mtrag_env, percentile, run_mtrag, write_json  # noqa: E402
from bench.http_load import free_port, request, start_server, stop_server, texts_for, wait_healthy  # noqa: E402

PROFILE = "bench-fusion"
PROFILES = f"profiles:\n  {PROFILE}:\n    fusion: {{dense: 0.5, fts: 2}}\n    neo4j_uri: local\n"
WINDOW_S = 2.0  # the questions asked from a command's start to this long after the server switched
SWAP_S = 1.0    # the questions asked this close to the server's first answer from the new generation


def ask_loop(port: int, texts: list[str], stop: threading.Event, log: list) -> None:
    i = 0
    while not stop.is_set():
        t0 = time.perf_counter()
        status, body = request(port, "/v1/query", {"query": texts[i % len(texts)], "k": 10}, 30)
        ms = (time.perf_counter() - t0) * 1000
        log.append((t0, ms, json.loads(body).get("generation") if status == 200 else f"http {status}"))
        i += 1


def switch(name: str, args: list[str], env: dict, log: list) -> dict:
    """Run `mtrag ARGS` beside the question loop; the server's switch is its first answer from the
    generation the command published."""
    t0 = time.perf_counter()
    wall, output, _ = run_mtrag(args, env)
    t_end = time.perf_counter()
    target = int(re.search(r"live generation (\d+)", output).group(1))
    while not any(g == target and t >= t_end - wall for t, _, g in log) and time.perf_counter() - t_end < 30:
        time.sleep(0.05)
    served_at = min((t for t, _, g in log if g == target and t >= t0), default=None)
    window = [ms for t, ms, _ in log if t0 <= t <= (served_at or t_end) + WINDOW_S]
    # the questions in flight around the swap itself (not the gate's queries in the command's process)
    at_swap = [ms for t, ms, _ in log if served_at is not None and abs(t - served_at) <= SWAP_S]
    publish = re.search(r"publish ([\d.]+) s", output)
    return {"command": name, "wall_s": round(wall, 3), "publish_s": float(publish.group(1)) if publish else None,
            "served_after_command_s": None if served_at is None else round(served_at - t_end, 3),
            "questions": len(window), "max_ms": round(max(window), 1) if window else None,
            "p95_ms": round(percentile(window, 95), 1) if window else None,
            "at_swap": {"questions": len(at_swap), "max_ms": round(max(at_swap), 1) if at_swap else None},
            "output": output.strip()[-300:]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--home", required=True)
    ap.add_argument("--sources")
    ap.add_argument("--profile", default=PROFILE)
    ap.add_argument("--out", default=str(REPO / "bench/out/cutover.json"))
    args = ap.parse_args()
    home = Path(args.home).resolve()
    sources = Path(args.sources).resolve() if args.sources else home / "sources.yaml"
    profiles = sources.parent / "profiles.yaml"
    if not profiles.exists():
        profiles.write_text(PROFILES)
    env = mtrag_env(home, sources, MTRAG_BUILD_SERVER="off")
    shadow_s, _, _ = run_mtrag(["build", "--profile", args.profile], env)
    print(f"shadow build of {args.profile}: {shadow_s:.1f} s")
    port = free_port()
    server = start_server(home, port)
    stop, log = threading.Event(), []
    try:
        wait_healthy(server, port, 120)
        _, texts = texts_for(home, 50, 7)
        loop = threading.Thread(target=ask_loop, args=(port, texts, stop, log), daemon=True)
        loop.start()
        time.sleep(5)
        steady = [ms for _, ms, _ in log[len(log) // 5:]]
        cut = switch("cutover", ["cutover", args.profile], env, log)
        time.sleep(3)
        back = switch("rollback", ["rollback"], env, log)
        time.sleep(2)
    finally:
        stop.set()
        stop_server(server)
        run_mtrag(["neo4j", "stop"], {**env, "MTRAG_HOME": str(home / "shadows" / args.profile),
                                      "DAGSTER_HOME": str(home / "shadows" / args.profile / "dagster_home")})
    errors = [g for _, _, g in log if isinstance(g, str)]
    result = {"home": str(home), "profile": args.profile, "shadow_build_s": round(shadow_s, 1),
              "steady": {"questions": len(steady), "p50_ms": round(percentile(steady, 50), 1),
                         "p95_ms": round(percentile(steady, 95), 1), "max_ms": round(max(steady), 1)},
              "cutover": cut, "rollback": back, "errors": errors[:5], "error_count": len(errors)}
    print(json.dumps(result, indent=1))
    write_json(args.out, result)


if __name__ == "__main__":
    main()
