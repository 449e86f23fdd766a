"""The blocking asset checks inside real Dagster runs on a real instance: a check that fails stops
the steps downstream of it in its run (index_manifest does not materialize, CURRENT stays), and
`embedder_fingerprint` fails with a description that says what disagrees."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from mtrag_resources.publish.manifest import current_path, load_current
from mtrag_resources.stores.connect import open_qdrant
from mtrag_resources.stores.fts_store import FtsStore
from mtrag_resources.stores.tables import read_rows
from tests.build_helpers import build, finish, settings, wait_stopped

pytestmark = [pytest.mark.integration, pytest.mark.neo4j]

REPO = Path(__file__).resolve().parents[1]
MTRAG = str(Path(sys.executable).with_name("mtrag"))


def _instance() -> dg.DagsterInstance:
    return dg.DagsterInstance.get()


def _check_record(asset: str, check: str, partition: str):
    key = dg.AssetCheckKey(dg.AssetKey(asset), check)
    records = _instance().event_log_storage.get_asset_check_execution_history(key, limit=20)
    records = [r for r in records if r.partition == partition]
    assert records, f"no execution of {asset}:{check} for {partition}"
    evaluation = records[0].event.dagster_event.event_specific_data
    return records[0], evaluation


def _manifest_materializations() -> list:
    return _instance().fetch_materializations(dg.AssetKey("index_manifest"), limit=100).records


def _layout(source_id: str):
    from mtrag_resources.core.layout import SourceLayout
    return SourceLayout(settings(), source_id)


# ------------------------------------------------------------------ a failing check blocks publishing



def _drop_fts_children(source_id: str, n: int) -> None:
    """Lose `n` child rows of a source in the FTS file (with their FTS entries), behind its
    committed marker and meta: what a restored backup or a hand edit leaves."""
    conn = sqlite3.connect(settings().fts_path, isolation_level=None, timeout=30)
    try:
        conn.execute("BEGIN IMMEDIATE")
        FtsStore._delete_rids(conn, "SELECT rid FROM chunks WHERE source_id = ? AND role = 'child' "
                                    f"ORDER BY rid LIMIT {int(n)}", (source_id,))
        conn.execute("COMMIT")
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc and SIGSTOP")
def test_failing_blocking_check_skips_index_manifest_in_its_run(mtrag_env):
    """`mtrag build --source shop` freezes inside its neo4j_graph step (after fts_db has written);
    meanwhile FTS loses two of shop's rows. counts_reconcile then fails in that run, so
    cross_source_links and index_manifest never run; the next build converges."""
    build()
    s = settings()
    before = current_path(s.manifest_dir).read_bytes()
    published_runs = {r.run_id for r in _manifest_materializations()}
    env = {**os.environ, "MTRAG_FAULT": "neo4j:after_begin", "MTRAG_FAULT_SIGNAL": "STOP"}
    proc = subprocess.Popen([MTRAG, "build", "--source", "shop"], env=env, cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_stopped(proc)
        run = _instance().get_runs(limit=1)[0]
        steps = {st.step_key: st.status.value for st in _instance().get_run_step_stats(run.run_id)}
        assert steps.get("fts_db") == "SUCCESS", steps  # FTS is written before the graph step
        _drop_fts_children("shop", 2)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    _, out, err = finish(proc, timeout=600)
    assert proc.returncode != 0
    assert "blocking asset check failed" in err and "counts_reconcile" in err, err[-3000:]

    instance = _instance()
    run = instance.get_run_by_id(run.run_id)
    assert run.status == dg.DagsterRunStatus.FAILURE
    steps = {st.step_key: st.status.value for st in instance.get_run_step_stats(run.run_id)}
    assert steps["neo4j_graph_counts_reconcile"] == "FAILURE"
    for ok in ("fts_db", "neo4j_graph", "qdrant_collection", "fts_db_fts_marker_committed",
               "qdrant_collection_qdrant_marker_committed", "neo4j_graph_neo4j_marker_committed"):
        assert steps[ok] == "SUCCESS", (ok, steps)
    # Downstream of the failed check: never started in this run, nothing materialized.
    assert steps.get("cross_source_links") in (None, "SKIPPED") and steps.get("index_manifest") in (None, "SKIPPED")
    materialized = {e.asset_key.to_user_string() for e in
                    instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION).records
                    for e in [e.event_log_entry.dagster_event]}
    assert {"fts_db", "neo4j_graph", "qdrant_collection"} <= materialized
    assert not materialized & {"cross_source_links", "index_manifest"}
    assert {r.run_id for r in _manifest_materializations()} == published_runs
    assert current_path(s.manifest_dir).read_bytes() == before

    record, evaluation = _check_record("neo4j_graph", "counts_reconcile", "shop")
    assert record.run_id == run.run_id and evaluation.passed is False
    assert evaluation.description.startswith("counts differ:")
    counts = {k: v.value for k, v in evaluation.metadata.items()}
    assert counts["fts_child_rows"] == counts["chunk_table_children"] - 2 == counts["qdrant_points"] - 2

    # The FTS store rewrites the rows it lost (its meta no longer matches its rows), the check
    # passes and the generation is published.
    result = build(only=["shop"])
    assert load_current(s.manifest_dir)["generation"] == 2
    record, evaluation = _check_record("neo4j_graph", "counts_reconcile", "shop")
    assert record.run_id == result["runs"]["shop"] and evaluation.passed is True


# ------------------------------------------------------------------ embedder_fingerprint

def _checks_only_run(check, partition: str) -> dg.ExecuteInProcessResult:
    """A run of one asset check alone (as the UI's "Execute" on a check does)."""
    from mtrag_assets.checks import ALL_CHECKS
    from mtrag_assets.definitions import ALL_ASSETS
    from mtrag_assets.resources import MtragResource
    job = dg.define_asset_job("one_check", selection=dg.AssetSelection.checks(check))
    defs = dg.Definitions(assets=ALL_ASSETS, asset_checks=ALL_CHECKS, jobs=[job], resources={"mtrag": MtragResource()})
    # The partition goes in as the run's tag: Dagster 1.13 validates a partition_key= argument against
    # the selected assets, and a selection of checks alone has none.
    return defs.resolve_job_def("one_check").execute_in_process(tags={"dagster/partition": partition},
                                                                instance=_instance(), raise_on_error=False)


def _forget_vector(fingerprint_id: str, content_hash: str) -> None:
    """Remove one content hash from every shard of the embedding cache (shards are replaced by a
    rename, as the cache itself writes them)."""
    from mtrag_resources.stores.embedding_cache import EmbeddingCache
    cache = EmbeddingCache(settings().embeddings_dir)
    removed = 0
    for shard in cache.shards(fingerprint_id):
        table = pq.read_table(shard)
        keep = [h != content_hash for h in table.column("content_hash").to_pylist()]
        if all(keep):
            continue
        removed += len(keep) - sum(keep)
        tmp = shard.with_name("." + shard.name + ".tmp")
        pq.write_table(table.filter(keep), tmp)
        os.replace(tmp, shard)
    assert removed, "the hash was not in the cache"
    assert cache.missing(fingerprint_id, [content_hash]) == [content_hash]


def test_embedder_fingerprint_fails_for_a_chunk_without_a_cached_vector(mtrag_env):
    from mtrag_assets.checks import embedder_fingerprint
    from mtrag_assets.resources import MtragResource
    build()
    fingerprint_id = MtragResource().embedder().fingerprint_id
    from mtrag_resources.core.models import vector_hash  # the hash of the text a child's vector embeds
    child = next(r for r in read_rows(_layout("shop").chunks) if r["role"] == "child")
    _forget_vector(fingerprint_id, vector_hash(child))

    result = _checks_only_run(embedder_fingerprint, "shop")
    assert not result.success
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.check_name == "embedder_fingerprint" and evaluation.passed is False
    assert evaluation.description == (f"1 texts lack a vector for {fingerprint_id}; collection dim 384 vs 384")
    meta = {k: v.value for k, v in evaluation.metadata.items()}
    assert meta == {"fingerprint": fingerprint_id, "missing_vectors": 1}
    # The instance keeps it for the UI (the check's Partitions tab), with its description.
    record, stored = _check_record("qdrant_collection", "embedder_fingerprint", "shop")
    assert record.run_id == result.run_id and stored.description == evaluation.description
    # The other source is unaffected.
    other = _checks_only_run(embedder_fingerprint, "shop-docs")
    assert other.success and other.get_asset_check_evaluations()[0].passed

    # The next build of the source embeds the missing text again and the check passes.
    build(only=["shop"])
    record, stored = _check_record("qdrant_collection", "embedder_fingerprint", "shop")
    assert stored.passed and stored.description == "cache, collection and configuration share one embedder"


def test_embedder_fingerprint_fails_for_a_collection_of_another_dim(mtrag_env):
    from mtrag_assets.checks import embedder_fingerprint
    build()
    with open_qdrant(settings()) as q:  # the code collection as a 16-d model would have made it
        q.client.delete_collection("mtrag_code")
        q.ensure_collection("code", 16)
        assert q.collection_info("code")["dim"] == 16
    result = _checks_only_run(embedder_fingerprint, "shop")
    assert not result.success
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.passed is False
    assert evaluation.description.endswith("; collection dim 16 vs 384")
    assert evaluation.description.startswith("0 texts lack a vector")
    # A docs source lives in its own collection, still 384-d: its check passes.
    other = _checks_only_run(embedder_fingerprint, "shop-docs")
    assert other.success and other.get_asset_check_evaluations()[0].passed
