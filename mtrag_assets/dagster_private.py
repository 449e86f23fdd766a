"""Every use of Dagster's private modules (`dagster._...`) in mtrag, each where Dagster (1.13.27,
pinned in pyproject.toml) has no public API for what mtrag needs; no other module imports them
(tests/test_layering.py). tests/test_dagster_private.py exercises each name as mtrag relies on it,
so a Dagster upgrade that moves or changes one fails there first."""
from __future__ import annotations

from contextlib import contextmanager

import dagster as dg

# A runless materialization that reads like a run's (fast_lane.record): a run writes these tags
# from `MaterializeResult(data_version=...)` and its inputs' records, and a runless event
# (`report_runless_asset_event`) takes only the tags; Dagster has no public names for them.
from dagster._core.definitions.data_version import (CODE_VERSION_TAG, DATA_VERSION_IS_USER_PROVIDED_TAG,
                                                    DATA_VERSION_TAG, get_input_data_version_tag,
                                                    get_input_event_pointer_tag)
# The job name Dagster gives a runless event; none public, and a check evaluation reported under a
# batch's id (report_check_evaluation) must carry it to read as runless.
from dagster._core.instance.utils import RUNLESS_JOB_NAME
# A run's origin: `execute_in_process` takes none, and the UI's Overview timeline leaves out every
# run without one; Dagster has no public way to give an in-process run its code location.
from dagster._core.remote_origin import (ManagedGrpcPythonEnvCodeLocationOrigin, RemoteJobOrigin,
                                         RemoteRepositoryOrigin)
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
# Kept SQLite connections (instance_engines.py): Dagster's SQLite storages have no pool setting in
# dagster.yaml and no public base class; the engines replace their private `_connect`/`connect`.
from dagster._core.storage.event_log.sqlite.sqlite_event_log import INDEX_SHARD_NAME, SqliteEventLogStorage
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from dagster._core.storage.sqlite import SQLITE_BUSY_TIMEOUT_SECONDS, create_db_conn_string

__all__ = [
    "CODE_VERSION_TAG", "DATA_VERSION_IS_USER_PROVIDED_TAG", "DATA_VERSION_TAG", "INDEX_SHARD_NAME",
    "SQLITE_BUSY_TIMEOUT_SECONDS", "SqliteEventLogStorage", "SqliteRunStorage", "SqliteScheduleStorage",
    "create_db_conn_string", "get_input_data_version_tag", "get_input_event_pointer_tag",
    "remote_job_origin", "report_check_evaluation", "runs_with_origin",
]


def report_check_evaluation(instance: dg.DagsterInstance, evaluation: dg.AssetCheckEvaluation,
                            run_id: str) -> None:
    """Record `evaluation` as a runless event under `run_id`. The public route,
    `report_runless_asset_event`, stores every evaluation under the empty run id, and a unique
    index on (asset, check, run id, partition) refuses a second one for a check and partition."""
    instance.report_dagster_event(dg.DagsterEvent(
        event_type_value=dg.DagsterEventType.ASSET_CHECK_EVALUATION.value, event_specific_data=evaluation,
        job_name=RUNLESS_JOB_NAME), run_id=run_id)


def remote_job_origin(job_name: str, module_name: str, working_directory: str, repository_name: str,
                      executable_path: str):
    """The origin a run launched from the UI carries for `job_name` of the code location that
    loads `module_name` (named after it, as `dagster dev -w workspace.yaml` names it)."""
    target = LoadableTargetOrigin(executable_path=executable_path, module_name=module_name,
                                  working_directory=working_directory)
    location = ManagedGrpcPythonEnvCodeLocationOrigin(loadable_target_origin=target, location_name=module_name)
    return RemoteJobOrigin(repository_origin=RemoteRepositoryOrigin(location, repository_name), job_name=job_name)


@contextmanager
def runs_with_origin(instance: dg.DagsterInstance, origin):
    """Runs `instance` creates meanwhile carry `origin` (and so its `dagster/code_location` tag):
    `execute_in_process` passes none to `create_run_for_job`, which takes one."""
    original = instance.create_run_for_job

    def create_run_for_job(*args, **kwargs):
        kwargs.setdefault("remote_job_origin", origin)
        return original(*args, **kwargs)

    instance.create_run_for_job = create_run_for_job
    try:
        yield
    finally:
        instance.__dict__.pop("create_run_for_job", None)
