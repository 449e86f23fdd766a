"""Dagster's private names mtrag uses (mtrag_assets/dagster_private.py), each exercised as mtrag
relies on it: a Dagster upgrade that moves, renames or changes one fails here first, before the
fast lane, the build or the kept SQLite connections notice."""
from __future__ import annotations

import inspect
import sys

import dagster as dg
import pytest
from sqlalchemy import text

from mtrag_assets import dagster_private as private

PARTS = dg.StaticPartitionsDefinition(["p"])


@dg.asset(code_version="up-code")
def upstream() -> dg.MaterializeResult:
    return dg.MaterializeResult(data_version=dg.DataVersion("u1"))


@dg.asset(code_version="down-code", deps=[upstream])
def downstream() -> dg.MaterializeResult:
    return dg.MaterializeResult(data_version=dg.DataVersion("d1"))


@pytest.fixture
def instance(tmp_path):
    with dg.instance_for_test(temp_dir=str(tmp_path)) as inst:
        yield inst


@pytest.mark.unit
def test_data_version_tags_keep_the_names_existing_event_logs_hold():
    """The fast lane writes these tags and reads them back from records a run wrote, old ones included."""
    key = dg.AssetKey(["group", "asset"])
    assert (private.CODE_VERSION_TAG, private.DATA_VERSION_TAG, private.DATA_VERSION_IS_USER_PROVIDED_TAG) == \
        ("dagster/code_version", "dagster/data_version", "dagster/data_version_is_user_provided")
    assert private.get_input_data_version_tag(key) == "dagster/input_data_version/group/asset"
    assert private.get_input_event_pointer_tag(key) == "dagster/input_event_pointer/group/asset"


@pytest.mark.integration  # a Dagster instance
def test_a_run_writes_the_data_version_tags_the_fast_lane_writes(instance):
    """fast_lane.record gives a runless materialization the tags a run's carries: the same keys,
    the upstream's data version and a pointer to its record."""
    assert dg.materialize([upstream, downstream], instance=instance).success
    up, down = (instance.fetch_materializations(k, limit=1).records[0] for k in (upstream.key, downstream.key))
    assert up.asset_materialization.tags == {private.CODE_VERSION_TAG: "up-code", private.DATA_VERSION_TAG: "u1",
                                             private.DATA_VERSION_IS_USER_PROVIDED_TAG: "true"}
    assert down.asset_materialization.tags == {
        private.CODE_VERSION_TAG: "down-code", private.DATA_VERSION_TAG: "d1",
        private.DATA_VERSION_IS_USER_PROVIDED_TAG: "true",
        private.get_input_data_version_tag(upstream.key): "u1",
        private.get_input_event_pointer_tag(upstream.key): str(up.storage_id)}


@pytest.mark.integration  # a Dagster instance
def test_check_evaluations_under_batch_ids_are_kept_and_read_as_runless(instance):
    """Why the fast lane reports a check evaluation under its batch's id: the public route keeps one
    runless evaluation per check and partition (when this first assertion fails, Dagster lifted
    that limit and report_runless_asset_event can take over)."""
    def evaluation(passed: bool) -> dg.AssetCheckEvaluation:
        return dg.AssetCheckEvaluation(asset_key=dg.AssetKey("a"), check_name="c", passed=passed, partition="p",
                                       blocking=True)

    instance.report_runless_asset_event(evaluation(True))
    with pytest.raises(Exception, match="UNIQUE constraint failed"):
        instance.report_runless_asset_event(evaluation(True))

    private.report_check_evaluation(instance, evaluation(True), run_id="watch-1")
    private.report_check_evaluation(instance, evaluation(False), run_id="watch-2")
    check_key = dg.AssetCheckKey(dg.AssetKey("a"), "c")
    history = instance.event_log_storage.get_asset_check_execution_history(check_key, limit=10)
    assert [(e.run_id, e.status.value, e.partition) for e in history] == \
        [("watch-2", "FAILED", "p"), ("watch-1", "SUCCEEDED", "p"), ("", "SUCCEEDED", "p")]
    # the job name Dagster gives its own runless events, on the batch's too
    instance.report_runless_asset_event(dg.AssetMaterialization("x"))
    runless = instance.fetch_materializations(dg.AssetKey("x"), limit=1).records[0].event_log_entry
    assert runless.job_name == private.RUNLESS_JOB_NAME
    assert {e.event.job_name for e in history} == {private.RUNLESS_JOB_NAME}


