"""`mtrag build`: its options, the choice between the home's build server and this process, and
the build in this process (the runner's Dagster runs, then what was published). The CLI runs it
for a person; the build server runs it for each request (`run_request`), with a `BuildProcess`
saying what that long-lived process keeps between builds instead of globals it would set."""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import current_path

from mtrag_assets.app.errors import OneLineParser, guarded


@dataclass(frozen=True)
class BuildProcess:
    """What the process running builds keeps between them: tags every build run carries besides
    the runner's (the build server's pid, which the UI filters by), and whether the embedded Qdrant
    stays open (parked) after a build for the next one (closed when another process asks for its lock)."""
    tags: Mapping[str, str] = field(default_factory=dict)
    keep_qdrant: bool = False


ONE_SHOT = BuildProcess()


def add_build_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", action="append", metavar="ID",
                   help="build only this source id of the sources file (repeatable; default: every changed source)")
    p.add_argument("--force", action="store_true", help="rebuild every source even when nothing changed")
    p.add_argument("--accept-quality-drop", action="store_true",
                   help="publish even if the golden-query gate refuses the generation (recorded in the manifest)")
    p.add_argument("--no-server", action="store_true",
                   help="build in this process, and start no build server (MTRAG_BUILD_SERVER=off for one call)")
    p.add_argument("--profile", metavar="NAME",
                   help="build a shadow generation of every source with the overrides of this profile in "
                        "profiles.yaml, into MTRAG_HOME/shadows/NAME; the live CURRENT is not touched (docs/shadow.md)")


def load_specs(settings: Settings):
    """The sources file's specs; a malformed file or entry is refused here. A `path` folder that
    does not exist is that source's error alone, reported by the build (source_problems)."""
    from mtrag_resources.ingest.sources import load_sources
    return load_sources(settings.sources_file)


def server_argv(args) -> list[str]:
    """The build's options as a build server's `mtrag build` takes them."""
    return ([f"--source={sid}" for sid in args.source or []] + ["--force"] * args.force
            + ["--accept-quality-drop"] * args.accept_quality_drop + ["--debug"] * bool(args.debug))


def cmd_build(args, process: BuildProcess | None = None) -> int:
    """`mtrag build`; `process`: what the process running it keeps between builds (ONE_SHOT: nothing)."""
    from mtrag_assets.interrupts import signals_seen
    with signals_seen() as last_signal:
        try:
            return _build(args, process or ONE_SHOT)
        except BaseException as exc:  # noqa: BLE001 - re-raised unless Ctrl-C or SIGTERM stopped the build
            from mtrag_assets.interrupts import exit_code, is_interrupt
            if args.debug or not (is_interrupt(exc) or last_signal() is not None):
                raise
            return _interrupted(exit_code(last_signal()))


def _interrupted(code: int) -> int:
    """One line instead of the run's traceback: what a stopped build leaves. Its sources' dirty
    markers stay (build_state.mark_dirty), so the next build rebuilds what it was writing."""
    import signal
    from mtrag_resources.publish.manifest import load_current
    name = signal.Signals(code - 128).name if code - 128 in signal.valid_signals() else f"signal {code - 128}"
    try:
        generation = (load_current(Settings.from_env().manifest_dir) or {}).get("generation")
    except Exception:  # noqa: BLE001 - the line is said whatever the manifest folder holds
        generation = None
    served = (f"generation {generation} is still the one served" if generation is not None
              else "nothing was published")
    print(f"mtrag: build interrupted ({name}); {served}; the next `mtrag build` converges what this one left",
          file=sys.stderr, flush=True)
    return code


def _build(args, process: BuildProcess) -> int:
    settings = Settings.from_env().ensure()
    if args.profile:  # a shadow generation (docs/shadow.md): built in this process, never by the build server
        from mtrag_assets.app.shadow_cli import build_profile
        return build_profile(args, settings, checked_specs(settings, args), build_here)
    from mtrag_assets.app import build_client
    mode = "off" if args.no_server else build_client.mode()
    specs = checked_specs(settings, args)  # bad input is refused before either path is taken
    if mode == "off":
        print(f"(building in this process: {'--no-server' if args.no_server else 'MTRAG_BUILD_SERVER=off'})",
              flush=True)
    else:  # the home's build server, when one runs for this code and these settings
        code = build_client.build_through_server(settings, server_argv(args))
        if code is not None:
            return code
    # A home with a published generation (its Dagster instance and graph made) gets its server
    # started beside this build, so that it is ready when the user's next change comes; a fresh
    # home's, once this build has made them.
    early = mode == "auto" and current_path(settings.manifest_dir).exists()
    pid = build_client.start_in_background(settings) if early else None
    code = build_here(settings, args, specs, process)
    if code == 0 and mode == "auto" and not early:
        pid = build_client.start_in_background(settings)
    if pid:
        print(f"(started the build server, pid {pid}, for the next builds: it warms up beside this build and "
              f"leaves after {build_client.AUTO_IDLE_TIMEOUT_S // 60} min without one; `mtrag build-server stop` "
              "ends it, MTRAG_BUILD_SERVER=off starts none)", flush=True)
    return code


