"""What every stage shares: code versions, results, digests (paths live in core/layout.py)."""
from __future__ import annotations

import hashlib
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path

from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.core.session import session_cache
from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.stores.table_delta import ProjectedTables


def projected_tables(layout: SourceLayout, store: str) -> ProjectedTables:
    """Where `store`'s stage keeps the tables it last projected for the layout's source."""
    return ProjectedTables(layout.graph / "projected" / store)


@dataclass
class StageResult:
    data_version: str
    metadata: dict = field(default_factory=dict)
    value: object = None


def digest_json(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def digest_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def chunk_set_generation(chunk_rows: list[dict], source_id: str | None = None) -> str:
    """A source's generation: digest of its chunk set (ids, hashes, parents, places) plus the
    code versions of the stages that shape the stores. `source_id`: this process keeps each row's
    part of the digest for that source's next call (a row of an unchanged file is the same dict,
    so it is not formatted again every watch batch)."""
    h = hashlib.sha256()
    for name in ("cas_chunks", "canonical_graph", "qdrant_collection", "fts_db", "neo4j_graph"):
        h.update(f"{name}={CODE_VERSIONS[name]};".encode())
    last = _ROW_LINES.get(source_id, {}) if source_id is not None else {}
    lines: dict[int, tuple[dict, bytes]] = {}
    for r in sorted(chunk_rows, key=itemgetter("chunk_id")):
        held = last.get(id(r))
        line = held[1] if held is not None and held[0] is r else _row_line(r)
        lines[id(r)] = (r, line)
        h.update(line)
    if source_id is not None:
        _ROW_LINES[source_id] = lines
    return h.hexdigest()[:24]


# Per source, each chunk row's part of the generation digest, by the row (held: its id is not reused).
_ROW_LINES = session_cache("common.generation_row_lines", max_entries=256)


def _row_line(r: dict) -> bytes:
    line = (f"{r['chunk_id']}\0{r['content_hash']}\0{r['parent_id'] or ''}\0{r['file_path']}\0"
            f"{r['start_line']}\0{r['end_line']}\n")
    if r.get("embed_hash"):  # what the vector embeds, when not the text (ingest/embed_text.py)
        line += f"e{r['embed_hash']}\n"
    if r.get("page"):  # a PDF chunk's page is in its payload and FTS row: a moved page is a change
        line += f"p{r['page']}\n"
    return line.encode()


@contextmanager
def timed(metadata: dict, key: str):
    t0 = time.perf_counter()
    yield
    metadata[key] = round(time.perf_counter() - t0, 4)
