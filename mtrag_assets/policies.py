"""Policies applied to every asset in one place (overridable per stage)."""
from datetime import timedelta

import dagster as dg

# The nightly schedule rebuilds every source; a day and a bit of slack before a warning.
DEFAULT_FRESHNESS = dg.FreshnessPolicy.time_window(fail_window=timedelta(hours=48), warn_window=timedelta(hours=26))
GROUP_BUILD = "build"
GROUP_STORES = "stores"
GROUP_PUBLISH = "publish"

# Tags every write of the fast lane (`mtrag watch`) carries: its plane, and the batch's id (the
# manifest's run_id of a generation the fast lane published; such a batch has no Dagster run).
PLANE_TAG = "mtrag/plane"
BATCH_TAG = "mtrag/batch"

# The UI lists a run's tags as chips but leaves out those under this prefix (Dagster's own run
# worker and gRPC tags live there). What identifies the build process (host, pid, its start time)
# is read by release_dead_runs only, so it goes there; the tags maintainers filter by stay visible.
HIDDEN_TAG_PREFIX = ".dagster/"
HOST_TAG = f"{HIDDEN_TAG_PREFIX}mtrag/host"
PID_TAG = f"{HIDDEN_TAG_PREFIX}mtrag/pid"
PROC_START_TAG = f"{HIDDEN_TAG_PREFIX}mtrag/proc_start"
