"""`mtrag watch` latency of two code trees alternating on one built home (bench/watch_latency.py run
from each tree's own folder): a speed-up as a ratio measured in one run, as bench/cli_change_ab.py
does for `mtrag build`. Each run appends --edits functions to --code-file and removes two docs
files (both put back afterwards: the next watch's start converges them, outside the clock).

    git worktree add /tmp/base HEAD~1
    python bench/watch_ab.py --base /tmp/base [--rounds 2] [--work bench/out/build-work]
    python bench/watch_ab.py --base /tmp/base --work bench/out/scale-work --code-file django/utils/text.py \\
        --docs-source django-docs --docs-dir docs/ref --docs-glob '*.txt' --docs-root .

Why each run starts from its tree's folder: bench/watch_latency.py starts `mtrag watch` with
`python -m` in its own repository folder, and `python -m` puts that folder first on sys.path, so
a run started from the other tree's folder would measure that tree. The medians per tree are
printed and written to --out."""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, git_commit, mtrag_env, stop_neo4j, write_json  # noqa: E402

FIGURES = ("watch_append_s", "watch_append_p95_s", "watch_delete_s", "watch_batch_s",
           "watch_serve_hybrid_p50_ms", "watch_serve_hybrid_p95_ms", "watch_serve_hybrid_max_ms")


def run_tree(tree: Path, args, removed: list[Path], out: Path) -> dict:
    """bench/watch_latency.py of `tree`, removing `removed` (under the corpus) one at a time."""
    corpus = Path(args.work).resolve() / "corpus"
    deletes = []
    for path in removed:
        rel = path.relative_to(corpus).as_posix()
        in_source = path.relative_to(corpus / args.docs_root).as_posix()
        deletes += ["--delete", f"{args.docs_source}:{rel}:{in_source}"]
    cmd = [sys.executable, "bench/watch_latency.py", "--work", str(Path(args.work).resolve()), "--file", args.code_file,
           "--edits", str(args.edits), "--out", str(out), *deletes]
    proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"watch_latency.py in {tree} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def _median(values: list[float]) -> float | None:
    """None where no run measured the figure (no docs file was left to remove, for one)."""
    return round(statistics.median(values), 3) if values else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the other code tree (a git worktree)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--edits", type=int, default=8)
    ap.add_argument("--work", default=str(REPO / "bench/out/build-work"))
    ap.add_argument("--code-file", default="flask/src/flask/helpers.py")
    ap.add_argument("--docs-source", default="flask-docs")
    ap.add_argument("--docs-dir", default="flask/docs", help="under the corpus")
    ap.add_argument("--docs-glob", default="*.rst")
    ap.add_argument("--docs-root", default="flask", help="the docs source's folder, under the corpus")
    ap.add_argument("--out", default=str(REPO / "bench/out/watch_ab.json"))
    ap.add_argument("--before-base", default="",
                    help="a shell command run before each base run: puts back a state of the home that head "
                         "migrates (a store format, an index), so that base measures it")
    args = ap.parse_args()
    corpus = Path(args.work).resolve() / "corpus"
    trees = {"base": Path(args.base).resolve(), "head": REPO}
    runs: dict[str, list[dict]] = {t: [] for t in trees}
    scratch = Path(tempfile.mkdtemp(prefix="watch-ab-"))
    try:
        for r in range(args.rounds):
            for name in (("base", "head") if r % 2 == 0 else ("head", "base")):
                docs = sorted(p for p in (corpus / args.docs_dir).glob(args.docs_glob)
                              if p.stat().st_size > 2000 and "index" not in p.name)[:2]
                # the removed docs and the appended code file are put back, so that every run (and
                # the next bench on this home) starts from the corpus as it was
                code = corpus / args.code_file
                kept = [(p, shutil.copy2(p, scratch / f"{i}-{p.name}")) for i, p in enumerate([*docs, code])]
                try:
                    if name == "base" and args.before_base:
                        subprocess.run(args.before_base, shell=True, check=True)
                    result = run_tree(trees[name], args, docs, scratch / f"{name}-{r}.json")
                finally:
                    for original, copy in kept:
                        shutil.copy2(copy, original)
                runs[name].append({k: result.get(k) for k in FIGURES})
                print(name, r + 1, runs[name][-1], flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        # the watches launched the home's Neo4j (from whichever tree ran first): stopped, or its JVM
        # outlives the run
        work = Path(args.work).resolve()
        stop_neo4j(mtrag_env(work / "home", work / "sources.yaml"))
    summary = {t: {k: _median([x[k] for x in v if x[k] is not None]) for k in FIGURES} for t, v in runs.items()}
    ratio = {k: round(summary["head"][k] / summary["base"][k], 3) for k in FIGURES
             if summary["base"][k] and summary["head"][k]}
    write_json(args.out, {"summary": summary, "head_over_base": ratio, "runs": runs, "base": str(trees["base"]),
                          "base_commit": git_commit(trees["base"]), "head_commit": git_commit(REPO)})


if __name__ == "__main__":
    main()
