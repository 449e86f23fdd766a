"""Shared by the benches: fetch a pinned sdist, run mtrag in a private home, percentiles."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def fetch_sdist(requirement: str, into: Path) -> Path:
    from mtrag_resources.ingest.sources import fetch_sdist as fetch
    return fetch(requirement, into)


def mtrag_env(home: Path, sources: Path, **extra) -> dict:
    env = dict(os.environ)
    home, sources = Path(home).resolve(), Path(sources).resolve()  # Dagster refuses a relative DAGSTER_HOME
    # MTRAG_BUILD_SERVER=use: a bench's `mtrag build` uses a build server where the bench starts one
    # (build_server.py, build.py's server_* keys) and leaves none behind of its own.
    env.update({"MTRAG_HOME": str(home), "MTRAG_SOURCES": str(sources), "DAGSTER_HOME": str(home / "dagster_home"),
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "MTRAG_BUILD_SERVER": "use"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_mtrag(args: list[str], env: dict, timeout: int = 3600) -> tuple[float, str, int]:
    """(wall seconds, combined output, peak RSS of the child in MB)."""
    import resource
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    if proc.returncode != 0:
        raise RuntimeError(f"mtrag {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall, proc.stdout + proc.stderr, int(peak_mb)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    idx = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[idx]


def write_json(path: str | None, data: dict) -> None:
    text = json.dumps(data, indent=1, sort_keys=True)
    print(text)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")


@contextmanager
def built_reader(home: Path, env: dict):
    """`mtrag build` of `home` (what is left to build, if anything), then an in-process reader on it
    under `env`; the reader closed and the home's Neo4j stopped after, also after an error."""
    try:
        run_mtrag(["build"], env)
        os.environ.update(env)
        from mtrag_resources.serving.reader import IndexReader
        reader = IndexReader(home=str(home), log_proposals=False)
        try:
            yield reader
        finally:
            reader.close()
    finally:
        stop_neo4j(env)


def stop_neo4j(env: dict) -> None:
    """`mtrag neo4j stop` for the home `env` names: a bench stops the local server its builds
    started (`mtrag build` leaves it running for the next command), or its JVM outlives the run."""
    subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", "neo4j", "stop"], env=env, capture_output=True)


def wipe_work(work: Path) -> None:
    """Remove a bench work folder, stopping the Neo4j server of its home first: deleting a running
    server's home leaves an orphan JVM (~600 MB, and CPU the next measurements lose)."""
    from mtrag_resources.core.config import Settings
    from mtrag_resources.stores.neo4j_server import Neo4jServer

    if (work / "home").is_dir():
        Neo4jServer(Settings(home=work / "home")).stop()
    shutil.rmtree(work, ignore_errors=True)


def folder_bytes(path: Path) -> tuple[int, int]:
    """(apparent, allocated) bytes of the files under `path` (Edge's sparse files differ a lot)."""
    apparent = allocated = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                st = os.stat(os.path.join(root, f))
            except OSError:
                continue
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return apparent, allocated


def stop_group(proc, grace_s: float = 30) -> None:
    """Stop a process started with start_new_session=True and everything it started (a daemon's
    code server and run workers, a server's threads' children): SIGTERM to its process group, then
    SIGKILL to what is left after `grace_s`."""
    import os
    import signal
    import subprocess
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def git_commit(tree: Path) -> str:
    """The short commit a code tree (a checkout or worktree) is at."""
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


def cpu_s(pid: int | None) -> float | None:
    """CPU seconds (user + system, all threads) a live process has used so far; None when it is gone
    (or no pid is given)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def rss_mb(pid: int) -> float:
    """A live process's resident memory now (VmRSS), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def add_change_arguments(ap, rounds: int, out: str) -> None:
    """The options of the benches that change files of one built home (cli_change_ab, build_server)."""
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--work", default=str(REPO / "bench/out/build-work"))
    ap.add_argument("--code-file", default="flask/src/flask/helpers.py")
    ap.add_argument("--docs-dir", default="flask/docs")
    ap.add_argument("--docs-glob", default="*.rst", help="which files under --docs-dir may be removed")
    ap.add_argument("--out", default=str(REPO / out))


def built_home(args, docs_per_round: int) -> tuple[Path, Path, dict, list[Path]]:
    """(corpus, home, env, the docs files a round may remove) of --work's built home, its Neo4j
    started; exits when the home has no published generation or too few docs files."""
    work = Path(args.work).resolve()
    corpus, home, sources = work / "corpus", work / "home", work / "sources.yaml"
    if not (home / "08-manifest" / "CURRENT").exists():
        sys.exit(f"{home} has no published generation: run bench/build.py (or bench/scale.py) first")
    env = mtrag_env(home, sources)
    docs = sorted(p for p in (corpus / args.docs_dir).rglob(args.docs_glob) if p.stat().st_size > 2000)
    if len(docs) < docs_per_round * args.rounds:
        sys.exit(f"{corpus / args.docs_dir} has too few docs files to remove for {args.rounds} rounds")
    subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", "neo4j", "start"], env=env, check=True,
                   capture_output=True)
    return corpus, home, env, docs
