"""The OpenAPI 3.1 document of the HTTP front (`GET /openapi.json`): every route, its request body
and every response, the error body included.

Written out as a plain dict and kept in sync with `serving/results.py` by a unit test
(tests/test_http_contract.py compares each result schema's property names with the dataclass's
JSON keys, and its `required` with the keys `to_dict()` always writes) and with `serving/http.py`
by a contract test that drives the running server with generated requests (schemathesis).
Result objects allow additional properties: `to_dict()` keeps keys a class does not name yet
after the named ones."""
from __future__ import annotations

import copy

from mtrag_resources.serving.requests import (DEFAULT_PATH_RELATIONS, KINDS, MAX_K, MAX_QUERY_BYTES, MAX_SOURCES,
                                             MODES, PATH_RELATIONS)

MAX_HOPS = 6  # the reader's default max_hops_limit
MAX_PATHS_LIMIT = 100
MAX_BODY_BYTES = 64 * 1024  # serving/http.py's request body limit (checked equal by the unit test)

ERROR_CODES = ("bad_request", "unauthorized", "not_found", "method_not_allowed", "request_timeout", "conflict",
               "length_required", "payload_too_large", "unsupported_media_type", "unprocessable",
               "too_many_requests", "embedder_mismatch", "unknown_source", "unknown_symbol", "uri_too_long",
               "headers_too_large", "internal", "unavailable", "http_version_not_supported")

_S = {"type": "string"}
_NS = {"type": ["string", "null"]}
_I = {"type": "integer"}
_NI = {"type": ["integer", "null"]}
_N = {"type": "number"}
_ANY = {}
_GEN = {"type": ["integer", "null"], "description": "The published generation answered from (null: nothing is published)."}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(properties: dict, required: list[str], description: str = "", extra: bool = True) -> dict:
    out = {"type": "object", "properties": properties, "required": required, "additionalProperties": extra}
    if description:
        out["description"] = description
    return out


def _array(items: dict, description: str = "") -> dict:
    out = {"type": "array", "items": items}
    if description:
        out["description"] = description
    return out


_PATH = _obj({"nodes": _array({"type": "object"}, "name, qualified_name, node_id, ..."),
              "edges": _array({"type": "object"}, "type, evidence, ..."),
              "hops": _I}, ["nodes", "edges", "hops"], "A verified graph path.")

_TEXT = {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_BYTES, "pattern": "\\S"}

