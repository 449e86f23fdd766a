import dagster as dg

from .checks import ALL_CHECKS
from .canonical_graph import canonical_graph
from .cas_chunks import cas_chunks
from .embedding_cache import embedding_cache
from .fts_db import fts_db
from .neo4j_graph import neo4j_graph
from .qdrant_collection import qdrant_collection
from .raw_source import raw_source

SOURCE_STAGES = [raw_source, cas_chunks, canonical_graph, embedding_cache, qdrant_collection, fts_db, neo4j_graph]

# One run per source partition: every per-source stage and its checks. cross_source_links and
# index_manifest follow by declarative automation once no source is in progress.
build_source_job = dg.define_asset_job(
    "build_source",
    selection=dg.AssetSelection.assets(*SOURCE_STAGES) | dg.AssetSelection.checks(*ALL_CHECKS),
    description="Rebuild one source partition: snapshot, chunks, graph, embeddings and its three stores.",
)
