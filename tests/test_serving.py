"""IndexReader over a real published generation: retrieval channels, gate, graph, HTTP."""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from mtrag_resources.publish.manifest import load_current, publish
from mtrag_resources.serving.http import MAX_BODY_BYTES, UnsafeBind, make_server
from mtrag_resources.serving.reader import EmbedderMismatch, IndexReader, QueryError
from tests.build_helpers import settings
from tests.http_helpers import running_server

pytestmark = [pytest.mark.integration, pytest.mark.neo4j]


@pytest.fixture(scope="module")
def reader(published):
    r = IndexReader(home=str(published["home"]), log_proposals=False)
    yield r
    r.close()


HIT_KEYS = {"rank", "chunk_id", "source_id", "source_kind", "file_path", "start_line", "end_line", "symbol",
            "title", "text", "score", "channels", "parent"}


def test_hybrid_query_shape_and_semantic_answer(reader):
    result = reader.query("how is the total price with tax computed", k=5)
    assert result["generation"] == 1 and result["stale"] == []
    assert {"generation", "query", "hits", "bridge", "paths", "bundles", "stale"} <= set(result)
    assert HIT_KEYS <= set(result["hits"][0])
    symbols = [h["symbol"] for h in result["hits"]]
    assert "shopcart.cart.Cart.total" in symbols[:3] or "shopcart.tax.apply_tax" in symbols[:3]
    method = next(h for h in result["hits"] if h["symbol"] == "shopcart.cart.Cart.total")
    assert method["parent"]["symbol"] == "shopcart.cart.Cart"  # hydrated by parent_id, not a scored hit
    assert all(h["parent"] is None or h["parent"]["chunk_id"] != h["chunk_id"] for h in result["hits"])


def _published_qdrant():
    from mtrag_resources.stores.connect import open_published_qdrant
    s = settings()
    return open_published_qdrant(s, load_current(s.manifest_dir)["stores"]["qdrant_snapshot"])


def test_exact_identifier_ranks_first_and_gets_its_true_cosine(reader):
    import shutil

    import numpy as np

    from mtrag_resources.embedding.embedder import Embedder, EmbedderConfig
    result = reader.query("shopcart.tax.lookup_rate", k=5)
    top = result["hits"][0]
    assert top["symbol"] == "shopcart.tax.lookup_rate"
    assert "exact" in top["channels"] and "dense" in top["channels"]
    # The cosine of the query's vector (embedded here, by the published generation's embedder) and
    # the vector the published Qdrant copy stores for the chunk.
    embedder = Embedder(EmbedderConfig(threads=1))
    assert embedder.fingerprint_id == load_current(settings().manifest_dir)["embedder"]["fingerprint_id"]
    qvec = embedder.encode(["shopcart.tax.lookup_rate"])[0]
    store, private = _published_qdrant()
    try:
        stored = store.vectors_for(top["source_kind"], [top["chunk_id"]])[top["chunk_id"]]
    finally:
        store.close()
        shutil.rmtree(private, ignore_errors=True)
    cosine = float(np.dot(qvec, stored) / (np.linalg.norm(qvec) * np.linalg.norm(stored)))
    assert top["cosine"] == pytest.approx(cosine, abs=1e-5)
    exact_only = reader.query("shopcart.tax.lookup_rate", mode="exact")
    assert [h["symbol"] for h in exact_only["hits"]] == ["shopcart.tax.lookup_rate"]
    assert set(exact_only["hits"][0]["channels"]) == {"exact"}


def test_chinese_two_character_query_matches_lexically(reader):
    result = reader.query("税率", mode="lexical")
    symbols = {h["symbol"] for h in result["hits"]}
    assert "shopcart.tax.lookup_rate" in symbols
    assert any(h["source_id"] == "shop-docs" for h in result["hits"])


def test_kind_filter_and_modes(reader):
    docs = reader.query("tax", kind="docs")
    assert docs["hits"] and all(h["source_kind"] == "docs" for h in docs["hits"])
    dense = reader.query("tax", mode="dense")
    # the dense channels only: the default collections and the multilingual one (the docs have Chinese)
    assert dense["hits"] and all(set(h["channels"]) <= {"dense", "dense_ml"} for h in dense["hits"])
    assert any("dense" in h["channels"] for h in dense["hits"])


