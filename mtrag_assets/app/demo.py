"""`mtrag demo`: build the demo sources through Dagster, publish a generation, and print real
answers: a semantic question, an exact identifier, a docs-to-code bridge, an issue by its key,
a call path, the path from a web route to the code it runs."""
from __future__ import annotations

import time

from mtrag_resources.core.config import Settings

QUESTIONS = [
    ("semantic question", dict(text="how do I prompt the user for a password on the command line", mode="hybrid")),
    ("exact identifier", dict(text="click.core.Context.invoke", mode="hybrid", k=3)),
    ("docs-to-code bridge", dict(text="how do I make a group of commands with subcommands", mode="hybrid", kind="docs", k=5)),
    ("issue", dict(text="#8", mode="hybrid", k=3)),  # data/issues: an issue by its key, and the code it names
]
PATH_FROM = "click.core.Context.invoke"
ROUTE_FROM = "GET /cart"  # data/samples/shop_web: a URL, its handler, what the handler calls


def run_demo(settings: Settings) -> int:
    from mtrag_assets.app.build_command import load_specs
    from mtrag_resources.stores.neo4j_server import launch_local_server
    from mtrag_resources.serving.reader import IndexReader
    from mtrag_resources.serving.render import render_paths, render_query

    t0 = time.perf_counter()
    specs = load_specs(settings)
    launch_local_server(settings)
    from mtrag_assets.runner import run_build
    summary = run_build(settings, specs)
    print(f"\n== build: {summary['built'] or 'nothing changed'} in {time.perf_counter() - t0:.1f} s")
    reader = IndexReader(home=str(settings.home))
    status = reader.status()
    print(f"== published generation {status['generation']}; stale channels: {len(status['stale'])}")
    for label, q in QUESTIONS:
        result = reader.query(**q)
        print(f"\n== {label}")
        print(render_query({**result, "hits": result["hits"][:3]}))
    print(f"\n== call path from {PATH_FROM}")
    print(render_paths(reader.paths(PATH_FROM, rel_types=["CALLS"], max_hops=2)))
    print(f"\n== route path from {ROUTE_FROM}")
    print(render_paths(reader.paths(ROUTE_FROM, max_hops=3)))
    reader.close()
    return 0
