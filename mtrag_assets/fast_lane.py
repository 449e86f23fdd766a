"""One fast-lane batch (`mtrag watch`): the code location's own asset and check functions invoked
directly on the changed sources' partitions (a stage once the stages it reads are done, so the
store writes run side by side; see run_batch); then the same materializations (metadata, data
version, code version, input data versions) and check evaluations recorded in the Dagster instance
as runless events tagged `mtrag/plane=watch`.

Why not an in-process run, as `mtrag build` does: a run adds its creation and an event-log write
per event to every change (docs/performance.md#the-fast-lane-and-the-watch). The
direct path writes one event per asset and per check, after the publish, so the change is
queryable first and the lineage follows. A batch that fails leaves its sources' markers dirty,
like a failed run, and the watch converges them through an ordinary run (which the UI then shows,
failure and all)."""
from __future__ import annotations

import inspect
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import dagster as dg

from mtrag_resources.core.config import Settings
from mtrag_resources.core.session import session_cache
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.publish.build_state import mark_dirty
from mtrag_resources.stages.cross_source_links import prepare_links
from mtrag_resources.stages.raw_source import changed_paths
from mtrag_resources.stages.warm import warm_stage_memos
from mtrag_resources.core.task_graph import Task, run_graph
from mtrag_resources.stores.connect import keep_neo4j_drivers, open_neo4j, shared_stores, sharing_stores

from mtrag_assets.canonical_graph import canonical_graph
from mtrag_assets.dagster_private import (CODE_VERSION_TAG, DATA_VERSION_IS_USER_PROVIDED_TAG, DATA_VERSION_TAG,
                                         get_input_data_version_tag, get_input_event_pointer_tag,
                                         report_check_evaluation)
from mtrag_assets.checks import ALL_CHECKS
from mtrag_assets.definitions import GLOBAL_ASSETS, PARTITIONED_ASSETS
from mtrag_assets.policies import BATCH_TAG, PLANE_TAG
from mtrag_assets.resources import MtragResource
from mtrag_assets.runner import build_session, dagster_instance, sync_partitions


class CheckFailed(RuntimeError):
    """A blocking check failed: as in a run, nothing downstream of it runs."""


@dataclass
class Batch:
    """What one batch did: the asset events to record, in dependency order, and its timings."""
    batch_id: str
    tags: dict
    events: list = field(default_factory=list)  # (asset key, partition or None, MaterializeResult | check result)
    seconds: dict = field(default_factory=dict)
    targets: list = field(default_factory=list)  # the sources built (lagging ones included)

    def metadata_of(self, asset_name: str) -> list[dict]:
        return [result.metadata for key, _, result in self.events
                if isinstance(key, dg.AssetKey) and key.path[-1] == asset_name]


def _one_key(asset: dg.AssetsDefinition) -> dg.AssetKey:
    return next(iter(asset.keys))


def _checks_by_asset() -> dict[dg.AssetKey, list]:
    """Each check under the last asset it reads (its target or an additional dependency), in
    PARTITIONED_ASSETS' order: it runs once all of them are done, before anything downstream."""
    order = [_one_key(a) for a in PARTITIONED_ASSETS]
    out: dict[dg.AssetKey, list] = {}
    for check in ALL_CHECKS:
        spec = next(iter(check.check_specs))
        reads = [spec.asset_key, *(d.asset_key for d in spec.additional_deps)]
        out.setdefault(max(reads, key=order.index), []).append(check)
    return out


_EPHEMERAL = session_cache("fast_lane.ephemeral_instance", max_entries=1)


def _context(tags: dict, partition: str | None):
    """A direct invocation's context. Its instance is an ephemeral one, made once per process: the
    events go to the real instance through `record`, and a new one per context would cost more
    than the batch's own work. It carries no resources: the asset or check gets the resource as
    its argument (`_invoke`), which a context that initialises them would slow (figures:
    docs/performance.md#the-fast-lane-and-the-watch)."""
    instance = _EPHEMERAL.get("instance")
    if instance is None:
        instance = _EPHEMERAL["instance"] = dg.DagsterInstance.ephemeral()
    return dg.build_asset_context(partition_key=partition, run_tags=tags, instance=instance)


