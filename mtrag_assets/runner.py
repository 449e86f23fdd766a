"""`mtrag build`: materialise through the Dagster instance at DAGSTER_HOME so every run shows in
the UI. One run per changed source partition; the last one also resolves the links and publishes
the manifest (a build with no changed source runs those two alone). The runs are runs of the code
location's jobs (`build_source`, `build_source_and_publish`, `publish_generation`), executed in this
process and recorded with the code location as their origin, so the UI's Overview timeline lists
them in those jobs' rows; tags `mtrag/trigger=cli`, `mtrag/source`, `mtrag/publish` filter them."""
from __future__ import annotations

import os
import sys
import socket
import stat
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import dagster as dg

from mtrag_resources.core import instance_file
from mtrag_resources.core.session import session_cache
from mtrag_resources.publish.build_state import (changed_sources, mark_dirty, publish_pending, source_lock,
                                                 source_problems)
from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import spec_root
from mtrag_resources.core.processes import alive, proc_start
from mtrag_resources.ingest.sources import SourceConfigError, SourceSpec
from mtrag_resources.publish.views import lagging_sources
from mtrag_resources.stores.connect import shared_qdrant

from mtrag_assets import dagster_private
from mtrag_assets.checks import ALL_CHECKS
from mtrag_assets.definitions import ALL_ASSETS, GLOBAL_ASSETS, PARTITIONED_ASSETS
from mtrag_assets.instance_engines import reuse_sqlite_engines
from mtrag_assets.interrupts import last_signal
from mtrag_assets.jobs import JOBS, build_source_and_publish_job, build_source_job, publish_generation_job
from mtrag_assets.partitions import sources_partitions
from mtrag_assets.policies import HOST_TAG, PID_TAG, PROC_START_TAG
from mtrag_assets.resources import MtragResource

# The terminal shows stage summaries; the full event log is in the instance (and the UI).
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}

# What dagster.yaml holds besides the storage (mtrag_resources/core/instance_file.py says why).
INSTANCE_YAML = instance_file.BASE_YAML


def dagster_instance(settings: Settings, log=None) -> dg.DagsterInstance:
    """The instance at DAGSTER_HOME, its `dagster.yaml` managed (mtrag_resources/core/instance_file.py):
    written when missing; mtrag's own file (its marker line) rewritten when what mtrag needs
    changes (the pools, the run tag limit, PostgreSQL storage when MTRAG_DAGSTER_PG_URL is set),
    one line per difference on stderr; a user's own file is never rewritten: its differences are
    printed, and a storage other than the one asked for is a ConfigError (runs would be recorded
    where nobody looks)."""
    from mtrag_resources.core.atomic import write_text_atomic
    from mtrag_resources.core.errors import ConfigError
    home = settings.dagster_home
    os.environ["DAGSTER_HOME"] = str(home)  # for Dagster itself: runs and daemons read it
    home.mkdir(parents=True, exist_ok=True)
    path = home / "dagster.yaml"
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    existing = path.read_text() if path.exists() else None
    try:
        plan = instance_file.plan(existing, INSTANCE_YAML, settings.dagster_pg_url, legacy=(INSTANCE_YAML,))
    except instance_file.InstanceFileError as exc:
        raise ConfigError(f"{path} {exc}; fix it or delete it (mtrag then writes its own)") from None
    if plan.action in ("write", "rewrite"):
        write_text_atomic(path, plan.text)
    verb = "rewritten" if plan.action == "rewrite" else "kept (your file; mtrag does not overwrite it)"
    for diff in plan.differences:
        if diff not in plan.errors:
            say(f"mtrag: {path}: {diff}; {verb}")
    if plan.errors:
        raise ConfigError(f"{path} cannot be used as it is: " + "; ".join(map(str, plan.errors))
                          + ("" if plan.managed else "; it is your file (no mtrag marker line), which mtrag does not "
                                                     "overwrite: edit it, or delete it and mtrag writes its own"))
    def key() -> tuple:
        return (str(home), _file_identity(path), settings.dagster_pg_url,
                *(_file_identity(home / folder) for folder in _SQLITE_FOLDERS))
    instance = _INSTANCE.get(key())
    if instance is not None:
        return instance
    instance = dg.DagsterInstance.get()
    reuse_sqlite_engines(instance)  # one kept connection per SQLite file (instance_engines.py)
    _INSTANCE[key()] = instance  # after: the storages make their folders
    return instance


