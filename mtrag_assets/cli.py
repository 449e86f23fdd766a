"""The `mtrag` command. Heavy imports (Dagster, torch, store clients) happen inside the commands
that need them, so `mtrag build` with nothing changed answers before loading any of them."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from mtrag_resources.core.config import Settings


def _settings() -> Settings:
    return Settings.from_env().ensure()


def _load_specs(settings: Settings):
    from mtrag_resources.ingest.sources import load_sources, validate_roots
    specs = load_sources(settings.sources_file)
    validate_roots(specs, settings.sources_file)
    return specs


def cmd_build(args) -> int:
    t0 = time.perf_counter()
    settings = _settings()
    specs = _load_specs(settings)
    unknown = sorted(set(args.source or []) - {s.id for s in specs})
    if unknown:
        from mtrag_resources.ingest.sources import SourceConfigError
        raise SourceConfigError(f"{settings.sources_file}: unknown source id(s) {unknown} given with --source; "
                                f"known: {[s.id for s in specs]}")
    from mtrag_resources.publish.golden import load_golden
    golden = load_golden(settings.golden_file)  # a malformed golden file fails now, not after the build
    if golden is not None:
        golden.unknown_sources(s.id for s in specs)
    if not args.source and not args.force:
        from mtrag_resources.publish.build_state import changed_sources, publish_pending
        from mtrag_resources.embedding.embedder import EmbedderConfig, Embedder, fingerprint_id_of
        fp = Embedder(EmbedderConfig.from_env()).fingerprint_without_loading()
        changed, removed = changed_sources(settings, specs, fingerprint_id_of(fp) if fp else None)
        if not changed and not removed and not publish_pending(settings):
            print(f"nothing changed since the published generation ({time.perf_counter() - t0:.2f} s)")
            return 0
    from mtrag_resources.stores.neo4j_server import launch_local_server
    launch_local_server(settings)  # boots while the first source is chunked and embedded
    summary = _run_build_or_refusal(settings, specs, args)
    from mtrag_resources.publish.manifest import load_current
    current = load_current(settings.manifest_dir) or {}
    print(f"built {summary['built'] or 'nothing'}; removed {summary['removed'] or 'nothing'}; "
          f"published generation {current.get('generation')} in {time.perf_counter() - t0:.1f} s")
    quality = current.get("quality") or {}
    if quality:
        print(f"golden recall {quality['recall']:.3f} ({quality['recalled']}/{quality['queries']} queries)")
    if quality.get("accepted_drop"):
        print("published despite the golden-query gate (--accept-quality-drop, recorded in the manifest): "
              + "; ".join(quality["accepted_drop"]["reasons"]))
    return 0


def _run_build_or_refusal(settings, specs, args) -> dict:
    """The build; a publish the golden-query gate refused is reported as that refusal (one clear
    message, exit code 1) rather than as Dagster's step failure around it."""
    from mtrag_assets.runner import run_build
    try:
        return run_build(settings, specs, only=args.source or None, force=args.force,
                         accept_quality_drop=args.accept_quality_drop)
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is the gate's refusal
        from mtrag_resources.publish.golden import QualityRefused
        cause, seen = exc, set()
        while cause is not None and not isinstance(cause, QualityRefused) and id(cause) not in seen:
            seen.add(id(cause))
            cause = cause.__cause__ or cause.__context__
        if not isinstance(cause, QualityRefused):
            raise
        raise cause from None


def _reader(args=None):
    from mtrag_resources.serving.reader import IndexReader
    return IndexReader(home=str(_settings().home))


def cmd_query(args) -> int:
    reader = _reader()
    result = reader.query(args.text, k=args.k, kind=args.kind, mode=args.mode)
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False, indent=1))
    else:
        from mtrag_resources.serving.render import render_query
        print(render_query(result))
    return 0


def cmd_paths(args) -> int:
    reader = _reader()
    rels = [r.strip().upper() for r in args.rel.split(",")] if args.rel else None
    result = reader.paths(args.from_name, to_name=args.to, rel_types=rels, direction=args.direction,
                          max_hops=args.max_hops)
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False, indent=1))
    else:
        from mtrag_resources.serving.render import render_paths
        print(render_paths(result))
    return 0


def cmd_status(args) -> int:
    result = _reader().status()
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False, indent=1))
    else:
        from mtrag_resources.serving.render import render_status
        print(render_status(result))
    return 0 if result.get("generation") is not None else 1


def cmd_serve(args) -> int:
    from mtrag_resources.serving.http import serve
    serve(_reader(), host=args.host, port=args.port, api_key=_settings().api_key)
    return 0


def cmd_mcp(args) -> int:
    """MCP over stdio (tools search, paths, status); imports no Dagster (serving/mcp.py)."""
    from mtrag_resources.serving.mcp import serve_stdio
    serve_stdio(_reader())
    return 0


def cmd_neo4j(args) -> int:
    from mtrag_resources.stores import neo4j_server
    settings = _settings()
    result = {"start": neo4j_server.cli_start, "stop": neo4j_server.cli_stop,
              "status": neo4j_server.cli_status}[args.action](settings)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"neo4j: {'running' if result.get('running') else 'not running'}"
              + (f" at {result['uri']}" if result.get("uri") else ""))
    return 0


def cmd_demo(args) -> int:
    from mtrag_assets.demo import run_demo
    return run_demo(_settings())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mtrag", description="Build and query mtrag's retrieval indexes.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build", help="materialise changed sources through Dagster and publish a generation")
    p.add_argument("--source", action="append", metavar="ID", help="build only this source (repeatable)")
    p.add_argument("--force", action="store_true", help="rebuild every source even when nothing changed")
    p.add_argument("--accept-quality-drop", action="store_true",
                   help="publish even if the golden-query gate refuses the generation (recorded in the manifest)")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("query", help="query the published generation")
    p.add_argument("text")
    p.add_argument("--json", action="store_true")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--kind", choices=["code", "docs"])
    p.add_argument("--mode", choices=["hybrid", "dense", "lexical", "exact", "bundles"], default="hybrid")
    p.set_defaults(func=cmd_query)

    p = sub.add_parser("paths", help="verified graph paths from a symbol")
    p.add_argument("--from", dest="from_name", required=True)
    p.add_argument("--to")
    p.add_argument("--rel", help="comma-separated relation types, e.g. CALLS,INHERITS")
    p.add_argument("--direction", choices=["out", "in"], default="out")
    p.add_argument("--max-hops", type=int, default=4)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_paths)

    p = sub.add_parser("status", help="the published generation and each store's marker")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("serve", help="HTTP: POST /v1/query, GET /v1/status, GET /healthz")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("mcp", help="MCP server on stdin/stdout for coding agents: tools search, paths, status")
    p.set_defaults(func=cmd_mcp)

    p = sub.add_parser("neo4j", help="the local Neo4j server (unless NEO4J_URI names another)")
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_neo4j)

    p = sub.add_parser("demo", help="build the demo sources, publish, and print real answers")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from mtrag_resources.core.errors import MtragError
    try:
        return args.func(args)
    except MtragError as exc:
        # What mtrag refuses on purpose is one clear line and the error's exit code (2: bad input
        # or configuration, 75: another build holds the source's lock, 1: anything else).
        print(f"mtrag: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        # `mtrag status | head`: the reader left; say nothing more (and not at exit either)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
