"""The HTTP contract: the OpenAPI 3.1 document at GET /openapi.json (serving/openapi.py) is valid
(openapi-spec-validator), names exactly the fields of the result classes (serving/results.py), and
the running server keeps it - every request schemathesis generates from it, valid or not, gets a
documented status and a body its schema allows, never a 500. The unit tests read the error
semantics (statuses, `{"error": {"code", "message", "field"?}}`, `Allow`, the access log) off a
server whose reader is a stub."""
from __future__ import annotations

import dataclasses
import http.client
import json
import socket

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from openapi_spec_validator import validate
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,
                                               status_code_conformance)

from mtrag_resources.serving import http as mhttp
from mtrag_resources.serving import openapi, results
from mtrag_resources.serving.http import make_server
from tests.http_helpers import running_server


# ------------------------------------------------------------------ the document


@pytest.mark.unit
def test_the_document_is_valid_openapi_3_1():
    doc = openapi.document()
    validate(doc)  # raises on an invalid document
    assert doc["openapi"].startswith("3.1")
    assert {path: sorted(m.upper() for m in ops) for path, ops in doc["paths"].items()} == \
        {path: sorted(methods) for path, methods in mhttp.ROUTES.items()}
    assert openapi.MAX_BODY_BYTES == mhttp.MAX_BODY_BYTES
    assert all(callable(getattr(mhttp._Handler, mhttp.ANSWERS[path], None)) for path in mhttp.ROUTES)
    assert openapi.document(4)["components"]["schemas"]["PathsRequest"]["properties"]["max_hops"]["maximum"] == 4
    assert set(mhttp.CODES.values()) <= set(openapi.ERROR_CODES)
    schemas = doc["components"]["schemas"]
    assert set(schemas["QueryRequest"]["properties"]) == mhttp.QUERY_FIELDS
    assert set(schemas["PathsRequest"]["properties"]) == mhttp.PATHS_FIELDS


@pytest.mark.unit
@pytest.mark.parametrize("name", openapi.RESULT_SCHEMAS)
def test_result_schemas_name_the_dataclass_fields(name):
    cls = getattr(results, name)
    schema = openapi.SCHEMAS[name]
    keys = [key for key, _, _, _ in cls._layout]
    always = [key for key, _, _, optional in cls._layout if not optional]
    assert list(schema["properties"]) == keys, name  # the same keys, in the JSON's order
    assert schema["required"] == always, name
    assert schema["additionalProperties"] is True  # `extra` keys (commit_sha, page) are kept
    assert {f.name for f in dataclasses.fields(cls)} - {"extra"} == {attr for _, attr, _, _ in cls._layout}


# ------------------------------------------------------------------ error semantics (stub reader)


class _StubReader:
    max_hops_limit = 6

    def __init__(self):
        self.calls = []

    def status(self):
        return {"generation": None, "sources": {}, "stale": []}

    def query(self, **kwargs):
        self.calls.append(kwargs)
        return {"generation": None, "query": kwargs["text"], "mode": kwargs["mode"], "hits": [], "bridge": [],
                "paths": [], "bundles": [], "stale": [], "channels": {}, "exact": {"identifier": False,
                                                                                   "matched": False},
                "confidence": "low"}

    def paths(self, *args):
        self.calls.append(args)
        if args[0] == "boom":
            raise KeyError("a bug")
        return {"generation": None, "from": args[0], "to": args[1], "paths": [], "stale": []}


def _request(port, method, path, body: bytes | None = None, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        raw = resp.read()
        assert resp.getheader("Content-Type") == "application/json; charset=utf-8", (method, path, raw[:200])
        return resp.status, (json.loads(raw) if raw else None), resp
    finally:
        conn.close()


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(data)
        chunks = []
        while b := sock.recv(65536):
            chunks.append(b)
        return b"".join(chunks)


def _error(body) -> dict:
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]) <= {"code", "message", "field"}
    return body["error"]


JSON = {"Content-Type": "application/json"}


