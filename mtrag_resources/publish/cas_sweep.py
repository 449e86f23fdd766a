"""CAS blobs that no source's build state names any more, deleted in two phases: a sweep records
the unreferenced ones, and a sweep at least GRACE_S later deletes those still unreferenced then,
so a reader still on an older generation keeps what it may fetch meanwhile. A sweep runs only
with every source's lock taken (no build is writing blobs its tables do not name yet) and at most
once per GRACE_S (listing the blobs is not free)."""
from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

from mtrag_resources.core.atomic import write_text_atomic
from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.ingest.snapshot import load_inventory
from mtrag_resources.publish.build_state import SourceBusy, source_lock
from mtrag_resources.publish.reclaim import built_sources, megabytes
from mtrag_resources.stores.cas import ContentStore
from mtrag_resources.stores.tables import column_names, read_table, table_exists

GRACE_S = 3600.0
HASH_COLUMNS = ("content_hash", "embed_hash")


def candidates_path(settings: Settings) -> Path:
    return settings.cas_dir / "unreferenced.json"


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


def sweep(settings: Settings, now: float | None = None) -> dict:
    """One sweep if due and every source's lock is free: {swept, deleted, bytes, pending, reclaimed}
    (`reclaimed`: what was given back, in words, or "")."""
    now = time.time() if now is None else now
    path = candidates_path(settings)
    previous = _load(path)
    if previous is not None and now - previous["time"] < GRACE_S:
        return _not_swept(len(previous["digests"]))
    sources = sorted(built_sources(settings))
    cas = ContentStore(settings.cas_dir)
    try:
        with contextlib.ExitStack() as locks:
            for sid in sources:
                locks.enter_context(source_lock(settings, sid))
            unreferenced = cas.digests() - live_digests(settings, sources)
            due = unreferenced & set(previous["digests"]) if previous is not None else set()
            freed = sum(cas.remove(digest) for digest in due)
            pending = sorted(unreferenced - due)
            write_text_atomic(path, json.dumps({"time": now, "digests": pending}))
    except SourceBusy:
        return _not_swept(len(previous["digests"]) if previous else 0)
    said = f"{megabytes(freed)} of {len(due)} CAS blobs no source names any more" if due else ""
    return {"swept": True, "deleted": len(due), "bytes": freed, "pending": len(pending), "reclaimed": said}


def _not_swept(pending: int) -> dict:
    return {"swept": False, "deleted": 0, "bytes": 0, "pending": pending, "reclaimed": ""}


def _load(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
        return {"time": float(data["time"]), "digests": list(data["digests"])}
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None
