"""The shadow commands of `mtrag` (docs/shadow.md): `build --profile NAME` and `compare A B`. Kept
apart from cli.py, which only hands them its arguments."""
from __future__ import annotations

import time
from pathlib import Path

from mtrag_resources.core.config import Settings
from mtrag_resources.core.profiles import (LIVE, Profile, applied, environment, load_profile, profiles_path,
                                           read_environment)


def _profile(live: Settings, name: str) -> tuple[Profile, dict]:
    """The profile and the environment its shadow's builds and readers run under."""
    path = profiles_path(live.sources_file)
    profile = load_profile(path, name)
    env = environment(profile, path, live.shadow_home(name), live.sources_file, live.golden_file)
    return profile, env


def _measure(live: Settings, profile: Profile, live_generation: int | None) -> None:
    """A read-time profile's golden ranks on the live generation, kept for its cut-over."""
    from mtrag_resources.core.profiles import serving_block
    from mtrag_resources.publish.cutover import record_measured
    from mtrag_resources.publish.golden import load_golden
    from mtrag_resources.serving.compare import Side
    golden = load_golden(live.golden_file)
    if golden is None or live_generation is None:
        return
    side = Side(profile.name, live.home, read_environment(profile), profile.fusion)
    home = live.shadow_home(profile.name)
    home.mkdir(parents=True, exist_ok=True)
    record = record_measured(home, live_generation, serving_block(profile.as_dict()), golden,
                             _golden_ranks(side, golden))
    print(f"measured its golden queries on live generation {live_generation}: recall "
          f"{record['quality']['recall']:.3f} (what `mtrag cutover {profile.name}` holds to the gate)")


RECORD_NICE = 10


def _record(record, *args) -> None:
    """What the command did, shown in the live instance's Dagster UI (shadow_events.py); a failure
    to record it is said, not raised: the command itself is done. The command's last step runs at a
    lower CPU priority: importing Dagster takes a second or two of CPU, which a server answering
    beside it on the same cores should not wait for (bench/README.md, cut-over under load)."""
    import os
    try:
        os.nice(RECORD_NICE)
    except OSError:
        pass
    try:
        record(*args)
    except Exception as exc:  # noqa: BLE001 - the instance (PostgreSQL, say) may be down
        import sys
        print(f"mtrag: not recorded in the Dagster instance: {type(exc).__name__}: {exc}", file=sys.stderr)


def _published(home) -> bool:
    from mtrag_resources.core.layout import current_path
    return current_path(Settings(home=home).manifest_dir).is_file()


def build_profile(args, live: Settings, specs, build_here) -> int:
    """`mtrag build --profile NAME`: every source built through the same path as a live build
    (`build_here`, in this process) into the shadow's home; the live CURRENT is not touched."""
    from mtrag_resources.publish.manifest import load_current
    from mtrag_resources.publish.shadow_home import prepare
    profile = load_profile(profiles_path(live.sources_file), args.profile)
    if args.source:
        from mtrag_resources.core.errors import ConfigError
        raise ConfigError("--profile builds every source (a shadow is a whole generation); drop --source")
    from mtrag_resources.publish.cutover import serves_shadow
    live_generation = (load_current(live.manifest_dir) or {}).get("generation")
    if serves_shadow(live, Settings(home=live.shadow_home(profile.name))) is not None:
        from mtrag_resources.core.errors import ConfigError
        raise ConfigError(f"live generation {live_generation} is served from {profile.name}'s shadow stores (a "
                          "cut-over): a live `mtrag build` builds with its settings now, or `mtrag rollback` first")
    if profile.read_time_only:
        print(f"{profile.name} changes only how a generation is read (fusion weights, ranker): it has no index "
              f"of its own to build. `mtrag compare live {profile.name}` reads the live generation with it, and "
              f"`mtrag cutover {profile.name}` serves it; live CURRENT unchanged (generation {live_generation})")
        _measure(live, profile, live_generation)
        return 0
    env = _profile(live, args.profile)[1]
    home, seeded = prepare(live, profile.as_dict())
    said = ", ".join(f"{n} {folder}" for folder, n in seeded.items())
    print(f"(shadow {profile.name}: building in this process into {home}"
          + (f"; linked the live home's {said}" if seeded else "") + ")", flush=True)
    with applied(env):
        code = build_here(Settings.from_env().ensure(), args, specs)
    shadow = load_current(Settings(home=home).manifest_dir)
    if code == 0 and shadow:
        from mtrag_assets.shadow_events import record_shadow_build
        _record(record_shadow_build, live, profile.as_dict(), shadow)
    print(f"live CURRENT unchanged (generation {live_generation}); compare with `mtrag compare live {profile.name}`")
    return code