@pytest.mark.unit
def test_statuses_and_error_bodies(capsys):
    reader = _StubReader()
    with running_server(reader) as server:
        port = server.server_address[1]
        code, body, resp = _request(port, "GET", "/v1/query")
        assert (code, _error(body)["code"], resp.getheader("Allow")) == (405, "method_not_allowed", "POST")
        for method in ("PUT", "DELETE", "OPTIONS", "PATCH", "TRACE", "BREW"):
            for path in mhttp.ROUTES:
                code, body, resp = _request(port, method, path)
                assert code == 405 and resp.getheader("Allow") == ", ".join(mhttp.ROUTES[path]), (method, path)
                assert _error(body)["code"] == "method_not_allowed"
            code, body, _ = _request(port, method, "/nowhere")
            assert code == 404 and _error(body)["code"] == "not_found"
        code, body, _ = _request(port, "POST", "/v1/query", b"{not json", JSON)
        assert code == 400 and _error(body)["code"] == "bad_request"
        for raw in (b'{"text": "x", "k": ' + b"9" * 5000 + b"}", b"[" * 50_000 + b"]" * 10_000):
            code, body, _ = _request(port, "POST", "/v1/query", raw, JSON)  # Python's json refuses: not a 500
            assert code == 400 and _error(body)["code"] == "bad_request"
        code, body, _ = _request(port, "POST", "/v1/query", b'{"text": "x"}', {"Content-Type": "text/plain"})
        assert code == 415 and _error(body)["code"] == "unsupported_media_type"
        code, body, _ = _request(port, "POST", "/v1/query", b"a" * (mhttp.MAX_BODY_BYTES + 1), JSON)
        assert code == 413 and _error(body)["code"] == "payload_too_large"
        raw = _raw(port, b"POST /v1/query HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"d\r\n{\"text\": \"x\"}\r\n0\r\n\r\n")
        assert raw.split(b" ", 2)[1] == b"411" and b'"length_required"' in raw
        raw = _raw(port, b"POST /v1/query HTTP/1.1\r\nHost: x\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n{}")
        assert raw.split(b" ", 2)[1] == b"413"  # not int() of 5000 digits (Python refuses: a 500)
        for bad, field, words in (({"k": 3}, "query", "query is missing"), ({"text": "x", "k": True}, "k", "integer"),
                                  ({"text": "x", "k": 1.5}, "k", "integer"), ({"text": "x", "k": 0}, "k", "from 1"),
                                  ({"text": "x", "evil": 1}, "evil", "unknown"), ({"text": ""}, "text", "empty"),
                                  ({"query": 3}, "query", "string"), ({"text": "x", "mode": "bogus"}, "mode", "bogus"),
                                  ({"text": "x", "kind": 1}, "kind", "not one of"),
                                  ({"text": "x", "query": "y"}, "query", "not both")):
            code, body, _ = _request(port, "POST", "/v1/query", json.dumps(bad).encode(), JSON)
            err = _error(body)
            assert (code, err["code"], err.get("field")) == (422, "unprocessable", field), (bad, body)
            assert words in err["message"], (bad, body)
        for bad, field in (({}, "from"), ({"from": "x", "max_hops": True}, "max_hops"),
                           ({"from": "x", "max_hops": 7}, "max_hops"), ({"from": "x", "limit": "10"}, "limit"),
                           ({"from": "x", "rel": "CALLS,NOPE"}, "rel"), ({"from": "x", "rel": [1]}, "rel"),
                           ({"from": "x", "verified_only": 1}, "verified_only"), ({"from": "x", "to": 5}, "to"),
                           ({"from": "x", "direction": "up"}, "direction")):
            code, body, _ = _request(port, "POST", "/v1/paths", json.dumps(bad).encode(), JSON)
            assert (code, _error(body).get("field")) == (422, field), (bad, body)
        code, body, _ = _request(port, "POST", "/v1/query", b"[1]", JSON)
        assert code == 422 and "field" not in _error(body)
        assert reader.calls == []  # nothing invalid reached the reader
        code, body, _ = _request(port, "POST", "/v1/query", b'{"query": "x", "k": 3, "kind": null}')  # no Content-Type: JSON
        assert code == 200 and reader.calls == [{"text": "x", "k": 3, "kind": None, "mode": "hybrid", "sources": None}]
        code, body, _ = _request(port, "POST", "/v1/paths", b'{"from": "a", "rel": "calls, inherits"}', JSON)
        assert code == 200 and reader.calls[-1] == ("a", None, ["CALLS", "INHERITS"], "out", 4, True, 10)
        code, body, _ = _request(port, "POST", "/v1/paths", b'{"from": "boom"}', JSON)
        assert code == 500 and _error(body)["code"] == "internal" and "KeyError" in _error(body)["message"]
        code, body, _ = _request(port, "GET", "/openapi.json")
        assert code == 200 and body == openapi.document()
        code, body, _ = _request(port, "GET", "/healthz?probe=1")
        assert (code, body) == (200, {"ok": True})
    log = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mtrag-http ")]
    assert "mtrag-http 127.0.0.1 GET /v1/query 405 " in log[0] and log[0].endswith("ms")
    assert any(" POST /v1/paths 500 " in line for line in log)
    assert len(log) == 1 + 6 * (len(mhttp.ROUTES) + 1) + 7 + 10 + 9 + 1 + 5  # one line per request


@pytest.mark.unit
def test_sources_shapes_are_422_naming_the_field_and_a_scope_reaches_the_reader():
    """`sources`: null or 1 to 50 non-empty strings; duplicates collapse in order. Whether each id
    is published is the reader's check (a 400, tests/test_http_errors.py)."""
    reader = _StubReader()
    with running_server(reader) as server:
        port = server.server_address[1]
        for sources, words in (([], "empty"), ("shop", "list of source ids"), ([1], "sources[0] must be a string"),
                               (["shop", ""], "sources[1] is empty"), (["  "], "sources[0] is empty"),
                               ({"shop": 1}, "list of source ids"),
                               ([f"s{i}" for i in range(51)], "51 ids; the limit is 50")):
            code, body, _ = _request(port, "POST", "/v1/query", json.dumps({"text": "x", "sources": sources}).encode(),
                                     JSON)
            err = _error(body)
            assert (code, err["code"], err.get("field")) == (422, "unprocessable", "sources"), (sources, body)
            assert words in err["message"], (sources, body)
        assert reader.calls == []
        fifty = [f"s{i}" for i in range(50)]
        for sources, given in ((None, None), (["b", "a", "b"], ["b", "a"]), (fifty, fifty)):
            code, body, _ = _request(port, "POST", "/v1/query", json.dumps({"text": "x", "sources": sources}).encode(),
                                     JSON)
            assert code == 200 and reader.calls[-1]["sources"] == given, body
    schema = openapi.document()["components"]["schemas"]["QueryRequest"]["properties"]["sources"]
    assert (schema["minItems"], schema["maxItems"], schema["type"]) == (1, 50, ["array", "null"])
    assert "unknown_source" in openapi.ERROR_CODES


@pytest.mark.unit
def test_api_key_refusal_is_a_json_401():
    with pytest.raises(mhttp.UnsafeBind):
        make_server(_StubReader(), "0.0.0.0", 0)
    with running_server(_StubReader(), api_key="k") as server:
        port = server.server_address[1]
        code, body, resp = _request(port, "GET", "/openapi.json")
        assert code == 401 and _error(body)["code"] == "unauthorized" and resp.getheader("WWW-Authenticate")
        assert _request(port, "GET", "/openapi.json", headers={"X-API-Key": "k"})[0] == 200


@pytest.mark.unit
def test_the_bearer_scheme_in_any_case_and_healthz_without_a_key():
    with running_server(_StubReader(), api_key="k") as server:
        port = server.server_address[1]
        for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):  # RFC 7235: the scheme is case-insensitive
            assert _request(port, "GET", "/v1/status", headers={"Authorization": f"{scheme} k"})[0] == 200, scheme
        for header in ("bearer wrong", "Basic k", "k", "bearer", "Bearerk"):
            code, body, _ = _request(port, "GET", "/v1/status", headers={"Authorization": header})
            assert (code, _error(body)["code"]) == (401, "unauthorized"), header
        # a liveness probe cannot send a key: /healthz answers without one, and says nothing else
        for method in ("GET", "HEAD"):
            code, body, _ = _request(port, method, "/healthz")
            assert code == 200 and body == ({"ok": True} if method == "GET" else None), method
        assert _request(port, "GET", "/healthz", headers={"Authorization": "Bearer wrong"})[:2] == (200, {"ok": True})
        assert _request(port, "POST", "/healthz")[0] == 405
        assert _request(port, "GET", "/healthz/../v1/status")[0] == 401
    responses = openapi.document()["paths"]["/healthz"]["get"]["responses"]
    assert "401" not in responses and "401" in openapi.document()["paths"]["/v1/status"]["get"]["responses"]


