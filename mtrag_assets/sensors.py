import dagster as dg

from mtrag_resources.core.config import Settings
from mtrag_resources.ingest.sources import SourceConfigError, load_sources
from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.ingest.snapshot import load_inventory, scan_source

from mtrag_assets.jobs import build_source_and_publish_job, build_source_job
from mtrag_assets.partitions import sources_partitions


@dg.sensor(minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Keeps the `sources` partitions equal to sources.yaml (added and removed).")
def sources_sync(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    settings = Settings.from_env()
    try:
        specs = load_sources(settings.sources_file)
    except SourceConfigError as exc:
        return dg.SensorResult(skip_reason=str(exc))
    existing = set(context.instance.get_dynamic_partitions(sources_partitions.name))
    wanted = {s.id for s in specs}
    requests = []
    if wanted - existing:
        requests.append(sources_partitions.build_add_request(sorted(wanted - existing)))
    if existing - wanted:
        requests.append(sources_partitions.build_delete_request(sorted(existing - wanted)))
    if not requests:
        return dg.SensorResult(skip_reason="partitions match sources.yaml")
    return dg.SensorResult(dynamic_partitions_requests=requests)


# The daemon's path from a saved file to a published generation is this sensor's interval, then a
# queued run launched in its own process (one process per step), then for a multi-source change
# publish_automation's tick (30 s). 15 s: the scan it pays per tick is a stat walk of each source
# (docs/performance.md#processes); see docs/dagster-path.md for the measured latency.
CHANGE_POLL_S = 15


@dg.sensor(jobs=[build_source_job, build_source_and_publish_job], minimum_interval_seconds=CHANGE_POLL_S,
           default_status=dg.DefaultSensorStatus.RUNNING,
           description="Requests a rebuild of each source whose files changed since its last raw_source "
                       "snapshot. One changed source: one run that builds it and publishes "
                       "(build_source_and_publish), without waiting for publish_automation; several: one "
                       "build_source run each, and publish_automation publishes once they committed.")
def source_changes(context: dg.SensorEvaluationContext):
    settings = Settings.from_env()
    try:
        specs = load_sources(settings.sources_file)
    except SourceConfigError as exc:
        return dg.SkipReason(str(exc))
    partitions = set(context.instance.get_dynamic_partitions(sources_partitions.name))
    changed = []
    for spec in specs:
        if spec.id not in partitions:
            continue  # sources_sync adds it first
        previous = load_inventory(SourceLayout(settings, spec.id))
        try:
            digest = scan_source(settings, spec).digest
        except SourceConfigError as exc:  # a broken git entry: its error, the other sources still checked
            context.log.warning(str(exc))
            continue
        if previous is None or previous.digest != digest:
            changed.append((spec.id, digest))
    job = build_source_and_publish_job if len(changed) == 1 else build_source_job
    return [dg.RunRequest(partition_key=sid, run_key=f"{sid}:{digest}", job_name=job.name,
                          tags={"mtrag/trigger": "source_changed"}) for sid, digest in changed] \
        or dg.SkipReason("no source changed")
