"""The publishing gate refuses while Qdrant or Neo4j lags behind a source's chunk set (FTS lagging
is covered in test_generations.py), CURRENT stays as it was, the reader keeps serving the
published generation and reports the channels that do not match it as `stale`; the next build
converges.

Two ways a store lags, both real: it was not written for the new chunk set (the other stores
were: a build that died or failed before that store's step), or it lost the source (wiped by
hand, or another server)."""
from __future__ import annotations

import pytest

from mtrag_resources.ingest.sources import load_sources
from mtrag_resources.publish.manifest import current_path, latest_number, load_current
from mtrag_resources.serving.reader import IndexReader
from mtrag_resources.stages.canonical_graph import build_canonical_graph
from mtrag_resources.stages.cas_chunks import build_cas_chunks
from mtrag_resources.stages.embedding_cache import build_embedding_cache
from mtrag_resources.stages.fts_db import build_fts_db
from mtrag_resources.stages.index_manifest import PublishRefused, build_index_manifest
from mtrag_resources.stages.neo4j_graph import build_neo4j_graph
from mtrag_resources.stages.qdrant_collection import build_qdrant_collection
from mtrag_resources.stages.raw_source import build_raw_source
from mtrag_resources.stores.connect import open_neo4j, open_qdrant
from tests.build_helpers import build, settings

pytestmark = [pytest.mark.integration, pytest.mark.neo4j]

STORES = ("qdrant", "fts", "neo4j")
TOKEN = "lagtokenq"


def _embedder():
    from mtrag_assets.resources import MtragResource
    return MtragResource().embedder()


def _spec(source_id: str):
    return next(s for s in load_sources(settings().sources_file) if s.id == source_id)


def _edit_tax(env) -> None:
    tax = env["pkg"] / "tax.py"
    tax.write_text(tax.read_text().replace("round to cents.", f"round to cents ({TOKEN})."))


def _advance_shop_except(store: str) -> None:
    """The new chunk set of `shop` through every stage and store but `store`."""
    s, spec = settings(), _spec("shop")
    build_raw_source(s, spec)
    build_cas_chunks(s, spec)
    build_canonical_graph(s, spec)
    build_embedding_cache(s, spec, _embedder())
    writers = {"qdrant": lambda: build_qdrant_collection(s, spec, _embedder()),
               "fts": lambda: build_fts_db(s, spec), "neo4j": lambda: build_neo4j_graph(s, spec)}
    for name, write in writers.items():
        if name != store:
            write()


def _refusal() -> PublishRefused:
    s = settings()
    with pytest.raises(PublishRefused) as info:
        build_index_manifest(s, load_sources(s.sources_file), _embedder())
    return info.value


def _stale(status_or_answer: dict) -> dict[tuple[str, str], str]:
    return {(x["source"], x["store"]): x["reason"] for x in status_or_answer["stale"]}


@pytest.fixture
def built(mtrag_env):
    build()
    s = settings()
    reader = IndexReader(home=str(mtrag_env["home"]), log_proposals=False)
    assert reader.status()["stale"] == []
    try:
        yield {"env": mtrag_env, "reader": reader, "current": current_path(s.manifest_dir).read_bytes(),
               "generation": load_current(s.manifest_dir)["generation"], "latest": latest_number(s.manifest_dir)}
    finally:
        reader.close()


def _assert_nothing_published(built) -> None:
    s = settings()
    assert current_path(s.manifest_dir).read_bytes() == built["current"]
    assert latest_number(s.manifest_dir) == built["latest"]  # not even a manifest-N.json was written


def _assert_converges(built) -> None:
    result = build()
    assert "shop" in result["built"]
    manifest = load_current(settings().manifest_dir)
    assert manifest["generation"] == built["generation"] + 1
    for store in STORES:
        assert manifest["sources"]["shop"]["stores"][store]["state"] == "committed"
    assert built["reader"].status()["stale"] == []


