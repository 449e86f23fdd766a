"""Blocking, per-source asset checks: the publishing gate as Dagster shows it. index_manifest
runs the same checks (mtrag_resources.publish.checks) before it publishes, because a blocking check stops
only downstream steps of its own run."""
from __future__ import annotations

import warnings

import dagster as dg

from mtrag_resources.publish.checks import check_parents, chunk_facts
from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.publish.views import check_one

from mtrag_assets.cas_chunks import cas_chunks
from mtrag_assets.fts_db import fts_db
from mtrag_assets.metadata import to_metadata
from mtrag_assets.neo4j_graph import neo4j_graph
from mtrag_assets.partitions import sources_partitions
from mtrag_assets.qdrant_collection import qdrant_collection
from mtrag_assets.resources import MtragResource

# Partitioned asset checks are a preview API in Dagster 1.13 (DESIGN: "partitioned asset checks
# need partitions_def"); the warning repeats on every import and tells maintainers nothing new.
warnings.filterwarnings("ignore", message=".*partitions_def on an AssetCheckSpec.*")


def _outcome(context, mtrag: MtragResource, name: str, store: str | None = None) -> dg.AssetCheckResult:
    embedder = mtrag.embedder()
    return _result(check_one(mtrag.settings(), mtrag.spec(context.partition_key), name,
                             embedder.fingerprint_id, embedder.dim, store,
                             ml_fingerprint_id=mtrag.multilingual().fingerprint_id))


def _result(outcome) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=outcome.passed, description=outcome.description,
                               metadata=to_metadata(outcome.metadata))


@dg.asset_check(asset=qdrant_collection, blocking=True, partitions_def=sources_partitions,
                description="Qdrant's marker for the source is committed at the chunk set's generation.")
def qdrant_marker_committed(context, mtrag: MtragResource) -> dg.AssetCheckResult:
    return _outcome(context, mtrag, "markers_committed", "qdrant")


@dg.asset_check(asset=qdrant_collection, blocking=True, partitions_def=sources_partitions,
                description="Cache, collection and configuration use one embedder fingerprint.")
def embedder_fingerprint(context, mtrag: MtragResource) -> dg.AssetCheckResult:
    return _outcome(context, mtrag, "embedder_fingerprint")


@dg.asset_check(asset=fts_db, blocking=True, partitions_def=sources_partitions,
                description="The FTS DB's marker for the source is committed at the chunk set's generation.")
def fts_marker_committed(context, mtrag: MtragResource) -> dg.AssetCheckResult:
    return _outcome(context, mtrag, "markers_committed", "fts")


@dg.asset_check(asset=neo4j_graph, blocking=True, partitions_def=sources_partitions,
                description="Neo4j's ProjectionMarker for the source is committed at the chunk set's generation.")
def neo4j_marker_committed(context, mtrag: MtragResource) -> dg.AssetCheckResult:
    return _outcome(context, mtrag, "markers_committed", "neo4j")


@dg.asset_check(asset=neo4j_graph, blocking=True, partitions_def=sources_partitions,
                additional_deps=[qdrant_collection, fts_db],
                description="Chunk table, Qdrant points, FTS rows and Neo4j chunk nodes agree.")
def counts_reconcile(context, mtrag: MtragResource) -> dg.AssetCheckResult:
    return _outcome(context, mtrag, "counts_reconcile")


@dg.asset_check(asset=cas_chunks, blocking=True, partitions_def=sources_partitions,
                description="Every chunk's parent_id names a chunk of the same source.")
def no_dangling_parents(context, mtrag: MtragResource) -> dg.AssetCheckResult:
    facts = chunk_facts(SourceLayout(mtrag.settings(), context.partition_key).chunks)
    return _result(check_parents(context.partition_key, facts))


ALL_CHECKS = [qdrant_marker_committed, embedder_fingerprint, fts_marker_committed, neo4j_marker_committed,
              counts_reconcile, no_dangling_parents]
