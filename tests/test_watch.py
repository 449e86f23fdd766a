"""`mtrag watch` as a real process on a temp source: edits, a new file, a rename and a delete
become visible to queries from other processes (bounded waits); a kill -9 in the middle of a
batch leaves the published generation serving, and a restarted watch converges; the Dagster
instance records the fast lane's batches (materializations and check evaluations, runless, with
their tags, data and code versions) and its start-up run."""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.neo4j, pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify, SIGKILL")]

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "mtrag_assets.app.cli"]
VISIBLE_S = 180  # only so that a stuck watch fails instead of hanging


class Watch:
    """A `mtrag watch` process whose output lines arrive on a queue."""

    def __init__(self, env: dict) -> None:
        self.proc = subprocess.Popen([*CLI, "watch"], env=env, cwd=REPO, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, text: str, timeout: float = 600) -> str:
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"watch exited ({self.proc.wait()}) before {text!r}:\n" + "\n".join(seen[-30:]))
            seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"no {text!r} within {timeout} s:\n" + "\n".join(seen[-30:]))

    def output(self) -> str:
        lines = []
        while not self.lines.empty():
            line = self.lines.get()
            if line is not None:
                lines.append(line)
        return "\n".join(lines[-30:])

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


def first_watch(env: dict) -> Watch:
    """A watch on a home with nothing published yet, once it published generation 1 and watches."""
    watch = Watch(env)
    try:
        watch.wait_for("published generation 1 (start)")
        watch.wait_for("watching")
    except BaseException:
        watch.stop()
        raise
    return watch


def niceness(pid: int) -> int:
    """The process's nice value (field 19 of /proc/PID/stat, after the command's parentheses)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def query(symbol: str) -> dict:
    out = subprocess.run([*CLI, "query", "--json", "--mode", "exact", symbol], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def until(what: str, check, watch: Watch) -> float:
    """Poll `check()` (a query from another process) until true; the seconds it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < VISIBLE_S:
        if check():
            return time.monotonic() - t0
        assert watch.proc.poll() is None, f"{what}: watch exited ({watch.proc.returncode}):\n{watch.output()}"
        time.sleep(0.2)
    raise AssertionError(f"{what}: not visible within {VISIBLE_S} s; watch said:\n{watch.output()}")


def files_of(symbol: str) -> set[str]:
    return {h["file_path"] for h in query(symbol)["hits"] if h["symbol"] == symbol}


def journal_entries() -> list[dict]:
    """The watch journal's entries, oldest first ([] before the first batch)."""
    from mtrag_resources.core.config import Settings
    from mtrag_resources.publish.journal import journal_path
    journal = journal_path(Settings.from_env())
    return [json.loads(line) for line in journal.read_text().splitlines()] if journal.exists() else []


def burst_entries(files: set[str]) -> list[dict]:
    """The watch journal's entries that name any of `files`."""
    return [e for e in journal_entries() if files & {f["file"] for f in e["files"]}]


def generation() -> int:
    from mtrag_resources.core.config import Settings
    from mtrag_resources.publish.manifest import load_current
    return load_current(Settings.from_env().manifest_dir)["generation"]


