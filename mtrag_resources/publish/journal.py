"""The fast lane's journal (`journal.jsonl` beside the manifests): one JSON line per batch `mtrag
watch` applied, with the files and their digests (None: deleted), the sources, the generation it
published and the batch id its Dagster events carry. A batch build after a watch run finds these
files already in the snapshot and does nothing again; `mtrag status` shows the last line."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from mtrag_resources.core.config import Settings

TAIL_BYTES = 1 << 16  # the last line is read from the end, however long the journal grew


def journal_path(settings: Settings) -> Path:
    return settings.manifest_dir / "journal.jsonl"


def append_batch(settings: Settings, entry: dict) -> None:
    path = journal_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"at": round(time.time(), 3), **entry}, ensure_ascii=False) + "\n"
    with open(path, "a", encoding="utf-8") as fh:  # one write per batch: O_APPEND keeps lines whole
        fh.write(line)


def last_batch(settings: Settings) -> dict | None:
    """The journal's last whole line, or None (no journal, or nothing readable in its tail)."""
    path = journal_path(settings)
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - TAIL_BYTES))
            tail = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            entry = json.loads(line)
        except ValueError:  # a torn first line of the tail, or a line cut by a crash
            continue
        if isinstance(entry, dict):
            return entry
    return None


def batch_summary(entry: dict | None) -> dict | None:
    """What `mtrag status` shows of a batch: no per-file list, its counts."""
    if not entry:
        return None
    files = entry.get("files") or []
    return {"generation": entry.get("generation"), "at": entry.get("at"), "batch": entry.get("batch"),
            "sources": entry.get("sources", []), "files": len(files),
            "deleted": sum(1 for f in files if f.get("sha256") is None), "seconds": entry.get("seconds")}
