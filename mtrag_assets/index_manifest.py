import dagster as dg

from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.stages.index_manifest import PublishRefused, build_index_manifest

from mtrag_assets.cross_source_links import cross_source_links
from mtrag_assets.fts_db import fts_db
from mtrag_assets.metadata import materialize_result
from mtrag_assets.policies import DEFAULT_FRESHNESS, GROUP_PUBLISH
from mtrag_assets.qdrant_collection import qdrant_collection
from mtrag_assets.resources import MtragResource


@dg.asset(
    deps=[qdrant_collection, fts_db, cross_source_links],
    code_version=CODE_VERSIONS["index_manifest"],
    group_name=GROUP_PUBLISH,
    kinds={"json"},
    freshness_policy=DEFAULT_FRESHNESS,
    automation_condition=dg.AutomationCondition.eager(),
    pool="qdrant_writer",  # copies the embedded Qdrant folder for readers
)
def index_manifest(context: dg.AssetExecutionContext, mtrag: MtragResource) -> dg.MaterializeResult:
    """The published generation N: per source the snapshot digest, chunk-set generation, counts and
    each store's committed marker; the embedder fingerprint; code versions; the run id. Published
    only when every store of every source committed its generation and the gate checks pass, by an
    atomic rename of CURRENT; otherwise CURRENT stays as it was and this step fails."""
    try:
        result = build_index_manifest(mtrag.settings(), mtrag.specs(), mtrag.embedder(), run_id=context.run.run_id)
    except PublishRefused as exc:
        raise dg.Failure(str(exc), metadata={"failing_checks": len(exc.failures)}) from exc
    return materialize_result(result)
