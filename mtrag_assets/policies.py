"""Policies applied to every asset in one place (overridable per stage)."""
from datetime import timedelta

import dagster as dg

# The nightly schedule rebuilds every source; a day and a bit of slack before a warning.
DEFAULT_FRESHNESS = dg.FreshnessPolicy.time_window(fail_window=timedelta(hours=48), warn_window=timedelta(hours=26))
GROUP_BUILD = "build"
GROUP_STORES = "stores"
GROUP_PUBLISH = "publish"