def _invoke(definition, resource: MtragResource, tags: dict, partition: str | None):
    """An asset or check of the code location called as a run's step calls it: its own function,
    with the context, the resource and default config. Dagster's direct invocation
    (`definition(context, mtrag=resource)`) binds the context and initialises the resource again on
    every call, which costs more than the function's own work in a small change
    (docs/performance.md#the-fast-lane-and-the-watch). What the batch records is the function's
    result either way."""
    call, kwargs = _callable(definition)
    return call(_context(tags, partition), mtrag=resource, **kwargs)


_CALLABLES = session_cache("fast_lane.callables", max_entries=256)  # past the assets and checks


def _callable(definition) -> tuple:
    """(the definition's decorated function, its config arguments at their defaults); Dagster's own
    invocation where a definition has no such function (another Dagster version's layout)."""
    found = _CALLABLES.get(definition)
    if found is None:
        fn = getattr(getattr(getattr(definition, "op", None), "compute_fn", None), "decorated_fn", None)
        if fn is None:
            found = (definition, {})
        else:
            params = inspect.signature(fn, eval_str=True).parameters  # checks.py's annotations are strings
            config = {name: param.annotation() for name, param in params.items()
                      if isinstance(param.annotation, type) and issubclass(param.annotation, dg.Config)
                      and not issubclass(param.annotation, dg.ConfigurableResource)}
            found = (fn, config)
        _CALLABLES[definition] = found
    return found


def warm_up(settings: Settings | None = None, source_ids: list[str] | None = None,
            specs: list[SourceSpec] | None = None) -> None:
    """Pay the first batch's one-time costs ahead of it: the ephemeral instance and one context,
    the stages' memos for `source_ids` (stages/warm.py), and Neo4j's (a server the watch's start
    just launched has no plans and no pages in memory)."""
    _context({PLANE_TAG: "watch"}, None)
    if settings is None:
        return
    keep_neo4j_drivers()  # one driver and its pooled connections for every batch of this process
    try:
        warm_stage_memos(settings, source_ids or [], specs)
    except Exception:  # noqa: BLE001 - a source not built yet (or its tables gone): its first batch reads them
        pass
    try:
        with open_neo4j(settings) as store:
            store.warm_up(source_ids or [])
    except Exception:  # noqa: BLE001 - no server to warm (or it refused): the first batch says what is wrong
        pass


# The stages of one source that may run at the same time: at most the three store writes. One pool
# for the process, so its threads keep their thread-local DuckDB connections between batches.
STAGE_WORKERS = 3
# In the session: its close shuts the pool down (threads already running finish their stage).
_POOL = session_cache("fast_lane.stage_pool", max_entries=1, on_evict=lambda _key, pool: pool.shutdown(wait=False))


def _stage_pool() -> ThreadPoolExecutor:
    pool = _POOL.get("pool")
    if pool is None:
        pool = _POOL["pool"] = ThreadPoolExecutor(max_workers=STAGE_WORKERS, thread_name_prefix="mtrag-stage")
    return pool


def run_batch(settings: Settings, specs: list[SourceSpec], targets: list[str], log=print,
              keep_qdrant: bool = False, changed: dict[str, set[str]] | None = None) -> Batch:
    """Materialise `targets`' partitions and publish, without a run; returns the batch's events
    for `record` (the caller records them after this returns: the generation is published).
    A stage starts once the stages it reads are done and the blocking checks on those passed, as
    in a run (see _batch_tasks), so a source's store writes run side by side. Sources go one after
    another; the manifest comes last. `keep_qdrant`: the embedded Qdrant stays open for the next
    batch (connect.close_parked_qdrant closes it). `changed`: per folder source, the paths (relative
    to its root) that alone changed since its last snapshot (the watcher's events): its raw stage
    reads only those again."""
    batch = Batch(batch_id=f"watch-{uuid.uuid4().hex[:12]}", tags={PLANE_TAG: "watch"})
    batch.tags[BATCH_TAG] = batch.batch_id
    resource = MtragResource()
    checks = _checks_by_asset()
    with build_session(settings, specs, targets, log, keep_qdrant=keep_qdrant) as targets:
        stores = shared_stores()
        tasks = _batch_tasks(settings, resource, batch, targets, checks)
        with changed_paths(changed or {}):
            results = run_graph({name: Task(_in_thread_of(stores, task.run), task.after) for name, task in tasks.items()},
                                _stage_pool())
    for sid in targets:  # the events in the jobs' order, each check after the last asset it reads
        for asset in PARTITIONED_ASSETS:
            key = _one_key(asset)
            result, seconds = results[_task_name(key, sid)]
            batch.events.append((key, sid, result))
            for check in checks.get(key, []):
                spec = next(iter(check.check_specs))
                outcome, check_seconds = results[_task_name(spec.key, sid)]
                batch.events.append((spec.key, sid, outcome))
                seconds += check_seconds
            batch.seconds[f"{sid}/{key.path[-1]}"] = round(seconds, 3)
    # the links resolved beside the store writes: the links stage's seconds no longer hold them
    batch.seconds[PREPARE_LINKS] = round(results[PREPARE_LINKS][1], 3)
    for asset in GLOBAL_ASSETS:
        key = _one_key(asset)
        result, seconds = results[_task_name(key, None)]
        batch.events.append((key, None, result))
        batch.seconds[key.path[-1]] = round(seconds, 3)
    batch.targets = targets
    return batch


