"""MCP server of the reader over stdio (`mtrag mcp`): tools `search`, `paths` and `status`.

Built on the official MCP Python SDK's low-level `Server` (package `mcp`), so each tool's input
schema is written out here with a description and the limits of every parameter, and checked
against the arguments before the reader is asked. Every answer comes from the published
generation only, exactly as `mtrag query --json` / `paths --json` / `status --json` give it (the
tool result's structured content, and the same JSON as its text), `stale` included: a lagging
store is reported there, never mixed in. What mtrag refuses (a bad argument: QueryError; the
query embedder is not the generation's: EmbedderMismatch; a `paths` symbol the generation does not
hold: UnknownSymbol; any MtragError) is a tool error (`isError`) carrying the message, and so is an unexpected failure (its traceback goes to
stderr); the server keeps serving.

A stdio server has no request to carry a key: the process is bound to one team by
MTRAG_MCP_KEY_NAME, the name of an entry of MTRAG_API_KEYS_FILE (serving/api_keys.py), and then
answers exactly as `mtrag serve` answers that team's key (reader.ScopedReader): its sources only.
It binds what the tools answer, not what the process may read: whoever runs it with the home's
files can read them all.

Reader calls run in worker threads (the reader is thread-safe), so a slow query does not stall
the protocol. Imports neither Dagster nor the application: `mtrag mcp` starts in about a second
and loads the embedding model on the first `search`."""
from __future__ import annotations

import json
import sys
import traceback
from typing import Any

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from mtrag_resources.core.config import env
from mtrag_resources.core.errors import ConfigError, MtragError
from mtrag_resources.serving.api_keys import ApiKeys
from mtrag_resources.serving.requests import (DEFAULT_PATH_RELATIONS, KINDS, MAX_K, MAX_QUERY_BYTES, MAX_SOURCES, MODES,
                                             PATH_RELATIONS, QueryError, check_known_symbols)

SERVER_NAME = "mtrag"
MAX_HOPS = 6  # the reader's default max_hops_limit
INSTRUCTIONS = (
    "mtrag searches the published retrieval index of this project's code and documentation. "
    "Use `search` for a question, an identifier (e.g. pkg.module.Class.method) or a pasted doc section; "
    "each hit gives source_id, file_path (relative to the source root), start_line-end_line, symbol and text, "
    "and `bridge` lists the code symbols the matching docs name. Use `paths` for verified call / inheritance "
    "paths between symbols, `status` for the published generation. Answers come from the published "
    "generation only; a channel whose store lags it is left out and listed in `stale`. "
    "`exact.matched: false` or `confidence: \"low\"` means nothing really matched.")

_STALE_SCHEMA = {
    "type": "array",
    "description": "Channels left out of this answer because their store does not hold the published generation "
                   "for a source (source `*`: every source): answers never mix generations.",
    "items": {"type": "object", "properties": {"source": {"type": "string"}, "store": {"type": "string"},
                                               "reason": {"type": "string"}},
              "required": ["source", "store", "reason"]},
}
_GENERATION_SCHEMA = {"type": ["integer", "null"],
                      "description": "The published generation answered from (null: nothing is published)."}

