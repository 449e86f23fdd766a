"""The first change a user builds right after a build that left the build server warming up
(`mtrag build`'s default, MTRAG_BUILD_SERVER=auto): its wall seconds, and what a later change
through the ready server costs. Per round: no server runs; one function appended, `mtrag build`
(in its own process; it starts the server); at once another appended, `mtrag build` (timed:
`first_s`); once the server is ready, a third, `mtrag build` (timed: `ready_s`); the server stopped.

`--base DIR` runs another checkout's code (PYTHONPATH) in alternate rounds, so the two trees compare
on one home in one run:

    python bench/first_change.py [--rounds 3] [--base /tmp/base]   # bench/build.py's home (built here if missing)
    python bench/first_change.py --work bench/out/scale-work --code-file django/utils/text.py \\
        --out bench/out/first_change_django.json                   # bench/scale.py's

The home's Neo4j is started first and stopped at the end."""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.build import bench_corpus  # noqa: E402
from bench.common import REPO, git_commit, mtrag_env, stop_neo4j, write_json  # noqa: E402

APPENDED = '''

def bench_first_change_{n}(value: str) -> str:
    """Return the value doubled; appended by bench/first_change.py."""
    return value * 2
'''


def mtrag(args: list[str], env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    # run from the tree (PYTHONPATH): `python -m` puts its working folder first on sys.path
    proc = subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", *args], env=env, capture_output=True, text=True,
                          cwd=env["PYTHONPATH"])
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"mtrag {' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return round(wall, 3), proc.stdout


def wait_ready(env: dict, timeout: float = 600) -> None:
    t0 = time.monotonic()
    def running() -> bool:  # `status` exits 3 while no server answers
        out = subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", "build-server", "status", "--json"],
                             env=env, capture_output=True, text=True, cwd=env["PYTHONPATH"])
        return bool(json.loads(out.stdout or "{}").get("running"))

    while not running():
        if time.monotonic() - t0 > timeout:
            raise RuntimeError("the build server was not ready in time")
        time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default=str(REPO / "bench/out/build-work"))
    ap.add_argument("--code-file", default="flask/src/flask/helpers.py")
    ap.add_argument("--base", help="another checkout whose code runs in alternate rounds")
    ap.add_argument("--out", default=str(REPO / "bench/out/first_change.json"))
    args = ap.parse_args()
    work = Path(args.work).resolve()
    home = work / "home"
    if (work / "sources.yaml").exists():
        sources = work / "sources.yaml"
    else:
        _, sources, _ = bench_corpus(work, fresh=True)
    trees = {"head": REPO, **({"base": Path(args.base).resolve()} if args.base else {})}
    envs = {name: {**mtrag_env(home, sources), "MTRAG_BUILD_SERVER": "auto", "PYTHONPATH": str(tree)}
            for name, tree in trees.items()}
    env = envs["head"]
    subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", "neo4j", "start"], env=env, check=True,
                   capture_output=True)
    code = work / "corpus" / args.code_file
    original = code.read_bytes()
    rounds = {name: {"first_s": [], "ready_s": []} for name in trees}
    paths: list[str] = []
    n = 0
    try:
        mtrag(["build-server", "stop"], env)
        mtrag(["build", "--no-server"], env)  # the full build (or what an earlier run left), outside the clock
        for r in range(args.rounds):
            for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
                mtrag(["build-server", "stop"], envs[name])
                for key in (None, "first_s", "ready_s"):
                    if key == "ready_s":
                        wait_ready(envs[name])
                    code.write_text(code.read_text() + APPENDED.format(n=n))
                    n += 1
                    wall, out = mtrag(["build"], envs[name])
                    if key:
                        rounds[name][key].append(wall)
                        paths.append(f"{name} {key}: {out.splitlines()[0]}")
                mtrag(["build-server", "stop"], envs[name])
                print(name, {k: v[-1] for k, v in rounds[name].items()}, flush=True)
    finally:
        code.write_bytes(original)
        mtrag(["build", "--no-server"], env)
        mtrag(["build-server", "stop"], env)
        stop_neo4j(env)
    summary = {name: {k: {"min": min(v), "median": round(statistics.median(v), 3)} for k, v in per.items()}
               for name, per in rounds.items()}
    if "base" in rounds:
        summary["head_over_base_median"] = {k: round(summary["head"][k]["median"] / summary["base"][k]["median"], 3)
                                            for k in ("first_s", "ready_s")}
    write_json(args.out, {"summary": summary, "rounds": rounds, "paths": paths,
                          "commits": {name: git_commit(tree) for name, tree in trees.items()}, "work": str(work)})


if __name__ == "__main__":
    main()
