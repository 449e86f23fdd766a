import dagster as dg
from pydantic import Field

from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.publish.golden import QualityRefused
from mtrag_resources.serving.golden import evaluate_candidate
from mtrag_resources.stages.index_manifest import PublishRefused, build_index_manifest

from mtrag_assets.cross_source_links import cross_source_links
from mtrag_assets.fts_db import fts_db
from mtrag_assets.metadata import frame_table, materialize_result
from mtrag_assets.policies import BATCH_TAG, DEFAULT_FRESHNESS, GROUP_PUBLISH
from mtrag_assets.qdrant_collection import qdrant_collection
from mtrag_assets.resources import MtragResource


class IndexManifestConfig(dg.Config):
    accept_quality_drop: bool = Field(
        default=False, description="publish even when the golden-query gate refuses the candidate; the manifest "
                                   "records the accepted drop (`mtrag build --accept-quality-drop`)")


GOLDEN_COLUMNS = {"id": "string", "query": "string", "k": "int", "rank": "int", "previous_rank": "int",
                  "recalled": "bool", "status": "string"}


def golden_frame(record: dict):
    """The per-query golden report for people: one row per query in the file's order, regressed ones first."""
    import pandas as pd
    frame = pd.DataFrame([{"id": qid, **q} for qid, q in record["per_query"].items()],
                         columns=list(GOLDEN_COLUMNS))
    for column, kind in GOLDEN_COLUMNS.items():
        frame[column] = frame[column].astype({"int": "Int64", "bool": "boolean", "string": "string"}[kind])
    order = frame["status"].fillna("").map(lambda s: 0 if "regress" in s else 1)
    return frame.assign(_order=order).sort_values("_order", kind="stable").drop(columns="_order").reset_index(drop=True)


def golden_metadata(record: dict) -> dict:
    """The golden figures Dagster plots across generations, and the per-query ranks as a table."""
    return {"golden_recall": dg.MetadataValue.float(float(record["recall"])),
            "golden_per_query": frame_table(golden_frame(record))}


def _run_id(context) -> str:
    """The run's id; a fast-lane batch (the asset invoked directly, no run) names its batch. The
    op context's tags are the run's in a run and the invocation's in a direct one
    (AssetExecutionContext.run_tags is deprecated, and `context.run` exists only in a run)."""
    return context.op_execution_context.run_tags.get(BATCH_TAG) or context.run.run_id


@dg.asset(
    deps=[qdrant_collection, fts_db, cross_source_links],
    code_version=CODE_VERSIONS["index_manifest"],
    group_name=GROUP_PUBLISH,
    kinds={"json"},
    freshness_policy=DEFAULT_FRESHNESS,
    automation_condition=dg.AutomationCondition.eager(),
    pool="qdrant_writer",  # copies the embedded Qdrant folder for readers
)
def index_manifest(context: dg.AssetExecutionContext, config: IndexManifestConfig,
                   mtrag: MtragResource) -> dg.MaterializeResult:
    """The published generation N: per source the snapshot digest, chunk-set generation, counts and
    each store's committed marker; the embedder fingerprint; code versions; the run id. Published
    only when every store of every source committed its generation and the gate checks pass, by an
    atomic rename of CURRENT; otherwise CURRENT stays as it was and this step fails. Where a golden
    query file exists (MTRAG_GOLDEN), the candidate's golden recall@k must hold too (its
    quality_gate); each generation's recall and per-query ranks are this asset's metadata."""
    try:
        result = build_index_manifest(mtrag.settings(), mtrag.specs(), mtrag.embedder(), run_id=_run_id(context),
                                      multilingual=mtrag.multilingual(), evaluate_golden=evaluate_candidate,
                                      accept_quality_drop=config.accept_quality_drop)
    except PublishRefused as exc:
        raise dg.Failure(str(exc), metadata={"failing_checks": len(exc.failures)}) from exc
    except QualityRefused as exc:
        raise dg.Failure(str(exc), metadata={**golden_metadata(exc.verdict.record),
                                             "regressed_queries": len(exc.verdict.regressed)}) from exc
    quality = result.value.get("quality")
    return materialize_result(result, extra=golden_metadata(quality) if quality else None)
