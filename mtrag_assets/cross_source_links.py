import dagster as dg

from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.stages.cross_source_links import build_cross_source_links

from mtrag_assets.metadata import materialize_result, sample_table
from mtrag_assets.neo4j_graph import neo4j_graph
from mtrag_assets.policies import DEFAULT_FRESHNESS, GROUP_PUBLISH
from mtrag_assets.resources import MtragResource
from mtrag_assets.schemas import GRAPH_RELATION_SCHEMA


@dg.asset(
    deps=[neo4j_graph],
    code_version=CODE_VERSIONS["cross_source_links"],
    group_name=GROUP_PUBLISH,
    kinds={"parquet", "neo4j"},
    freshness_policy=DEFAULT_FRESHNESS,
    automation_condition=dg.AutomationCondition.eager(),
    metadata={"dagster/column_schema": GRAPH_RELATION_SCHEMA},
)
def cross_source_links(context: dg.AssetExecutionContext, mtrag: MtragResource) -> dg.MaterializeResult:
    """Doc -> code MENTIONS (roles, code spans) and IMPLEMENTS (autodoc directives) edges resolved
    across sources through qualified names, re-exports, the current module, inherited members and
    dotted suffixes; one candidate is VERIFIED, several stay INFERRED with candidates. Proposals
    logged by the bridge at query time join as INFERRED. Parquet + Neo4j under the links marker."""
    result = build_cross_source_links(mtrag.settings(), mtrag.specs())
    rows = [r.__dict__ for r in result.value]
    return materialize_result(result, {
        "sample": sample_table(rows, ["rel_type", "src_id", "dst_id", "confidence", "evidence_text"])})
