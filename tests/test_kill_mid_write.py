"""`mtrag build` killed with SIGKILL partway through writing a store's data: the Neo4j projection of
a changed source has committed its first write transaction (the new and changed nodes) but not
the relationships nor its `committed` marker (fault point `neo4j:after_batch`). The published
generation does not move, the reader serves it without taking anything from the half-written
graph, and the next `mtrag build` converges.

Real processes throughout: the build runs as `.venv/bin/mtrag build` and dies by its own SIGKILL."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from mtrag_resources.publish.manifest import current_path, load_current
from mtrag_resources.serving.reader import IndexReader
from mtrag_resources.stores.connect import open_fts, open_neo4j
from tests.build_helpers import build, settings

pytestmark = [pytest.mark.integration, pytest.mark.neo4j, pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGKILL fault points")]

REPO = Path(__file__).resolve().parents[1]
MTRAG = str(Path(sys.executable).with_name("mtrag"))
TOKEN = "midwritetoken"
NEW_FUNCTION = f'''

def discount_rate(region: str) -> float:
    """Loyalty discount ({TOKEN}): half the regional tax rate."""
    return lookup_rate(region) / 2
'''


def _mtrag(*args: str, fault: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MTRAG_FAULT", "MTRAG_FAULT_SIGNAL")}
    if fault:
        env["MTRAG_FAULT"] = fault
    return subprocess.run([MTRAG, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _graph_counts(source_id: str) -> dict:
    neo = open_neo4j(settings())
    try:
        return {"counts": neo.counts(source_id), "marker": neo.marker(source_id)}
    finally:
        neo.close()


def test_kill_9_between_neo4j_write_transactions_then_converge(mtrag_env):
    build()
    s = settings()
    before = current_path(s.manifest_dir).read_bytes()
    published = load_current(s.manifest_dir)
    n, expected = published["generation"], published["sources"]["shop"]["chunk_generation"]
    graph_before = _graph_counts("shop")
    assert graph_before["marker"].state == "committed"

    tax = mtrag_env["pkg"] / "tax.py"
    tax.write_text(tax.read_text() + NEW_FUNCTION)
    out = _mtrag("build", "--source", "shop", fault="neo4j:after_batch")
    assert out.returncode == -signal.SIGKILL, (out.returncode, out.stderr[-3000:])

    # The kill landed inside the write: the new Function node (and its chunk node) are in Neo4j,
    # the old edges of changed relationships are already deleted, their replacements and the new
    # function's CALLS edge are not created yet, and the marker still says `begin`.
    graph = _graph_counts("shop")
    assert graph["marker"].state == "begin" and graph["marker"].generation != expected
    nodes, nodes_before = graph["counts"]["nodes"], graph_before["counts"]["nodes"]
    assert nodes.get("Function", 0) == nodes_before.get("Function", 0) + 1
    assert graph["counts"]["chunks"] > graph_before["counts"]["chunks"]
    rels, rels_before = graph["counts"]["relationships"], graph_before["counts"]["relationships"]
    assert rels.get("CALLS") == rels_before["CALLS"]
    assert sum(rels.values()) < sum(rels_before.values())

    # Nothing was published, and the reader serves generation N without mixing: the half-written
    # graph of `shop` is stale, so its paths are dropped even where the old edges are still there.
    assert current_path(s.manifest_dir).read_bytes() == before
    reader = IndexReader(home=str(mtrag_env["home"]), log_proposals=False)
    try:
        status = reader.status()
        assert status["generation"] == n
        stale = {(x["source"], x["store"]): x["reason"] for x in status["stale"]}
        assert stale[("shop", "neo4j")].startswith("write in progress (begin")
        assert f"published generation is {expected}" in stale[("shop", "neo4j")]
        assert not any(src == "shop-docs" for src, _ in stale)
        assert reader.paths("shopcart.cart.Cart.total")["paths"] == []
        assert reader.paths("shopcart.tax.discount_rate")["paths"] == []
        for mode in ("hybrid", "lexical", "dense"):
            answer = reader.query(f"loyalty discount {TOKEN}", mode=mode, k=10)
            assert answer["generation"] == n
            assert not any(TOKEN in h["text"] or h["symbol"] == "shopcart.tax.discount_rate"
                           for h in answer["hits"]), mode
        dense = reader.query("apply the regional tax to an amount", mode="dense", k=5)
        assert any(h["symbol"] == "shopcart.tax.apply_tax" for h in dense["hits"])

        # The killed build's run is left STARTED in the instance; the next build marks it failed.
        instance = dg.DagsterInstance.get()
        dead = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
        assert len(dead) == 1 and dead[0].tags.get("dagster/partition") == "shop"

        out = _mtrag("build")
        assert out.returncode == 0, out.stderr[-3000:]
        assert "built ['shop']" in out.stdout and f"published generation {n + 1}" in out.stdout
        assert "released 1 run(s) of build processes that died" in out.stdout
        assert instance.get_run_by_id(dead[0].run_id).status == dg.DagsterRunStatus.FAILURE

        # Converged: every store committed the new chunk set and the counts reconcile.
        manifest = load_current(s.manifest_dir)
        assert manifest["generation"] == n + 1
        shop = manifest["sources"]["shop"]
        assert {st: m["state"] for st, m in shop["stores"].items()} == dict.fromkeys(("qdrant", "fts", "neo4j"), "committed")
        graph = _graph_counts("shop")
        assert graph["marker"].state == "committed" and graph["marker"].generation == shop["chunk_generation"]
        assert graph["counts"]["chunks"] == shop["counts"]["chunks"]
        assert graph["counts"]["relationships"]["CALLS"] == graph_before["counts"]["relationships"]["CALLS"] + 1
        fts = open_fts(s)
        try:
            assert fts.counts("shop")["child_rows"] == shop["counts"]["children"]
        finally:
            fts.close()
        assert reader.status()["stale"] == []
        hits = reader.query(TOKEN, mode="lexical")["hits"]
        assert hits and hits[0]["symbol"] == "shopcart.tax.discount_rate"
        chains = [[x["qualified_name"] for x in p["nodes"]] for p in reader.paths("shopcart.tax.discount_rate")["paths"]]
        assert ["shopcart.tax.discount_rate", "shopcart.tax.lookup_rate"] in chains
        assert reader.paths("shopcart.cart.Cart.total")["paths"]
    finally:
        reader.close()
