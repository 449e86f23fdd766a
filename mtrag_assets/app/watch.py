"""`mtrag watch`: the fast lane. One long-lived process keeps the imports, the embedders and the
Dagster instance loaded, watches the folder sources' files and the git sources' refs, and applies
each batch of changes through the same stages (on the changed files only), gate and publish as a
build, recording each in `journal.jsonl`. A change is a fast-lane batch (fast_lane.py); the
start-up convergence is an in-process run. How it batches, what it keeps and how it recovers:
docs/watch.md."""
from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mtrag_resources.core.config import Settings
from mtrag_resources.core.gc_tuning import collections_after
from mtrag_resources.core.layout import spec_root
from mtrag_resources.ingest.globs import matches_any
from mtrag_resources.ingest.snapshot import load_inventory
from mtrag_resources.ingest.sources import SourceConfigError, SourceSpec, folder_problem
from mtrag_resources.publish.build_state import changed_sources, publish_pending
from mtrag_resources.publish.journal import append_batch
from mtrag_resources.publish.manifest import load_current
from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.core.session import new_session
from mtrag_resources.stores.connect import close_kept_neo4j_drivers, close_parked_qdrant, forget_neo4j_schemas

from mtrag_assets.policies import PLANE_TAG

DEBOUNCE_MS = 200  # the longest a burst of changes is grouped into one batch
# A batch starts once no change came for this long: an editor's save (a write, a rename) and a git
# checkout's files come microseconds to milliseconds apart, and every edit waits this long
# (docs/performance.md#the-fast-lane-and-the-watch).
QUIET_MS = 20
RESCAN_S = 5.0  # a stat walk of the watched sources when no event came for this long
RETRY_S = 30.0  # a convergence run that failed is tried again after this long, or at the next change
# The embedded Qdrant stays open from one batch to the next, and is closed after this long without
# one (or at once when another process waits for its lock: stores/qdrant_folder.wanted_by_another).
KEEP_QDRANT_OPEN_S = 600.0
# How often the loop wakes without a change: to see a lock request, the armed state, a rescan.
LOOP_TICK_MS = 200
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
WATCH_NICE = "10"


def watch_niceness() -> int:
    """The CPU niceness `mtrag watch` adds to its own: MTRAG_WATCH_NICE, 10 unless set (0: none).
    Where `mtrag serve` shares the cores, a batch's stages and its embedding threads then run in
    what the queries leave, instead of taking a core from a query in flight."""
    from mtrag_resources.core.config import env
    from mtrag_resources.core.errors import ConfigError
    raw = env("MTRAG_WATCH_NICE", WATCH_NICE)
    try:
        increment = int(raw)
    except ValueError:
        increment = -1  # refused below with the out-of-range values
    if not 0 <= increment <= 19:
        raise ConfigError(f"MTRAG_WATCH_NICE={raw!r}: not a whole number from 0 to 19 (0: no change)")
    return increment


def _relative(path: Path, root: Path) -> str | None:
    """`path` relative to a source root, or None outside it."""
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        return None


def _named(path: Path, root: Path) -> str | None:
    """`path` relative to a source root as the event named it (a symlink is not followed), or None
    outside it."""
    try:
        return Path(os.path.abspath(path)).relative_to(root).as_posix()
    except ValueError:
        return None


def _taken(specs: list[SourceSpec], roots: dict[str, Path], path: Path) -> bool:
    """Do a watched source's include/exclude globs take `path`?"""
    for spec in specs:
        rel = _relative(path, roots[spec.id])
        if rel is not None and (not spec.include or matches_any(rel, spec.include)) \
                and not matches_any(rel, spec.exclude):
            return True
    return False


def _git_dir(settings: Settings, spec: SourceSpec) -> Path:
    from mtrag_resources.ingest.snapshot import open_git
    with open_git(settings, spec) as repo:
        return repo.control_dir.resolve()


def _ref_file(path: Path, git_dirs: dict[str, Path]) -> bool:
    """Is `path` where a ref moves (refs/..., HEAD, packed-refs) in a watched git folder?"""
    for git_dir in git_dirs.values():
        rel = _relative(path, git_dir)
        if rel is not None and (rel in ("HEAD", "packed-refs") or rel.startswith("refs/")):
            return True
    return False


def _moved_refs(settings: Settings, specs: dict[str, SourceSpec], git_dirs: dict[str, Path],
                paths: set[Path]) -> list[str]:
    """The git sources whose ref now names another commit than their snapshot's."""
    from mtrag_resources.ingest.snapshot import open_git
    moved = []
    for sid, spec in specs.items():
        if not any(_relative(p, git_dirs[sid]) is not None for p in paths):
            continue
        inventory = load_inventory(SourceLayout(settings, sid))
        try:
            with open_git(settings, spec) as repo:
                commit = repo.resolve(spec.ref)
        except Exception:  # noqa: BLE001 - a ref gone for now: the batch build reports it
            continue
        if inventory is None or inventory.commit != commit:
            moved.append(sid)
    return moved


