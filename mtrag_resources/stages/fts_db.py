"""fts_db: a source's chunks in SQLite FTS5 (trigram + CJK bigram indexes), its exact aliases and
its parent rows for hydration, replaced in one transaction under a generation marker."""
from __future__ import annotations

import json
import os
import re
from pathlib import PurePosixPath

from ..cas import ContentStore
from ..config import Settings
from ..sources import SourceSpec
from ..stores.connect import open_fts
from ..tables import read_rows
from .common import SourceLayout, StageResult, digest_json, read_state, timed

ISSUE_KEY_RE = re.compile(r"\b[A-Z][A-Z0-9]+-\d+\b")


def aliases_for(row: dict, source_id: str) -> list[tuple[str, str, str]]:
    """(alias, kind, chunk_id): every name a user may type to mean exactly this chunk."""
    cid = row["chunk_id"]
    out = [(row["file_path"], "file_path", cid), (PurePosixPath(row["file_path"]).name, "basename", cid),
           (cid, "chunk_id", cid), (source_id, "source_id", cid)]
    if row["symbol"]:
        out.append((row["symbol"], "symbol", cid))
        short = row["symbol"].rsplit(".", 1)[-1].rsplit(" > ", 1)[-1]
        out.append((short, "short_symbol", cid))
    if row["title"]:
        out.append((row["title"], "title", cid))
    for gid in row.get("graph_ids") or []:
        out.append((gid, "graph_id", cid))
    for key in ISSUE_KEY_RE.findall(row.get("title", "") + " " + row.get("summary", "")):
        out.append((key, "issue_key", cid))
    return out


def build_fts_db(settings: Settings, spec: SourceSpec) -> StageResult:
    layout = SourceLayout(settings, spec.id)
    generation = read_state(layout)["generation"]
    cas = ContentStore(settings.cas_dir)
    meta: dict = {}
    with timed(meta, "seconds"):
        rows = read_rows(layout.chunks)
        for r in rows:
            r["text"] = cas.get_text(r["content_hash"])
            r["graph_ids_json"] = json.dumps(r.get("graph_ids") or [])
        aliases = [a for r in rows for a in aliases_for(r, spec.id)]
        input_sha = digest_json([[r["chunk_id"], r["content_hash"], r["start_line"], r["end_line"]] for r in rows])
        store = open_fts(settings)
        try:
            stats = store.write_source(spec.id, generation, input_sha, rows, aliases)
            marker = store.marker(spec.id)
        finally:
            store.close()
    meta.update({k: v for k, v in stats.items() if isinstance(v, (int, float, str, bool))})
    meta.update({"generation": generation, "marker": marker.state if marker else "none",
                 "path": str(settings.fts_path),
                 "db_bytes": os.path.getsize(settings.fts_path) if settings.fts_path.exists() else 0})
    return StageResult(data_version=generation, metadata=meta)
