"""The Dagster instance on PostgreSQL: `mtrag postgres start|status|stop` as real processes of the
installed console script, `mtrag build` recording its runs, events and materializations in that
server (and nothing in SQLite), the managed dagster.yaml refusing a user's file that lacks the
storage asked for, and a backfill queued on the PostgreSQL instance, launched out of process by the
daemon (queued run coordinator, default run launcher) and published by declarative automation."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import psutil
import pytest

from mtrag_assets.definitions import GLOBAL_ASSETS, PARTITIONED_ASSETS
from mtrag_assets.runner import dagster_instance, sync_partitions
from mtrag_resources.core.config import Settings
from mtrag_resources.core.instance_file import MARKER, PG_URL_ENV
from mtrag_resources.ingest.sources import load_sources
from mtrag_resources.publish.manifest import load_current
from tests.postgres_fixture import pg_server_url, pg_url  # noqa: F401 - fixtures
from tests.test_backfill import Daemon, _automation_sensor, _dagster, _kill_group, _wait

pytestmark = [pytest.mark.integration, pytest.mark.neo4j, pytest.mark.postgres]

REPO = Path(__file__).resolve().parents[1]
MTRAG = str(Path(sys.executable).with_name("mtrag"))
SOURCES = ["shop", "shop-docs"]


def mtrag(env: dict, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([MTRAG, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def pg_rows(url: str, sql: str, *params) -> list[tuple]:
    import psycopg2  # the driver dagster-postgres uses

    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall()
    finally:
        conn.close()


def sqlite_files(dagster_home: Path) -> list[str]:
    """SQLite databases Dagster's default storages would have created under DAGSTER_HOME
    (history/runs.db, history/runs/<run id>.db, schedules/schedules.db, ...)."""
    return sorted(str(p.relative_to(dagster_home)) for p in dagster_home.rglob("*")
                  if p.suffix in (".db", ".sqlite") or p.name.endswith((".db-wal", ".db-journal")))


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_mtrag_postgres_cli_and_a_build_recorded_in_postgres(mtrag_env, monkeypatch):
    home = mtrag_env["home"]
    env = {k: v for k, v in os.environ.items() if k != PG_URL_ENV}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")

    out = mtrag(env, "postgres", "status", "--json")
    assert out.returncode == 3, out.stderr  # not running
    assert json.loads(out.stdout)["running"] is False
    assert not (home / "postgres").exists()  # status creates nothing

    out = mtrag(env, "postgres", "start", "--json")
    assert out.returncode == 0, out.stderr
    started = json.loads(out.stdout)
    pid, url = started["pid"], started["url"]
    try:
        assert started["running"] is True and started["database"] == "dagster"
        assert url.startswith("postgresql://mtrag:") and f"@127.0.0.1:{started['port']}/dagster" in url
        assert started["home"] == str(home / "postgres")
        # bound to loopback only, and answering there
        listening = {(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections("inet")
                     if c.status == psutil.CONN_LISTEN}
        assert listening == {("127.0.0.1", started["port"])}
        assert pg_rows(url, "SELECT current_database(), current_user") == [("dagster", "mtrag")]
        assert (home / "postgres" / "password").stat().st_mode & 0o077 == 0

        # start is idempotent: the same server; status agrees (and hides the password as text)
        again = mtrag(env, "postgres", "start", "--json")
        assert again.returncode == 0 and json.loads(again.stdout) == started
        assert json.loads(mtrag(env, "postgres", "status", "--json").stdout) == started
        text = mtrag(env, "postgres", "status").stdout
        assert text.startswith(f"postgres: running at postgresql://mtrag:***@127.0.0.1:{started['port']}/dagster")
        assert url.split(":")[2].split("@")[0] not in text

        # the build's runs, events and materializations are in PostgreSQL
        built = mtrag({**env, PG_URL_ENV: url}, "build")
        assert built.returncode == 0, built.stderr[-3000:]
        assert "published generation 1" in built.stdout
        dagster_home = home / "dagster_home"
        yaml_text = (dagster_home / "dagster.yaml").read_text()
        assert yaml_text.splitlines()[0] == MARKER
        assert f"env: {PG_URL_ENV}" in yaml_text and "127.0.0.1" not in yaml_text  # no URL, no password

        monkeypatch.setenv(PG_URL_ENV, url)
        instance = dagster_instance(Settings.from_env())
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
        runs = instance.get_runs()
        assert sorted(r.tags.get("mtrag/source") for r in runs) == SOURCES
        assert all(r.status == dg.DagsterRunStatus.SUCCESS and r.tags["mtrag/trigger"] == "cli" for r in runs)
        for sid in SOURCES:
            records = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey("cas_chunks"), asset_partitions=[sid]), limit=5).records
            assert len(records) == 1 and records[0].run_id in {r.run_id for r in runs}
        manifest_mat = instance.get_latest_materialization_event(dg.AssetKey("index_manifest"))
        assert manifest_mat is not None and manifest_mat.run_id == load_current(Settings.from_env().manifest_dir)["run_id"]

        # the same, read straight from the tables dagster-postgres writes
        assert pg_rows(url, "SELECT count(*) FROM runs") == [(len(runs),)]
        by_run = dict(pg_rows(url, "SELECT run_id, count(*) FROM event_logs GROUP BY run_id"))
        assert set(by_run) == {r.run_id for r in runs} and min(by_run.values()) > 20
        materialized = pg_rows(url, "SELECT count(*) FROM event_logs WHERE dagster_event_type = 'ASSET_MATERIALIZATION'")
        assert materialized[0][0] == len(SOURCES) * len(PARTITIONED_ASSETS) + len(GLOBAL_ASSETS)
        assert ('["index_manifest"]',) in pg_rows(url, "SELECT asset_key FROM asset_keys")
        # and SQLite was not used for any of it
        assert sqlite_files(dagster_home) == []

        # a user's own dagster.yaml without the asked-for storage is refused, never overwritten
        user_yaml = "concurrency:\n  pools:\n    default_limit: 1\n"
        (dagster_home / "dagster.yaml").write_text(user_yaml)
        refused = mtrag({**env, PG_URL_ENV: url}, "build", "--force")
        assert refused.returncode == 2, refused.stderr[-3000:]
        lines = refused.stderr.splitlines()
        path = dagster_home / "dagster.yaml"
        assert lines[0].startswith(f"mtrag: {path}: concurrency.runs.tag_concurrency_limits: mtrag needs an entry "
                                   "{key: dagster/partition"), refused.stderr  # one line per difference
        assert lines[0].endswith("; kept (your file; mtrag does not overwrite it)")
        assert lines[1].startswith(f"mtrag: {path} cannot be used as it is: storage: mtrag needs postgres with "
                                   f"postgres_url {{env: {PG_URL_ENV}}}"), refused.stderr
        assert len(lines) == 2
        assert (dagster_home / "dagster.yaml").read_text() == user_yaml
        assert pg_rows(url, "SELECT count(*) FROM runs") == [(len(runs),)]
    finally:
        stopped = mtrag(env, "postgres", "stop")
    assert stopped.returncode == 0 and stopped.stdout.strip() == "postgres: stopped", stopped.stderr
    assert gone(pid)
    assert json.loads(mtrag(env, "postgres", "status", "--json").stdout)["running"] is False
    assert mtrag(env, "postgres", "stop").stdout.strip() == "postgres: not running"
    assert not (home / "postgres" / "run" / "postgres.pid").exists()


def _dagster_processes(dagster_home: Path) -> list[psutil.Process]:
    """Processes whose environment names this test's DAGSTER_HOME (daemon, code server, run workers)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and proc.environ().get("DAGSTER_HOME") == str(dagster_home) \
                    and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _is_daemon(proc: psutil.Process) -> bool:
    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return False
    return any(part.endswith("dagster-daemon") for part in cmd[:2]) and "run" in cmd


