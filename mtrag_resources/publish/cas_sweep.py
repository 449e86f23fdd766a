"""CAS blobs that no source's build state names any more, deleted in two phases: a sweep records
the unreferenced ones, and a sweep at least GRACE_S later deletes those still unreferenced then,
so a reader still on an older generation keeps what it may fetch meanwhile. A sweep runs only
with every source's lock taken (no build is writing blobs its tables do not name yet) and at most
once per GRACE_S (listing the blobs is not free)."""
from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from mtrag_resources.core.atomic import write_text_atomic
from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.ingest.snapshot import load_inventory
from mtrag_resources.publish.build_state import SourceBusy, source_lock
from mtrag_resources.stores.tables import column_names, read_table, table_exists

GRACE_S = 3600.0
HASH_COLUMNS = ("content_hash", "embed_hash")


def candidates_path(settings: Settings) -> Path:
    return settings.cas_dir / "unreferenced.json"


def built_sources(settings: Settings) -> list[str]:
    """Every source with build state in the home (raw snapshot or chunk tables)."""
    found = set()
    for base in (settings.raw_dir, settings.cas_dir / "tables"):
        if base.is_dir():
            found.update(p.name for p in base.iterdir() if p.is_dir())
    return sorted(found)


def live_digests(settings: Settings, source_ids: list[str]) -> set[str]:
    """What the sources' snapshots (file bytes) and chunk tables (texts, embedding texts) name."""
    live: set[str] = set()
    for sid in source_ids:
        layout = SourceLayout(settings, sid)
        inventory = load_inventory(layout)
        if inventory is not None:
            live.update(f.sha256 for f in inventory.files if f.sha256)
        if table_exists(layout.chunks):
            columns = [c for c in HASH_COLUMNS if c in column_names(layout.chunks)]
            table = read_table(layout.chunks, columns=columns)
            for column in columns:
                live.update(v for v in table.column(column).to_pylist() if v)
    return live


def stored_digests(settings: Settings) -> set[str]:
    blobs = settings.cas_dir / "blobs"
    if not blobs.is_dir():
        return set()
    return {entry.name for top in os.scandir(blobs) if top.is_dir()
            for sub in os.scandir(top.path) if sub.is_dir()
            for entry in os.scandir(sub.path) if entry.is_file() and not entry.name.startswith(".tmp-")}


def sweep(settings: Settings, now: float | None = None) -> dict:
    """One sweep if due and every source's lock is free: {swept, deleted, bytes, pending}."""
    now = time.time() if now is None else now
    path = candidates_path(settings)
    previous = _load(path)
    if previous is not None and now - previous["time"] < GRACE_S:
        return {"swept": False, "deleted": 0, "bytes": 0, "pending": len(previous["digests"])}
    sources = built_sources(settings)
    try:
        with contextlib.ExitStack() as locks:
            for sid in sources:
                locks.enter_context(source_lock(settings, sid))
            unreferenced = stored_digests(settings) - live_digests(settings, sources)
            due = unreferenced & set(previous["digests"]) if previous is not None else set()
            freed = 0
            for digest in due:
                blob = settings.cas_dir / "blobs" / digest[:2] / digest[2:4] / digest
                with contextlib.suppress(FileNotFoundError):
                    freed += blob.stat().st_size
                    blob.unlink()
            pending = sorted(unreferenced - due)
            write_text_atomic(path, json.dumps({"time": now, "digests": pending}))
    except SourceBusy:
        return {"swept": False, "deleted": 0, "bytes": 0, "pending": len(previous["digests"]) if previous else 0}
    return {"swept": True, "deleted": len(due), "bytes": freed, "pending": len(pending)}


def _load(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
        return {"time": float(data["time"]), "digests": list(data["digests"])}
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None
