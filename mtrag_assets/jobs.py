import dagster as dg

from mtrag_assets.checks import ALL_CHECKS
from mtrag_assets.canonical_graph import canonical_graph
from mtrag_assets.cas_chunks import cas_chunks
from mtrag_assets.embedding_cache import embedding_cache
from mtrag_assets.fts_db import fts_db
from mtrag_assets.neo4j_graph import neo4j_graph
from mtrag_assets.qdrant_collection import qdrant_collection
from mtrag_assets.raw_source import raw_source

SOURCE_STAGES = [raw_source, cas_chunks, canonical_graph, embedding_cache, qdrant_collection, fts_db, neo4j_graph]

# One run per source partition: every per-source stage and its checks. cross_source_links and
# index_manifest follow by declarative automation once no source is in progress.
build_source_job = dg.define_asset_job(
    "build_source",
    selection=dg.AssetSelection.assets(*SOURCE_STAGES) | dg.AssetSelection.checks(*ALL_CHECKS),
    description="Rebuild one source partition: snapshot, chunks, graph, embeddings and its three stores.",
)