@pytest.mark.slow  # a dagster-daemon launching a process per run and per step: minutes
def test_backfill_through_the_daemon_on_postgres_publishes(mtrag_env, pg_url, tmp_path, monkeypatch):
    monkeypatch.setenv(PG_URL_ENV, pg_url)
    settings = Settings.from_env().ensure()
    instance = dagster_instance(settings)  # dagster.yaml with the PostgreSQL storage
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
    assert type(instance.run_launcher).__name__ == "DefaultRunLauncher"
    sync_partitions(instance, load_sources(settings.sources_file))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "MTRAG_NIGHTLY_CRON": "0 0 29 2 *"}

    _dagster(env, "sensor", "stop", "source_changes")
    automation = _automation_sensor()
    if automation.default_status != dg.DefaultSensorStatus.RUNNING:
        _dagster(env, "sensor", "start", automation.name)
    _dagster(env, "job", "backfill", "-j", "build_source", "--partitions", ",".join(SOURCES), "--noprompt")
    queued = instance.get_runs()
    assert sorted(r.tags.get("dagster/partition") for r in queued) == SOURCES
    assert all(r.status == dg.DagsterRunStatus.QUEUED for r in queued)
    built = {r.run_id for r in queued}

    dagster_home = settings.dagster_home
    assert not [p for p in _dagster_processes(dagster_home) if _is_daemon(p)]
    daemon = Daemon(env, tmp_path / "daemon.log")
    deadline = time.monotonic() + 900
    daemons_seen = set()
    try:
        def published():
            daemons_seen.update(p.pid for p in _dagster_processes(dagster_home) if _is_daemon(p))
            runs = instance.get_runs()
            failed = [r for r in runs if r.status == dg.DagsterRunStatus.FAILURE]
            assert not failed, f"failed runs: {[(r.job_name, r.tags) for r in failed]}\n{daemon.tail()}"
            if any(r.status != dg.DagsterRunStatus.SUCCESS for r in runs):
                return None
            manifest = load_current(settings.manifest_dir)
            latest = instance.get_latest_materialization_event(dg.AssetKey("index_manifest"))
            if manifest is None or latest is None or latest.run_id != manifest["run_id"]:
                return None
            return manifest
        manifest = _wait("the backfill to be published", daemon, published, deadline)
    finally:
        _kill_group(daemon.proc)
    # one daemon, and nothing of it left once stopped (its code server and run workers included)
    assert daemons_seen == {daemon.proc.pid}
    deadline = time.monotonic() + 20  # SIGKILLed processes take a moment to go
    while (leftover := _dagster_processes(dagster_home)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert leftover == [], [_cmdline(p) for p in leftover]

    # the runs were launched out of process by the daemon, each in a process of its own
    records = {rec.dagster_run.run_id: rec for rec in instance.get_run_records()}
    for rid in built:
        run = records[rid].dagster_run
        assert run.status == dg.DagsterRunStatus.SUCCESS and run.tags.get("dagster/backfill")
        starts = instance.all_logs(rid, of_type=dg.DagsterEventType.RUN_START)
        assert starts and all(e.dagster_event.pid not in (os.getpid(), daemon.proc.pid) for e in starts)
    publishers = [r for r in records.values() if dg.AssetKey("index_manifest") in (r.dagster_run.asset_selection or ())]
    assert publishers and all(r.dagster_run.tags.get("dagster/sensor_name") == automation.name for r in publishers)
    assert sorted(manifest["sources"]) == SOURCES
    for sid in SOURCES:
        assert {s["state"] for s in manifest["sources"][sid]["stores"].values()} == {"committed"}
    # all of it in this test's PostgreSQL database, none in SQLite
    assert pg_rows(pg_url, "SELECT count(*) FROM runs") == [(len(records),)]
    assert pg_rows(pg_url, "SELECT count(*) FROM bulk_actions") == [(1,)]  # the backfill
    assert sqlite_files(dagster_home) == []