# The last instance made, with what it was made from (DAGSTER_HOME, its dagster.yaml's identity,
# the PostgreSQL URL, the SQLite storages' folders): a build server builds again and again at one
# home, and a new instance per build made its storages, their engines and SQLAlchemy's statement
# caches anew (docs/performance.md#the-dagster-instance). A changed file or home makes a new one, and so
# does a storage folder removed and made again (kept connections would write to deleted files).
_INSTANCE = session_cache("runner.instance", max_entries=1)  # what it was made from -> the instance
_SQLITE_FOLDERS = ("history", "schedules")  # runs and event logs; schedules


def _file_identity(path: Path) -> tuple | None:
    """A file by inode, size and time; a folder by its inode alone (its time moves with every run
    file made in it); None where it is missing."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino,) if stat.S_ISDIR(st.st_mode) else (st.st_ino, st.st_size, st.st_mtime_ns)


def _process_tags() -> dict:
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid()), PROC_START_TAG: proc_start(os.getpid())}


# Where runs recorded before these tags were hidden keep them: a build killed then is released too.
_VISIBLE_PROCESS_TAGS = {HOST_TAG: "mtrag/host", PID_TAG: "mtrag/pid", PROC_START_TAG: "mtrag/proc_start"}


def _process_tag(run, key: str) -> str:
    return run.tags.get(key, run.tags.get(_VISIBLE_PROCESS_TAGS[key], ""))


def release_dead_runs(instance: dg.DagsterInstance, log=print) -> list[str]:
    """A build killed mid-run (kill -9, OOM, power loss) leaves its in-process run STARTED with its
    concurrency-pool slots claimed, and every later run needing that pool (qdrant_writer) would
    wait for them forever. Runs `mtrag build` started on this host whose process is gone are
    marked failed and their slots freed; runs of live processes and runs launched elsewhere (the
    daemon, the UI) are left alone."""
    released = []
    runs = {run.run_id: run for host_tag in (HOST_TAG, _VISIBLE_PROCESS_TAGS[HOST_TAG])
            for run in instance.get_runs(filters=dg.RunsFilter(
                statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.STARTING],
                tags={host_tag: socket.gethostname()}))}
    for run in runs.values():
        pid = _process_tag(run, PID_TAG)
        if not pid.isdigit() or alive(int(pid), _process_tag(run, PROC_START_TAG)):
            continue
        instance.report_run_failed(run, message=f"the build process (pid {pid}) died during this run; "
                                               "a later build marked it failed and freed its pool slots")
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        released.append(run.run_id)
    if released:
        log(f"released {len(released)} run(s) of build processes that died: {released}")
    return released


class StageProgress:
    """What `mtrag build` prints while a run executes, from the run's own events: each stage
    (asset step) as it starts and ends, with its counts and seconds; the embedding asset's
    progress lines; warnings; a failed step in one line. The same figures are in the Dagster run
    log (the materialization's metadata, the asset's `context.log` lines)."""

    MAX_COUNTS = 6

    def __init__(self, log, label: str, asset_steps: set[str] | frozenset = frozenset()):
        """`asset_steps`: the step keys of assets (announced when they start); the others are
        checks, printed once when they end."""
        self.log, self.label, self.asset_steps = log, label, set(asset_steps)
        self.started: dict[str, float] = {}
        self.counts: dict[str, dict] = {}

    def __call__(self, entry) -> None:
        try:
            self._handle(entry)
        except Exception:  # noqa: BLE001 - progress output never fails a build
            pass

    def _handle(self, entry) -> None:
        event = entry.dagster_event
        if event is None:  # a context.log line
            message = entry.user_message or ""
            if message.startswith("embedded ") and "/s" in message:
                self.log(f"[{self.label}] {entry.step_key}: {message}")
            elif entry.level >= 30:  # logging.WARNING
                self.log(f"[{self.label}] {entry.step_key or 'run'}: warning: {' '.join(message.split())}")
            return
        step, kind = entry.step_key, event.event_type_value
        if kind == "STEP_START":
            self.started[step] = time.perf_counter()
            if step in self.asset_steps:
                self.log(f"[{self.label}] {step} ...")
        elif kind == "ASSET_MATERIALIZATION":
            meta = event.event_specific_data.materialization.metadata
            self.counts[step] = {k: getattr(v, "value", v) for k, v in meta.items()}
        elif kind == "STEP_SUCCESS":
            seconds = time.perf_counter() - self.started.pop(step, time.perf_counter())
            meta = self.counts.pop(step, {})
            reclaimed = meta.get("reclaimed")
            counts = [f"{k} {v}" for k, v in meta.items()
                      if isinstance(v, int) and not isinstance(v, bool) and not k.endswith(("seconds", "_s", "_ms"))]
            if step not in self.asset_steps:
                self.log(f"[{self.label}] check {step} ok in {seconds:.1f} s")
                return
            self.log(f"[{self.label}] {step} done in {seconds:.1f} s"
                     + (f": {', '.join(counts[:self.MAX_COUNTS])}" if counts else ""))
            if reclaimed:  # the publish gave disk back (publish/reclaim.py)
                self.log(f"[{self.label}] reclaimed {reclaimed}")
        elif kind == "STEP_FAILURE":
            error = getattr(event.event_specific_data, "error", None)
            cause = error
            while cause is not None and getattr(cause, "cause", None) is not None:
                cause = cause.cause
            if getattr(cause, "cls_name", "") == "DagsterExecutionInterruptedError" or last_signal() is not None:
                return  # Ctrl-C or SIGTERM (and what it broke): `mtrag build` says so in one line
            why = " ".join((getattr(cause, "message", "") or "").split())
            # on stderr: what failed is the error output of the build, and survives a quiet stdout
            print(f"[{self.label}] {step} failed" + (f": {why[:300]}" if why else ""), file=sys.stderr, flush=True)


@contextmanager
def watching_events(instance: dg.DagsterInstance, callback):
    """Calls `callback(entry)` for each event the in-process run stores through `instance`, as it
    happens (dg.materialize takes no run id to subscribe with before the run starts)."""
    original = instance.handle_new_event

    def handle_new_event(event, *args, **kwargs):
        callback(event)  # first: a failure whose event cannot be stored (a full disk) is still shown
        original(event, *args, **kwargs)

    instance.handle_new_event = handle_new_event
    try:
        yield
    finally:
        instance.__dict__.pop("handle_new_event", None)


# The code location `dagster dev -w workspace.yaml` loads (workspace.yaml names the module; its
# Definitions are the one repository, `__repository__`): where the UI looks for a run's job.
CODE_LOCATION = "mtrag_assets.definitions"
REPOSITORY = "__repository__"


def remote_job_origin(job_name: str):
    """The origin a run launched from the UI would carry for `job_name`. An in-process run has
    none, and the Overview timeline leaves out every run without one."""
    return dagster_private.remote_job_origin(job_name, CODE_LOCATION, str(Path(__file__).resolve().parents[1]),
                                             REPOSITORY, sys.executable)


def runs_with_origin(instance: dg.DagsterInstance, job_name: str):
    """Runs `instance` creates meanwhile carry the code location's origin for `job_name` (and so
    its `dagster/code_location` tag), as if launched from the UI; execute_in_process takes none."""
    return dagster_private.runs_with_origin(instance, remote_job_origin(job_name))


def cli_definitions(resources: dict) -> dg.Definitions:
    """The code location's assets, checks and jobs bound to `mtrag build`'s resources."""
    return dg.Definitions(assets=ALL_ASSETS, asset_checks=ALL_CHECKS, jobs=JOBS, resources=resources)


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


@contextmanager
def build_session(settings: Settings, specs: list[SourceSpec], targets: list[str], log=print,
                  keep_qdrant: bool = False):
    """What every build holds while it writes, batch or fast lane: each target source's lock, one
    embedded Qdrant open for all steps, the publish's dirty marker (removed when the block ends
    without an error). Yields the targets plus the sources whose stores lag behind their files.
    `keep_qdrant`: leave the embedded Qdrant open for the process's next session (the watch, the build server)."""
    with ExitStack() as stack:
        for sid in targets:
            stack.enter_context(source_lock(settings, sid))
        # One embedded Qdrant open for the whole build instead of one per step and check.
        stack.enter_context(shared_qdrant(settings, keep_open=keep_qdrant))
        publish_marker = mark_dirty(settings)
        # Unchanged files but stores that lost the source (or a crashed writer): rebuild it too,
        # so the publish gate passes without a manual --force.
        lagging = lagging_sources(settings, [s for s in specs if s.id not in targets])
        for sid, why in lagging.items():
            log(f"source {sid}: {why}; rebuilding it ...")
            stack.enter_context(source_lock(settings, sid))
        targets = targets + list(lagging)
        # A pinned sdist is fetched (or refused: a bad pin is one clear line) before any run starts.
        by_id = {s.id: s for s in specs}
        for sid in targets:
            if by_id[sid].pip_sdist:
                spec_root(settings, by_id[sid])
        yield targets
        publish_marker.unlink(missing_ok=True)


