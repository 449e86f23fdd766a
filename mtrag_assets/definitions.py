"""The code location `dagster dev` loads (workspace.yaml)."""
import dagster as dg

from mtrag_resources.core.gc_tuning import freeze_startup, tune_gc

from mtrag_assets.canonical_graph import canonical_graph
from mtrag_assets.cas_chunks import cas_chunks
from mtrag_assets.checks import ALL_CHECKS
from mtrag_assets.cross_source_links import cross_source_links
from mtrag_assets.embedding_cache import embedding_cache
from mtrag_assets.fts_db import fts_db
from mtrag_assets.index_manifest import index_manifest
from mtrag_assets.neo4j_graph import neo4j_graph
from mtrag_assets.qdrant_collection import qdrant_collection
from mtrag_assets.raw_source import raw_source
from mtrag_assets.jobs import IN_PROCESS_BY_DEFAULT, JOBS
from mtrag_assets.resources import IndexReaderResource, MtragResource
from mtrag_assets.schedules import nightly_rebuild
from mtrag_assets.sensors import source_changes, sources_sync
from mtrag_assets.shadow_events import SHADOW_ASSETS
from mtrag_assets.shadow_jobs import SHADOW_JOBS

tune_gc()  # the code server and every run worker build rows by the million (core/gc_tuning.py)

PARTITIONED_ASSETS = [raw_source, cas_chunks, canonical_graph, embedding_cache, qdrant_collection, fts_db, neo4j_graph]
GLOBAL_ASSETS = [cross_source_links, index_manifest]
ALL_ASSETS = PARTITIONED_ASSETS + GLOBAL_ASSETS

# Dagster's default automation sensor starts stopped; this one runs by default so that a backfill,
# the schedule or a sensor-requested rebuild ends in a published generation without a click.
publish_automation = dg.AutomationConditionSensorDefinition(
    "publish_automation", target=dg.AssetSelection.assets(cross_source_links, index_manifest),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Evaluates the automation conditions of cross_source_links and index_manifest: once "
                "source runs (backfills, the nightly schedule, source_changes) committed new generations "
                "and none is in progress, it requests one run that resolves the links and publishes.")

defs = dg.Definitions(
    assets=ALL_ASSETS + SHADOW_ASSETS,
    asset_checks=ALL_CHECKS,
    jobs=JOBS + SHADOW_JOBS,
    schedules=[nightly_rebuild],
    sensors=[sources_sync, source_changes, publish_automation],
    resources={"mtrag": MtragResource.from_environment(), "index_reader": IndexReaderResource()},
    executor=IN_PROCESS_BY_DEFAULT,
)

freeze_startup()  # what is loaded by now lives as long as the process (core/gc_tuning.py)