SEARCH = types.Tool(
    name="search",
    title="Search code and docs",
    description=(
        "Search the published index of code and documentation. Hybrid retrieval (dense vectors, full-text, "
        "exact identifiers, fused by weighted reciprocal rank) returns the best `k` chunks, each with "
        "source_id, source_kind, file_path, start_line, end_line, symbol, title, text, score, cosine, the "
        "channels that found it and its parent chunk; `bridge` lists the code symbols the doc hits (or the "
        "query's own prose) name, `paths` call paths from an exact code hit, `stale` the channels left out. "
        "The result is the JSON of `mtrag query --json`."),
    input_schema={
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_BYTES,
                      "description": "What to look for: a question in prose, an identifier (a dotted or "
                                     "snake_case name), or a whole doc section pasted in. Not empty; at most "
                                     f"16 KB ({MAX_QUERY_BYTES} bytes) of UTF-8."},
            "k": {"type": "integer", "minimum": 1, "maximum": MAX_K, "default": 10,
                  "description": f"How many hits to return, best first: 1 to {MAX_K} (default 10)."},
            "kind": {"type": "string", "enum": list(KINDS),
                     "description": "Only hits from sources of this kind: `code`, `docs` or `issues` (default: every kind)."},
            "mode": {"type": "string", "enum": list(MODES), "default": "hybrid",
                     "description": "Which channels answer: `hybrid` (dense + full-text + exact, the default), "
                                    "`dense` (embeddings only), `lexical` (full-text only), `exact` (identifier "
                                    "aliases only), `bundles` (hybrid, plus the best files as scored bundles)."},
            "sources": {"type": "array", "items": {"type": "string", "minLength": 1},
                        "minItems": 1, "maxItems": MAX_SOURCES,
                        "description": f"Only these sources: 1 to {MAX_SOURCES} source ids of the published "
                                       "generation (`status` lists them; duplicates are collapsed). Every channel, "
                                       "the bridge and paths read only them. An unknown id is an error that lists "
                                       "the known ones. Default: every published source."},
        },
        "required": ["query"],
        "additionalProperties": False,
    },
    output_schema={
        "type": "object",
        "properties": {
            "generation": _GENERATION_SCHEMA,
            "query": {"type": "string"}, "mode": {"type": "string"},
            "hits": {"type": "array", "description": "The best chunks, best first (rank 1).",
                     "items": {"type": "object"}},
            "bridge": {"type": "array", "description": "Code symbols the doc hits or the query name (at most 12).",
                       "items": {"type": "object"}},
            "paths": {"type": "array", "items": {"type": "object"}},
            "bundles": {"type": "array", "items": {"type": "object"}},
            "stale": _STALE_SCHEMA,
            "exact": {"type": "object", "description": "identifier: the query is identifier-shaped; matched: a "
                                                       "symbol of that name exists."},
            "confidence": {"type": "string", "enum": ["high", "normal", "low"]},
        },
        "required": ["generation", "query", "hits", "bridge", "paths", "bundles", "stale", "exact", "confidence"],
    },
    annotations=types.ToolAnnotations(title="Search code and docs", read_only_hint=True, idempotent_hint=True,
                                      open_world_hint=False),
)

PATHS = types.Tool(
    name="paths",
    title="Graph paths between symbols",
    description=(
        "Verified paths in the code graph from a symbol (a qualified name such as pkg.module.Class.method, or "
        "a short name), following relations of the given types; each path lists its nodes (name, "
        "qualified_name) and edges (type, evidence: file and line). The result is the JSON of "
        "`mtrag paths --json`. A `from` or `to` that names no symbol of the published generation is an error "
        "naming it and the nearest symbols; while the graph cannot be read, `paths` is empty and `stale` says why."),
    input_schema={
        "type": "object",
        "properties": {
            "from": {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_BYTES,
                     "description": "The symbol the paths start from (qualified or short name); at most "
                                    f"{MAX_QUERY_BYTES} bytes."},
            "to": {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_BYTES,
                   "description": "Only paths that end at this symbol (default: paths to anything)."},
            "rel": {"type": "array", "items": {"type": "string", "enum": list(PATH_RELATIONS)},
                    "minItems": 1, "uniqueItems": True, "default": list(DEFAULT_PATH_RELATIONS),
                    "description": "Relation types to follow, upper case: "
                                   + ", ".join(PATH_RELATIONS) + " (default " + json.dumps(list(DEFAULT_PATH_RELATIONS))
                                   + ": calls, and from a web endpoint such as `GET /login` to its handler)."},
            "direction": {"type": "string", "enum": ["out", "in"], "default": "out",
                          "description": "`out`: what `from` reaches (calls, inherits from); `in`: what reaches "
                                         "`from` (its callers). Default `out`."},
            "max_hops": {"type": "integer", "minimum": 1, "maximum": MAX_HOPS, "default": 4,
                         "description": f"Longest path, in edges: 1 to {MAX_HOPS} (default 4)."},
        },
        "required": ["from"],
        "additionalProperties": False,
    },
    output_schema={
        "type": "object",
        "properties": {
            "generation": _GENERATION_SCHEMA,
            "from": {"type": "string"}, "to": {"type": ["string", "null"]},
            "paths": {"type": "array", "description": "Verified paths: nodes, edges, hops.",
                      "items": {"type": "object"}},
            "stale": _STALE_SCHEMA,
        },
        "required": ["generation", "from", "to", "paths", "stale"],
    },
    annotations=types.ToolAnnotations(title="Graph paths between symbols", read_only_hint=True,
                                      idempotent_hint=True, open_world_hint=False),
)