SCHEMAS: dict[str, dict] = {
    "Error": _obj({"error": _obj({
        "code": {"type": "string", "enum": list(ERROR_CODES), "description": "A short machine-readable code."},
        "message": {"type": "string", "description": "What was wrong, naming the input."},
        "field": {"type": "string", "description": "The request field at fault, when there is one."},
    }, ["code", "message"], extra=False)}, ["error"], "Every error answer.", extra=False),
    "Health": _obj({"ok": {"type": "boolean"}}, ["ok"], extra=False),
    "QueryRequest": _obj({
        "text": _TEXT | {"description": "The query (or use `query`): prose, an identifier or a doc section; "
                                        f"at most {MAX_QUERY_BYTES} bytes of UTF-8, no NUL."},
        "query": _TEXT | {"description": "Another name of `text` (give one of them)."},
        "k": {"type": "integer", "minimum": 1, "maximum": MAX_K, "default": 10},
        "kind": {"type": ["string", "null"], "enum": [*KINDS, None], "default": None},
        "mode": {"type": "string", "enum": list(MODES), "default": "hybrid"},
        "sources": {"type": ["array", "null"], "items": {"type": "string", "minLength": 1, "pattern": "\\S"},
                    "minItems": 1, "maxItems": MAX_SOURCES, "default": None,
                    "description": f"Only these published sources (1 to {MAX_SOURCES} source ids of the "
                                   "published generation's manifest; duplicates are collapsed): every channel - "
                                   "dense, full-text, exact, the doc -> code bridge, paths, bundles - reads only "
                                   "them. Absent or null: every published source (a team's key: every source of "
                                   "its team). An id the generation does not hold, or another team's, is a 400 "
                                   "(`unknown_source`, field `sources`) that lists the ones the key may read."},
    }, [], "Exactly one of `text` and `query`.", extra=False) | {
        "oneOf": [{"required": ["text"], "not": {"required": ["query"]}},
                  {"required": ["query"], "not": {"required": ["text"]}}]},
    "PathsRequest": _obj({
        "from": _TEXT | {"description": "The symbol the paths start from (qualified or short name)."},
        "to": {"anyOf": [_TEXT, {"type": "null"}], "default": None},
        "rel": {"anyOf": [_array({"type": "string", "enum": list(PATH_RELATIONS)}),
                          {"type": "string", "description": "Comma-separated relation types."},
                          {"type": "null"}],
                "description": f"Relation types to follow (default {', '.join(DEFAULT_PATH_RELATIONS)}): "
                               + ", ".join(PATH_RELATIONS)},
        "direction": {"type": "string", "enum": ["out", "in"], "default": "out"},
        "max_hops": {"type": "integer", "minimum": 1, "maximum": MAX_HOPS, "default": 4},
        "verified_only": {"type": "boolean", "default": True},
        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_PATHS_LIMIT, "default": 10},
    }, ["from"], extra=False),
    "ChannelRank": _obj({"rank": _I, "score": _N}, ["rank", "score"]),
    "Parent": _obj({"chunk_id": _S, "title": _NS, "symbol": _NS, "start_line": _NI, "end_line": _NI, "text": _NS},
                   ["chunk_id", "title", "symbol", "start_line", "end_line", "text"]),
    "Hit": _obj({"rank": _I, "chunk_id": _S, "source_id": _S, "source_kind": _S, "file_path": _S,
                 "start_line": _NI, "end_line": _NI, "symbol": _NS, "title": _NS, "text": _NS, "score": _N,
                 "cosine": {"type": ["number", "null"]},
                 "channels": {"type": "object", "additionalProperties": _ref("ChannelRank")},
                 "parent": {"anyOf": [_ref("Parent"), {"type": "null"}]},
                 "commit_sha": _S | {"description": "Git sources: the commit of the published snapshot."},
                 "repository": _S | {"description": "Git sources: the repository (its path, or the source's "
                                                    "`repository`)."},
                 "ref": _S | {"description": "Git sources: the ref the source names (branch, tag or sha)."},
                 "page": {"type": "integer", "minimum": 1,
                          "description": "PDF documents: the 1-based page the hit's text is on (absent for "
                                         "other hits)."},
                 "issue_key": _S | {"description": "Issue-tracker exports: the hit's issue (`owner/repo#12`, "
                                                   "`#12`, `PROJ-12`; absent for other hits)."},
                 "state": _S | {"description": "Issue-tracker exports: the issue's state (`open`, `closed`, a "
                                               "Jira status; absent for other hits)."}},
                ["rank", "chunk_id", "source_id", "source_kind", "file_path", "start_line", "end_line", "symbol",
                 "title", "text", "score", "cosine", "channels", "parent"]),
    "BridgeEntry": _obj({"from_chunk_id": _S, "from_title": _NS, "from_rank": _I, "symbol": _NS, "file_path": _NS,
                         "start_line": _NI, "relation": _NS, "confidence": _NS,
                         "evidence": {"type": ["object", "null"]}, "via": _S, "source_id": _NS},
                        ["from_chunk_id", "from_title", "from_rank", "symbol", "file_path", "start_line", "relation",
                         "confidence", "evidence", "via"]),
    "Bundle": _obj({"unit": _S, "source_id": _S, "score": _N, "best_path": _ANY, "cost_path": _ANY,
                    "best_support_id": _ANY, "best_facet_id": _ANY, "best_point_id": _ANY},
                   ["unit", "source_id", "score", "best_path", "cost_path", "best_support_id", "best_facet_id",
                    "best_point_id"]),
    "Stale": _obj({"source": _S, "store": _S, "reason": _S}, ["source", "store", "reason"]),
    "Exact": _obj({"identifier": {"type": "boolean"}, "matched": {"type": "boolean"}}, ["identifier", "matched"]),
    "ChannelCount": _obj({"hits": _I, "embedder": _NS}, ["hits"]),
    "Answer": _obj({
        "generation": _GEN, "query": _S, "mode": _S,
        "hits": _array(_ref("Hit"), "The best chunks, best first (rank 1)."),
        "bridge": _array(_ref("BridgeEntry"), "Code symbols the doc hits or the query name (at most 12).") | {"maxItems": 12},
        "paths": _array(_PATH, "Verified call paths from the best exact code hit."),
        "bundles": _array(_ref("Bundle"), "Scored files (mode `bundles`)."),
        "stale": _array(_ref("Stale"), "Channels left out and why."),
        "channels": {"type": "object", "additionalProperties": _ref("ChannelCount")},
        "exact": _ref("Exact"),
        "confidence": {"type": "string", "enum": ["high", "normal", "low"]},
        "timings_ms": {"type": "object", "additionalProperties": {"type": "number"}},
        "translation": _S | {"description": "The English words a Chinese question was also searched with."},
        "empty_reason": _S | {"description": "Why the answer has no hit (absent when it has one)."},
    }, ["generation", "query", "mode", "hits", "bridge", "paths", "bundles", "stale", "channels", "exact",
        "confidence"], "The answer to a query: the JSON of `mtrag query --json`."),
    "PathsAnswer": _obj({"generation": _GEN, "from": _S, "to": _NS, "paths": _array(_PATH),
                         "stale": _array(_ref("Stale"))},
                        ["generation", "from", "to", "paths", "stale"], "The JSON of `mtrag paths --json`."),
    "StoreState": _obj({"generation": {"type": ["string", "integer", "null"]}, "state": _S}, ["generation", "state"]),
    "Status": _obj({"generation": _GEN,
                    "sources": {"type": "object", "additionalProperties": {
                        "type": "object", "additionalProperties": _ref("StoreState")}},
                    "stale": _array(_ref("Stale")),
                    "quality": {"type": "object"}, "quality_refused": {"type": "object"},
                    "fast_lane": {"type": "object", "description": "the last batch `mtrag watch` applied"},
                    "serving": {"type": "object", "description": "the shadow profile served since `mtrag cutover`"}},
                   ["generation", "sources", "stale"], "The JSON of `mtrag status --json`."),
}

