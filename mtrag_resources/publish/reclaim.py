"""Disk given back after a publish: the build folders of sources that neither the sources file nor
the published generation names any more, and the SQLite FTS file's free pages.

What may be deleted: a source's `01-raw/<id>`, `02-cas/tables/<id>` and `03-graph/<id>` are build
inputs only (no reader opens them: serving reads the manifest, the stores, the published Qdrant
versions and the CAS blobs), so they go once a published generation without the source is CURRENT.
A source whose lock another build holds is left for a later publish. The CAS blobs, the embedding
cache, the published Qdrant versions (stages/index_manifest.py prunes those) and the manifests are
left alone: an older generation a reader may still serve can name any blob."""
from __future__ import annotations

import shutil
from pathlib import Path

from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.publish.build_state import SourceBusy, source_lock


def source_folders(settings: Settings, source_id: str) -> list[Path]:
    """A source's build folders (core/layout.py), whichever exist."""
    layout = SourceLayout(settings, source_id)
    return [p for p in (layout.inventory.parent, layout.tables, layout.graph) if p.exists()]


def built_sources(settings: Settings) -> set[str]:
    """Ids with a build folder (raw snapshot, chunk tables or graph)."""
    found = set()
    for base in (settings.raw_dir, settings.cas_dir / "tables", settings.graph_dir):
        if base.is_dir():
            found.update(p.name for p in base.iterdir() if p.is_dir())
    return found


def stale_sources(settings: Settings, keep: set[str]) -> list[str]:
    """Ids with a build folder that are not in `keep`."""
    return sorted(built_sources(settings) - keep)


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def remove_stale_sources(settings: Settings, keep: set[str]) -> dict:
    """Delete the build folders of every source not in `keep` (the sources file's and the
    published generation's ids) whose lock is free. {removed: [ids], busy: [ids], bytes}."""
    removed, busy, freed = [], [], 0
    for sid in stale_sources(settings, keep):
        try:
            with source_lock(settings, sid):
                for folder in source_folders(settings, sid):
                    freed += folder_bytes(folder)
                    shutil.rmtree(folder, ignore_errors=True)
                settings.dirty_marker(sid).unlink(missing_ok=True)
        except SourceBusy:
            busy.append(sid)
            continue
        removed.append(sid)
    return {"removed": removed, "busy": busy, "bytes": freed}


def compact_fts(settings: Settings) -> dict:
    """The SQLite FTS file compacted where it is mostly free pages (FtsStore.compact); nothing
    where the lexical index lives elsewhere or no file exists yet."""
    if not settings.fts_path.exists():
        return {"compacted": False, "bytes_before": 0, "bytes_after": 0}
    from mtrag_resources.stores.connect import open_fts
    store = open_fts(settings)
    try:
        compact = getattr(store, "compact", None)
        return compact() if compact else {"compacted": False, "bytes_before": 0, "bytes_after": 0}
    finally:
        store.close()


def reclaim(settings: Settings, keep: set[str]) -> dict:
    """Both, after a publish; the metadata the publishing stage reports."""
    sources = remove_stale_sources(settings, keep)
    fts = compact_fts(settings)
    fts_freed = max(0, fts["bytes_before"] - fts["bytes_after"])
    total = sources["bytes"] + fts_freed
    said = []
    if sources["removed"]:
        said.append(f"{megabytes(sources['bytes'])} of removed sources' build folders {sources['removed']}")
    if fts["compacted"]:
        said.append(f"{megabytes(fts_freed)} of the FTS file ({megabytes(fts['bytes_before'])} -> {megabytes(fts['bytes_after'])})")
    return {"reclaimed_bytes": total, "reclaimed_sources": sources["removed"],
            "reclaim_busy_sources": sources["busy"], "fts_compacted": fts["compacted"],
            "fts_free_pages": fts.get("free_pages", 0), "fts_pages": fts.get("pages", 0),
            "reclaimed": "; ".join(said)}


def megabytes(n: int) -> str:
    return f"{n / (1 << 20):.1f} MB"