@pytest.mark.unit
def test_the_remote_job_origin_names_the_code_location_and_its_repository():
    origin = private.remote_job_origin("build_source", "mtrag_assets.definitions", "/repo", "__repository__",
                                       sys.executable)
    assert origin.job_name == "build_source"
    assert (origin.location_name, origin.repository_origin.repository_name) == \
        ("mtrag_assets.definitions", "__repository__")
    target = origin.repository_origin.code_location_origin.loadable_target_origin
    assert (target.module_name, target.working_directory, target.executable_path) == \
        ("mtrag_assets.definitions", "/repo", sys.executable)


@pytest.mark.integration  # a Dagster instance
def test_in_process_runs_take_the_origin_and_its_code_location_tag(instance):
    """What the UI's Overview timeline needs to list a CLI build's run."""
    origin = private.remote_job_origin("__ephemeral_asset_job__", "mtrag_assets.definitions", "/repo",
                                       "__repository__", sys.executable)
    with private.runs_with_origin(instance, origin):
        inside = dg.materialize([upstream], instance=instance)
    outside = dg.materialize([upstream], instance=instance)
    run = instance.get_run_by_id(inside.run_id)
    assert run.remote_job_origin == origin
    assert run.tags["dagster/code_location"] == "mtrag_assets.definitions"
    assert instance.get_run_by_id(outside.run_id).remote_job_origin is None  # the instance is as it was


@pytest.mark.integration  # a Dagster instance
def test_sqlite_storages_have_what_the_kept_engines_replace(instance):
    """instance_engines.py replaces these storages' connection methods by hand: their types, the
    attributes it reads and the methods' shapes are those of Dagster 1.13."""
    events, runs, schedules = instance.event_log_storage, instance.run_storage, instance.schedule_storage
    assert (type(events), type(runs), type(schedules)) == \
        (private.SqliteEventLogStorage, private.SqliteRunStorage, private.SqliteScheduleStorage)
    assert (instance._event_storage, instance._run_storage, instance._schedule_storage) == (events, runs, schedules)
    # the event log: one file per shard, the index shard by name, each set up by `_initdb(engine)`
    assert events.conn_string_for_shard("r1") == private.create_db_conn_string(events._base_dir, "r1")
    assert events.path_for_shard(private.INDEX_SHARD_NAME).endswith(f"/{private.INDEX_SHARD_NAME}.db")
    required = [p.name for p in inspect.signature(events._initdb).parameters.values() if p.default is p.empty]
    assert required == ["engine"]  # as Dagster's own `_connect` calls it for a new shard
    assert isinstance(events._initialized_dbs, set) and hasattr(events._db_lock, "acquire")
    with events._connect("r1") as conn:  # creates the shard, remembered as set up
        assert conn.execute(text("select 1")).scalar() == 1
    assert "r1" in events._initialized_dbs
    for storage in (runs, schedules):
        assert isinstance(storage._conn_string, str)
        with storage.connect() as conn:
            assert conn.execute(text("select 1")).scalar() == 1
    assert isinstance(private.SQLITE_BUSY_TIMEOUT_SECONDS, (int, float))


@pytest.mark.integration  # a Dagster instance
def test_the_manifest_names_the_batch_when_invoked_directly_and_the_run_in_a_run(instance):
    """index_manifest's run id through public context properties alone (no isinstance check on
    Dagster's private direct-invocation context): a fast-lane batch's tag, else the run's id."""
    from mtrag_assets.index_manifest import _run_id
    from mtrag_assets.policies import BATCH_TAG

    direct = dg.build_asset_context(run_tags={BATCH_TAG: "watch-1"}, instance=instance)
    assert _run_id(direct) == "watch-1"
    seen = {}

    @dg.asset
    def manifest_like(context):
        seen[context.run.tags.get(BATCH_TAG, "")] = _run_id(context)

    plain = dg.materialize([manifest_like], instance=instance)
    tagged = dg.materialize([manifest_like], instance=instance, tags={BATCH_TAG: "watch-2"})
    assert seen == {"": plain.run_id, "watch-2": "watch-2"}
    assert tagged.run_id != "watch-2"