def _task_name(key, sid: str | None) -> str:
    return f"{sid}/{key.to_user_string()}" if sid else key.to_user_string()


def _batch_tasks(settings: Settings, resource: MtragResource, batch: Batch, targets: list[str],
                 checks: dict) -> dict[str, Task]:
    """The batch's assets and checks as tasks returning (result, seconds), with a run's order: an
    asset after the assets it depends on and the (blocking) checks on those; a check after every
    asset it reads. Besides: a source starts after the previous one is done (two sources never
    write one store at once), its dirty marker goes once all its tasks are done, and the manifest,
    the publish gate, waits for every task."""
    checks_on: dict[dg.AssetKey, list] = {}  # asset -> the checks that block its downstream
    for found in checks.values():
        for check in found:
            spec = next(iter(check.check_specs))
            checks_on.setdefault(spec.asset_key, []).append(spec.key)
    tasks: dict[str, Task] = {}
    previous: list[str] = []
    for sid in targets:
        marker = mark_dirty(settings, sid)  # as a run: a failure below leaves it for the next build
        own: list[str] = []
        for asset in PARTITIONED_ASSETS:
            key = _one_key(asset)
            after = [_task_name(k, sid) for d in sorted(asset.asset_deps[key], key=_order_of)
                     for k in (d, *checks_on.get(d, []))] or previous
            own.append(_task_name(key, sid))
            tasks[own[-1]] = Task(_timed(lambda a=asset, i=sid: _invoke(a, resource, batch.tags, i)), after)
            for check in checks.get(key, []):
                spec = next(iter(check.check_specs))
                reads = [spec.asset_key, *(d.asset_key for d in spec.additional_deps)]
                own.append(_task_name(spec.key, sid))
                tasks[own[-1]] = Task(
                    _timed(lambda c=check, s=spec, i=sid: _passed(_invoke(c, resource, batch.tags, i), s, i)),
                    [_task_name(r, sid) for r in reads])
        tasks[f"{sid}/clean"] = Task(lambda m=marker: m.unlink(missing_ok=True), own)
        previous = [*own, f"{sid}/clean"]
    # The links resolved once every source's graph is written, beside the last one's store writes;
    # the links stage takes them where nothing it reads changed since (not an asset: the stage's
    # own result and figures are what it records).
    graph_key = _one_key(canonical_graph)
    graphs = [_task_name(k, sid) for sid in targets for k in (graph_key, *checks_on.get(graph_key, []))]
    tasks[PREPARE_LINKS] = Task(_timed(lambda: prepare_links(resource.settings(), resource.specs())), graphs)
    for asset in GLOBAL_ASSETS:
        key = _one_key(asset)
        if asset is GLOBAL_ASSETS[-1]:
            after = list(tasks)  # the manifest: after everything
        else:
            upstream = list(asset.asset_deps[key])
            after = ([_task_name(k, sid) for sid in targets for d in upstream if d not in _GLOBAL_KEYS
                      for k in (d, *checks_on.get(d, []))]
                     + [_task_name(d, None) for d in upstream if d in _GLOBAL_KEYS] + [PREPARE_LINKS])
        tasks[_task_name(key, None)] = Task(_timed(lambda a=asset: _invoke(a, resource, batch.tags, None)), after)
    return tasks


