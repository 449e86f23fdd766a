"""The code location `dagster dev` loads (workspace.yaml)."""
import dagster as dg

from .canonical_graph import canonical_graph
from .cas_chunks import cas_chunks
from .checks import ALL_CHECKS
from .cross_source_links import cross_source_links
from .embedding_cache import embedding_cache
from .fts_db import fts_db
from .index_manifest import index_manifest
from .neo4j_graph import neo4j_graph
from .qdrant_collection import qdrant_collection
from .raw_source import raw_source
from .jobs import build_source_job
from .resources import MtragResource
from .schedules import nightly_rebuild
from .sensors import source_changes, sources_sync

PARTITIONED_ASSETS = [raw_source, cas_chunks, canonical_graph, embedding_cache, qdrant_collection, fts_db, neo4j_graph]
GLOBAL_ASSETS = [cross_source_links, index_manifest]
ALL_ASSETS = PARTITIONED_ASSETS + GLOBAL_ASSETS

# Dagster's default automation sensor starts stopped; this one runs by default so that a backfill,
# the schedule or a sensor-requested rebuild ends in a published generation without a click.
publish_automation = dg.AutomationConditionSensorDefinition(
    "publish_automation", target=dg.AssetSelection.assets(cross_source_links, index_manifest),
    default_status=dg.DefaultSensorStatus.RUNNING)

defs = dg.Definitions(
    assets=ALL_ASSETS,
    asset_checks=ALL_CHECKS,
    jobs=[build_source_job],
    schedules=[nightly_rebuild],
    sensors=[sources_sync, source_changes, publish_automation],
    resources={"mtrag": MtragResource()},
)
