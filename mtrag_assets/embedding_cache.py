import dagster as dg

from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.stages.embedding_cache import build_embedding_cache

from mtrag_assets.cas_chunks import cas_chunks
from mtrag_assets.metadata import materialize_result
from mtrag_assets.partitions import sources_partitions
from mtrag_assets.policies import DEFAULT_FRESHNESS, GROUP_BUILD
from mtrag_assets.resources import MtragResource


@dg.asset(
    deps=[cas_chunks],
    partitions_def=sources_partitions,
    code_version=CODE_VERSIONS["embedding_cache"],
    group_name=GROUP_BUILD,
    kinds={"pytorch", "parquet", "duckdb"},
    freshness_policy=DEFAULT_FRESHNESS,
)
def embedding_cache(context: dg.AssetExecutionContext, mtrag: MtragResource) -> dg.MaterializeResult:
    """One vector per (embedder fingerprint, content hash) for the source's child chunks, in
    Parquet shards looked up with DuckDB. Only hashes missing from the cache are embedded, so an
    unchanged source costs nothing and an edit re-embeds only the chunks it changed."""

    def progress(done: int, total: int) -> None:
        context.log.info(f"embedded {done}/{total}")

    result = build_embedding_cache(mtrag.settings(), mtrag.spec(context.partition_key), mtrag.embedder(), log=progress,
                                   multilingual=mtrag.multilingual())
    return materialize_result(result)