def test_bridge_from_docs_to_code(reader):
    result = reader.query("apply tax to an amount", kind="docs", k=3)
    bridged = {(b["symbol"], b["relation"]) for b in result["bridge"]}
    assert ("shopcart.tax.apply_tax", "MENTIONS") in bridged
    assert all(b["confidence"] in ("VERIFIED", "INFERRED", "PROPOSED") for b in result["bridge"])


def test_call_paths_verified_with_evidence(reader):
    result = reader.paths("shopcart.cart.Cart.total", rel_types=["CALLS"], max_hops=3)
    chains = [[n["qualified_name"] for n in p["nodes"]] for p in result["paths"]]
    assert ["shopcart.cart.Cart.total", "shopcart.tax.apply_tax", "shopcart.tax.lookup_rate"] in chains
    for p in result["paths"]:
        assert all(e["confidence"] == "VERIFIED" and e["evidence"]["file"] for e in p["edges"])
    incoming = reader.paths("shopcart.tax.lookup_rate", rel_types=["CALLS"], direction="in", max_hops=1)
    assert {p["nodes"][-1]["qualified_name"] for p in incoming["paths"]} == {"shopcart.tax.apply_tax"}
    assert reader.paths("shopcart.tax.lookup_rate", rel_types=["CALLS"], max_hops=2)["paths"] == []
    with pytest.raises(QueryError, match="max_hops"):
        reader.paths("shopcart.tax.lookup_rate", max_hops=50)
    with pytest.raises(QueryError, match="relation"):
        reader.paths("x", rel_types=["DROP"])


def test_bundles_rank_containing_units(reader):
    result = reader.query("tax rate for a region", mode="bundles")
    assert result["bundles"]
    top = result["bundles"][0]
    assert top["unit"] == "src/shopcart/tax.py" and top["best_path"] in ("point", "facet", "direct")
    assert [b["score"] for b in result["bundles"]] == sorted(b["score"] for b in result["bundles"])


@pytest.mark.parametrize("text", ['a" OR 1=1 --', "NEAR(tax rate)", "`lookup_rate`*", "})-[r]-(x) DETACH DELETE x",
                                  "税率 AND (", "{col}:value ^ -x"])
def test_hostile_query_text_is_inert(reader, text):
    before = _store_counts()
    for mode in ("hybrid", "lexical", "exact"):
        result = reader.query(text, mode=mode)
        assert result["generation"] == 1 and result["stale"] == [] and result["query"] == text
        assert {"generation", "query", "hits", "bridge", "paths", "bundles", "stale"} <= set(result)
        assert [h["rank"] for h in result["hits"]] == list(range(1, len(result["hits"]) + 1))
        assert all(HIT_KEYS <= set(h) and h["source_id"] in ("shop", "shop-docs") for h in result["hits"])
        assert all(set(h["channels"]) <= {"dense", "dense_ml", "fts", "fts_en", "exact"} for h in result["hits"])
        if mode == "exact":
            assert all(set(h["channels"]) == {"exact"} for h in result["hits"])
    paths = reader.paths(text)
    assert paths["paths"] == [] and paths["generation"] == 1
    assert _store_counts() == before  # Qdrant points, FTS rows, Neo4j nodes and relationships
    assert reader.status()["stale"] == []
    assert reader.query("shopcart.tax.lookup_rate", mode="exact")["hits"]


def _store_counts() -> dict:
    """Every store the reader reads, counted from outside it: the live Qdrant folder and the
    published copy (points per source), FTS (rows per source), the whole Neo4j database."""
    import shutil

    from mtrag_resources.stores.connect import open_fts, open_neo4j, open_qdrant
    s = settings()
    sources = ("shop", "shop-docs")
    counts = {}
    with open_qdrant(s) as live:
        counts["qdrant_live"] = {(k, sid): live.count(k, sid) for k in ("code", "docs") for sid in sources}
    published, private = _published_qdrant()
    try:
        counts["qdrant_published"] = {(k, sid): published.count(k, sid) for k in ("code", "docs") for sid in sources}
    finally:
        published.close()
        shutil.rmtree(private, ignore_errors=True)
    fts = open_fts(s)
    try:
        counts["fts"] = {sid: fts.counts(sid) for sid in sources}
    finally:
        fts.close()
    neo = open_neo4j(s)
    try:
        counts["neo4j"] = neo.database_counts()
    finally:
        neo.close()
    assert counts["qdrant_published"][("code", "shop")] > 0 and counts["fts"]["shop"]["child_rows"] > 0
    assert counts["neo4j"]["nodes"] > 0
    return counts


