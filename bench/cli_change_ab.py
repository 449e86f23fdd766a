"""`mtrag build` for one-file changes, two code trees alternating on one built home: a speed-up as a
ratio measured in one run (the machine is shared; runs an hour apart differ by more than most
changes). Each round, for each tree in turn: one function appended to a Python file, `mtrag build`;
one docs file removed, `mtrag build`. Both trees do the same work on the same stores; the file and
the docs are restored (and built) at the end.

    git worktree add /tmp/base HEAD~1
    python bench/cli_change_ab.py --base /tmp/base [--rounds 4] [--work bench/out/build-work]
    python bench/cli_change_ab.py --base /tmp/base --work bench/out/scale-work \
        --code-file django/utils/text.py --docs-dir docs --docs-glob '*.txt'     # bench/scale.py's home

The home is `bench/build.py`'s (`--work`, built first by that script). Each build runs with its
tree as the working directory and on PYTHONPATH: `python -m` puts the working directory first on
sys.path, ahead of PYTHONPATH and of the editable install, so the same virtual environment runs
either tree's packages. Fastest and median per tree
and change are printed and written to --out. The home's Neo4j is started first and stopped at the end."""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import REPO, add_change_arguments, built_home, git_commit, stop_neo4j, write_json  # noqa: E402

APPENDED = '''

def bench_ab_helper_{n}(value: str) -> str:
    """Return the value reversed; appended by bench/cli_change_ab.py."""
    return value[::-1]
'''


def build(env: dict, tree: Path) -> float:
    env = {**env, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", "build"], env=env, capture_output=True,
                          text=True, cwd=tree)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"mtrag build in {tree} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return round(wall, 3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the other code tree (a git worktree)")
    add_change_arguments(ap, rounds=4, out="bench/out/cli_change_ab.json")
    args = ap.parse_args()
    # the home's Neo4j up and whatever an earlier run left unbuilt built, outside the clock
    corpus, home, env, docs = built_home(args, docs_per_round=2)
    trees = {"base": Path(args.base).resolve(), "head": REPO}
    build(env, REPO)
    walls: dict[str, dict[str, list[float]]] = {t: {"append": [], "delete": []} for t in trees}
    code = corpus / args.code_file
    # what the rounds change is put back afterwards (and built, outside the clock), so the home's
    # corpus stays the same from one run of this script to the next
    original = code.read_bytes()
    removed = {p: p.read_bytes() for p in docs[:2 * args.rounds]}
    n = 0
    try:
        for r in range(args.rounds):
            for name in (("base", "head") if r % 2 == 0 else ("head", "base")):
                code.write_text(code.read_text() + APPENDED.format(n=n))
                walls[name]["append"].append(build(env, trees[name]))
                docs[n].unlink()
                walls[name]["delete"].append(build(env, trees[name]))
                n += 1
                print(name, {k: v[-1] for k, v in walls[name].items()}, flush=True)
    finally:
        code.write_bytes(original)
        for path, data in removed.items():
            path.write_bytes(data)
        build(env, REPO)
    summary = {t: {c: {"min": min(v), "median": round(statistics.median(v), 3)} for c, v in changes.items()}
               for t, changes in walls.items()}
    ratio = {c: round(summary["head"][c]["min"] / summary["base"][c]["min"], 3) for c in ("append", "delete")}
    out = {"summary": summary, "head_over_base_min": ratio, "rounds": walls, "base": str(trees["base"]),
           "base_commit": git_commit(trees["base"]), "head_commit": git_commit(REPO)}
    write_json(args.out, out)
    stop_neo4j(env)


if __name__ == "__main__":
    main()
