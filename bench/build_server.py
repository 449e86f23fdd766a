"""`mtrag build` for one-file changes in its own process (`--no-server`) and through the home's build
server (`mtrag build-server`), alternating in one run on one built home: the fixed cost a server
saves, as a ratio measured the same minute. Each round, for each way in turn: one function
appended to a Python file, `mtrag build`; one docs file removed, `mtrag build`. Also the no-change
build both ways, the server's start-up (ready) time and its RSS after the rounds. What the rounds
changed is put back (and built) at the end.

    python bench/build_server.py [--rounds 5]                                  # bench/build.py's home
    python bench/build_server.py --work bench/out/scale-work --code-file django/utils/text.py \\
        --docs-dir docs --docs-glob '*.txt' --out bench/out/build_server_django.json   # bench/scale.py's

The home's Neo4j is started first and stopped at the end, and so is the server."""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, add_change_arguments, built_home, git_commit, rss_mb, stop_neo4j, write_json  # noqa: E402

APPENDED = '''

def bench_server_helper_{n}(value: str) -> str:
    """Return the value reversed; appended by bench/build_server.py."""
    return value[::-1]
'''
WAYS = {"process": ["build", "--no-server"], "server": ["build"]}


def mtrag(args: list[str], env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", *args], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"mtrag {' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return round(wall, 3), proc.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    add_change_arguments(ap, rounds=5, out="bench/out/build_server.json")
    args = ap.parse_args()
    corpus, home, env, docs = built_home(args, docs_per_round=4)
    mtrag(WAYS["process"], env)  # whatever an earlier run left unbuilt, outside the clock
    _, started = mtrag(["build-server", "start", "--json"], env)
    server = json.loads(started)
    if not server.get("usable"):
        sys.exit(f"a build server of other code or settings runs for {home} (pid {server['pid']}): stop it first")
    print(f"build server pid {server['pid']} ready in {server['ready_s']} s", flush=True)
    changes = ("append_first", "delete_first", "append", "delete", "nochange")
    walls: dict[str, dict[str, list[float]]] = {w: {c: [] for c in changes} for w in WAYS}
    code = corpus / args.code_file
    original = code.read_bytes()
    removed = {p: p.read_bytes() for p in docs[:4 * args.rounds]}
    n = 0
    try:
        for r in range(args.rounds):
            for way in (("process", "server") if r % 2 == 0 else ("server", "process")):
                for suffix in ("_first", ""):
                    code.write_text(code.read_text() + APPENDED.format(n=n))
                    walls[way][f"append{suffix}"].append(mtrag(WAYS[way], env)[0])
                    docs[n].unlink()
                    walls[way][f"delete{suffix}"].append(mtrag(WAYS[way], env)[0])
                    n += 1
                walls[way]["nochange"].append(mtrag(WAYS[way], env)[0])
                print(way, {k: v[-1] for k, v in walls[way].items()}, flush=True)
        server_rss = rss_mb(server["pid"])
        served = json.loads(mtrag(["build-server", "status", "--json"], env)[1])
    finally:
        code.write_bytes(original)
        for path, data in removed.items():
            path.write_bytes(data)
        mtrag(WAYS["process"], env)
        mtrag(["build-server", "stop"], env)
        stop_neo4j(env)
    summary = {w: {c: {"min": min(v), "median": round(statistics.median(v), 3)} for c, v in per_change.items()}
               for w, per_change in walls.items()}
    ratio = {c: round(summary["server"][c]["median"] / summary["process"][c]["median"], 3)
             for c in changes}
    out = {"summary": summary, "server_over_process_median": ratio, "rounds": walls,
           "server_ready_s": server["ready_s"], "server_rss_mb": server_rss, "server_builds": served["builds"],
           "work": str(home.parent), "commit": git_commit(REPO)}
    print(json.dumps({"summary": summary, "server_over_process_median": ratio, "server_ready_s": server["ready_s"],
                      "server_rss_mb": server_rss}, indent=1))
    write_json(args.out, out)


if __name__ == "__main__":
    main()
