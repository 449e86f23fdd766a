"""Cut-over and rollback under load (issue #56's targets: each under a second, no query stalled
over 200 ms). A built live home, two profiles: `bench-fusion` (fusion {dense: 0.5, fts: 2}: read-time
settings, no shadow to build) and `bench-fp32` (the fp32 ONNX embedder: a shadow built with
`mtrag build --profile`, its own local Neo4j). `mtrag serve` answers a steady stream of hybrid
questions over HTTP while `mtrag cutover NAME` then `mtrag rollback` run beside it, for each.
Reports each command's wall time, its gate and publish steps, how long the server took to answer
from the new generation, and the latencies of the questions asked before and around each switch.

Usage: python bench/cutover.py --home HOME [--sources FILE] [--out bench/out/cutover.json]
  HOME must be published; the profiles are written to profiles.yaml beside the sources file, which
  must not exist yet (or already hold them).
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

PROFILES = ("profiles:\n  bench-fusion:\n    fusion: {dense: 0.5, fts: 2}\n"
            "  bench-fp32:\n    embedder: {backend: onnx}\n    neo4j_uri: local\n")
WINDOW_S = 2.0  # the questions asked from a command's start to this long after the server switched
SWAP_S = 1.0    # the questions asked this close to the server's first answer from the new generation


def ask_loop(port: int, texts: list[str], stop: threading.Event, log: list) -> None:
    i = 0
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            status, body = request(port, "/v1/query", {"query": texts[i % len(texts)], "k": 10}, 30)
            answer = json.loads(body).get("generation") if status == 200 else f"http {status}: {body[:200]!r}"
        except OSError as exc:
            answer = f"{type(exc).__name__}: {exc}"
        log.append((t0, (time.perf_counter() - t0) * 1000, answer))
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
    gate = re.search(r"gate ([\d.]+) s", output)
    return {"command": name, "wall_s": round(wall, 3), "publish_s": float(publish.group(1)) if publish else None,
            "gate_s": float(gate.group(1)) if gate else None,
            "served_after_command_s": None if served_at is None else round(served_at - t_end, 3),
            "served_after_start_s": None if served_at is None else round(served_at - t0, 3),
            "questions": len(window), "max_ms": round(max(window), 1) if window else None,
            "p95_ms": round(percentile(window, 95), 1) if window else None,
            "at_swap": {"questions": len(at_swap), "max_ms": round(max(at_swap), 1) if at_swap else None},
            "output": output.strip()[-300:]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--home", required=True)
    ap.add_argument("--sources")
    ap.add_argument("--out", default=str(REPO / "bench/out/cutover.json"))
    args = ap.parse_args()
    home = Path(args.home).resolve()
    sources = Path(args.sources).resolve() if args.sources else home / "sources.yaml"
    profiles = sources.parent / "profiles.yaml"
    if not profiles.exists():
        profiles.write_text(PROFILES)
    env = mtrag_env(home, sources, MTRAG_BUILD_SERVER="off")
    built = {}
    for name in ("bench-fusion", "bench-fp32"):
        built[name] = round(run_mtrag(["build", "--profile", name], env)[0], 1)
        print(f"mtrag build --profile {name}: {built[name]} s")
    port = free_port()
    server = start_server(home, port)
    stop, log, runs = threading.Event(), [], {}
    try:
        wait_healthy(server, port, 120)
        _, texts = texts_for(home, 50, 7)
        threading.Thread(target=ask_loop, args=(port, texts, stop, log), daemon=True).start()
        time.sleep(5)
        steady = [ms for _, ms, _ in log[len(log) // 5:]] or [float("nan")]
        for name in built:
            runs[name] = {"cutover": switch("cutover", ["cutover", name], env, log)}
            time.sleep(3)
            runs[name]["rollback"] = switch("rollback", ["rollback"], env, log)
            time.sleep(2)
    finally:
        stop.set()
        stop_server(server)
        shadow = home / "shadows" / "bench-fp32"
        run_mtrag(["neo4j", "stop"], {**env, "MTRAG_HOME": str(shadow), "DAGSTER_HOME": str(shadow / "dagster_home")})
    errors = [g for _, _, g in log if isinstance(g, str)]
    result = {"home": str(home), "profile_build_s": built,
              "steady": {"questions": len(steady), "p50_ms": round(percentile(steady, 50), 1),
                         "p95_ms": round(percentile(steady, 95), 1), "max_ms": round(max(steady), 1)},
              "runs": runs, "errors": errors[:5], "error_count": len(errors)}
    print(json.dumps(result, indent=1))
    write_json(args.out, result)


if __name__ == "__main__":
    main()