def _commits(settings: Settings, sources: list[str]) -> list[dict]:
    out = []
    for sid in sources:
        inventory = load_inventory(SourceLayout(settings, sid))
        out.append({"source": sid, "commit": inventory.commit if inventory else None})
    return out


def _journal(settings: Settings, sources: list[str], paths: set[Path], roots: dict[str, Path],
             generation, seconds: float, batch_id: str | None = None, commits: list[dict] | None = None,
             stage_seconds: dict | None = None) -> None:
    """`stage_seconds`: a fast-lane batch's seconds per asset ("<source>/<asset>", and the global
    assets by name; each with its checks) and of the links resolved beside the store writes
    ("links/prepare"), so that where a batch's time goes is on record."""
    files = []
    for sid in sources:
        inventory = load_inventory(SourceLayout(settings, sid))
        digests = {f.path: f.sha256 for f in inventory.files} if inventory else {}
        for rel in filter(None, (_relative(p, roots[sid]) for p in sorted(paths))):
            files.append({"source": sid, "file": rel, "sha256": digests.get(rel)})  # None: deleted
    entry = {"generation": generation, "batch": batch_id, "sources": sources + [c["source"] for c in commits or []],
             "files": files, "seconds": round(seconds, 3)}
    if commits:  # a git source's batch: the commit its ref moved to (the files are the tree diff's)
        entry["commits"] = commits
    if stage_seconds:
        entry["stage_seconds"] = stage_seconds
    append_batch(settings, entry)


def _embedded(settings: Settings, runs: dict) -> int:
    """Chunks embedded by the batch's runs (their embedding_cache materializations)."""
    import dagster as dg
    from mtrag_assets.runner import dagster_instance
    instance = dagster_instance(settings)
    total = 0
    for run_id in set(runs.values()):
        for record in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
            mat = record.asset_materialization
            if mat is not None and mat.asset_key.path[-1] == "embedding_cache":
                total += int(getattr(mat.metadata.get("embedded"), "value", 0) or 0)
    return total