_GLOBAL_KEYS = {_one_key(a) for a in GLOBAL_ASSETS}
PREPARE_LINKS = "links/prepare"


def _order_of(key: dg.AssetKey) -> int:
    return [_one_key(a) for a in PARTITIONED_ASSETS].index(key)


def _passed(outcome, spec, sid: str):
    if not outcome.passed:
        raise CheckFailed(f"source {sid}: check {spec.name} failed: {outcome.description}")
    return outcome


def _timed(run):
    def timed_run():
        t0 = time.perf_counter()
        return run(), time.perf_counter() - t0
    return timed_run


def _in_thread_of(stores: dict, run):
    """`run` in a worker thread, with the batch's shared embedded Qdrant."""
    def adopted():
        with sharing_stores(stores):
            return run()
    return adopted


def record(settings: Settings, specs: list[SourceSpec], batch: Batch) -> int:
    """The batch's materializations and check evaluations as runless events, each materialization
    with the tags a run's would carry (data version, code version, the data versions of its
    upstream assets and pointers to their records), so that the UI's lineage, staleness and check
    history read the same for both planes. Returns the number of events written."""
    instance = _instance(settings)
    sync_partitions(instance, specs)
    code_versions = {k: v for a in PARTITIONED_ASSETS + GLOBAL_ASSETS for k, v in a.code_versions_by_key.items()}
    partitioned = {k for a in PARTITIONED_ASSETS for k in a.keys}
    # An unpartitioned asset reading partitioned ones (cross_source_links) names no input partition:
    # its inputs carry no versions, as in a run.
    deps = {k: [d for d in sorted(a.asset_deps[k], key=lambda d: d.to_user_string())
                if k in partitioned or d not in partitioned]
            for a in PARTITIONED_ASSETS + GLOBAL_ASSETS for k in a.keys}
    latest: dict[tuple, tuple[str, int | None]] = {}  # (key, partition) -> (data version, storage id)
    written = 0
    for key, partition, result in batch.events:
        if isinstance(result, dg.AssetCheckResult):
            # Under the batch's id: Dagster 1.13 keeps one runless evaluation per check and
            # partition, so a second batch's would be refused (dagster_private says why).
            evaluation = dg.AssetCheckEvaluation(
                asset_key=key.asset_key, check_name=key.name, passed=result.passed, metadata=result.metadata,
                severity=result.severity, description=result.description, blocking=True, partition=partition)
            report_check_evaluation(instance, evaluation, run_id=batch.batch_id)
            written += 1
            continue
        tags = {**batch.tags, CODE_VERSION_TAG: code_versions[key] or "",
                DATA_VERSION_TAG: result.data_version.value, DATA_VERSION_IS_USER_PROVIDED_TAG: "true"}
        for dep in deps[key]:
            upstream = latest.get((dep, partition)) or _latest_record(instance, dep, partition)
            if upstream:
                tags[get_input_data_version_tag(dep)] = upstream[0]
                tags[get_input_event_pointer_tag(dep)] = str(upstream[1]) if upstream[1] else "NULL"
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=key, partition=partition, metadata=result.metadata, tags=tags))
        written += 1
        record_ = _latest_record(instance, key, partition)
        latest[(key, partition)] = record_ or (result.data_version.value, None)
    return written


_INSTANCES = session_cache("fast_lane.instances", max_entries=16)  # by DAGSTER_HOME


def _instance(settings: Settings) -> dg.DagsterInstance:
    """The instance at the settings' DAGSTER_HOME, made once per process: a watch records every
    batch, and making the instance (its storages, its dagster.yaml check) each time would add to
    each (docs/performance.md#the-fast-lane-and-the-watch)."""
    home = str(settings.dagster_home)
    instance = _INSTANCES.get(home)
    if instance is None:
        instance = _INSTANCES[home] = dagster_instance(settings)
    return instance


def _latest_record(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str | None):
    """(data version, storage id) of the asset's latest materialization (of `partition`), or None."""
    filters = dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition] if partition else None)
    records = instance.fetch_materializations(filters, limit=1).records
    if not records:
        return None
    mat = records[0].asset_materialization
    return (mat.tags or {}).get(DATA_VERSION_TAG, ""), records[0].storage_id
