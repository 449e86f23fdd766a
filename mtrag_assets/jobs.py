"""The jobs a maintainer finds in the UI (and on the Overview timeline, one row each): what the
sensors, the schedule and `mtrag build` run."""
import dagster as dg

from mtrag_assets.checks import ALL_CHECKS
from mtrag_assets.canonical_graph import canonical_graph
from mtrag_assets.cas_chunks import cas_chunks
from mtrag_assets.cross_source_links import cross_source_links
from mtrag_assets.embedding_cache import embedding_cache
from mtrag_assets.fts_db import fts_db
from mtrag_assets.index_manifest import index_manifest
from mtrag_assets.neo4j_graph import neo4j_graph
from mtrag_assets.qdrant_collection import qdrant_collection
from mtrag_assets.raw_source import raw_source

SOURCE_STAGES = [raw_source, cas_chunks, canonical_graph, embedding_cache, qdrant_collection, fts_db, neo4j_graph]
PUBLISH_STAGES = [cross_source_links, index_manifest]

# The executor of every job without its own (publish_generation, and the asset job the UI's
# "Materialize" and asset backfills run): Dagster's multi_or_in_process executor with in_process
# as its default. Its multiprocess default starts a Python process per step (imports
# and resources anew for each of a run's 13 steps), most of a run's time when a partition has not
# changed (bench/backfill.py); `mtrag build` runs the same stages in one process too. A run whose
# steps should run in parallel asks for it in its run config: `execution: {config: {multiprocess: {}}}`.
IN_PROCESS_BY_DEFAULT = dg.ExecutorDefinition(
    name="in_process_by_default",
    config_schema=dg.Field(dg.multi_or_in_process_executor.config_schema.as_field().config_type,
                           default_value={"in_process": {}}),
    requirements=dg.multi_or_in_process_executor.get_requirements,
    executor_creation_fn=dg.multi_or_in_process_executor.executor_creation_fn,
    description="multi_or_in_process_executor, in_process unless the run config asks for multiprocess",
)

# One run per source partition: every per-source stage and its checks. cross_source_links and
# index_manifest follow by declarative automation once no source is in progress.
build_source_job = dg.define_asset_job(
    "build_source",
    selection=dg.AssetSelection.assets(*SOURCE_STAGES) | dg.AssetSelection.checks(*ALL_CHECKS),
    description="Rebuild one source partition: snapshot, chunks, graph, embeddings and its three stores.",
    # Its job backfills and the nightly schedule keep a process per step: store steps in parallel
    # on wide rebuilds (tests/test_backfill.py holds one step's process at a fault point).
    executor_def=dg.multi_or_in_process_executor,
)

# The publishing assets alone, unpartitioned (the assets `publish_automation` materialises after
# source runs): what `mtrag build` runs when no source changed, or a maintainer to publish again.
publish_generation_job = dg.define_asset_job(
    "publish_generation",
    selection=dg.AssetSelection.assets(*PUBLISH_STAGES),
    description="Resolve the doc -> code links across sources and publish the next index generation "
                "(index_manifest), if every store of every source committed and the gate checks pass.",
)

# `mtrag build`'s last changed source: build_source and publish_generation in one run (one run's
# fixed cost less per build; a failed blocking check skips the publishing steps of that run).
# In one process, whatever the run config says: the source_changes sensor's run for a one-source
# change (and a UI launch). The multiprocess executor starts a Python process per step: measured
# through dagster-daemon, a one-function change took most of its time to publish in process
# start-up (bench/dagster_path.py, docs/dagster-path.md).
build_source_and_publish_job = dg.define_asset_job(
    "build_source_and_publish",
    selection=dg.AssetSelection.assets(*SOURCE_STAGES, *PUBLISH_STAGES) | dg.AssetSelection.checks(*ALL_CHECKS),
    description="Rebuild one source partition (as build_source) and, in the same run, resolve the "
                "cross-source links and publish the next generation (as publish_generation); its "
                "steps run in the run's own process.",
    executor_def=dg.in_process_executor,
)

JOBS = [build_source_job, build_source_and_publish_job, publish_generation_job]
