import dagster as dg

from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.stages.qdrant_collection import build_qdrant_collection

from mtrag_assets.embedding_cache import embedding_cache
from mtrag_assets.metadata import materialize_result
from mtrag_assets.partitions import sources_partitions
from mtrag_assets.policies import DEFAULT_FRESHNESS, GROUP_STORES
from mtrag_assets.resources import MtragResource


@dg.asset(
    deps=[embedding_cache],
    partitions_def=sources_partitions,
    code_version=CODE_VERSIONS["qdrant_collection"],
    group_name=GROUP_STORES,
    kinds={"qdrant"},
    freshness_policy=DEFAULT_FRESHNESS,
    pool="qdrant_writer",  # embedded Qdrant allows one process per folder
)
def qdrant_collection(context: dg.AssetExecutionContext, mtrag: MtragResource) -> dg.MaterializeResult:
    """Dense points for the source's child chunks in the collection of its kind (mtrag_code,
    mtrag_docs; cosine), with the full payload and payload indexes on filter fields. Point ids come
    from chunk ids; the source's points missing from the new chunk set are deleted; the write is
    bracketed by a begin/commit marker for the source's generation."""
    result = build_qdrant_collection(mtrag.settings(), mtrag.spec(context.partition_key), mtrag.embedder(),
                                     multilingual=mtrag.multilingual())
    return materialize_result(result)
