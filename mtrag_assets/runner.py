"""`mtrag build`: materialise through the Dagster instance at DAGSTER_HOME so every run shows in
the UI. One run per changed source partition; the last one also resolves the links and publishes
the manifest (a build with no changed source runs those two alone)."""
from __future__ import annotations

import os
import socket
from contextlib import ExitStack
from pathlib import Path

import dagster as dg

from mtrag_resources.publish.build_state import changed_sources, mark_dirty, source_lock
from mtrag_resources.core.config import Settings
from mtrag_resources.ingest.sources import SourceConfigError, SourceSpec
from mtrag_resources.publish.views import lagging_sources
from mtrag_resources.stores.connect import shared_qdrant

from mtrag_assets.checks import ALL_CHECKS
from mtrag_assets.definitions import ALL_ASSETS, GLOBAL_ASSETS, PARTITIONED_ASSETS
from mtrag_assets.partitions import sources_partitions
from mtrag_assets.resources import MtragResource

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
    home = settings.dagster_home
    os.environ["DAGSTER_HOME"] = str(home)  # for Dagster itself: runs and daemons read it
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").exists():
        (home / "dagster.yaml").write_text(INSTANCE_YAML)
    return dg.DagsterInstance.get()


def _proc_start(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' where /proc is missing): with the
    pid it names one process, so a reused pid is not mistaken for the original."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _process_tags() -> dict:
    return {"mtrag/host": socket.gethostname(), "mtrag/pid": str(os.getpid()),
            "mtrag/proc_start": _proc_start(os.getpid())}


def _alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not start or _proc_start(pid) in ("", start)


def release_dead_runs(instance: dg.DagsterInstance, log=print) -> list[str]:
    """A build killed mid-run (kill -9, OOM, power loss) leaves its in-process run STARTED with its
    concurrency-pool slots claimed, and every later run needing that pool (qdrant_writer) would
    wait for them forever. Runs `mtrag build` started on this host whose process is gone are
    marked failed and their slots freed; runs of live processes and runs launched elsewhere (the
    daemon, the UI) are left alone."""
    released = []
    runs = instance.get_runs(filters=dg.RunsFilter(
        statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING],
        tags={"mtrag/host": socket.gethostname()}))
    for run in runs:
        pid = run.tags.get("mtrag/pid", "")
        if not pid.isdigit() or _alive(int(pid), run.tags.get("mtrag/proc_start", "")):
            continue
        instance.report_run_failed(run, message=f"the build process (pid {pid}) died during this run; "
                                               "a later build marked it failed and freed its pool slots")
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        released.append(run.run_id)
    if released:
        log(f"released {len(released)} run(s) of build processes that died: {released}")
    return released


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
              force: bool = False, log=print, accept_quality_drop: bool = False) -> dict:
    """`accept_quality_drop`: the publishing run publishes even where the golden-query gate refuses
    the candidate (index_manifest's config; the manifest records it)."""
    instance = dagster_instance(settings)
    sync_partitions(instance, specs)
    release_dead_runs(instance, log)
    tags = {"mtrag/trigger": "cli", **_process_tags()}
    resources = {"mtrag": MtragResource()}
    if only:
        unknown = sorted(set(only) - {s.id for s in specs})
        if unknown:
            raise SourceConfigError(f"unknown source id(s) {unknown}; known: {[s.id for s in specs]}")
        targets, removed = list(only), []
    elif force:
        targets, removed = [s.id for s in specs], []
    else:
        # The embedder's fingerprint too: a new model or backend invalidates every source's vectors.
        targets, removed = changed_sources(settings, specs, resources["mtrag"].embedder().fingerprint_id)
    runs = {}
    with ExitStack() as stack:
        for sid in targets:
            stack.enter_context(source_lock(settings, sid))
        # One embedded Qdrant open for the whole build instead of one per step and check.
        stack.enter_context(shared_qdrant(settings))
        publish_marker = mark_dirty(settings)
        # Unchanged files but stores that lost the source (or a crashed writer): rebuild it too,
        # so the publish gate passes without a manual --force.
        lagging = lagging_sources(settings, [s for s in specs if s.id not in targets])
        for sid, why in lagging.items():
            log(f"source {sid}: {why}; rebuilding it ...")
            stack.enter_context(source_lock(settings, sid))
        targets = targets + list(lagging)

        def run(sid: str | None, publish: bool) -> str:
            """One in-process run: a source's partition, the links and the manifest, or both (the
            last source shares the publishing run: one run's fixed cost less per build)."""
            selection = (PARTITIONED_ASSETS if sid else []) + (GLOBAL_ASSETS if publish else [])
            marker = mark_dirty(settings, sid) if sid else None
            run_config = QUIET
            if publish and accept_quality_drop:
                run_config = {**QUIET, "ops": {"index_manifest": {"config": {"accept_quality_drop": True}}}}
            result = dg.materialize(ALL_ASSETS + ALL_CHECKS, selection=selection, partition_key=sid,
                                    instance=instance, resources=resources, tags=tags, run_config=run_config)
            if marker is not None:
                marker.unlink(missing_ok=True)
            return result.run_id

        for i, sid in enumerate(targets):
            last = i == len(targets) - 1
            log(f"building source {sid}" + (" and publishing ..." if last else " ..."))
            runs[sid] = run(sid, publish=last)
        if targets:
            runs["__publish__"] = runs[targets[-1]]
        else:
            log("resolving cross-source links and publishing the manifest ...")
            runs["__publish__"] = run(None, publish=True)
        publish_marker.unlink(missing_ok=True)
    return {"built": targets, "removed": removed, "runs": runs}