def cmd_compare(args) -> int:
    from mtrag_resources.core.errors import ConfigError, NotPublished
    from mtrag_resources.serving import compare
    live = Settings.from_env()
    if args.a == args.b:
        raise ConfigError(f"compare {args.a} {args.b}: name two different generations (live or profile names)")
    if not _published(live.home):
        raise NotPublished(f"{LIVE}: {live.home} has no published generation; run mtrag build")
    sides = [_side(live, name) for name in (args.a, args.b)]
    report = compare.compare(sides[0], sides[1], _queries(live, args.queries))
    print(compare.render(report))
    from mtrag_assets.shadow_events import record_comparison
    _record(record_comparison, live, report, compare.markdown(report))
    if args.out:
        written = compare.write(report, Path(args.out))
        print(f"wrote {written['json']} and {written['markdown']}")
    return 0


def _queries(live: Settings, given: str | None):
    """The query set of `--queries` (the golden file's format, or `mtrag serve`'s query log), or
    the golden file."""
    from mtrag_resources.core.errors import ConfigError
    from mtrag_resources.publish.golden import load_golden
    path = Path(given) if given else live.golden_file
    if path.suffix == ".jsonl" and path.is_file():  # `mtrag serve`'s query log (MTRAG_QUERY_LOG)
        from mtrag_resources.serving.query_log import logged_queries
        return logged_queries(path)
    golden = load_golden(path)
    if golden is None:
        raise ConfigError(f"{path}: no such query file (golden format: docs/retrieval.md#golden-queries); "
                          "give one with --queries FILE")
    return golden


def _side(live: Settings, name: str):
    """What `compare` reads for `name`: the live generation; a profile's shadow; or, for a profile
    that changes only read-time settings and has no shadow built, the live generation read with them."""
    from mtrag_resources.core.errors import NotPublished
    from mtrag_resources.serving.compare import Side
    if name == LIVE:
        return Side(LIVE, live.home)
    profile = load_profile(profiles_path(live.sources_file), name)
    if _published(live.shadow_home(name)):
        return Side(name, live.shadow_home(name), _profile(live, name)[1], profile.fusion)
    if profile.read_time_only:
        print(f"({name}: no shadow built; its overrides are read-time only, so the live generation is read with them)")
        return Side(name, live.home, read_environment(profile), profile.fusion)
    raise NotPublished(f"{name}: {live.shadow_home(name)} has no published generation; "
                       f"run mtrag build --profile {name}")


def add_compare_parser(command) -> None:
    p = command("compare", "the same queries against two generations: live and a shadow, or two shadows",
                "Run a query set (the golden queries, or --queries FILE in the same format) through the same "
                "reader code against two published generations, `live` or a profile's shadow "
                "(`mtrag build --profile NAME`), and report per query the rank of each expected item, the "
                "top-k overlap and the latency; overall recall@k, MRR and p50/p95; the queries worse on the "
                "second, worst first. docs/shadow.md.")
    p.add_argument("a", metavar="A", help="`live` or a profile name")
    p.add_argument("b", metavar="B", help="`live` or a profile name")
    p.add_argument("--queries", metavar="FILE",
                   help="queries in the golden file's format (default: the golden file), or a query log "
                        "(*.jsonl, MTRAG_QUERY_LOG) whose questions are compared by overlap and latency")
    p.add_argument("--out", metavar="DIR", help="also write compare.json and compare.md into DIR")
    p.set_defaults(func=cmd_compare)


def cmd_cutover(args) -> int:
    """`mtrag cutover NAME`: the shadow's generation (or, for a profile of read-time settings with
    no shadow built, the live one read with them) becomes live if the golden gate passes on it,
    read with its profile (publish/cutover.py)."""
    from mtrag_resources.core.profiles import serving_block
    from mtrag_resources.publish import cutover
    from mtrag_resources.publish.golden import load_golden
    from mtrag_resources.publish.manifest import load_current
    live = Settings.from_env()
    profile = load_profile(profiles_path(live.sources_file), args.name)
    shadow = Settings(home=live.shadow_home(args.name)) if _published(live.shadow_home(args.name)) else None
    if shadow is None and not profile.read_time_only:
        from mtrag_resources.core.errors import NotPublished
        raise NotPublished(f"{args.name}: {live.shadow_home(args.name)} has no published generation; "
                           f"run mtrag build --profile {args.name}")
    serving = serving_block(profile.as_dict())
    golden = load_golden(live.golden_file)
    ranks, how = None, "no golden file"
    t0 = time.perf_counter()
    if golden is not None:
        if shadow:
            ranks = cutover.gated_ranks(load_current(shadow.manifest_dir), golden, serving)
        else:
            ranks = cutover.measured_ranks(live.shadow_home(args.name),
                                           load_current(live.manifest_dir)["generation"], golden, serving)
        how = "the golden ranks measured by its build" if ranks is not None else "golden queries asked"
        if ranks is None:  # the reader is imported only here: a cut-over's command is its publish
            ranks = _golden_ranks(_side(live, args.name), golden)
    t1 = time.perf_counter()
    manifest = cutover.promote(live, shadow, serving, golden, ranks, args.accept_quality_drop)
    t2 = time.perf_counter()
    from mtrag_assets.shadow_events import record_publish
    _record(record_publish, live, manifest, "cutover")
    quality = manifest.get("quality")
    said = f"golden recall {quality['recall']:.3f}, {how}" if quality else f"no golden file at {live.golden_file}"
    what = f"{args.name}'s generation {manifest['cutover']['shadow_generation']}" if shadow else \
        f"generation {manifest['cutover']['previous']} read with {args.name}"
    print(f"cut over: live generation {manifest['generation']} is {what} ({said}; gate {t1 - t0:.2f} s, "
          f"publish {t2 - t1:.3f} s); `mtrag rollback` restores generation {manifest['cutover']['previous']}")
    return 0