def test_bad_requests_raise_query_error(reader):
    for kwargs in ({"text": ""}, {"text": "x", "mode": "sql"}, {"text": "x", "kind": "images"},
                   {"text": "x", "k": 0}, {"text": "x" * (16 * 1024 + 1)}):
        with pytest.raises(QueryError):
            reader.query(**kwargs)


def test_a_scope_is_checked_against_the_published_manifest(reader):
    from mtrag_resources.serving.reader import UnknownSource
    with pytest.raises(UnknownSource, match=r"^sources: unknown source id\(s\) \['nope'\]; the published "
                                            r"generation's sources are \['shop', 'shop-docs'\]$"):
        reader.query("tax", sources=["shop", "nope"])
    for bad, words in (([], "empty"), ([f"s{i}" for i in range(51)], "51 ids; the limit is 50"),
                       (["shop", 3], r"sources\[1\] must be a string"), ("shop", "list of source ids"),
                       ([""], r"sources\[0\] is empty")):
        with pytest.raises(QueryError, match=words):
            reader.query("tax", sources=bad)
    once = [h.chunk_id for h in reader.query("tax", sources=["shop"]).hits]
    assert once and [h.chunk_id for h in reader.query("tax", sources=["shop", "shop"]).hits] == once  # collapsed


def test_status_json_shape(reader):
    status = reader.status()
    assert status["generation"] == 1
    assert set(status["sources"]) == {"shop", "shop-docs"}
    assert set(status["sources"]["shop"]) == {"qdrant", "fts", "neo4j"}
    assert status["sources"]["shop"]["fts"]["state"] == "committed"


@pytest.fixture(scope="module")
def server(reader):
    with running_server(reader) as srv:
        yield f"http://127.0.0.1:{srv.server_address[1]}"


