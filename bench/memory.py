"""Peak memory of `mtrag build` on three hostile inputs (issue #58), each beside a small good
source in a fresh home of its own:

* `alias_bomb`: sources.yaml whose `repository` value is an alias bomb (`--bomb-levels` levels of
  nine aliases each: 9**levels "lol"s; 9 levels built a 2.8 GB string before the bound);
* `minified_js`: one minified JS file of `--js-functions` small functions on one line (60,000:
  2.3 MB, under a `max_file_bytes` of 4 MB);
* `issues`: a GitHub export of `--issues` small issues (100,000: 32 MB, `max_file_bytes` raised);
* `baseline`: the good source alone, what any build costs.

Each build runs through the CLI (`python -m mtrag_assets.app.cli build --no-server`) in a subprocess;
its process tree's RSS (the build and any step process it starts; the local Neo4j excluded) is
polled every 50 ms. By default a build is stopped when the hostile source's embedding starts: on
a CPU, embedding the unbounded inputs' chunks takes hours, and what the bounds change is what the
stages before it hold (`--full` builds to the end). Printed and written as JSON (`--out`).

Usage: .venv/bin/python bench/memory.py [--out bench/out/memory.json] [--full] [--only NAME]...
Before/after: run it once on this tree and once with PYTHONPATH naming an older checkout."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import REPO, mtrag_env, write_json  # noqa: E402
from tests.hostile_corpus import alias_bomb, github_issues, minified_js  # noqa: E402

GOOD_SOURCE = '  - {id: good, kind: code, path: good}\n'
HOSTILE_SOURCE = {"baseline": "good", "alias_bomb": "bomb", "minified_js": "web", "issues": "tracker"}


def stop_line(name: str) -> str:
    """The runner's line as the hostile source's embedding stage starts."""
    return f"[{HOSTILE_SOURCE[name]}] embedding_cache ..."


def write_input(name: str, work: Path, args) -> Path:
    """The sources file of input `name` (with its files) under `work`."""
    (work / "good").mkdir(parents=True)
    (work / "good" / "tax.py").write_text('def compute_tax(amount):\n    """Tax on an amount."""\n    return amount * 0.2\n')
    sources = work / "sources.yaml"
    if name == "baseline":  # the good source alone: what any build costs
        entry = ""
    elif name == "alias_bomb":
        entry = f"  - id: bomb\n    kind: code\n    path: good\n    repository: {alias_bomb(args.bomb_levels)}\n"
    elif name == "minified_js":
        (work / "web").mkdir()
        (work / "web" / "app.min.js").write_text(minified_js(args.js_functions))
        entry = "  - {id: web, kind: code, path: web, max_file_bytes: 4194304}\n"
    else:
        (work / "issues.json").write_text(github_issues(args.issues))
        entry = "  - {id: tracker, kind: issues, path: issues.json, max_file_bytes: 200000000}\n"
    sources.write_text("sources:\n" + GOOD_SOURCE + entry)
    return sources


class TreePeak:
    """The peak RSS of a process and its descendants (java excluded: a Neo4j a build starts
    outlives it and is no part of its cost), polled in a thread."""

    def __init__(self, pid: int, interval: float = 0.05):
        self.root, self.interval = psutil.Process(pid), interval
        self.peak_tree = self.peak_one = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.poll, daemon=True)
        self.thread.start()

    def poll(self) -> None:
        while not self.done.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            sizes = []
            for p in procs:
                try:
                    if p.name() != "java":
                        sizes.append(p.memory_info().rss)
                except psutil.Error:
                    pass
            self.peak_tree = max(self.peak_tree, sum(sizes))
            self.peak_one = max([self.peak_one, *sizes])
            time.sleep(self.interval)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def run_input(name: str, args, neo4j_uri: str) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"mtrag-memory-{name}-") as tmp:
        work = Path(tmp)
        sources = write_input(name, work, args)
        env = mtrag_env(work / "home", sources, NEO4J_URI=neo4j_uri, MTRAG_BUILD_SERVER="off")
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "mtrag_assets.app.cli", "build", "--no-server"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=work)
        peak = TreePeak(proc.pid)
        lines, stopped = [], False
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if not args.full and stop_line(name) in line:
                stopped = True
                for child in psutil.Process(proc.pid).children(recursive=True):
                    if child.name() != "java":
                        child.kill()
                proc.kill()
                break
        proc.wait()
        peak.stop()
        wall = time.perf_counter() - started
    said = [line for line in lines if ": cut: " in line or line.startswith("mtrag: ")]
    return {"input": name, "peak_rss_mb": round(peak.peak_tree / 2**20), "peak_rss_one_process_mb":
            round(peak.peak_one / 2**20), "wall_s": round(wall, 1), "exit": proc.returncode,
            "stopped_at_embedding": stopped, "said": [s[:300] for s in said[:4]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "bench/out/memory.json"))
    ap.add_argument("--only", action="append", choices=list(HOSTILE_SOURCE))
    ap.add_argument("--bomb-levels", type=int, default=9)
    ap.add_argument("--js-functions", type=int, default=60_000)
    ap.add_argument("--issues", type=int, default=100_000)
    ap.add_argument("--full", action="store_true", help="build to the end (embedding included)")
    args = ap.parse_args()
    uri = os.environ.get("NEO4J_URI")
    neo_home = None if uri else Path(tempfile.mkdtemp(prefix="mtrag-memory-neo4j-"))
    if neo_home:  # one local server for every input's build, stopped (and its home removed) at the end
        neo_env = mtrag_env(neo_home, neo_home / "sources.yaml")
        subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", "neo4j", "start"], env=neo_env, check=True,
                       capture_output=True)
        status = subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", "neo4j", "status", "--json"], env=neo_env,
                                capture_output=True, text=True)
        uri = json.loads(status.stdout)["uri"]
    results = []
    try:
        for name in args.only or list(HOSTILE_SOURCE):
            result = run_input(name, args, uri)
            print(f"{name}: peak RSS {result['peak_rss_mb']} MB (largest process {result['peak_rss_one_process_mb']} MB), "
                  f"{result['wall_s']} s, exit {result['exit']}"
                  + (" (stopped at embedding)" if result["stopped_at_embedding"] else ""), flush=True)
            results.append(result)
    finally:
        if neo_home:
            subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", "neo4j", "stop"], env=neo_env, capture_output=True)
            shutil.rmtree(neo_home, ignore_errors=True)
    write_json(args.out, {"inputs": results, "bomb_levels": args.bomb_levels, "js_functions": args.js_functions,
                          "issues": args.issues, "full": args.full, "pythonpath": os.environ.get("PYTHONPATH", ""),
                          "cpus": os.cpu_count()})


if __name__ == "__main__":
    main()