STATUS = types.Tool(
    name="status",
    title="Index status",
    description=(
        "The published generation, each store's marker (generation, state) per source, and the stale "
        "channels (a store that does not hold the published generation for a source). The result is the "
        "JSON of `mtrag status --json`."),
    input_schema={"type": "object", "properties": {}, "additionalProperties": False},
    output_schema={
        "type": "object",
        "properties": {
            "generation": _GENERATION_SCHEMA,
            "sources": {"type": "object", "description": "source id -> store -> {generation, state}."},
            "stale": _STALE_SCHEMA,
        },
        "required": ["generation", "sources", "stale"],
    },
    annotations=types.ToolAnnotations(title="Index status", read_only_hint=True, idempotent_hint=True,
                                      open_world_hint=False),
)

TOOLS = (SEARCH, PATHS, STATUS)
_BY_NAME = {t.name: t for t in TOOLS}


def check_arguments(tool: types.Tool, arguments: dict[str, Any] | None) -> dict[str, Any]:
    """The arguments with the schema's defaults filled in; QueryError naming the first one that the
    tool's input schema refuses (unknown, missing, wrong type, out of its range)."""
    schema = tool.input_schema
    args = dict(arguments or {})
    props = schema.get("properties", {})
    unknown = sorted(set(args) - set(props))
    if unknown:
        raise QueryError(f"{tool.name}: unknown argument(s) {unknown}; allowed: {sorted(props)}")
    for name in schema.get("required", []):
        if args.get(name) is None:
            raise QueryError(f"{tool.name}: argument {name!r} is required")
    out = {}
    for name, spec in props.items():
        if args.get(name) is None:
            if "default" in spec:
                out[name] = json.loads(json.dumps(spec["default"]))
            continue
        out[name] = _check_value(f"{tool.name}: {name}", spec, args[name])
    return out


def _check_value(label: str, spec: dict, value: Any) -> Any:
    kind = spec.get("type")
    if kind == "string" and not isinstance(value, str):
        raise QueryError(f"{label} must be a string, got {type(value).__name__}")
    if kind == "integer" and (isinstance(value, bool) or not isinstance(value, int)):
        raise QueryError(f"{label} must be an integer, got {value!r}")
    if kind == "array" and not isinstance(value, list):
        raise QueryError(f"{label} must be an array, got {type(value).__name__}")
    if "enum" in spec and value not in spec["enum"]:
        raise QueryError(f"{label} must be one of {spec['enum']}, got {value!r}")
    if "minimum" in spec and value < spec["minimum"] or "maximum" in spec and value > spec["maximum"]:
        raise QueryError(f"{label} must be from {spec['minimum']} to {spec['maximum']}, got {value!r}")
    if kind == "string":
        if len(value) < spec.get("minLength", 0) or not value.strip():
            raise QueryError(f"{label} is empty")
        if "maxLength" in spec and len(value.encode("utf-8")) > spec["maxLength"]:
            raise QueryError(f"{label} is {len(value.encode('utf-8'))} bytes of UTF-8; the limit is "
                             f"{spec['maxLength']} bytes (16 KB)")
    if kind == "array":
        if len(value) < spec.get("minItems", 0):
            raise QueryError(f"{label} must name at least {spec['minItems']} item(s)")
        if "maxItems" in spec and len(value) > spec["maxItems"]:
            raise QueryError(f"{label} names {len(value)} items; the limit is {spec['maxItems']}")
        if spec.get("uniqueItems") and len(set(map(json.dumps, value))) != len(value):
            raise QueryError(f"{label} repeats an item")
        value = [_check_value(f"{label}[{i}]", spec.get("items", {}), v) for i, v in enumerate(value)]
    return value


