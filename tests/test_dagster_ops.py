"""Operating the code location on a real Dagster instance: a killed build's run and pool slot are
released (`release_dead_runs`), a `pip_sdist` source is fetched from PyPI and snapshotted, and the
assets' freshness policies are evaluated by Dagster's own freshness evaluation (the daemon's),
passing for fresh materializations and warning / failing as they age."""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import pytest

from mtrag_assets.policies import PID_TAG
from mtrag_resources.publish.manifest import load_current
from tests.build_helpers import build, finish, latest_metadata, settings, wait_stopped

REPO = Path(__file__).resolve().parents[1]
MTRAG = str(Path(sys.executable).with_name("mtrag"))
POOL = "qdrant_writer"


def _env(fault: str | None = None, stop: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MTRAG_FAULT", "MTRAG_FAULT_SIGNAL")}
    if fault:
        env["MTRAG_FAULT"] = fault
    if stop:
        env["MTRAG_FAULT_SIGNAL"] = "STOP"
    return env




def _started_runs(instance: dg.DagsterInstance) -> list:
    return instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))


# ------------------------------------------------------------------ release_dead_runs

@pytest.mark.integration
@pytest.mark.neo4j
@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc, SIGKILL and SIGSTOP")
def test_release_dead_runs_frees_a_killed_builds_run_and_pool_slot_only(mtrag_env):
    from mtrag_assets.runner import release_dead_runs
    build()
    instance = dg.DagsterInstance.get()
    # Killed inside its qdrant_collection step, which holds the one slot of the qdrant_writer pool.
    out = subprocess.run([MTRAG, "build", "--source", "shop"], env=_env("qdrant:after_begin"), cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == -signal.SIGKILL, out.stderr[-3000:]
    (dead,) = _started_runs(instance)
    pid = int(dead.tags[PID_TAG])
    assert not Path(f"/proc/{pid}").exists()
    info = instance.event_log_storage.get_concurrency_info(POOL)
    assert {(c.run_id, c.step_key) for c in info.claimed_slots} == {(dead.run_id, "qdrant_collection")}
    assert info.slot_count == 1  # the instance's pool limit: nothing else can write Qdrant now

    logged: list[str] = []
    assert release_dead_runs(instance, log=logged.append) == [dead.run_id]
    assert logged == [f"released 1 run(s) of build processes that died: {[dead.run_id]}"]
    run = instance.get_run_by_id(dead.run_id)
    assert run.status == dg.DagsterRunStatus.FAILURE
    failure = instance.get_records_for_run(dead.run_id, of_type=dg.DagsterEventType.RUN_FAILURE).records
    assert f"the build process (pid {pid}) died during this run" in failure[-1].event_log_entry.dagster_event.message
    assert instance.event_log_storage.get_concurrency_info(POOL).claimed_slots == []
    assert release_dead_runs(instance, log=logged.append) == []  # once only

    # A build that is alive (frozen in its neo4j_graph step, before any pooled step) keeps its run,
    # though it is STARTED too; let go, it takes the freed slot for its Qdrant steps and publishes.
    proc = subprocess.Popen([MTRAG, "build", "--source", "shop"], env=_env("neo4j:after_begin", stop=True),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_stopped(proc)
        (live,) = _started_runs(instance)
        assert live.tags[PID_TAG] == str(proc.pid)
        assert release_dead_runs(instance, log=logged.append) == []
        assert instance.get_run_by_id(live.run_id).status == dg.DagsterRunStatus.STARTED
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    _, out, err = finish(proc, timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert instance.get_run_by_id(live.run_id).status == dg.DagsterRunStatus.SUCCESS
    assert "built ['shop']" in out and "published generation 2" in out
    assert instance.event_log_storage.get_concurrency_info(POOL).claimed_slots == []


@pytest.mark.integration  # a Dagster instance
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
def test_release_dead_runs_reads_hidden_and_older_visible_process_tags(tmp_path):
    """Runs recorded before the process tags moved under Dagster's hidden prefix keep the visible
    ones: a build killed then is released too; a live process's run is left alone either way."""
    import socket
    import uuid
    from mtrag_assets.policies import HOST_TAG, PROC_START_TAG
    from mtrag_assets.runner import release_dead_runs
    from mtrag_resources.core.processes import proc_start
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = socket.gethostname()
    hidden = lambda pid, start: {HOST_TAG: host, PID_TAG: str(pid), PROC_START_TAG: start}  # noqa: E731
    visible = lambda pid, start: {"mtrag/host": host, "mtrag/pid": str(pid), "mtrag/proc_start": start}  # noqa: E731
    me = (os.getpid(), proc_start(os.getpid()))
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        runs = {name: dg.DagsterRun(job_name="build_source", run_id=str(uuid.uuid4()),
                                    status=dg.DagsterRunStatus.STARTED, tags=tags)
                for name, tags in (("dead", hidden(gone.pid, "1")), ("dead_before", visible(gone.pid, "1")),
                                   ("live", hidden(*me)), ("live_before", visible(*me)))}
        for run in runs.values():
            instance.add_run(run)
        released = release_dead_runs(instance, log=lambda *_: None)
        assert sorted(released) == sorted([runs["dead"].run_id, runs["dead_before"].run_id])
        assert {name for name, run in runs.items()
                if instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED} == {"live", "live_before"}


# ------------------------------------------------------------------ pip_sdist

SDIST = "six==1.16.0"  # 34 KB, one module


@pytest.fixture
def sdist_env(tmp_path, monkeypatch):
    home = tmp_path / "home"
    sources = tmp_path / "sources.yaml"
    sources.write_text(textwrap.dedent(f"""\
        sources:
          - {{id: six, kind: code, pip_sdist: "{SDIST}", include: ["six.py"]}}
        """))
    monkeypatch.setenv("MTRAG_HOME", str(home))
    monkeypatch.setenv("MTRAG_SOURCES", str(sources))
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster_home"))
    return {"home": home, "sources": sources}


def _materialize_snapshot(partition: str) -> dg.ExecuteInProcessResult:
    from mtrag_assets.cas_chunks import cas_chunks
    from mtrag_assets.raw_source import raw_source
    from mtrag_assets.resources import MtragResource
    from mtrag_assets.runner import dagster_instance
    instance = dagster_instance(settings().ensure())
    if partition not in instance.get_dynamic_partitions("sources"):
        instance.add_dynamic_partitions("sources", [partition])
    return dg.materialize([raw_source, cas_chunks], partition_key=partition, instance=instance,
                          resources={"mtrag": MtragResource()})


@pytest.mark.integration
def test_pip_sdist_source_is_fetched_from_pypi_and_snapshotted(sdist_env):
    result = _materialize_snapshot("six")
    assert result.success
    s = settings()
    unpacked = s.sdist_dir / "six-1.16.0"
    assert (unpacked / ".mtrag-complete").read_text() == SDIST
    assert (unpacked / "setup.py").is_file()  # the whole sdist is unpacked; the include picks six.py

    from mtrag_resources.core.layout import SourceLayout
    inventory = json.loads(SourceLayout(s, "six").inventory.read_text())
    included = [f for f in inventory["files"] if f["status"] == "ok"]
    assert [f["path"] for f in included] == ["six.py"]
    data = (unpacked / "six.py").read_bytes()
    assert included[0]["sha256"] == hashlib.sha256(data).hexdigest() and included[0]["size"] == len(data)
    from mtrag_resources.stores.cas import ContentStore
    assert ContentStore(s.cas_dir).get_text(included[0]["sha256"]) == data.decode()

    meta = latest_metadata("raw_source", "six")
    assert meta["files"] == 1 and meta["by_language"] == "| language | count |\n| --- | ---: |\n| python | 1 |"
    assert meta["sdist"] == SDIST and "commit" not in meta  # its pin, not a git HEAD above its folder
    assert Path(meta["root"]) == unpacked
    chunks = latest_metadata("cas_chunks", "six")
    assert chunks["chunks"] > 20  # six.py's functions and classes
    from mtrag_resources.stores.tables import read_rows
    symbols = {r["symbol"] for r in read_rows(SourceLayout(s, "six").chunks)}
    assert {"six.add_metaclass", "six.with_metaclass"} <= symbols

    # A second snapshot reuses the unpacked sdist (no download) and has the same data version.
    stamp = (unpacked / ".mtrag-complete").stat().st_mtime_ns
    first = dg.DagsterInstance.get().get_latest_data_version_record(dg.AssetKey("raw_source"), partition_key="six")
    assert _materialize_snapshot("six").success
    assert (unpacked / ".mtrag-complete").stat().st_mtime_ns == stamp
    second = dg.DagsterInstance.get().get_latest_data_version_record(dg.AssetKey("raw_source"), partition_key="six")
    assert first is not None and second is not None
    assert second.asset_materialization.tags["dagster/data_version"] == first.asset_materialization.tags["dagster/data_version"]


@pytest.mark.integration
def test_pip_sdist_that_pypi_does_not_have_fails_the_step_naming_it(sdist_env):
    from mtrag_resources.ingest.sources import SourceConfigError, fetch_sdist
    with pytest.raises(SourceConfigError, match=r"pip_sdist 'six==0\.0\.0\.404': pip download failed"):
        fetch_sdist("six==0.0.0.404", settings().ensure().sdist_dir)
    assert not (settings().sdist_dir / "six-0.0.0.404").exists()


# ------------------------------------------------------------------ freshness

ASSETS = ["raw_source", "cas_chunks", "canonical_graph", "embedding_cache", "qdrant_collection", "fts_db",
          "neo4j_graph", "cross_source_links", "index_manifest"]
GLOBAL = {"cross_source_links", "index_manifest"}


@pytest.mark.integration
@pytest.mark.neo4j
def test_freshness_passes_when_fresh_and_warns_then_fails_as_materializations_age(mtrag_env):
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.test_utils import freeze_time
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
    from dagster._daemon.freshness import FreshnessDaemon

    build()
    t0 = dt.datetime.now(dt.timezone.utc)
    instance = dg.DagsterInstance.get()
    keys = [dg.AssetKey(a) for a in ASSETS]
    origin = InProcessCodeLocationOrigin(LoadableTargetOrigin(
        module_name="mtrag_assets.definitions", attribute="defs", working_directory=str(REPO)))

    with WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(origin)) as workspace:
        daemon = FreshnessDaemon()

        def states_at(when: dt.datetime | None) -> dict[str, str]:
            """One pass of the freshness daemon at `when` (Dagster's clock), and the states the
            instance then holds (what the UI shows)."""
            if when is None:
                list(daemon.run_iteration(workspace))
            else:
                with freeze_time(when):
                    list(daemon.run_iteration(workspace))
            records = instance.get_freshness_state_records(keys)
            return {k.to_user_string(): records[k].freshness_state.value if k in records else "none" for k in keys}

        assert states_at(None) == dict.fromkeys(ASSETS, "PASS")
        assert states_at(t0 + dt.timedelta(hours=25)) == dict.fromkeys(ASSETS, "PASS")  # inside warn_window=26h
        assert states_at(t0 + dt.timedelta(hours=27)) == dict.fromkeys(ASSETS, "WARN")

        # 27 h later only the publishing assets are materialized again (a build with nothing changed
        # re-publishes): they pass, every per-source asset still warns.
        with freeze_time(t0 + dt.timedelta(hours=27)):
            build()
        assert load_current(settings().manifest_dir)["generation"] == 2
        expected = {a: ("PASS" if a in GLOBAL else "WARN") for a in ASSETS}
        assert states_at(t0 + dt.timedelta(hours=27, minutes=1)) == expected
        # Past fail_window=48h for the source assets; 22 h for the publishing ones.
        expected = {a: ("PASS" if a in GLOBAL else "FAIL") for a in ASSETS}
        assert states_at(t0 + dt.timedelta(hours=49)) == expected
        assert states_at(t0 + dt.timedelta(hours=76)) == dict.fromkeys(ASSETS, "FAIL")  # 49 h for the publishing ones
