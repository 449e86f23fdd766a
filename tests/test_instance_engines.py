"""Kept SQLite connections for the instance's storages (mtrag_assets/instance_engines.py): a real
run and concurrent event writes through them land in Dagster's files exactly as without them,
readable by an instance in another process that has none; an idle kept connection holds no lock;
the number of files held open is bounded; a wipe leaves no handle on a deleted file."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading

import dagster as dg
import pytest

from mtrag_assets.instance_engines import MAX_FILES, reuse_sqlite_engines

@dg.asset
def tiny_asset() -> int:
    return 1


READ_BACK = """
import json, dagster as dg
inst = dg.DagsterInstance.get()
runs = inst.get_runs()
mats = inst.fetch_materializations(dg.AssetKey("tiny_asset"), limit=100).records
reported = inst.fetch_materializations(dg.AssetKey("reported"), limit=1000).records
print(json.dumps({"runs": [r.status.value for r in runs], "tiny": len(mats), "reported": len(reported),
                  "engines": hasattr(inst.event_log_storage, "_mtrag_engines")}))
"""


EXCLUSIVE = """
import sqlite3, sys
for path in sys.argv[1:]:
    conn = sqlite3.connect(path, timeout=2, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    conn.execute("ROLLBACK")
    conn.close()
"""


@pytest.mark.integration
def test_runs_and_concurrent_events_through_kept_connections_read_the_same_elsewhere_and_hold_no_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    instance = dg.DagsterInstance.get()
    assert reuse_sqlite_engines(instance) == 3  # event log, runs, schedules
    assert reuse_sqlite_engines(instance) == 0  # once per instance

    result = dg.materialize([tiny_asset], instance=instance)
    assert result.success
    event_engines = instance.event_log_storage._mtrag_engines.strings()
    # the index shard and the run's own shard, each one engine however many events went through it
    assert {s.rsplit("/", 1)[-1] for s in event_engines} >= {"index.db", f"{result.run_id}.db"}
    assert len(instance.get_records_for_run(result.run_id).records) > 10

    errors: list[BaseException] = []

    def report(worker: int) -> None:
        try:
            for i in range(15):
                instance.report_runless_asset_event(
                    dg.AssetMaterialization(asset_key="reported", metadata={"worker": worker, "i": i}))
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=report, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []

    seen = json.loads(subprocess.run([sys.executable, "-c", READ_BACK], capture_output=True, text=True,
                                     check=True).stdout.strip().splitlines()[-1])
    assert seen == {"runs": ["SUCCESS"], "tiny": 1, "reported": 60, "engines": False}

    # The kept connections are idle, not inside a transaction: another process takes an exclusive
    # lock on every file at once (SQLite refuses it while any connection holds even a read lock).
    files = [s.split("sqlite:///", 1)[1] for s in event_engines] + [str(tmp_path / "history" / "runs.db")]
    locked = subprocess.run([sys.executable, "-c", EXCLUSIVE, *files], capture_output=True, text=True)
    assert locked.returncode == 0, locked.stderr

    # At most MAX_FILES run files keep a connection, however many runs this process records.
    for _ in range(MAX_FILES + 2):
        assert dg.materialize([tiny_asset], instance=instance).success
    assert len(instance.event_log_storage._mtrag_engines.strings()) == MAX_FILES

    # wipe() deletes the files: nothing written afterwards may go to a kept handle on a deleted one.
    instance.wipe()
    assert dg.materialize([tiny_asset], instance=instance).success
    seen = json.loads(subprocess.run([sys.executable, "-c", READ_BACK], capture_output=True, text=True,
                                     check=True).stdout.strip().splitlines()[-1])
    assert (seen["runs"], seen["tiny"]) == (["SUCCESS"], 1)


@pytest.mark.unit
def test_storages_of_other_kinds_are_left_alone():
    class Other:  # a PostgreSQL storage, or one a later Dagster shapes differently
        _conn_string = "postgresql://x"

        def connect(self):
            return "theirs"

    class Instance:
        _event_storage, _run_storage, _schedule_storage = Other(), Other(), Other()

    instance = Instance()
    assert reuse_sqlite_engines(instance) == 0
    assert instance._run_storage.connect() == "theirs"
    assert not hasattr(instance._event_storage, "_mtrag_engines")


@pytest.mark.integration
def test_kept_connections_commit_without_fsync_only_to_wal_files_and_existing_tables_are_remembered(tmp_path, monkeypatch):
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    instance = dg.DagsterInstance.get()
    reuse_sqlite_engines(instance)
    result = dg.materialize([tiny_asset], instance=instance)
    assert result.success
    storage = instance.event_log_storage
    # every kept connection to Dagster's (WAL) files: synchronous NORMAL (1), not FULL (2)
    for name in (f"{result.run_id}.db", "index.db"):
        conn_string = next(s for s in storage._mtrag_engines.strings() if s.endswith(name))
        with storage._mtrag_engines.get(conn_string).connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1
    # a file in another journal mode keeps SQLite's default
    from mtrag_assets.instance_engines import _Engines
    plain = tmp_path / "plain.db"
    import sqlite3
    sqlite3.connect(plain).execute("CREATE TABLE t (x)").connection.close()
    with _Engines().get(f"sqlite:///{plain}").connect() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2
    # has_table: a table found is not looked up again; one missing is asked each time
    calls: list[str] = []
    original = type(storage).has_table

    def counting(table_name):
        calls.append(table_name)
        return original(storage, table_name)
    monkeypatch.setattr(type(storage), "has_table", lambda self, name: counting(name))
    fresh = dg.DagsterInstance.get()
    reuse_sqlite_engines(fresh)
    for _ in range(3):
        assert fresh.event_log_storage.has_table("dynamic_partitions")
        assert not fresh.event_log_storage.has_table("no_such_table")
    assert calls.count("dynamic_partitions") == 1 and calls.count("no_such_table") == 3
    # after a wipe the tables are asked again
    fresh.event_log_storage.wipe()
    assert fresh.event_log_storage.has_table("dynamic_partitions")
    assert calls.count("dynamic_partitions") == 2


SCHEMA = """
import json, sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
print(json.dumps({"objects": sorted(conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()),
                  "alembic": conn.execute("SELECT version_num FROM alembic_version").fetchall(),
                  "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0]}))
"""


def _schema(path) -> dict:
    out = subprocess.run([sys.executable, "-c", SCHEMA, str(path)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.integration
def test_new_run_shards_are_written_from_a_template_equal_to_what_dagster_makes(tmp_path, monkeypatch):
    from mtrag_assets import instance_engines
    from mtrag_assets.dagster_private import SqliteEventLogStorage

    # What Dagster itself makes of a new run shard, in a storage without kept engines.
    plain = SqliteEventLogStorage(str(tmp_path / "plain"))
    with plain.run_connection("reference"):
        pass
    reference = _schema(tmp_path / "plain" / "reference.db")
    assert reference["journal_mode"] == "wal" and reference["alembic"]

    monkeypatch.setattr(instance_engines, "_TEMPLATE", instance_engines._ShardTemplate())
    made: list[str] = []
    make = instance_engines._ShardTemplate._make
    monkeypatch.setattr(instance_engines._ShardTemplate, "_make",
                        staticmethod(lambda storage: made.append("template") or make(storage)))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    instance = dg.DagsterInstance.get()
    reuse_sqlite_engines(instance)
    runs = [dg.materialize([tiny_asset], instance=instance).run_id for _ in range(3)]
    assert made == ["template"]  # made once, for the first new shard; the others copied it

    runs_dir = tmp_path / "home" / "history" / "runs"
    for run_id in runs:
        assert _schema(runs_dir / f"{run_id}.db") == reference
        assert len(instance.get_records_for_run(run_id).records) > 10
    assert not [p.name for p in runs_dir.iterdir() if p.name.endswith(".part")]
    seen = json.loads(subprocess.run([sys.executable, "-c", READ_BACK], capture_output=True, text=True,
                                     check=True).stdout.strip().splitlines()[-1])
    assert seen["runs"] == ["SUCCESS"] * 3 and seen["tiny"] == 3

    # A shard whose file exists (an earlier process's run) is not written over: _initdb checks it.
    before = (runs_dir / f"{runs[0]}.db").stat()
    assert instance_engines._TEMPLATE.write(instance.event_log_storage, runs[0]) is False
    assert (runs_dir / f"{runs[0]}.db").stat().st_ino == before.st_ino
    assert instance_engines._TEMPLATE.write(instance.event_log_storage, "index") is False


@pytest.mark.integration
def test_a_build_process_keeps_its_instance_while_home_and_file_stay(tmp_path, monkeypatch):
    """The build server builds at one home again and again: one instance (its storages, kept
    engines and statement caches) serves them; another DAGSTER_HOME or an edited dagster.yaml gets
    a new one, which reads and writes where the file says."""
    from mtrag_assets.runner import dagster_instance
    from mtrag_resources.core.config import Settings
    monkeypatch.delenv("MTRAG_DAGSTER_PG_URL", raising=False)
    settings = Settings(home=tmp_path)

    def at(name: str) -> dg.DagsterInstance:
        monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / name))
        return dagster_instance(settings)

    instance = at("a")
    assert at("a") is instance
    instance.add_dynamic_partitions("sources", ["kept"])
    assert at("a").get_dynamic_partitions("sources") == ["kept"]
    other = at("b")
    assert other is not instance and other.get_dynamic_partitions("sources") == []
    again = at("a")  # back to the first home: made anew, reads what was written there
    assert again is not instance and again.get_dynamic_partitions("sources") == ["kept"]
    shutil.rmtree(tmp_path / "a" / "history")  # the runs and event logs removed under a kept instance
    fresh = at("a")
    assert fresh is not again and fresh.get_dynamic_partitions("sources") == []
    yaml_file = tmp_path / "a" / "dagster.yaml"
    yaml_file.write_text(yaml_file.read_text() + "\n# a user's note\n")  # an edited file
    assert at("a") is not fresh
