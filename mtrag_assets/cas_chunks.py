import dagster as dg

from mtrag_resources.stages.cas_chunks import build_cas_chunks
from mtrag_resources.core.versions import CODE_VERSIONS

from mtrag_assets.metadata import materialize_result, sample_table
from mtrag_assets.partitions import sources_partitions
from mtrag_assets.policies import DEFAULT_FRESHNESS, GROUP_BUILD
from mtrag_assets.raw_source import raw_source
from mtrag_assets.resources import MtragResource
from mtrag_assets.schemas import CHUNK_TABLE_SCHEMA


@dg.asset(
    deps=[raw_source],
    partitions_def=sources_partitions,
    code_version=CODE_VERSIONS["cas_chunks"],
    group_name=GROUP_BUILD,
    kinds={"python", "parquet"},
    freshness_policy=DEFAULT_FRESHNESS,
    metadata={"dagster/column_schema": CHUNK_TABLE_SCHEMA},
)
def cas_chunks(context: dg.AssetExecutionContext, mtrag: MtragResource) -> dg.MaterializeResult:
    """Parent and child chunks of one source. Code: a child per function, method and class and a
    parent per file and class (Python via ast; JS/TS, Java, Go, Rust via tree-sitter). Docs:
    heading-aware sections as parents, token-bounded CJK-aware passages as children. Chunk ids come
    from structure (source, path, symbol or heading path), never line numbers; texts live once in
    the content-addressed store; the chunk table is Parquet. Unchanged files are not re-parsed.
    A code child is embedded as its name's words + its source (`embed_hash`); `@overload` stubs
    fold into their implementation's chunk, other declaration-only code is flagged `declaration`."""
    result = build_cas_chunks(mtrag.settings(), mtrag.spec(context.partition_key))
    for warning in result.metadata.get("new_warnings", [])[:20]:  # "warnings": every file's, kept ones too
        context.log.warning(warning)
    return materialize_result(result, {
        "dagster/row_count": result.metadata["chunks"],
        "sample": sample_table(result.value, ["chunk_id", "role", "chunk_type", "symbol", "locator"]),
    })
