"""fts_db: a source's chunks in SQLite FTS5 (trigram + CJK bigram indexes), its exact aliases and
its parent rows for hydration, replaced in one transaction under a generation marker."""
from __future__ import annotations

import os

from mtrag_resources.stores.cas import ContentStore
from mtrag_resources.core.config import Settings
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.stores.connect import open_fts
from mtrag_resources.stores.tables import read_rows
from mtrag_resources.stages.common import StageResult, digest_json, timed
from mtrag_resources.core.layout import SourceLayout, read_state


def build_fts_db(settings: Settings, spec: SourceSpec) -> StageResult:
    layout = SourceLayout(settings, spec.id)
    generation = read_state(layout)["generation"]
    cas = ContentStore(settings.cas_dir)
    meta: dict = {}
    with timed(meta, "seconds"):
        rows = read_rows(layout.chunks)
        input_sha = digest_json([[r["chunk_id"], r["content_hash"], r["start_line"], r["end_line"]] for r in rows])
        store = open_fts(settings)
        try:
            if not store.holds(spec.id, generation, input_sha):  # texts only when something is written
                for r in rows:
                    r["text"] = cas.get_text(r["content_hash"])
            stats = store.write_source(spec.id, generation, input_sha, rows)  # standard aliases (fts_query.derive_aliases)
            marker = store.marker(spec.id)
        finally:
            store.close()
    meta.update({k: v for k, v in stats.items() if isinstance(v, (int, float, str, bool))})
    meta.update({"generation": generation, "marker": marker.state if marker else "none",
                 "path": str(settings.fts_path),
                 "db_bytes": os.path.getsize(settings.fts_path) if settings.fts_path.exists() else 0})
    return StageResult(data_version=generation, metadata=meta)
