"""A backfill of two source partitions the way Dagster runs one: runs queued on the instance,
dequeued by the daemon's run queue, launched in their own processes with every step in a process
of its own (multiprocess executor), and published by declarative automation afterwards.

The instance is the one `mtrag build` writes (`runner.INSTANCE_YAML`): pool `qdrant_writer`
limited to one step at a time, at most one queued-then-launched run per `dagster/partition` value."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import dagster as dg
import psutil
import pytest

from mtrag_assets.definitions import defs
from mtrag_assets.runner import dagster_instance, sync_partitions
from mtrag_resources.core.config import Settings
from mtrag_resources.publish.manifest import load_current
from mtrag_resources.ingest.sources import load_sources
from tests.build_helpers import latest_metadata

# a dagster-daemon launching a process per run and per step: minutes
pytestmark = [pytest.mark.integration, pytest.mark.neo4j, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
BIN = REPO / ".venv" / "bin"
SOURCES = ["shop", "shop-docs"]
TIMEOUT = 900  # the whole backfill; each step is a process of its own on a small shared machine
QUEUE_PASS = "checking tag concurrency limits for queued runs"  # logged by each run-queue pass
QUEUE_PASSES = 2  # passes the duplicate `shop` run must stay queued through while the first one runs
# Each run's qdrant_collection step stops itself (SIGSTOP) once its `begin` marker is written, so the
# first `shop` run is still in flight for as long as the test looks at the queue; then the test lets
# the stopped steps go on (SIGCONT).
FAULT = {"MTRAG_FAULT": "qdrant:after_begin", "MTRAG_FAULT_SIGNAL": "STOP"}
IN_FLIGHT = (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
             dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING)


def _automation_sensor() -> dg.SensorDefinition:
    """The sensor that evaluates index_manifest's automation condition (Dagster's default one
    unless the code location declares its own)."""
    graph = defs.resolve_asset_graph()
    for sensor in defs.get_repository_def().sensor_defs:
        if isinstance(sensor, dg.AutomationConditionSensorDefinition) and \
                dg.AssetKey("index_manifest") in sensor.asset_selection.resolve(graph):
            return sensor
    raise AssertionError("no automation condition sensor targets index_manifest")


def _dagster(env: dict, *args: str) -> None:
    proc = subprocess.run([str(BIN / "dagster"), *args, "-w", "workspace.yaml"], cwd=REPO, env=env,
                          text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, f"dagster {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"


def _kill_group(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
    try:  # the daemon's code server and any run worker it left behind
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def _step_windows(instance: dg.DagsterInstance, run_id: str) -> dict[str, tuple[float, float, int]]:
    """step key -> (STEP_START time, STEP_SUCCESS time, pid of the step's process)."""
    starts, ends = {}, {}
    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if event is None or not event.step_key:
            continue
        if event.event_type == dg.DagsterEventType.STEP_START:
            starts[event.step_key] = (entry.timestamp, event.pid)
        elif event.event_type == dg.DagsterEventType.STEP_SUCCESS:
            ends[event.step_key] = entry.timestamp
    return {k: (starts[k][0], ends[k], starts[k][1]) for k in starts if k in ends}


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


class Daemon:
    def __init__(self, env: dict, log: Path):
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([str(BIN / "dagster-daemon"), "run", "-w", "workspace.yaml"], cwd=REPO,
                                         env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def check(self) -> None:
        if self.proc.poll() is not None:
            pytest.fail(f"dagster-daemon exited with {self.proc.returncode}:\n{self.tail()}")

    def tail(self, chars: int | None = 4000) -> str:
        text = self.log.read_text(errors="replace")
        return text[-chars:] if chars else text


def _resume_stopped(daemon: Daemon) -> set[int]:
    """SIGCONT every process under the daemon that stopped itself at its fault point; their pids."""
    resumed = set()
    try:
        procs = psutil.Process(daemon.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return resumed
    for proc in procs:
        try:
            if proc.status() == psutil.STATUS_STOPPED:
                proc.send_signal(signal.SIGCONT)
                resumed.add(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return resumed


def _wait(what: str, daemon: Daemon, predicate, deadline: float):
    while time.monotonic() < deadline:
        daemon.check()
        result = predicate()
        if result:
            return result
        time.sleep(1)
    pytest.fail(f"timed out waiting for {what}\n{daemon.tail()}")


def test_backfill_of_two_sources_runs_in_parallel_and_publishes(mtrag_env, tmp_path):
    settings = Settings.from_env().ensure()
    instance = dagster_instance(settings)  # writes DAGSTER_HOME/dagster.yaml from INSTANCE_YAML
    sync_partitions(instance, load_sources(settings.sources_file))
    assert sorted(instance.get_dynamic_partitions("sources")) == SOURCES
    # The nightly schedule must not fire into this test (it runs at 02:00 UTC by default).
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
           "MTRAG_NIGHTLY_CRON": "0 0 29 2 *"}

    # The test requests the builds, so the change sensor must not request them as well; publishing
    # is left to declarative automation (Dagster's default automation sensor starts stopped).
    _dagster(env, "sensor", "stop", "source_changes")
    automation = _automation_sensor()
    if automation.default_status != dg.DefaultSensorStatus.RUNNING:
        _dagster(env, "sensor", "start", automation.name)

    # A backfill of both partitions of build_source, then a second request for `shop` (as a
    # sensor or a second backfill would make) while the first is still queued.
    _dagster(env, "job", "backfill", "-j", "build_source", "--partitions", ",".join(SOURCES), "--noprompt")
    _dagster(env, "job", "backfill", "-j", "build_source", "--partitions", "shop", "--noprompt")
    queued = sorted(instance.get_runs(), key=lambda r: instance.get_run_record_by_id(r.run_id).create_timestamp)
    assert [r.tags.get("dagster/partition") for r in queued] == ["shop", "shop-docs", "shop"]
    assert all(r.status == dg.DagsterRunStatus.QUEUED and r.tags.get("dagster/backfill") for r in queued)
    shop, docs, shop_again = (r.run_id for r in queued)

    daemon = Daemon({**env, **FAULT}, tmp_path / "daemon.log")
    deadline = time.monotonic() + TIMEOUT  # only so that a stuck backfill fails instead of hanging
    resumed: set[int] = set()
    try:
        status = lambda rid: instance.get_run_by_id(rid).status  # noqa: E731
        launched = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.SUCCESS)
        _wait("both sources to be launched", daemon,
              lambda: status(shop) in launched and status(docs) in launched, deadline)
        # One source never builds twice at the same time: passes of the run queue leave the second
        # `shop` run queued while the first runs (nothing else limits runs here; the first cannot
        # finish, its qdrant step is held at the fault point); then it is cancelled.
        passes_before = daemon.tail(None).count(QUEUE_PASS)
        while daemon.tail(None).count(QUEUE_PASS) - passes_before < QUEUE_PASSES:
            daemon.check()
            assert status(shop_again) == dg.DagsterRunStatus.QUEUED, "a second run of `shop` was launched"
            assert status(shop) in launched[:2], f"the first `shop` run ended while held:\n{daemon.tail()}"
            if time.monotonic() > deadline:
                pytest.fail(f"the run queue did not run:\n{daemon.tail()}")
            time.sleep(0.5)
        assert instance.run_coordinator.cancel_run(shop_again)

        def settled():
            resumed.update(_resume_stopped(daemon))  # each qdrant step, as it reaches its fault point
            runs = instance.get_runs()
            failed = [r for r in runs if r.status == dg.DagsterRunStatus.FAILURE]
            assert not failed, f"failed runs: {[(r.run_id, r.job_name, r.tags) for r in failed]}\n{daemon.tail()}"
            if any(r.status in IN_FLIGHT for r in runs) or status(shop) != dg.DagsterRunStatus.SUCCESS \
                    or status(docs) != dg.DagsterRunStatus.SUCCESS:
                return None
            manifest = load_current(settings.manifest_dir)
            latest = instance.get_latest_materialization_event(dg.AssetKey("index_manifest"))
            if manifest is None or latest is None or latest.run_id != manifest["run_id"]:
                return None
            return manifest
        manifest = _wait("the backfill to be published", daemon, settled, deadline)
    finally:
        _resume_stopped(daemon)
        _kill_group(daemon.proc)

    records = {rec.dagster_run.run_id: rec for rec in instance.get_run_records()}
    window = {rid: (rec.start_time, rec.end_time) for rid, rec in records.items()}
    assert records[shop_again].dagster_run.status == dg.DagsterRunStatus.CANCELED
    assert window[shop_again][0] is None, "the duplicate `shop` run never started"

    # The two sources built at the same time, each step in a process of its own.
    assert _overlap(window[shop], window[docs]), (window[shop], window[docs])
    steps = {rid: _step_windows(instance, rid) for rid in (shop, docs)}
    for rid, by_step in steps.items():
        assert {"raw_source", "qdrant_collection", "fts_db", "neo4j_graph", "neo4j_graph_counts_reconcile"} <= set(by_step)
        assert len({pid for _s, _e, pid in by_step.values()}) == len(by_step), "one process per step (multiprocess executor)"

    # What was held at the fault point and let go: the qdrant step of each run, nothing else.
    assert resumed == {steps[rid]["qdrant_collection"][2] for rid in (shop, docs)}

    # The qdrant_writer pool (limit 1) kept the embedded Qdrant writes of the two runs apart.
    assert instance.event_log_storage.get_concurrency_info("qdrant_writer").slot_count == 1
    qdrant = [steps[rid]["qdrant_collection"][:2] for rid in (shop, docs)]
    assert not _overlap(*qdrant), qdrant

    # Automation published a generation holding both sources as the backfill built them.
    publishers = [r for r in instance.get_runs() if dg.AssetKey("index_manifest") in (r.asset_selection or ())]
    assert publishers and all(r.tags.get("dagster/sensor_name") == automation.name for r in publishers)
    assert window[manifest["run_id"]][0] > min(window[shop][0], window[docs][0])
    assert sorted(manifest["sources"]) == SOURCES
    for sid in SOURCES:
        generation = latest_metadata("cas_chunks", sid)["generation"]
        entry = manifest["sources"][sid]
        assert entry["chunk_generation"] == generation
        assert entry["stores"] == {s: {"generation": generation, "state": "committed"} for s in ("fts", "neo4j", "qdrant")}