def _golden_ranks(side, golden) -> dict:
    from mtrag_resources.serving.compare import run_side
    _, answers = run_side(side, golden.queries)
    return {q.id: q.rank(answers[q.id].hits) for q in golden.queries}


def cmd_rollback(args) -> int:
    from mtrag_resources.publish import cutover
    live = Settings.from_env()
    manifest = cutover.rollback(live)
    from mtrag_assets.shadow_events import record_publish
    _record(record_publish, live, manifest, "rollback")
    back = manifest["rollback"]
    print(f"rolled back: live generation {manifest['generation']} is generation {back['restored']} again "
          f"(the cut-over to {back['profile']!r}, generation {back['from']}, is no longer served)")
    return 0


def add_cutover_parsers(command) -> None:
    p = command("cutover", "make a shadow's generation the live one, in one step",
                "Publish the shadow of profile NAME (`mtrag build --profile NAME`) as the live home's next "
                "generation, with the same atomic move of CURRENT as a build's publish, if the golden queries "
                "pass the publish gate on it read with the profile's settings; later live builds build with "
                "the profile. `mtrag rollback` undoes it. docs/shadow.md#cut-over.")
    p.add_argument("name", metavar="NAME", help="the profile whose shadow becomes live")
    p.add_argument("--accept-quality-drop", action="store_true",
                   help="cut over even if the golden-query gate refuses (the drop is recorded in the manifest)")
    p.set_defaults(func=cmd_cutover)
    p = command("rollback", "undo the cut-over the live home serves",
                "Publish again the generation the served cut-over replaced (only while CURRENT is the "
                "cut-over itself). docs/shadow.md#cut-over.")
    p.set_defaults(func=cmd_rollback)


def cmd_compare_stores(args) -> int:
    from mtrag_resources.core.errors import ConfigError
    from mtrag_resources.serving import compare_stores
    live = Settings.from_env()
    if not 1 <= args.k <= 100:
        raise ConfigError(f"--k {args.k}: must be 1 to 100")
    url = args.pg_url or _local_postgres(live)
    if not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(f"--pg-url {url!r}: expected postgresql://user:password@host:port/database")
    texts = [q.query for q in _queries(live, args.queries).queries]
    report = compare_stores.compare_stores(live, url, texts, args.k)
    print(compare_stores.render(report))
    if args.out:
        import json
        from mtrag_resources.core.atomic import write_text_atomic
        path = Path(args.out) / "compare-stores.json"
        write_text_atomic(path, json.dumps(report, indent=1))
        print(f"wrote {path}")
    return 0


def _local_postgres(live: Settings) -> str:
    from mtrag_resources.core.errors import ConfigError
    from mtrag_resources.stores.postgres_server import PostgresServer
    state = PostgresServer(live).status()
    if not state.get("running"):
        raise ConfigError("no PostgreSQL to load pgvector into: start this home's with `mtrag postgres start`, "
                          "or give --pg-url")
    return state["url"]


def add_compare_stores_parser(command) -> None:
    p = command("compare-stores", "the published vectors in Qdrant and in pgvector, searched alike",
                "Load the published generation's dense vectors into pgvector on PostgreSQL (HNSW, cosine) "
                "and search both stores with the same query vectors: per collection each store's recall of the "
                "exact nearest neighbours, the overlap of their top k, search latency, and pgvector's load and "
                "index time and size. The tables are dropped afterwards. docs/shadow.md#store-comparison.")
    p.add_argument("--pg-url", metavar="URL", help="the PostgreSQL to load into (default: this home's "
                                                   "`mtrag postgres` server, if it runs)")
    p.add_argument("--queries", metavar="FILE",
                   help="the questions: the golden file's format or a query log (*.jsonl); default the golden file")
    p.add_argument("--k", type=int, default=10, help="neighbours per query (1-100)")
    p.add_argument("--out", metavar="DIR", help="also write compare-stores.json into DIR")
    p.set_defaults(func=cmd_compare_stores)
