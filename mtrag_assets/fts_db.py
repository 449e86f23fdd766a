import dagster as dg

from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.stages.fts_db import build_fts_db

from mtrag_assets.canonical_graph import canonical_graph
from mtrag_assets.cas_chunks import cas_chunks
from mtrag_assets.metadata import materialize_result
from mtrag_assets.partitions import sources_partitions
from mtrag_assets.policies import DEFAULT_FRESHNESS, GROUP_STORES
from mtrag_assets.resources import MtragResource


@dg.asset(
    deps=[cas_chunks, canonical_graph],  # the graph's web endpoints are exact aliases too
    partitions_def=sources_partitions,
    code_version=CODE_VERSIONS["fts_db"],
    group_name=GROUP_STORES,
    kinds={"sqlite"},
    freshness_policy=DEFAULT_FRESHNESS,
)
def fts_db(context: dg.AssetExecutionContext, mtrag: MtragResource) -> dg.MaterializeResult:
    """SQLite FTS5: a trigram index over child title/summary/text/symbol plus a CJK bigram index
    (so 2-character Chinese terms match), exact aliases (file path, basename, symbols, graph ids,
    source id, title, issue keys, web endpoints `GET /login`) and parent rows for hydration. The
    source's rows are replaced in one transaction under a generation marker; WAL keeps readers
    unblocked."""
    result = build_fts_db(mtrag.settings(), mtrag.spec(context.partition_key))
    return materialize_result(result)
