
import dagster as dg

from mtrag_assets.jobs import build_source_job
from mtrag_assets.partitions import sources_partitions

from mtrag_resources.core.config import env

NIGHTLY_CRON = env("MTRAG_NIGHTLY_CRON", "0 2 * * *")


@dg.schedule(cron_schedule=NIGHTLY_CRON, job=build_source_job, execution_timezone="UTC",
             default_status=dg.DefaultScheduleStatus.RUNNING,
             description=f"Rebuilds every source nightly ({NIGHTLY_CRON} UTC, MTRAG_NIGHTLY_CRON): one build_source "
                         "run per partition, tag mtrag/trigger=nightly; publish_automation then publishes.")
def nightly_rebuild(context: dg.ScheduleEvaluationContext):
    """Rebuild every source nightly, one run per partition (build_schedule_from_partitioned_job
    refuses dynamic partitions). Unchanged sources finish fast: stat-cached hashes, memoised
    parsing and the embedding cache."""
    for key in context.instance.get_dynamic_partitions(sources_partitions.name):
        yield dg.RunRequest(partition_key=key, run_key=f"nightly:{context.scheduled_execution_time:%Y-%m-%d}:{key}",
                            tags={"mtrag/trigger": "nightly"})
