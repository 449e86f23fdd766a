"""`mtrag mcp`: the reader as an MCP server over stdio (serving/mcp.py), driven by the official SDK's
clients - in process for the protocol and error rules, and over stdio against `.venv/bin/mtrag mcp`
launched on a published home, which must answer from the published generation, report a lagging
store as `stale`, and never import Dagster."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from mtrag_resources.core.errors import StoreError
from mtrag_resources.serving.mcp import make_server
from mtrag_resources.serving.requests import QueryError

MTRAG = Path(sys.executable).with_name("mtrag")
TOOLS = {"search", "paths", "status"}
EMPTY_ANSWER = {"generation": 1, "query": "", "mode": "hybrid", "hits": [], "bridge": [], "paths": [], "bundles": [],
                "stale": [], "channels": {}, "exact": {"identifier": False, "matched": False}, "confidence": "low"}


class FakeReader:
    """Records the calls; refuses what the real reader refuses in the ways the server must handle."""

    def __init__(self):
        self.calls = []

    def query(self, text, k=10, kind=None, mode="hybrid", sources=None):
        self.calls.append(("query", text, k, kind, mode) + ((sources,) if sources is not None else ()))
        if text == "store gone":
            raise StoreError("the FTS store cannot be read")
        if text == "bug":
            raise KeyError("oops")
        return {**EMPTY_ANSWER, "query": text, "mode": mode}

    def paths(self, from_name, to_name=None, rel_types=None, direction="out", max_hops=4, **_):
        self.calls.append(("paths", from_name, to_name, rel_types, direction, max_hops))
        if from_name == "bad":
            raise QueryError("from 'bad' is not a symbol")
        return {"generation": 1, "from": from_name, "to": to_name, "paths": [], "stale": []}

    def symbol_lookup(self, name, limit=5):
        return {"generation": 1, "known": name != "no.such.symbol", "nearest": ["a.b", "a.c"]}

    def status(self):
        self.calls.append(("status",))
        return {"generation": 1, "sources": {}, "stale": []}

    def close(self):
        pass


def _in_process(reader, fn):
    async def main():
        with anyio.fail_after(60):
            async with Client(make_server(reader)) as client:
                return await fn(client)
    return anyio.run(main)


@pytest.mark.unit
def test_three_tools_with_documented_schemas_and_limits():
    tools = _in_process(FakeReader(), lambda c: c.list_tools())
    by_name = {t.name: t for t in tools.tools}
    assert set(by_name) == TOOLS
    for tool in by_name.values():
        assert tool.description and tool.input_schema["type"] == "object"
        assert tool.input_schema["additionalProperties"] is False
        assert all(p.get("description") for p in tool.input_schema["properties"].values()), tool.name
        assert tool.annotations.read_only_hint is True
    search = by_name["search"].input_schema
    assert search["required"] == ["query"]
    assert (search["properties"]["k"]["minimum"], search["properties"]["k"]["maximum"]) == (1, 100)
    assert search["properties"]["query"]["maxLength"] == 16 * 1024
    assert set(search["properties"]["mode"]["enum"]) == {"hybrid", "dense", "lexical", "exact", "bundles"}
    assert set(search["properties"]["kind"]["enum"]) == {"code", "docs", "issues"}
    paths = by_name["paths"].input_schema
    assert paths["required"] == ["from"] and set(paths["properties"]) == {"from", "to", "rel", "direction", "max_hops"}
    assert (paths["properties"]["max_hops"]["minimum"], paths["properties"]["max_hops"]["maximum"]) == (1, 6)
    assert "CALLS" in paths["properties"]["rel"]["items"]["enum"]
    scope = search["properties"]["sources"]
    assert (scope["type"], scope["minItems"], scope["maxItems"], scope["items"]["type"]) == ("array", 1, 50, "string")
    assert by_name["status"].input_schema["properties"] == {}


@pytest.mark.unit
def test_calls_reach_the_reader_with_defaults_and_return_its_json():
    reader = FakeReader()

    async def calls(c):
        return [await c.call_tool("search", {"query": "how do I add tax"}),
                await c.call_tool("search", {"query": "tax", "k": 3, "kind": "docs", "mode": "lexical"}),
                await c.call_tool("search", {"query": "tax", "sources": ["shop", "shop-docs", "shop"]}),
                await c.call_tool("paths", {"from": "a.b", "rel": ["CALLS", "INHERITS"], "direction": "in"}),
                await c.call_tool("status", {})]
    results = _in_process(reader, calls)
    assert [r.is_error for r in results] == [False] * 5
    assert reader.calls == [("query", "how do I add tax", 10, None, "hybrid"), ("query", "tax", 3, "docs", "lexical"),
                            ("query", "tax", 10, None, "hybrid", ["shop", "shop-docs", "shop"]),  # the reader collapses
                            ("paths", "a.b", None, ["CALLS", "INHERITS"], "in", 4), ("status",)]
    assert results[0].structured_content == {**EMPTY_ANSWER, "query": "how do I add tax"}
    assert json.loads(results[0].content[0].text) == results[0].structured_content
    assert results[3].structured_content["from"] == "a.b"
    assert results[4].structured_content == {"generation": 1, "sources": {}, "stale": []}


@pytest.mark.unit
def test_refusals_and_failures_are_tool_errors_with_the_message():
    reader = FakeReader()
    cases = [
        ("search", {"query": "x", "k": 0}, "k must be from 1 to 100"),
        ("search", {"query": "x", "k": 101}, "k must be from 1 to 100"),
        ("search", {"query": "x", "k": "3"}, "k must be an integer"),
        ("search", {"query": "  "}, "query is empty"),
        ("search", {"query": "a" * (16 * 1024 + 1)}, "the limit is 16384 bytes"),
        ("search", {"query": "x", "mode": "fuzzy"}, "mode must be one of"),
        ("search", {"query": "x", "evil": 1}, "unknown argument(s) ['evil']"),
        ("search", {}, "'query' is required"),
        ("search", {"query": "x", "sources": []}, "sources must name at least 1 item"),
        ("search", {"query": "x", "sources": [f"s{i}" for i in range(51)]}, "sources names 51 items; the limit is 50"),
        ("search", {"query": "x", "sources": "shop"}, "sources must be an array"),
        ("search", {"query": "x", "sources": [3]}, "sources[0] must be a string"),
        ("search", {"query": "x", "sources": ["shop", " "]}, "sources[1] is empty"),
        ("paths", {"from": "a", "max_hops": 7}, "max_hops must be from 1 to 6"),
        ("paths", {"from": "a", "rel": ["DROP"]}, "must be one of"),
        ("paths", {"from": "bad"}, "from 'bad' is not a symbol"),        # QueryError from the reader
        # no path because the symbol is unknown: said as `mtrag paths` says it, not an empty list
        ("paths", {"from": "no.such.symbol"},
         "from 'no.such.symbol': no such symbol in generation 1; nearest symbols: a.b, a.c"),
        ("paths", {"from": "a.b", "to": "no.such.symbol"}, "to 'no.such.symbol': no such symbol"),
        ("search", {"query": "store gone"}, "the FTS store cannot be read"),  # another MtragError
        ("search", {"query": "bug"}, "internal error: KeyError"),          # an unexpected failure
        ("nope", {}, "unknown tool 'nope'"),
    ]

    async def calls(c):
        out = [await c.call_tool(name, args) for name, args, _ in cases]
        out.append(await c.call_tool("status", {}))  # still serving after all of that
        return out
    results = _in_process(reader, calls)
    for (name, args, message), result in zip(cases, results):
        assert result.is_error, (name, args)
        assert message in result.content[0].text, (name, args, result.content[0].text)
    assert not results[-1].is_error
    # What the schema refuses never reaches the reader.
    assert [c[:2] for c in reader.calls] == [("paths", "bad"), ("paths", "no.such.symbol"), ("paths", "a.b"),
                                             ("query", "store gone"), ("query", "bug"), ("status",)]


# ------------------------------------------------------------------ over stdio, `.venv/bin/mtrag mcp`


def _stdio(env: dict, errlog_path: Path, fn, cwd: Path):
    async def main():
        with anyio.fail_after(240), open(errlog_path, "w") as errlog:
            params = StdioServerParameters(command=str(MTRAG), args=["mcp"], env=env, cwd=str(cwd))
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    return await fn(session)
    return anyio.run(main)


def _env(**extra) -> dict:
    """This process's environment (MTRAG_HOME, MTRAG_SOURCES, DAGSTER_HOME and NEO4J_URI as the
    fixtures set them, HF_HUB_OFFLINE, the caches) for the server process."""
    return {**os.environ, **extra}


@pytest.mark.integration
@pytest.mark.neo4j
def test_mtrag_mcp_over_stdio_answers_from_the_published_generation(published, tmp_path):
    from mtrag_resources.serving.reader import IndexReader

    async def session(s):
        tools = await s.list_tools()
        search = await s.call_tool("search", {"query": "shopcart.tax.lookup_rate", "k": 3})
        prose = await s.call_tool("search", {"query": "how is the total price with tax computed", "k": 5})
        docs = await s.call_tool("search", {"query": "apply tax to an amount", "kind": "docs", "k": 3,
                                            "mode": "hybrid"})
        paths = await s.call_tool("paths", {"from": "shopcart.cart.Cart.total", "rel": ["CALLS"], "max_hops": 3})
        status = await s.call_tool("status", {})
        bad = await s.call_tool("search", {"query": "x", "k": 500})
        unknown = await s.call_tool("search", {"query": "apply tax", "sources": ["nope", "shop"]})
        scoped = await s.call_tool("search", {"query": "apply tax to an amount", "k": 5, "sources": ["shop-docs"]})
        nowhere = await s.call_tool("paths", {"from": "shopcart.cart.Cart.totl"})
        return tools, search, prose, docs, paths, status, bad, unknown, scoped, nowhere

    errlog = tmp_path / "mcp.stderr"
    tools, search, prose, docs, paths, status, bad, unknown, scoped, nowhere = _stdio(
        _env(PYTHONPROFILEIMPORTTIME="1"), errlog, session, tmp_path)
    assert {t.name for t in tools.tools} == TOOLS and len(tools.tools) == 3
    for r in (search, prose, docs, paths, status):
        assert not r.is_error, r.content[0].text
        assert json.loads(r.content[0].text) == r.structured_content
    answer = search.structured_content
    assert answer["generation"] == 1 and answer["stale"] == []
    top = answer["hits"][0]
    assert top["symbol"] == "shopcart.tax.lookup_rate" and top["file_path"] == "src/shopcart/tax.py"
    assert top["source_id"] == "shop" and top["start_line"] >= 1 and "def lookup_rate" in top["text"]
    assert answer["exact"] == {"identifier": True, "matched": True}
    symbols = [h["symbol"] for h in prose.structured_content["hits"]]
    assert "shopcart.cart.Cart.total" in symbols[:3] or "shopcart.tax.apply_tax" in symbols[:3]
    assert any(b["symbol"] == "shopcart.tax.apply_tax" for b in docs.structured_content["bridge"])
    assert all(h["source_kind"] == "docs" for h in docs.structured_content["hits"])
    # The same JSON as the reader (and `mtrag query --json`), timings aside.
    reader = IndexReader(home=str(published["home"]), log_proposals=False)
    try:
        expected = reader.query("shopcart.tax.lookup_rate", k=3).to_dict()
        assert list(answer) == list(expected)
        assert answer == json.loads(json.dumps(expected | {"timings_ms": answer["timings_ms"]}))
        assert status.structured_content == reader.status().to_dict()
        assert paths.structured_content == reader.paths("shopcart.cart.Cart.total", rel_types=["CALLS"],
                                                        max_hops=3).to_dict()
    finally:
        reader.close()
    chains = [[n["qualified_name"] for n in p["nodes"]] for p in paths.structured_content["paths"]]
    assert ["shopcart.cart.Cart.total", "shopcart.tax.apply_tax", "shopcart.tax.lookup_rate"] in chains
    assert status.structured_content["generation"] == 1 and status.structured_content["stale"] == []
    assert bad.is_error and "k must be from 1 to 100" in bad.content[0].text
    # A scope naming an unpublished source is a tool error naming it and the known ones; a scope
    # to the docs source answers from it alone (its bridge would lead into `shop`: none).
    assert unknown.is_error and "unknown source id(s) ['nope']" in unknown.content[0].text
    assert "['shop', 'shop-docs']" in unknown.content[0].text
    assert not scoped.is_error, scoped.content[0].text
    hits = scoped.structured_content["hits"]
    assert hits and {h["source_id"] for h in hits} == {"shop-docs"}
    assert scoped.structured_content["bridge"] == [] and scoped.structured_content["paths"] == []
    # A symbol the generation does not hold: a tool error saying so, with the nearest symbols, as
    # `mtrag paths` says it - not an empty list of paths.
    assert nowhere.is_error, nowhere.content
    assert nowhere.content[0].text.startswith("from 'shopcart.cart.Cart.totl': no such symbol in generation 1; "
                                              "nearest symbols: shopcart.cart.Cart.total")
    # The whole session of `mtrag mcp` - startup, a dense query, paths - never imported Dagster.
    imported = [line.split("|")[-1].strip() for line in errlog.read_text().splitlines()
                if line.startswith("import time:")]
    assert "mtrag_resources.serving.mcp" in imported and "mtrag_resources.embedding.embedder" in imported
    # ... nor the Dagster layer's modules: only the application room's (the CLI and its parser's parts)
    assert not [m for m in imported if m.split(".")[0] in ("dagster", "dagster_webserver")
                or m.startswith("mtrag_assets.") and not m.startswith("mtrag_assets.app")]
    assert "mtrag_assets.app.cli" in imported


@pytest.mark.integration
@pytest.mark.neo4j
def test_mtrag_mcp_reports_a_lagging_store_as_stale(mtrag_env, tmp_path):
    """A private home (mtrag_env): its FTS store takes a `begin` marker for source `shop` - as a
    build writing the next generation would - and the server answers without shop's FTS rows,
    reporting the channel stale; nothing is restored."""
    from mtrag_resources.core.config import Settings
    from mtrag_resources.stores.fts_store import FtsStore
    from tests.build_helpers import build
    build()
    fts = FtsStore(Settings.from_env().fts_path)
    try:
        FtsStore._set_marker(fts._conn, "shop", "next-generation", "begin", time.time())
        assert fts.marker("shop").state == "begin"
    finally:
        fts.close()

    async def session(s):
        return (await s.call_tool("search", {"query": "lookup_rate region", "mode": "lexical", "k": 5}),
                await s.call_tool("search", {"query": "apply the regional tax", "mode": "dense", "k": 5}),
                await s.call_tool("status", {}))

    lexical, dense, status = _stdio(_env(), tmp_path / "mcp.stderr", session, tmp_path)
    assert not lexical.is_error and not dense.is_error and not status.is_error
    lagging = {"source": "shop", "store": "fts"}
    for r in (lexical, dense, status):
        stale = r.structured_content["stale"]
        assert [{k: s[k] for k in ("source", "store")} for s in stale] == [lagging], stale
        assert stale[0]["reason"]
    assert all(h["source_id"] != "shop" for h in lexical.structured_content["hits"])  # never mixed in
    assert any(h["source_id"] == "shop" for h in dense.structured_content["hits"])  # Qdrant is current
    assert status.structured_content["sources"]["shop"]["fts"]["state"] == "begin"


def _closed_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens there once the socket is closed


@pytest.mark.integration
@pytest.mark.neo4j
def test_mtrag_mcp_paths_without_neo4j_say_the_graph_is_stale(published, tmp_path):
    """Neo4j down: `paths` of a known symbol answers no path and says why in `stale` (the graph
    channel, "Neo4j unreachable"); an unknown symbol is still "no such symbol" (the FTS store
    knows every symbol)."""
    async def session(s):
        return (await s.call_tool("paths", {"from": "shopcart.cart.Cart.total"}),
                await s.call_tool("paths", {"from": "shopcart.cart.Cart.totl"}))

    env = _env(NEO4J_URI=f"bolt://127.0.0.1:{_closed_port()}")
    known, unknown = _stdio(env, tmp_path / "mcp.stderr", session, tmp_path)
    assert not known.is_error, known.content[0].text
    answer = known.structured_content
    assert answer["paths"] == [] and answer["generation"] == 1
    stale = {(x["source"], x["store"]): x["reason"] for x in answer["stale"]}
    assert set(stale) == {("shop", "neo4j"), ("shop-docs", "neo4j")}
    assert all(reason.startswith("Neo4j unreachable: ") for reason in stale.values())
    assert unknown.is_error and "no such symbol in generation 1" in unknown.content[0].text
