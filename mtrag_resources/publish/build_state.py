"""Cheap decisions made before Dagster or torch are imported: has anything changed since the
published generation, and is another build of the same source running?"""
from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

from mtrag_resources.core.errors import BusyError
from mtrag_resources.core.config import Settings
from mtrag_resources.publish.manifest import load_current
from mtrag_resources.ingest.sources import SourceConfigError, SourceSpec
from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.core.layout import SourceLayout, read_state
from mtrag_resources.ingest.snapshot import scan_source, source_problem


class SourceBusy(BusyError):
    pass


def dirty_marker(settings: Settings, source_id: str | None = None) -> Path:
    """Exists while a source's build (or, without a source, the publish step) runs, and after one
    that failed: that work must not take the no-change shortcut, so the next build converges."""
    return settings.dirty_marker(source_id)


def mark_dirty(settings: Settings, source_id: str | None = None) -> Path:
    path = dirty_marker(settings, source_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"pid {os.getpid()}\n")
    return path


def publish_pending(settings: Settings) -> bool:
    return dirty_marker(settings).exists()


def changed_sources(settings: Settings, specs: list[SourceSpec], fingerprint_id: str | None) -> tuple[list[str], list[str]]:
    """(sources whose snapshot or stores differ from the published generation, removed source ids).
    A git source costs its ref's lookup when the commit is the published one (no file is read),
    else a diff of the two trees and the changed blobs; one that cannot be read (no repository, no
    such ref) counts as changed, so the build reports its error instead of "nothing changed"."""
    manifest = load_current(settings.manifest_dir) or {}
    published = manifest.get("sources", {})
    removed = sorted(set(published) - {s.id for s in specs})
    global_stale = (manifest.get("code_versions") != CODE_VERSIONS
                    or (fingerprint_id and manifest.get("embedder", {}).get("fingerprint_id") != fingerprint_id))
    changed = []
    for spec in specs:
        entry = published.get(spec.id)
        if global_stale or entry is None or dirty_marker(settings, spec.id).exists():
            changed.append(spec.id)
            continue
        try:
            inventory = scan_source(settings, spec)
        except SourceConfigError:
            if spec.pip_sdist:  # a pin that cannot be fetched refuses the build (one line, exit 2)
                raise
            # a missing folder, a broken git entry or export file: the build names it, and builds the others
            changed.append(spec.id)
            continue
        state = read_state(SourceLayout(settings, spec.id))
        if inventory.digest != entry.get("snapshot_digest") or state.get("generation") != entry.get("chunk_generation"):
            changed.append(spec.id)
    return changed, removed


def source_problems(settings: Settings, specs: list[SourceSpec]) -> dict[str, str]:
    """{source id: why it cannot be built now} (a `path` folder that does not exist, a git entry
    with both `path` and `git`, a `git:` that is no repository, a ref that names no commit, an
    issues source whose export file is missing, unreadable or no GitHub / Jira export; each
    message names the entry). A build leaves these out and builds the others."""
    return {spec.id: why for spec in specs if (why := source_problem(settings, spec))}


def publishable_sources(settings: Settings, specs: list[SourceSpec]) -> list[SourceSpec]:
    """The sources a generation publishes: every one, except those that cannot be built now and
    were never published (nothing of them to serve). One that was published keeps its last
    snapshot's generation, unchanged in every store, until its entry is fixed."""
    problems = source_problems(settings, specs)
    if not problems:
        return list(specs)
    published = (load_current(settings.manifest_dir) or {}).get("sources", {})
    return [s for s in specs if s.id not in problems or s.id in published]


def source_busy(settings: Settings, source_id: str) -> bool:
    """Whether another process builds the source now (holds its lock); probed, not held."""
    path = settings.source_lock(source_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


@contextmanager
def source_lock(settings: Settings, source_id: str):
    """One build per source at a time, across processes; a second one is refused, not queued."""
    path = settings.source_lock(source_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "a+")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            raise SourceBusy(f"source {source_id!r} is already being built by {holder}; try again when it finishes") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}")
        fh.flush()
        yield
    finally:
        fh.close()


@contextmanager
def publish_lock(settings: Settings):
    """One writer of the manifest series at a time, across processes: a build's publish step from
    reading the published manifest to moving CURRENT, a cut-over, a rollback. A second one waits
    (these steps take seconds); a holder that dies releases it."""
    path = settings.locks_dir / "publish.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield
