import dagster as dg

from mtrag_resources.stages.canonical_graph import build_canonical_graph
from mtrag_resources.core.versions import CODE_VERSIONS

from mtrag_assets.cas_chunks import cas_chunks
from mtrag_assets.metadata import materialize_result, sample_table
from mtrag_assets.partitions import sources_partitions
from mtrag_assets.policies import DEFAULT_FRESHNESS, GROUP_BUILD
from mtrag_assets.resources import MtragResource
from mtrag_assets.schemas import GRAPH_RELATION_SCHEMA


@dg.asset(
    deps=[cas_chunks],
    partitions_def=sources_partitions,
    code_version=CODE_VERSIONS["canonical_graph"],
    group_name=GROUP_BUILD,
    kinds={"python", "parquet"},
    freshness_policy=DEFAULT_FRESHNESS,
    metadata={"dagster/column_schema": GRAPH_RELATION_SCHEMA},
)
def canonical_graph(context: dg.AssetExecutionContext, mtrag: MtragResource) -> dg.MaterializeResult:
    """Entities (Source, File, Module, Class, Function, Method, Page, Section) and typed, directed
    relations (CONTAINS, DEFINES, IMPORTS, INHERITS, CALLS) of one source, each with evidence (file,
    line span, content hash) and a confidence: VERIFIED only when resolved unambiguously, else
    INFERRED with its candidates. The references docs make are kept for cross_source_links."""
    result = build_canonical_graph(mtrag.settings(), mtrag.spec(context.partition_key))
    _nodes, relations, _refs = result.value
    rows = [r.__dict__ for r in relations]
    return materialize_result(result, {
        "sample": sample_table(rows, ["rel_type", "src_id", "dst_id", "confidence", "evidence_text"]),
    })