class _PublishedStubReader(_StubReader):
    """A published generation whose graph holds `a.b` and `a.c` only, with no path between them."""

    def paths(self, *args):
        self.calls.append(args)
        return {"generation": 3, "from": args[0], "to": args[1], "paths": [], "stale": []}

    def symbol_lookup(self, name, limit=5):
        return {"generation": 3, "known": name in ("a.b", "a.c"), "nearest": ["a.b", "a.c"]}


@pytest.mark.unit
def test_paths_of_an_unknown_symbol_is_a_404_naming_it():
    with running_server(_PublishedStubReader()) as server:
        port = server.server_address[1]
        code, body, _ = _request(port, "POST", "/v1/paths", b'{"from": "a.x"}', JSON)
        assert code == 404 and _error(body) == {
            "code": "unknown_symbol", "field": "from",
            "message": "from 'a.x': no such symbol in generation 3; nearest symbols: a.b, a.c"}
        code, body, _ = _request(port, "POST", "/v1/paths", b'{"from": "a.b", "to": "a.y"}', JSON)
        assert (code, _error(body)["field"]) == (404, "to") and "'a.y': no such symbol" in _error(body)["message"]
        code, body, _ = _request(port, "POST", "/v1/paths", b'{"from": "a.b", "to": "a.c"}', JSON)
        assert code == 200 and body["paths"] == []  # both exist: no path is an ordinary answer
    assert "unknown_symbol" in openapi.ERROR_CODES
    assert "unknown_symbol" in openapi.document()["paths"]["/v1/paths"]["post"]["responses"]["404"]["description"]


# ------------------------------------------------------------------ the running server (schemathesis)

_CONFIG = schemathesis.Config.from_dict({"generation": {"mode": "all", "max-examples": 30, "deterministic": True,
                                                        "database": "none"}})
schema = schemathesis.openapi.from_dict(openapi.document(), config=_CONFIG)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def base_url(published):
    from mtrag_resources.serving.reader import IndexReader
    reader = IndexReader(home=str(published["home"]), log_proposals=False)
    try:
        with running_server(reader) as server:
            yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        reader.close()


@pytest.mark.integration
@pytest.mark.neo4j
@schema.parametrize()
@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_every_generated_request_gets_a_documented_answer(case, base_url):
    case.call_and_validate(base_url=base_url, checks=CHECKS, timeout=60)
