"""`mtrag build`: materialise through the Dagster instance at DAGSTER_HOME so every run shows in
the UI. One run per changed source partition, then one for the links and the manifest."""
from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path

import dagster as dg

from mtrag_resources.buildstate import changed_sources, mark_dirty, source_lock
from mtrag_resources.config import Settings
from mtrag_resources.sources import SourceSpec

from .checks import ALL_CHECKS
from .definitions import ALL_ASSETS, GLOBAL_ASSETS, PARTITIONED_ASSETS
from .partitions import sources_partitions
from .resources import MtragResource

# The terminal shows stage summaries; the full event log is in the instance (and the UI).
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}

# Pools: one step at a time per pool (qdrant_writer: embedded Qdrant allows one writer process).
# Runs: at most one queued-then-launched run per source partition (UI backfills, sensors, the
# schedule); `mtrag build` executes in process and takes a per-source file lock instead.
INSTANCE_YAML = """\
telemetry:
  enabled: false
concurrency:
  pools:
    default_limit: 1
  runs:
    tag_concurrency_limits:
      - key: dagster/partition
        value:
          applyLimitPerUniqueValue: true
        limit: 1
"""


def dagster_instance(settings: Settings) -> dg.DagsterInstance:
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(settings.dagster_home)))
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        (home / "dagster.yaml").write_text(INSTANCE_YAML)
    return dg.DagsterInstance.get()


def sync_partitions(instance: dg.DagsterInstance, specs: list[SourceSpec]) -> dict:
    """Make the `sources` partitions equal to the sources file (removed sources lose theirs)."""
    name = sources_partitions.name
    existing = set(instance.get_dynamic_partitions(name))
    wanted = {s.id for s in specs}
    added, removed = sorted(wanted - existing), sorted(existing - wanted)
    if added:
        instance.add_dynamic_partitions(name, added)
    for key in removed:
        instance.delete_dynamic_partition(name, key)
    return {"added": added, "removed": removed}


def run_build(settings: Settings, specs: list[SourceSpec], only: list[str] | None = None,
              force: bool = False, log=print) -> dict:
    instance = dagster_instance(settings)
    sync_partitions(instance, specs)
    resources = {"mtrag": MtragResource()}
    if only:
        unknown = sorted(set(only) - {s.id for s in specs})
        if unknown:
            raise SystemExit(f"unknown source id(s) {unknown}; known: {[s.id for s in specs]}")
        targets, removed = list(only), []
    elif force:
        targets, removed = [s.id for s in specs], []
    else:
        targets, removed = changed_sources(settings, specs, None)
    runs = {}
    with ExitStack() as stack:
        for sid in targets:
            stack.enter_context(source_lock(settings, sid))
        publish_marker = mark_dirty(settings)
        for sid in targets:
            log(f"building source {sid} ...")
            marker = mark_dirty(settings, sid)
            result = dg.materialize(PARTITIONED_ASSETS + ALL_CHECKS, partition_key=sid, instance=instance,
                                    resources=resources, tags={"mtrag/trigger": "cli"}, run_config=QUIET)
            marker.unlink(missing_ok=True)
            runs[sid] = result.run_id
        log("resolving cross-source links and publishing the manifest ...")
        result = dg.materialize(ALL_ASSETS, selection=GLOBAL_ASSETS, instance=instance, resources=resources,
                                tags={"mtrag/trigger": "cli"}, run_config=QUIET)
        publish_marker.unlink(missing_ok=True)
        runs["__publish__"] = result.run_id
    return {"built": targets, "removed": removed, "runs": runs}