@pytest.mark.parametrize("store", ["qdrant", "neo4j"])
def test_gate_refuses_while_one_store_is_behind_the_new_chunk_set(built, store):
    _edit_tax(built["env"])
    _advance_shop_except(store)
    new_generation = built["reader"].status()  # the stores that moved show the new generation
    refused = _refusal()
    # Exactly one failing check: the markers of `shop`, naming the store that lags and no other.
    assert [(f.source_id, f.name) for f in refused.failures] == [("shop", "markers_committed")]
    description = refused.failures[0].description
    assert f"'{store}'" in description
    assert all(f"'{other}'" not in description for other in STORES if other != store)
    assert "generation not published" in str(refused)
    _assert_nothing_published(built)

    # The reader still serves generation N. The stores that moved ahead are stale for `shop`; the
    # lagging one still holds N, which is what the manifest publishes, so it keeps serving.
    reader = built["reader"]
    status = reader.status()
    assert status["generation"] == built["generation"]
    moved = {("shop", s) for s in ("fts", "neo4j") if s != store}
    assert set(_stale(status)) == moved, status["stale"]
    for pair in moved:
        assert "the manifest publishes" in _stale(status)[pair]
    assert new_generation["sources"]["shop"][store]["generation"] == status["sources"]["shop"][store]["generation"]
    answer = reader.query("apply the regional tax to an amount", k=5)
    assert answer["generation"] == built["generation"]
    assert any(h["symbol"] == "shopcart.tax.apply_tax" for h in answer["hits"])
    assert not any(TOKEN in h["text"] for h in answer["hits"])  # nothing of the unpublished chunk set
    assert reader.query(TOKEN, mode="lexical")["hits"] == []
    if store == "qdrant":  # Neo4j moved ahead: the graph of `shop` fails closed
        assert reader.paths("shopcart.cart.Cart.total")["paths"] == []
    else:  # Neo4j still holds N: its verified paths keep serving
        assert reader.paths("shopcart.cart.Cart.total")["paths"]

    _assert_converges(built)
    assert reader.query(TOKEN, mode="lexical")["hits"]


@pytest.mark.parametrize("store", ["qdrant", "neo4j"])
def test_gate_refuses_while_one_store_lost_the_source(built, store):
    s = settings()
    generation = load_current(s.manifest_dir)["sources"]["shop"]["chunk_generation"]
    if store == "qdrant":
        with open_qdrant(s) as q:
            assert q.delete_source("shop") > 0
    else:
        neo = open_neo4j(s)
        try:
            assert neo.delete_source("shop")["deleted_nodes"] > 0
        finally:
            neo.close()
    refused = _refusal()
    failures = {f.name: f.description for f in refused.failures if f.source_id == "shop"}
    assert set(failures) == {"markers_committed", "counts_reconcile"}
    assert {f.source_id for f in refused.failures} == {"shop"}  # shop-docs is untouched
    assert f"'{store}': None" in failures["markers_committed"]
    counted = "qdrant_points': 0" if store == "qdrant" else "neo4j_chunk_nodes': 0"
    assert counted in failures["counts_reconcile"]
    _assert_nothing_published(built)

    reader = built["reader"]
    status = reader.status()
    assert status["generation"] == built["generation"]
    if store == "neo4j":
        # The live graph lost `shop`: its channel is stale and says what the manifest expects.
        assert _stale(status) == {("shop", "neo4j"): f"no marker; the manifest expects generation {generation}"}
        assert status["sources"]["shop"]["neo4j"] == {"generation": None, "state": "missing"}
        assert reader.paths("shopcart.cart.Cart.total")["paths"] == []
        answer = reader.query("shopcart.cart.Cart.total", k=5)
        assert answer["paths"] == []
        assert ("shop", "neo4j") in _stale(answer)
    else:
        # Embedded Qdrant is served from the copy the manifest names, which the live folder's loss
        # cannot touch: the dense channel stays current and keeps answering for `shop`.
        assert status["stale"] == []
        dense = reader.query("apply the regional tax to an amount", mode="dense", k=5)
        assert any(h["source_id"] == "shop" and h["symbol"] == "shopcart.tax.apply_tax" for h in dense["hits"])
    # Nothing changed in the files, yet the next build sees the lost source and rebuilds it.
    _assert_converges(built)


def test_fts_rows_lost_behind_a_committed_marker_are_refused_then_rewritten(built):
    """FTS loses rows while its marker and meta still say committed (a restored backup, a hand
    edit): only the counts show it. The gate refuses on counts_reconcile alone; a build of the
    source rewrites the rows instead of trusting its meta, and publishes."""
    import sqlite3

    from mtrag_resources.stores.connect import open_fts
    from mtrag_resources.stores.fts_store import FtsStore
    s = settings()
    conn = sqlite3.connect(s.fts_path, isolation_level=None, timeout=30)
    try:
        conn.execute("BEGIN IMMEDIATE")
        FtsStore._delete_rids(conn, "SELECT rid FROM chunks WHERE source_id = ? AND role = 'child' "
                                    "ORDER BY rid LIMIT 3", ("shop",))
        conn.execute("COMMIT")
    finally:
        conn.close()
    refused = _refusal()
    assert [(f.source_id, f.name) for f in refused.failures] == [("shop", "counts_reconcile")]
    counts = refused.failures[0].metadata
    assert counts["fts_child_rows"] == counts["chunk_table_children"] - 3
    _assert_nothing_published(built)
    assert build(only=["shop"])["built"] == ["shop"]
    manifest = load_current(s.manifest_dir)
    assert manifest["generation"] == built["generation"] + 1
    fts = open_fts(s)
    try:
        assert fts.counts("shop")["child_rows"] == manifest["sources"]["shop"]["counts"]["children"]
    finally:
        fts.close()