# The result schemas and the results.py classes they describe (checked by the unit test).
RESULT_SCHEMAS = ("ChannelRank", "Parent", "Hit", "BridgeEntry", "Bundle", "Stale", "Exact", "ChannelCount",
                  "Answer", "PathsAnswer", "StoreState", "Status")


def _error(description: str, allow: bool = False) -> dict:
    out = {"description": description, "content": {"application/json": {"schema": _ref("Error")}}}
    if allow:
        out["headers"] = {"Allow": {"schema": {"type": "string"}, "description": "The methods the route takes."}}
    return out


def _ok(schema: str, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": _ref(schema)}}}


_COMMON = {"401": _error("Missing or wrong API key (only when the server has one)."),
           "404": _error("No such route; for /v1/paths also: `from` or `to` names no symbol of the published "
                         "generation (code `unknown_symbol`, field `from` or `to`; the message names the symbol "
                         "and the nearest ones)."),
           "405": _error("The route does not take this method.", allow=True),
           "408": _error("The request's head and body were not read within the server's deadline "
                         "(MTRAG_HTTP_READ_DEADLINE_S); the connection is closed."),
           "429": _error("Too many connections from this client address are waiting to be served; the "
                         "connection is closed unread."),
           "500": _error("A bug in mtrag."),
           "503": _error("The published generation cannot be served now (nothing is published, a store cannot "
                         "be opened, a manifest is unreadable).")}
_BODY = {"400": _error("The body is not JSON."),
         "411": _error("No Content-Length (a chunked body)."),
         "413": _error(f"The body is over {MAX_BODY_BYTES} bytes."),
         "415": _error("The Content-Type is not JSON."),
         "422": _error("Well-formed JSON with an invalid field (`field` names it).")}


def _post(op_id: str, summary: str, request: str, response: str, extra: dict | None = None) -> dict:
    return {"operationId": op_id, "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {"200": _ok(response, summary)} | _BODY | (extra or {}) | _COMMON}


def _get(op_id: str, summary: str, response: str, keyed: bool = True) -> dict:
    common = _COMMON if keyed else {code: answer for code, answer in _COMMON.items() if code != "401"}
    return {"operationId": op_id, "summary": summary, "responses": {"200": _ok(response, summary)} | common}


DOCUMENT: dict = {
    "openapi": "3.1.0",
    "info": {"title": "mtrag", "version": "1",
             "description": "Retrieval over the published generation of mtrag's code and documentation "
                            "indexes. Every error answer is `{\"error\": {\"code\", \"message\", \"field\"?}}`."},
    "paths": {
        "/v1/query": {"post": _post("query", "Search code and docs (the JSON of `mtrag query --json`)",
                                    "QueryRequest", "Answer",
                                    {"400": _error("The body is not JSON, or `sources` names a source the "
                                                   "published generation does not hold or the key may not read "
                                                   "(code `unknown_source`, field `sources`; the message lists "
                                                   "the ones it may)."),
                                     "409": _error("The query embedder does not match the published generation's "
                                                   "(code `embedder_mismatch`).")})},
        "/v1/paths": {"post": _post("paths", "Verified graph paths from a symbol", "PathsRequest", "PathsAnswer")},
        "/v1/status": {"get": _get("status", "The published generation and every store's marker", "Status")},
        "/healthz": {"get": _get("healthz", "Liveness (reads no store; needs no API key, and says nothing but "
                                            "`{\"ok\": true}`)", "Health", keyed=False)},
        "/openapi.json": {"get": {"operationId": "openapi", "summary": "This document",
                                  "responses": {"200": {"description": "The OpenAPI 3.1 document",
                                                        "content": {"application/json": {"schema": {"type": "object"}}}},
                                                "401": _COMMON["401"], "405": _COMMON["405"]}}},
    },
    "components": {
        "schemas": SCHEMAS,
        "securitySchemes": {"apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
                            "bearer": {"type": "http", "scheme": "bearer"}},
    },
}


def document(max_hops: int = MAX_HOPS) -> dict:
    """The document (a fresh copy), with the server's reader's hop limit."""
    doc = copy.deepcopy(DOCUMENT)
    doc["components"]["schemas"]["PathsRequest"]["properties"]["max_hops"]["maximum"] = max_hops
    return doc