def checked_specs(settings: Settings, args):
    """The sources file's specs, refused with one line before any build starts: a malformed
    sources or golden file, or a --source id the file does not name."""
    specs = load_specs(settings)
    unknown = sorted(set(args.source or []) - {s.id for s in specs})
    if unknown:
        from mtrag_resources.ingest.sources import SourceConfigError
        raise SourceConfigError(f"{settings.sources_file}: unknown source id(s) {unknown} given with --source; "
                                f"known: {[s.id for s in specs]}")
    from mtrag_resources.publish.golden import load_golden
    golden = load_golden(settings.golden_file)
    if golden is not None:
        golden.unknown_sources(s.id for s in specs)
    return specs


def build_here(settings: Settings, args, specs, process: BuildProcess | None = None) -> int:
    """The build in this process, of the specs checked_specs gave; `process`: as for cmd_build."""
    t0 = time.perf_counter()
    known_changes = None
    if not args.source and not args.force:
        from mtrag_resources.publish.build_state import changed_sources, publish_pending, source_problems
        from mtrag_resources.embedding.embedder import EmbedderConfig, Embedder, fingerprint_id_of
        fp = Embedder(EmbedderConfig.from_env()).fingerprint_without_loading()
        changed, removed = changed_sources(settings, specs, fingerprint_id_of(fp) if fp else None)
        failing = source_problems(settings, [s for s in specs if s.id in changed]) if changed else {}
        if not set(changed) - set(failing) and not removed and not publish_pending(settings):
            # A source that cannot be built (a missing folder) is no change: publishing again would
            # only copy the published generation under a new number, build after build.
            return _nothing_changed(failing, t0, settings=settings, specs=specs)
        if fp:  # taken with the embedder's fingerprint: the build need not scan the sources again
            known_changes = (changed, removed)
    from mtrag_resources.stores.neo4j_server import launch_local_server
    launch_local_server(settings)  # boots while the first source is chunked and embedded
    summary = _run_build_or_refusal(settings, specs, args, process or ONE_SHOT, known_changes)
    if summary.get("unchanged"):  # every source to build failed, and nothing else changed
        return _nothing_changed(summary["failed"], t0, said=True)
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
    if summary.get("failed"):  # sources left out (a broken git entry; the runner printed each why): exit 1
        print(f"mtrag: not built: {sorted(summary['failed'])} (see above)", file=sys.stderr)
        return 1
    return 0


def _nothing_changed(failing: dict[str, str], t0: float, said: bool = False, settings: Settings | None = None,
                     specs=None) -> int:
    """No new generation: exit 0, or 1 naming each source that cannot be built (its why on stderr,
    unless the runner `said` it), which the published generation goes on serving as last built.
    With `settings`, the disk an earlier build left to reclaim is given back first (a home built
    before publishes reclaimed anything would otherwise keep it until something changes)."""
    if settings is not None:
        from mtrag_resources.publish.manifest import load_current
        from mtrag_resources.publish.reclaim import reclaim
        published = (load_current(settings.manifest_dir) or {}).get("sources", {})
        reclaimed = reclaim(settings, {s.id for s in specs} | set(published))["reclaimed"]
        if reclaimed:
            print(f"reclaimed {reclaimed}")
        from mtrag_resources.publish.cas_sweep import sweep
        swept = sweep(settings)["reclaimed"]  # here, where every store holds what the tables say
        if swept:
            print(f"reclaimed {swept}")
    seconds = f"{time.perf_counter() - t0:.2f} s"
    if not failing:
        print(f"nothing changed since the published generation ({seconds})")
        return 0
    if not said:
        for why in failing.values():
            print(f"mtrag: {why}; not built", file=sys.stderr, flush=True)
    print(f"nothing else changed since the published generation ({seconds}); no new generation published")
    print(f"mtrag: not built: {sorted(failing)} (see above)", file=sys.stderr)
    return 1


def _run_build_or_refusal(settings, specs, args, process: BuildProcess, known_changes=None) -> dict:
    """The build; what mtrag refused inside a step (the golden-query gate's refusal, a bad
    `pip_sdist` pin, ...) is reported as that error (one clear message and its exit code) rather
    than as Dagster's step failure around it. Dagster's console log stays silent unless --debug:
    the runner prints each stage, and the full event log is in the instance."""
    from mtrag_assets.runner import run_build
    try:
        return run_build(settings, specs, only=args.source or None, force=args.force,
                         accept_quality_drop=args.accept_quality_drop,
                         console_log_level="WARNING" if args.debug else "CRITICAL", changed=known_changes,
                         extra_tags=dict(process.tags), keep_qdrant=process.keep_qdrant)
    except Exception as exc:  # noqa: BLE001 - re-raised unless mtrag refused something on purpose
        from mtrag_resources.core.errors import MtragError
        cause, seen = exc, set()
        while cause is not None and not isinstance(cause, MtragError) and id(cause) not in seen:
            seen.add(id(cause))
            cause = cause.__cause__ or cause.__context__
        if not isinstance(cause, MtragError) or args.debug:
            raise
        raise cause from None


def run_request(argv: list[str], process: BuildProcess) -> int:
    """`mtrag build --no-server <argv>` for a long-lived process: parsed and ended as the CLI would."""
    parser = OneLineParser(prog="mtrag build")
    parser.add_argument("--debug", action="store_true")
    add_build_arguments(parser)
    try:
        args = parser.parse_args(["--no-server", *argv])
    except SystemExit as exc:  # argparse's refusal (a client of another version), already said
        return exc.code if isinstance(exc.code, int) else 2
    return guarded(lambda: cmd_build(args, process), args.debug)