def _one_line(exc: BaseException) -> str:
    """An exception as the watch logs it: its type and its message on one line, cut at 300 chars."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


class WatchLoop:
    """One `mtrag watch` process: the sources it follows, the batches it applies (the fast lane,
    or a Dagster run to converge), and the loop over the file events that feeds them."""

    def __init__(self, settings: Settings, specs: list[SourceSpec], only: list[str] | None = None, log=print,
                 stop: threading.Event | None = None):
        if only:
            unknown = sorted(set(only) - {s.id for s in specs})
            if unknown:
                raise SourceConfigError(f"unknown source id(s) {unknown}; known: {[s.id for s in specs]}")
        self.settings, self.specs, self.log = settings, specs, log
        # folder sources (an issues source's path is an export file: `mtrag build` picks up a new
        # one); a missing folder is not watched, and each build names it as that source's error
        self.watched = [s for s in specs if (not only or s.id in only) and s.path and s.kind != "issues"]
        for spec in [s for s in self.watched if folder_problem(s, settings.sources_file)]:
            log(f"mtrag: {folder_problem(spec, settings.sources_file)}; not watched (the other sources are)")
            self.watched.remove(spec)
        # git sources: a new commit on the ref (refs, HEAD, packed-refs change under the git folder)
        self.git_watched = [s for s in specs if (not only or s.id in only) and s.git is not None and not s.error]
        if not self.watched and not self.git_watched:
            raise SourceConfigError("nothing to watch: `mtrag watch` follows folder sources (`path:`) and git "
                                    "sources (`git:` + `ref:`); the others are pinned sdists or issue exports: "
                                    f"{[s.id for s in specs]}")
        self.roots = {s.id: spec_root(settings, s).resolve() for s in self.watched}
        self.git_dirs = {s.id: _git_dir(settings, s) for s in self.git_watched}
        self.git_by_id = {s.id: s for s in self.git_watched}
        self.stop = stop or threading.Event()
        for sig in STOP_SIGNALS:
            signal.signal(sig, lambda *_: self.stop.set())
        # set by a failed fast batch: the next batch converges through a Dagster run
        self.converge_pending = False
        self.retry_at = 0.0  # when a failed convergence is tried again without a change
        self.last_scan = time.monotonic()  # the rescan's clock, restarted once the watcher is up
        # Lineage is written by one worker, in batch order, while the loop takes the next change: a
        # change saved right after a publish waited for the previous batch's ~15 event writes. The
        # loop's end waits for it, so a stopped watch has recorded everything.
        self.recorder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mtrag-watch-record")

    def run(self, debounce_ms: int = DEBOUNCE_MS) -> int:
        """Converge, warm up, then apply each batch of changes until `stop`; 0 once stopped."""
        import watchfiles

        # Converge first: what changed while no watch ran, or what a killed batch left half-applied.
        self.apply(set(), "start")
        self._warm_up()
        armed = False
        self.last_scan = time.monotonic()
        # An empty batch every LOOP_TICK_MS (yield_on_timeout; a change's batch is debounced as
        # before): the first one says the watcher is armed, so a change saved before that is caught
        # by one more convergence pass, not lost.
        for changes in watchfiles.watch(*self.roots.values(), *self.git_dirs.values(), watch_filter=self._keeper(),
                                        debounce=debounce_ms, step=QUIET_MS, stop_event=self.stop,
                                        rust_timeout=LOOP_TICK_MS, yield_on_timeout=True, raise_interrupt=False):
            # The live Qdrant the batches keep open goes when another process (`mtrag build`,
            # `mtrag status`) waits for its lock, or after a long quiet spell.
            close_parked_qdrant(idle_s=KEEP_QDRANT_OPEN_S)
            if self.stop.is_set():
                break
            if not armed:
                armed = True
                self.apply(set(), "start")
                folders = {**self.roots, **self.git_dirs}
                self.log(f"watching {', '.join(f'{sid} ({root})' for sid, root in folders.items())}; Ctrl-C stops")
            self._take({Path(p) for _, p in changes})
        return self._shut_down()

    def _warm_up(self) -> None:
        # Load the embedding model now (a start with nothing to embed never did): the first change
        # would otherwise pay it (docs/performance.md#the-fast-lane-and-the-watch).
        from mtrag_assets.resources import MtragResource
        MtragResource().embedder().encode(["mtrag watch warm-up"])
        # ... and the fast lane's own first-use costs: its imports, the ephemeral instance its asset
        # contexts share, the plans of the Neo4j write statements.
        from mtrag_assets.fast_lane import warm_up
        warm_up(self.settings, [s.id for s in self.watched + self.git_watched], self.specs)

    def _keeper(self):
        """The event filter: watchfiles' default one drops everything under `.git`, where a watched
        ref moves."""
        import watchfiles
        default_filter = watchfiles.DefaultFilter()

        def keep(change, path: str) -> bool:
            return _ref_file(Path(path), self.git_dirs) or default_filter(change, path)
        return keep

    def _take(self, paths: set[Path]) -> None:
        """One turn of the loop: the events' batch, a pending convergence, or the rescan."""
        if any(_taken(self.watched, self.roots, p) for p in paths) or any(_ref_file(p, self.git_dirs) for p in paths):
            self.apply(paths, "change")
            self.last_scan = time.monotonic()
        elif self.converge_pending and time.monotonic() >= self.retry_at:
            self.apply(set(), "retry")  # a failed fast batch: converge through a run
        elif time.monotonic() - self.last_scan > RESCAN_S:
            # A safety net under inotify (a save that raced a long batch, or an event the kernel
            # dropped): the watched sources' stat walk against their snapshots, every RESCAN_S.
            self.last_scan = time.monotonic()
            lagging = changed_sources(self.settings, self.watched + self.git_watched, None)[0]
            if lagging:
                self.log(f"rescan: {', '.join(lagging)} changed without a file event")
                self.apply(set(), "rescan", lagging)

    def apply(self, paths: set[Path], why: str, targets: list[str] | None = None) -> None:
        """`targets`: sources known to have changed (the rescan) go straight to the fast lane."""
        # A batch runs in a thread of its own: SIGINT / SIGTERM then only set `stop` (the main
        # thread's handler) and the batch is published before the loop ends. Dagster turns a
        # signal into a failed run only on the main thread.
        failure: list[BaseException] = []

        def work() -> None:
            try:
                self._apply(paths, why, targets)
            except BaseException as exc:  # noqa: BLE001 - re-raised on the main thread
                failure.append(exc)

        worker = threading.Thread(target=work, name="mtrag-watch-batch")
        worker.start()
        while worker.is_alive():
            worker.join(0.2)
        if failure and why == "start":
            raise failure[0]
        if failure:  # a change's run failed (the UI shows it): keep watching; the next change retries
            self.retry_at = time.monotonic() + RETRY_S  # not a failing run every turn of the loop
            self.log(f"build failed ({_one_line(failure[0])}); still watching")

    def _apply(self, paths: set[Path], why: str, known: list[str] | None) -> None:
        t0 = time.perf_counter()
        if (paths or known) and not self.converge_pending:
            self._fast(paths, why, t0, known)
        else:
            self._converge(paths, why, t0)

    def _converge(self, paths: set[Path], why: str, t0: float) -> None:
        """The changed sources through a Dagster run (`run_build`): the start, and the batch after
        a failed fast one."""
        from mtrag_assets.runner import run_build
        settings = self.settings
        targets, removed = changed_sources(settings, self.specs, None)
        targets = [t for t in targets if t in self.roots or t in self.git_by_id] if paths else targets
        if not targets and (paths or not (removed or publish_pending(settings))):
            self.converge_pending = False
            return
        summary = run_build(settings, self.specs, only=targets or None, log=lambda line: None,
                            extra_tags={PLANE_TAG: "watch"})
        self.converge_pending = False
        if summary.get("unchanged"):  # only sources that cannot be built changed: nothing published
            return
        seconds = time.perf_counter() - t0
        generation = (load_current(settings.manifest_dir) or {}).get("generation")
        embedded = _embedded(settings, summary["runs"])
        _journal(settings, summary["built"], paths, self.roots, generation, seconds, summary["runs"].get("__publish__"))
        self._published(generation, why, summary["built"], paths, embedded, seconds)

    def _fast(self, paths: set[Path], why: str, t0: float, targets: list[str] | None = None) -> None:
        """The changed files' sources through the fast lane (fast_lane.py): no run, lineage after."""
        from mtrag_assets.fast_lane import run_batch
        settings, roots = self.settings, self.roots
        if targets is None:
            targets = [s.id for s in self.watched if any(_taken([s], roots, p) for p in paths)]
            targets += _moved_refs(settings, self.git_by_id, self.git_dirs, paths)
        if not targets:  # a git folder's own bookkeeping (objects, index, logs): no ref moved
            return
        # the raw stage reads only what the events named (the rescan catches what they missed)
        changed = {sid: {rel for rel in (_named(p, roots[sid]) for p in paths) if rel is not None}
                   for sid in targets if sid in roots} if paths else None
        try:
            # a batch's garbage collections run once it has published, not on its path
            # (docs/performance.md#the-fast-lane-and-the-watch)
            with collections_after():
                batch = run_batch(settings, self.specs, targets, log=lambda line: None, keep_qdrant=True,
                                  changed=changed)
        except Exception as exc:  # noqa: BLE001 - the next batch converges through a run
            self._fast_failed(exc)
            return
        seconds = time.perf_counter() - t0
        generation = (load_current(settings.manifest_dir) or {}).get("generation")
        embedded = sum(int(getattr(meta.get("embedded"), "value", 0) or 0) for meta in batch.metadata_of("embedding_cache"))
        _journal(settings, [t for t in batch.targets if t in roots], paths, roots, generation, seconds,
                 batch.batch_id, commits=_commits(settings, [t for t in batch.targets if t in self.git_by_id]),
                 stage_seconds=batch.seconds)
        self._published(generation, why, batch.targets, paths, embedded, seconds)
        self.recorder.submit(self._record, batch)

    def _fast_failed(self, exc: Exception) -> None:
        close_parked_qdrant()  # a build of another process may be what it ran into
        forget_neo4j_schemas()  # or an index dropped under it: made again before the next write
        self.converge_pending = True
        self.log(f"batch failed ({_one_line(exc)}); the next change converges through a Dagster run")

    def _published(self, generation, why: str, sources: list[str], paths: set[Path], embedded: int,
                   seconds: float) -> None:
        self.log(f"published generation {generation} ({why}): sources {', '.join(sources) or '-'}, "
                 f"files {len(paths)}, chunks embedded {embedded}, {seconds:.2f} s")

    def _record(self, batch) -> None:
        """A published batch's lineage into the Dagster instance (on the recorder thread)."""
        from mtrag_assets.fast_lane import record
        t1 = time.perf_counter()
        try:
            events = record(self.settings, self.specs, batch)
        except Exception as exc:  # noqa: BLE001 - the generation is published; its lineage is what failed
            self.log(f"recording batch {batch.batch_id} failed ({_one_line(exc)})")
            return
        self.log(f"recorded {events} asset events of batch {batch.batch_id} in {time.perf_counter() - t1:.2f} s")

    def _shut_down(self) -> int:
        close_parked_qdrant()
        self.recorder.shutdown(wait=True)
        close_kept_neo4j_drivers()
        self.log("stopped")
        return 0


def run_watch(settings: Settings, specs: list[SourceSpec], only: list[str] | None = None, log=print,
              stop: threading.Event | None = None, debounce_ms: int = DEBOUNCE_MS) -> int:
    """`mtrag watch`: follow the watched sources and publish each change until `stop` (or SIGINT /
    SIGTERM); 0 once stopped. Its caches and open stores live in one build session, closed as it leaves."""
    session = new_session()
    try:
        return WatchLoop(settings, specs, only=only, log=log, stop=stop).run(debounce_ms)
    finally:
        session.close()