def answer(reader, name: str, arguments: dict[str, Any] | None) -> dict[str, Any]:
    """The JSON answer of tool `name` (synchronous; raises QueryError / MtragError)."""
    tool = _BY_NAME.get(name)
    if tool is None:
        raise QueryError(f"unknown tool {name!r}; tools: {sorted(_BY_NAME)}")
    args = check_arguments(tool, arguments)
    if name == "search":
        result = reader.query(args["query"], k=args["k"], kind=args.get("kind"), mode=args["mode"],
                              sources=args.get("sources"))
    elif name == "paths":
        result = reader.paths(args["from"], to_name=args.get("to"), rel_types=args["rel"],
                              direction=args["direction"], max_hops=args["max_hops"])
        # a symbol the generation does not hold is a tool error saying so, as `mtrag paths` says it
        check_known_symbols(reader, result, {"from": args["from"], "to": args.get("to")})
    else:
        result = reader.status()
    return result.to_dict() if hasattr(result, "to_dict") else result


def call_tool(reader, name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
    """A tool call's result: the answer as structured content and as JSON text, or a tool error
    (`is_error`) with the message of what went wrong - never an exception."""
    try:
        body = answer(reader, name, arguments)
    except MtragError as exc:
        return _error(str(exc))
    except Exception as exc:  # noqa: BLE001 - a tool error for the client, the traceback for the operator
        traceback.print_exc(file=sys.stderr)
        return _error(f"internal error: {type(exc).__name__}: {exc}")
    return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(body, ensure_ascii=False))],
                                structured_content=body)


def _error(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


def make_server(reader) -> Server:
    """The MCP server (SDK low-level `Server`) answering the three tools from `reader`."""

    async def on_list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=list(TOOLS))

    async def on_call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        return await anyio.to_thread.run_sync(call_tool, reader, params.name, params.arguments)

    return Server(SERVER_NAME, version=_version(), title="mtrag index", instructions=INSTRUCTIONS,
                  get_tool_input_schema=lambda name: _BY_NAME[name].input_schema if name in _BY_NAME else None,
                  on_list_tools=on_list_tools, on_call_tool=on_call_tool)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("mtrag")
    except PackageNotFoundError:
        return "0"


def team_reader(reader):
    """`reader` scoped to the team MTRAG_MCP_KEY_NAME names (unset: `reader`, every source);
    ConfigError for a name the keys file does not hold."""
    name = env("MTRAG_MCP_KEY_NAME")
    if not name:
        return reader
    if not env("MTRAG_API_KEYS_FILE"):
        raise ConfigError(f"MTRAG_MCP_KEY_NAME {name[:80]!r} names a team key, but MTRAG_API_KEYS_FILE is not set")
    return reader.scoped(ApiKeys.from_env().team(name).sources)


async def _serve_stdio(reader) -> None:
    server = make_server(reader)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


def serve_stdio(reader) -> None:
    """Serve MCP on this process's stdin/stdout until the client closes stdin, as the team
    MTRAG_MCP_KEY_NAME names if set; closes `reader`."""
    try:
        anyio.run(_serve_stdio, team_reader(reader))
    except KeyboardInterrupt:
        pass
    finally:
        reader.close()