def _call(url, body=None, raw: bytes | None = None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_http_contract(server, reader):
    assert _call(server + "/healthz") == (200, {"ok": True})
    code, status = _call(server + "/v1/status")
    assert code == 200 and status == reader.status()
    code, body = _call(server + "/v1/query", {"text": "shopcart.tax.lookup_rate", "k": 3})
    assert code == 200 and body["hits"][0]["symbol"] == "shopcart.tax.lookup_rate"
    assert body == json.loads(json.dumps(reader.query("shopcart.tax.lookup_rate", k=3) | {"timings_ms": body["timings_ms"]}))
    for bad, field in (({"text": ""}, "text"), ({"text": "x", "mode": "bogus"}, "mode"),
                       ({"text": "x", "evil": 1}, "evil"), ({"k": 3}, "query"), ({"text": "x", "k": True}, "k")):
        code, body = _call(server + "/v1/query", bad)
        assert code == 422 and body["error"]["code"] == "unprocessable" and body["error"]["field"] == field, (bad, body)
    code, body = _call(server + "/v1/query", raw=b"{not json")
    assert code == 400 and body["error"]["code"] == "bad_request"
    assert _call(server + "/v1/query", raw=b"[1]")[0] == 422
    code, body = _call(server + "/v1/query", raw=b'{"text": "' + b"a" * MAX_BODY_BYTES + b'"}')
    assert code == 413 and "limit" in body["error"]["message"]
    assert _call(server + "/../../etc/passwd")[0] == 404
    assert _call(server + "/v1/paths", {"from": "shopcart.cart.Cart.total", "rel": "CALLS"})[1]["paths"]


def test_api_key_required_beyond_loopback(reader):
    with pytest.raises(UnsafeBind, match="MTRAG_API_KEY"):
        make_server(reader, "0.0.0.0", 0)
    with running_server(reader, api_key="s3cret") as srv:
        url = f"http://127.0.0.1:{srv.server_address[1]}/v1/status"
        assert _call(url)[0] == 401
        req = urllib.request.Request(url, headers={"X-API-Key": "s3cret"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200


def test_embedder_mismatch_is_refused(published, reader):
    s = settings()
    manifest = load_current(s.manifest_dir)
    tampered = json.loads(json.dumps(manifest))
    tampered["generation"] = manifest["generation"] + 1
    tampered["embedder"]["model_id"] = "Qwen/Qwen3-Embedding-0.6B"
    tampered["embedder"]["dim"] = 1024
    publish(s.manifest_dir, tampered)
    try:
        with pytest.raises(EmbedderMismatch, match="model_id"):
            reader.query("tax", mode="dense")
        assert reader.query("税率", mode="lexical")["hits"]  # channels without the embedder still serve
    finally:
        publish(s.manifest_dir, manifest)
    assert reader.query("tax", mode="dense")["hits"]


def test_query_embedder_follows_the_published_vector_kind(published, reader, monkeypatch):
    """With MTRAG_EMBED_BACKEND unset, queries are embedded the way the published generation embedded
    its chunks (an fp32 generation keeps serving after the int8 default); a backend set by hand that
    makes another kind of vector is refused, naming it."""
    s = settings()
    manifest = load_current(s.manifest_dir)
    core = reader._core()
    assert reader.query("tax", mode="dense")["hits"]
    assert core.embedder().config.backend == "onnx-int8"  # built with the default
    fp32 = json.loads(json.dumps(manifest))
    fp32["generation"] = manifest["generation"] + 1
    fp32["embedder"]["backend"] = "onnx"
    publish(s.manifest_dir, fp32)
    try:
        assert reader.query("tax", mode="dense")["hits"]
        assert core.embedder().config.backend == "onnx"
        monkeypatch.setenv("MTRAG_EMBED_BACKEND", "onnx-int8")
        with pytest.raises(EmbedderMismatch, match="vectors"):
            reader.query("tax", mode="dense")
    finally:
        monkeypatch.delenv("MTRAG_EMBED_BACKEND", raising=False)
        publish(s.manifest_dir, manifest)
    assert reader.query("tax", mode="dense")["hits"]
    assert core.embedder().config.backend == "onnx-int8"


def test_queries_from_many_threads_at_once_match_the_serial_answers(reader):
    """One reader serves concurrent requests (the HTTP server's threads) without a global lock."""
    queries = [("how is the total price with tax computed", "hybrid"), ("shopcart.tax.lookup_rate", "exact"),
               ("税率", "lexical"), ("tax", "dense"), ("apply tax to the cart", "bundles")]
    serial = {q: [h["chunk_id"] for h in reader.query(q[0], mode=q[1], k=5)["hits"]] for q in queries}
    results, errors = [], []

    def worker(i):
        try:
            for j in range(6):
                q = queries[(i + j) % len(queries)]
                results.append((q, [h["chunk_id"] for h in reader.query(q[0], mode=q[1], k=5)["hits"]]))
        except Exception as exc:  # noqa: BLE001 - any error fails the test below
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and len(results) == 48
    assert all(ids == serial[q] for q, ids in results)


# ------------------------------------------------------------------ scoped queries (last: rebuilds the graph)

FORK = "shop-fork"


@pytest.fixture
def overlapping(mtrag_env):
    """A published home of three sources whose texts overlap: `shop`, `shop-fork` (the same
    package under another root: every identifier, word and call in both) and `shop-docs`, whose
    MENTIONS name symbols both code sources define. Runs after the module's other tests: its
    build replaces the graph the `published` fixture's reader reads."""
    import shutil
    root = mtrag_env["root"]
    shutil.copytree(root / "shop", root / FORK)
    mtrag_env["sources"].write_text(
        "sources:\n"
        "  - {id: shop, kind: code, path: shop, include: [\"src/**/*.py\"]}\n"
        f"  - {{id: {FORK}, kind: code, path: {FORK}, include: [\"src/**/*.py\"]}}\n"
        "  - {id: shop-docs, kind: docs, path: shop-docs}\n")
    from tests.build_helpers import build
    build()
    r = IndexReader(home=str(mtrag_env["home"]), log_proposals=False)
    yield r
    r.close()


def _answer_sources(answer) -> dict[str, set]:
    """The source of every hit, bridge entry, bundle and path node of an answer."""
    from mtrag_resources.serving.graph_queries import node_source as _node_source
    return {"hits": {h["source_id"] for h in answer["hits"]},
            "bridge": {b["source_id"] for b in answer["bridge"]},
            "bundles": {b["source_id"] for b in answer["bundles"]},
            "paths": {_node_source(n) for p in answer["paths"] for n in p["nodes"]}}


MODE_QUERIES = [("hybrid", "apply the regional tax to an amount"), ("dense", "apply the regional tax to an amount"),
                ("lexical", "tax region"), ("exact", "shopcart.tax.apply_tax"), ("bundles", "tax rate for a region")]


def test_a_scoped_query_reads_only_its_sources_in_every_channel(overlapping):
    reader = overlapping
    assert set(reader.status()["sources"]) == {"shop", FORK, "shop-docs"}
    for mode, text in MODE_QUERIES:
        every = _answer_sources(reader.query(text, mode=mode, k=20))
        assert {"shop", FORK} <= every["hits"], (mode, every)  # unscoped: both copies answer
        if mode == "bundles":
            assert {"shop", FORK} <= every["bundles"], every
        for scope in (["shop"], [FORK]):
            answer = reader.query(text, mode=mode, k=20, sources=scope)
            assert answer["hits"] and answer["stale"] == [], (mode, scope, answer["stale"])
            got = _answer_sources(answer)
            for what, found in got.items():
                assert found <= set(scope), (mode, scope, what, found)
            if mode == "bundles":
                assert got["bundles"] == set(scope)
            if mode == "exact":
                assert {h["symbol"] for h in answer["hits"]} >= {"shopcart.tax.apply_tax"}
                assert answer["exact"]["matched"] is True

    # Paths from an exact code anchor whose name both copies define: the scope's own nodes only.
    every = _answer_sources(reader.query("shopcart.cart.Cart.total", k=10))
    assert every["paths"] == {"shop", FORK}, every
    for scope in (["shop"], [FORK]):
        answer = reader.query("shopcart.cart.Cart.total", k=10, sources=scope)
        chains = [[n["qualified_name"] for n in p["nodes"]] for p in answer["paths"]]
        assert ["shopcart.cart.Cart.total", "shopcart.tax.apply_tax", "shopcart.tax.lookup_rate"] in chains
        assert _answer_sources(answer)["paths"] == set(scope) and _answer_sources(answer)["hits"] == set(scope)

    # The doc -> code bridge: each code copy, scoped with the docs, gets its own symbols (the graph's
    # edge when it leads there, else the doc's identifiers resolved in the scope's aliases); the
    # docs alone bridge to nothing (all code is elsewhere).
    every = reader.query("apply tax to an amount", kind="docs", k=3)
    assert every["bridge"] and _answer_sources(every)["bridge"] <= {"shop", FORK}
    for code in ("shop", FORK):
        answer = reader.query("apply tax to an amount", kind="docs", k=3, sources=["shop-docs", code])
        assert _answer_sources(answer)["hits"] == {"shop-docs"}
        assert _answer_sources(answer)["bridge"] == {code}, answer["bridge"]
        assert "shopcart.tax.apply_tax" in {b["symbol"] for b in answer["bridge"]}
    docs_only = reader.query("apply tax to an amount", k=10, sources=["shop-docs"])
    assert _answer_sources(docs_only)["hits"] == {"shop-docs"} and docs_only["bridge"] == []
    # A pasted doc section naming code: the query's own identifiers resolve in the scope only.
    pasted = "Use :func:`shopcart.tax.apply_tax` to add tax\nto an amount, and count items\nwith Cart.item_count.\n"
    for code in ("shop", FORK):
        answer = reader.query(pasted, k=10, sources=[code, "shop-docs"])
        assert _answer_sources(answer)["bridge"] == {code}, answer["bridge"]
        assert _answer_sources(answer)["hits"] <= {code, "shop-docs"}