def run_build(settings: Settings, specs: list[SourceSpec], only: list[str] | None = None,
              force: bool = False, log=print, accept_quality_drop: bool = False,
              console_log_level: str = "WARNING", extra_tags: dict | None = None,
              changed: tuple[list[str], list[str]] | None = None, keep_qdrant: bool = False) -> dict:
    """`accept_quality_drop`: the publishing run publishes even where the golden-query gate refuses
    the candidate (index_manifest's config; the manifest records it). `log` gets each stage's
    start and end (counts, seconds) and the embedding's progress; `console_log_level`: Dagster's
    own console logger (`mtrag build` silences it unless --debug: a failure is its one line).
    `changed`: the caller's changed_sources answer (targets, removed) for these specs and this
    embedder, taken moments before (`mtrag build` asks before importing Dagster): not asked again,
    which scanned every source's folder a second time (docs/performance.md#the-dagster-instance). A file that
    changes in between is built by the next build, as one that changes during this one.
    `keep_qdrant`: build_session's (the build server's next build finds the embedded Qdrant open)."""
    instance = dagster_instance(settings)
    sync_partitions(instance, specs)
    release_dead_runs(instance, log)
    tags = {"mtrag/trigger": "cli", **_process_tags(), **(extra_tags or {})}  # watch: mtrag/plane=watch
    resources = {"mtrag": MtragResource()}
    if only:
        unknown = sorted(set(only) - {s.id for s in specs})
        if unknown:
            raise SourceConfigError(f"unknown source id(s) {unknown}; known: {[s.id for s in specs]}")
        targets, removed = list(only), []
    elif force:
        targets, removed = [s.id for s in specs], []
    elif changed is not None:
        targets, removed = list(changed[0]), list(changed[1])
    else:
        # The embedder's fingerprint too: a new model or backend invalidates every source's vectors.
        targets, removed = changed_sources(settings, specs, resources["mtrag"].embedder().fingerprint_id)
    runs = {}
    asset_steps = {key.path[-1] for a in ALL_ASSETS for key in a.keys}
    # A source that cannot be built now (a git entry that is no repository, names no commit, or also
    # gives `path`) is left out with its error on stderr; the others build and publish.
    failed = source_problems(settings, [s for s in specs if not only or s.id in only])
    for why in failed.values():
        print(f"mtrag: {why}; not built (the other sources are)", file=sys.stderr, flush=True)
    targets = [t for t in targets if t not in failed]
    buildable = [s for s in specs if s.id not in failed]
    pending = publish_pending(settings)  # before build_session marks this build's publish
    with build_session(settings, buildable, targets, log, keep_qdrant=keep_qdrant) as targets:
        if failed and not targets and not removed and not pending:
            # only sources that cannot be built changed: a publish would copy the published
            # generation under a new number, once per build until the entry is fixed
            return {"built": [], "removed": [], "runs": {}, "failed": failed, "unchanged": True}
        defs = cli_definitions(resources)

        def run(sid: str | None, publish: bool) -> str:
            """One in-process run: a source's partition (build_source), the links and the manifest
            (publish_generation), or both (build_source_and_publish: the last source shares the
            publishing run, one run's fixed cost less per build)."""
            selection = (PARTITIONED_ASSETS if sid else []) + (GLOBAL_ASSETS if publish else [])
            job = defs.resolve_job_def((build_source_and_publish_job if publish else build_source_job).name if sid
                                       else publish_generation_job.name)
            marker = mark_dirty(settings, sid) if sid else None
            run_config = {"loggers": {"console": {"config": {"log_level": console_log_level}}}}
            if publish and accept_quality_drop:
                run_config = {**run_config, "ops": {"index_manifest": {"config": {"accept_quality_drop": True}}}}
            run_tags = {**tags, **({"mtrag/source": sid} if sid else {}), "mtrag/publish": str(publish).lower()}
            with watching_events(instance, StageProgress(log, sid or "publish", asset_steps)), \
                    runs_with_origin(instance, job.name):
                result = job.execute_in_process(run_config=run_config, instance=instance, partition_key=sid,
                                                asset_selection=[k for a in selection for k in a.keys],
                                                tags=run_tags)
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
    return {"built": targets, "removed": removed, "runs": runs, "failed": failed}
