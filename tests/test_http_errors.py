"""The HTTP server's error statuses, each caused for real and read with a real HTTP client
(http.client): 409 when the query embedder cannot embed for the published generation, 503 when
the published generation cannot be read (a corrupt CURRENT) or a store cannot be opened, 404 when
/v1/paths names a symbol the generation does not hold, and 200 with the channel reported `stale`
when only the graph is unreachable. An error answer is always a
status and a JSON body `{"error": {"code", "message"}}`, never a connection closed without a
response."""
from __future__ import annotations

import http.client
import json
import shutil
import socket
from contextlib import contextmanager

import pytest

from mtrag_resources.publish.manifest import current_path, load_current, publish
from mtrag_resources.serving.reader import IndexReader
from tests.build_helpers import build, settings
from tests.http_helpers import running_server

pytestmark = [pytest.mark.integration, pytest.mark.neo4j]


@contextmanager
def serving(home):
    reader = IndexReader(home=str(home), log_proposals=False)
    try:
        with running_server(reader) as server:
            yield server.server_address[1]
    finally:
        reader.close()


def call(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        data = json.dumps(body) if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        assert resp.getheader("Content-Type") == "application/json; charset=utf-8"
        return resp.status, json.loads(raw)
    finally:
        conn.close()


def test_409_when_the_published_generation_was_embedded_by_another_model(published):
    s = settings()
    manifest = load_current(s.manifest_dir)
    with serving(published["home"]) as port:
        assert call(port, "POST", "/v1/query", {"text": "apply tax", "mode": "dense"})[0] == 200
        other = json.loads(json.dumps(manifest))
        other["generation"] = manifest["generation"] + 1
        other["embedder"].update(model_id="Qwen/Qwen3-Embedding-0.6B", dim=1024)
        publish(s.manifest_dir, other)
        try:
            for mode in ("dense", "hybrid", "bundles"):  # every mode that embeds the query
                code, body = call(port, "POST", "/v1/query", {"text": "apply tax", "mode": mode})
                assert code == 409 and body["error"]["code"] == "embedder_mismatch", (mode, body)
                message = body["error"]["message"]
                assert message.startswith("the query embedder does not match the published generation's embedder: ")
                assert f"model_id: query {manifest['embedder']['model_id']!r} vs manifest 'Qwen/Qwen3-Embedding-0.6B'" in message
                assert "dim: query 384 vs manifest 1024" in message
            # Channels that need no query vector still answer, from the new generation.
            code, body = call(port, "POST", "/v1/query", {"text": "税率", "mode": "lexical"})
            assert code == 200 and body["generation"] == other["generation"] and body["hits"]
            code, body = call(port, "GET", "/v1/status")
            assert code == 200 and body["generation"] == other["generation"]
        finally:
            publish(s.manifest_dir, manifest)
        code, body = call(port, "POST", "/v1/query", {"text": "apply tax", "mode": "dense"})
        assert code == 200 and body["generation"] == manifest["generation"] and body["hits"]


def test_400_when_sources_names_a_source_the_generation_does_not_hold(published):
    with serving(published["home"]) as port:
        code, body = call(port, "POST", "/v1/query", {"text": "apply tax", "sources": ["shop", "nope", "x" * 200]})
        assert code == 400, body
        assert body == {"error": {"code": "unknown_source", "field": "sources",
                                  "message": f"sources: unknown source id(s) ['nope', '{'x' * 77}...']; the "
                                             "published generation's sources are ['shop', 'shop-docs']"}}
        for mode in ("hybrid", "lexical", "exact", "bundles"):  # refused before any channel runs, in every mode
            code, body = call(port, "POST", "/v1/query", {"text": "apply tax", "mode": mode, "sources": ["Shop"]})
            assert (code, body["error"]["code"], body["error"]["field"]) == (400, "unknown_source", "sources")
        code, body = call(port, "POST", "/v1/query", {"text": "apply tax", "sources": [f"s{i}" for i in range(51)]})
        assert (code, body["error"]["field"]) == (422, "sources") and "the limit is 50" in body["error"]["message"]
        code, body = call(port, "POST", "/v1/query", {"text": "apply tax", "sources": ["shop", "shop"], "k": 5})
        assert code == 200 and body["hits"] and {h["source_id"] for h in body["hits"]} == {"shop"}
        code, body = call(port, "POST", "/v1/query", {"text": "apply tax", "sources": None, "k": 10})
        assert code == 200 and {h["source_id"] for h in body["hits"]} == {"shop", "shop-docs"}


def test_503_while_current_is_corrupt_and_200_once_it_is_repaired(published):
    path = current_path(settings().manifest_dir)
    good = path.read_text()
    with serving(published["home"]) as port:
        assert call(port, "GET", "/v1/status")[0] == 200
        path.write_text("manifest-latest.json\n")  # a hand edit: not a manifest name
        try:
            for method, route, body in (("POST", "/v1/query", {"text": "apply tax"}),
                                        ("POST", "/v1/paths", {"from": "shopcart.cart.Cart.total"}),
                                        ("GET", "/v1/status", None)):
                code, answer = call(port, method, route, body)
                assert code == 503, (route, answer)
                assert answer == {"error": {"code": "unavailable",
                                            "message": f"{path}: unexpected content 'manifest-latest.json'"}}
            assert call(port, "GET", "/healthz") == (200, {"ok": True})  # liveness reads no store
        finally:
            path.write_text(good)
        code, answer = call(port, "POST", "/v1/query", {"text": "shopcart.tax.lookup_rate"})
        assert code == 200 and answer["hits"][0]["symbol"] == "shopcart.tax.lookup_rate"


def test_503_while_the_fts_store_cannot_be_opened_then_recovers(mtrag_env):
    build()
    fts = settings().fts_path
    aside = fts.parent.with_name("06-fts.aside")
    fts.parent.rename(aside)
    (fts).mkdir(parents=True)  # where the database file should be, something SQLite cannot open
    try:
        with serving(mtrag_env["home"]) as port:
            for _ in range(2):  # the same answer each time, not a half-open reader afterwards
                code, answer = call(port, "POST", "/v1/query", {"text": "apply tax", "mode": "lexical"})
                assert code == 503, answer
                assert answer["error"] == {"code": "unavailable",
                                           "message": "store unavailable: OperationalError: unable to open database file"}
                code, answer = call(port, "GET", "/v1/status")
                assert code == 503 and "unable to open database file" in answer["error"]["message"]
            assert call(port, "GET", "/healthz")[0] == 200
            shutil.rmtree(fts.parent)
            aside.rename(fts.parent)
            code, answer = call(port, "POST", "/v1/query", {"text": "shopcart.tax.lookup_rate", "mode": "exact"})
            assert code == 200 and answer["hits"][0]["symbol"] == "shopcart.tax.lookup_rate"
            assert call(port, "GET", "/v1/status")[1]["stale"] == []
    finally:
        if aside.exists():
            shutil.rmtree(fts.parent, ignore_errors=True)
            aside.rename(fts.parent)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens there once the socket is closed


def test_unreachable_graph_is_200_with_the_graph_channel_stale(published, monkeypatch):
    monkeypatch.setenv("NEO4J_URI", f"bolt://127.0.0.1:{_closed_port()}")
    with serving(published["home"]) as port:
        code, status = call(port, "GET", "/v1/status")
        assert code == 200
        stale = {(x["source"], x["store"]): x["reason"] for x in status["stale"]}
        assert set(stale) == {("shop", "neo4j"), ("shop-docs", "neo4j")}
        assert all(reason.startswith("Neo4j unreachable: ") for reason in stale.values())
        code, answer = call(port, "POST", "/v1/query", {"text": "shopcart.tax.lookup_rate", "k": 3})
        assert code == 200 and answer["hits"][0]["symbol"] == "shopcart.tax.lookup_rate"
        assert answer["paths"] == []
        # a scoped query reports what lags among the sources it read, not elsewhere
        code, answer = call(port, "POST", "/v1/query", {"text": "tax rate", "k": 3, "sources": ["shop"]})
        assert code == 200 and {(x["source"], x["store"]) for x in answer["stale"]} == {("shop", "neo4j")}
        code, answer = call(port, "POST", "/v1/paths", {"from": "shopcart.cart.Cart.total"})
        assert code == 200 and answer["paths"] == []
        stale = {(x["source"], x["store"]): x["reason"] for x in answer["stale"]}  # why there is no path
        assert set(stale) == {("shop", "neo4j"), ("shop-docs", "neo4j")}
        assert all(reason.startswith("Neo4j unreachable: ") for reason in stale.values())
        # the FTS store still knows every symbol: an unknown one is "no such symbol", not stale
        code, answer = call(port, "POST", "/v1/paths", {"from": "shopcart.cart.Cart.totl"})
        assert (code, answer["error"]["code"], answer["error"]["field"]) == (404, "unknown_symbol", "from")


def test_404_when_paths_names_a_symbol_the_generation_does_not_hold(published):
    """The CLI's "no such symbol" (with the nearest names), not an empty list that reads as "no
    verified path"; a known symbol with no path is still a 200."""
    with serving(published["home"]) as port:
        code, answer = call(port, "POST", "/v1/paths", {"from": "shopcart.cart.Cart.totl"})
        assert code == 404, answer
        assert answer["error"]["code"] == "unknown_symbol" and answer["error"]["field"] == "from"
        assert answer["error"]["message"].startswith("from 'shopcart.cart.Cart.totl': no such symbol in generation 1; "
                                                     "nearest symbols: shopcart.cart.Cart.total")
        code, answer = call(port, "POST", "/v1/paths", {"from": "shopcart.cart.Cart.total", "to": "shopcart.nowhere"})
        assert (code, answer["error"]["field"]) == (404, "to")
        assert answer["error"]["message"].startswith("to 'shopcart.nowhere': no such symbol")
        code, answer = call(port, "POST", "/v1/paths", {"from": "shopcart.tax.lookup_rate",
                                                        "to": "shopcart.cart.Cart.total"})
        assert code == 200 and answer["paths"] == []  # both exist; lookup_rate calls nothing
