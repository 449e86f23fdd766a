import dagster as dg

from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.stages.neo4j_graph import build_neo4j_graph

from mtrag_assets.canonical_graph import canonical_graph
from mtrag_assets.metadata import materialize_result
from mtrag_assets.partitions import sources_partitions
from mtrag_assets.policies import DEFAULT_FRESHNESS, GROUP_STORES
from mtrag_assets.resources import MtragResource


@dg.asset(
    deps=[canonical_graph],
    partitions_def=sources_partitions,
    code_version=CODE_VERSIONS["neo4j_graph"],
    group_name=GROUP_STORES,
    kinds={"neo4j"},
    freshness_policy=DEFAULT_FRESHNESS,
)
def neo4j_graph(context: dg.AssetExecutionContext, mtrag: MtragResource) -> dg.MaterializeResult:
    """The source's canonical graph in Neo4j: constraints and indexes first, nodes and upper-case
    typed relationships MERGEd by stable id in UNWIND batches with evidence and confidence, a chunk
    node per chunk (no text, no vectors), stale ids removed, bracketed by a ProjectionMarker."""
    result = build_neo4j_graph(mtrag.settings(), mtrag.spec(context.partition_key))
    return materialize_result(result)