def test_watch_applies_edits_renames_and_deletes_and_converges_after_kill_9(mtrag_env):
    pkg = mtrag_env["pkg"]
    env = dict(os.environ)
    env.pop("MTRAG_FAULT", None)
    watch = first_watch(env)
    try:
        # it runs at MTRAG_WATCH_NICE's default niceness above its parent's: queries go first
        assert niceness(watch.proc.pid) == min(19, os.nice(0) + 10)
        # an edit: a new function appended to a file
        tax = pkg / "tax.py"
        tax.write_text(tax.read_text() + '\n\ndef watch_added(x):\n    """Added while watched."""\n    return x\n')
        until("the appended function", lambda: files_of("shopcart.tax.watch_added") == {"src/shopcart/tax.py"}, watch)
        line = watch.wait_for("published generation")
        assert "sources shop" in line and "chunks embedded" in line, line
        # a new file, then the same file renamed, then deleted
        (pkg / "fresh.py").write_text('def fresh_helper():\n    """A fresh helper."""\n    return 1\n')
        until("the new file", lambda: files_of("shopcart.fresh.fresh_helper") == {"src/shopcart/fresh.py"}, watch)
        (pkg / "fresh.py").rename(pkg / "moved.py")
        until("the renamed file", lambda: files_of("shopcart.moved.fresh_helper") == {"src/shopcart/moved.py"}
              and not files_of("shopcart.fresh.fresh_helper"), watch)
        (pkg / "moved.py").unlink()
        until("the deleted file", lambda: not files_of("shopcart.moved.fresh_helper"), watch)
        # a burst (three files saved back to back, as a checkout writes them) is one batch: the
        # journal's entry that names one of them names all three (found by file, not by generation:
        # a query can stop seeing the deleted file while its batch still writes, before it publishes)
        burst = {f"src/shopcart/burst_{n}.py" for n in range(3)}
        for n in range(3):
            (pkg / f"burst_{n}.py").write_text(f'def burst_{n}():\n    return {n}\n')
        until("the burst", lambda: all(files_of(f"shopcart.burst_{n}.burst_{n}") for n in range(3)), watch)
        until("the burst's journal entries", lambda: burst <= {f["file"] for e in burst_entries(burst)
                                                              for f in e["files"]}, watch)
        assert [{f["file"] for f in e["files"]} for e in burst_entries(burst)] == [burst]
        assert watch.stop() == 0, watch.output()  # SIGTERM between batches: a clean exit
    finally:
        watch.stop()
    published = generation()
    journal = journal_entries()
    assert {f["file"] for entry in journal for f in entry["files"]} >= {"src/shopcart/tax.py", "src/shopcart/moved.py"}
    assert journal[-1]["generation"] == published
    # each fast-lane batch records where its time went: every asset of the source, and the globals
    timed = [e["stage_seconds"] for e in journal if e.get("stage_seconds")]
    assert len(timed) >= 4, journal  # the edit, the new file, the rename, the removal
    from mtrag_assets.definitions import GLOBAL_ASSETS, PARTITIONED_ASSETS
    from mtrag_assets.fast_lane import PREPARE_LINKS
    wanted = ({f"shop/{a.key.path[-1]}" for a in PARTITIONED_ASSETS} | {a.key.path[-1] for a in GLOBAL_ASSETS}
              | {PREPARE_LINKS})
    assert all(set(t) >= wanted and all(v >= 0 for v in t.values()) for t in timed), timed

    # kill -9 in the middle of a batch: the watch dies after Qdrant's `begin` marker
    killed = Watch({**env, "MTRAG_FAULT": "qdrant:after_begin"})
    try:
        killed.wait_for("watching")
        tax.write_text(tax.read_text() + '\n\ndef watch_after_kill(x):\n    return x\n')
        assert killed.proc.wait(timeout=300) == -signal.SIGKILL
    finally:
        killed.stop()
    assert generation() == published  # the last generation stays current
    assert not files_of("shopcart.tax.watch_after_kill")
    restarted = Watch(env)
    try:
        restarted.wait_for("(start)")  # converges what the killed batch left
        until("the change of the killed batch", lambda: files_of("shopcart.tax.watch_after_kill"), restarted)
        status = subprocess.run([*CLI, "status", "--json"], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert json.loads(status.stdout)["stale"] == []
        # `mtrag status` shows each store's cursor per source and the journal's last batch
        shown = json.loads(status.stdout)
        assert set(shown["sources"]["shop"]) >= {"qdrant", "fts", "neo4j"}
        assert shown["fast_lane"]["generation"] == shown["generation"], shown.get("fast_lane")
    finally:
        assert restarted.stop() == 0

    import dagster as dg
    instance = dg.DagsterInstance.get()
    # The start-up convergence is an ordinary in-process run, tagged with its plane.
    runs = instance.get_runs(filters=dg.RunsFilter(tags={"mtrag/plane": "watch"}))
    assert any(r.status == dg.DagsterRunStatus.SUCCESS and r.tags.get("mtrag/publish") == "true" for r in runs)
    assert not [r.run_id for r in runs if r.status in (dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING)]
    # A change is a fast-lane batch: no run, the same materializations recorded afterwards with
    # the batch's tags, data version and code version; its check evaluations too.
    from dagster._core.event_api import PartitionKeyFilter
    from mtrag_resources.core.versions import CODE_VERSIONS
    batches = set()
    for asset in ("raw_source", "cas_chunks", "qdrant_collection", "fts_db", "neo4j_graph"):
        records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset),
                                                                        asset_partitions=["shop"]), limit=20).records
        fast = [r for r in records if (r.asset_materialization.tags or {}).get("mtrag/plane") == "watch"
                and not r.run_id]
        assert fast, f"{asset}: no fast-lane materialization among {[r.run_id for r in records]}"
        tags = fast[0].asset_materialization.tags
        assert tags["dagster/code_version"] == CODE_VERSIONS[asset]
        assert tags["dagster/data_version"]
        assert fast[0].asset_materialization.metadata  # the batch plane's metadata keys
        batches.add(tags["mtrag/batch"])
    # the watch's code graph resolved again only the calls whose symbol-table reads changed
    graphs = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey("canonical_graph"),
                                                                   asset_partitions=["shop"]), limit=20).records
    reused = [r.asset_materialization.metadata["calls_reused"].value for r in graphs
              if not r.run_id and "calls_reused" in r.asset_materialization.metadata]
    assert reused and max(reused) > 0, reused
    # the watch's raw stage read the paths its events named, not the whole folder
    raws = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey("raw_source"),
                                                                 asset_partitions=["shop"]), limit=20).records
    scans = [r.asset_materialization.metadata["folder_scan"].value for r in raws if not r.run_id]
    assert any(s.startswith("rescan of ") for s in scans), scans
    # ... and its links stage kept the reference resolutions whose index entries did not change
    links = instance.fetch_materializations(dg.AssetKey("cross_source_links"), limit=20).records
    kept = [r.asset_materialization.metadata["targets_kept"].value for r in links
            if not r.run_id and "targets_kept" in r.asset_materialization.metadata]
    assert kept and max(kept) > 0, kept
    manifests = instance.fetch_materializations(dg.AssetKey("index_manifest"), limit=50).records
    assert any((r.asset_materialization.tags or {}).get("mtrag/batch") in batches for r in manifests)
    check = instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(dg.AssetKey("qdrant_collection"), "qdrant_marker_committed"), limit=20,
        partition_filter=PartitionKeyFilter(key="shop"))
    assert any(e.run_id in batches and e.status.value == "SUCCEEDED" for e in check), [(e.run_id, e.status) for e in check]


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
                              "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_watch_follows_a_git_ref_new_commits_publish_uncommitted_edits_do_not(tmp_path, monkeypatch, neo4j_uri):
    from tests.conftest import use_fresh_home
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "calc.py").write_text('def add(a, b):\n    """Add two numbers."""\n    return a + b\n')
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "first")
    sources = tmp_path / "sources.yaml"
    sources.write_text(f"sources:\n  - {{id: calc, kind: code, git: {repo}, ref: main, include: ['pkg/**/*.py']}}\n")
    use_fresh_home(monkeypatch, tmp_path / "home", sources, neo4j_uri)
    env = dict(os.environ)
    env.pop("MTRAG_FAULT", None)
    watch = first_watch(env)
    try:
        calc = repo / "pkg" / "calc.py"
        # an uncommitted edit is not the ref's tree: nothing is published for it
        calc.write_text(calc.read_text() + '\n\ndef uncommitted(x):\n    return x\n')
        time.sleep(2)
        assert generation() == 1 and not files_of("pkg.calc.uncommitted")
        # a commit on the ref is: the new function is found, with the new commit's sha
        calc.write_text(calc.read_text() + '\n\ndef committed_later(x):\n    """Committed while watched."""\n    return x\n')
        _git(repo, "commit", "-q", "-am", "second")
        sha = _git(repo, "rev-parse", "HEAD")
        until("the committed function", lambda: files_of("pkg.calc.committed_later") == {"pkg/calc.py"}, watch)
        hits = [h for h in query("pkg.calc.committed_later")["hits"] if h["symbol"] == "pkg.calc.committed_later"]
        assert hits[0]["commit_sha"] == sha
        line = watch.wait_for("published generation")
        assert "sources calc" in line, line
        assert watch.stop() == 0, watch.output()
    finally:
        watch.stop()
    journal = journal_entries()
    assert {"source": "calc", "commit": sha} in journal[-1]["commits"]
