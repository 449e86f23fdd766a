import dagster as dg

from mtrag_resources.core.config import Settings
from mtrag_resources.ingest.sources import SourceConfigError, load_sources
from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.ingest.snapshot import load_inventory, scan_source

from mtrag_assets.jobs import build_source_job
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


@dg.sensor(job=build_source_job, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.RUNNING,
           description="Requests a rebuild of a source whose files changed since its last raw_source snapshot.")
def source_changes(context: dg.SensorEvaluationContext):
    settings = Settings.from_env()
    try:
        specs = load_sources(settings.sources_file)
    except SourceConfigError as exc:
        return dg.SkipReason(str(exc))
    partitions = set(context.instance.get_dynamic_partitions(sources_partitions.name))
    requests = []
    for spec in specs:
        if spec.id not in partitions:
            continue  # sources_sync adds it first
        previous = load_inventory(SourceLayout(settings, spec.id))
        digest = scan_source(settings, spec).digest
        if previous is None or previous.digest != digest:
            requests.append(dg.RunRequest(partition_key=spec.id, run_key=f"{spec.id}:{digest}",
                                          tags={"mtrag/trigger": "source_changed"}))
    return requests or dg.SkipReason("no source changed")
