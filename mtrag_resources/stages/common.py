"""What every stage shares: per-source file layout, code versions, results, digests."""
from __future__ import annotations

import hashlib
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mtrag_resources.core.config import Settings
from mtrag_resources.ingest.sources import SourceSpec

# Bump a stage's version when its output for the same input changes; Dagster then shows the
# stage and everything downstream as stale, and the generation digest changes.
CODE_VERSIONS = {
    "raw_source": "1",
    "cas_chunks": "1",
    "canonical_graph": "1",
    "embedding_cache": "1",
    "qdrant_collection": "1",
    "fts_db": "1",
    "neo4j_graph": "1",
    "cross_source_links": "1",
    "index_manifest": "1",
}


@dataclass
class StageResult:
    data_version: str
    metadata: dict = field(default_factory=dict)
    value: object = None


@dataclass(frozen=True)
class SourceLayout:
    settings: Settings
    source_id: str

    @property
    def inventory(self) -> Path:
        return self.settings.raw_dir / self.source_id / "inventory.json"

    @property
    def tables(self) -> Path:
        return self.settings.cas_dir / "tables" / self.source_id

    @property
    def chunks(self) -> Path:
        return self.tables / "chunks.parquet"

    @property
    def facts(self) -> Path:
        return self.tables / "facts.json"

    @property
    def graph(self) -> Path:
        return self.settings.graph_dir / self.source_id

    @property
    def nodes(self) -> Path:
        return self.graph / "nodes.parquet"

    @property
    def relations(self) -> Path:
        return self.graph / "relations.parquet"

    @property
    def references(self) -> Path:
        return self.graph / "references.parquet"

    @property
    def state(self) -> Path:
        """Small JSON with what each stage last produced (generation, digests) for this source."""
        return self.settings.raw_dir / self.source_id / "state.json"


def digest_json(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def digest_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def chunk_set_generation(chunk_rows: list[dict]) -> str:
    """A source's generation: digest of its chunk set (ids, hashes, parents, places) plus the
    code versions of the stages that shape the stores."""
    h = hashlib.sha256()
    for name in ("cas_chunks", "canonical_graph", "qdrant_collection", "fts_db", "neo4j_graph"):
        h.update(f"{name}={CODE_VERSIONS[name]};".encode())
    for r in sorted(chunk_rows, key=lambda r: r["chunk_id"]):
        h.update(f"{r['chunk_id']}\0{r['content_hash']}\0{r['parent_id'] or ''}\0{r['file_path']}\0"
                 f"{r['start_line']}\0{r['end_line']}\n".encode())
    return h.hexdigest()[:24]


def read_state(layout: SourceLayout) -> dict:
    try:
        return json.loads(layout.state.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def update_state(layout: SourceLayout, **values) -> None:
    from mtrag_resources.core.atomic import write_text_atomic
    state = read_state(layout)
    state.update(values)
    layout.state.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(layout.state, json.dumps(state, indent=1, sort_keys=True))


@contextmanager
def timed(metadata: dict, key: str):
    t0 = time.perf_counter()
    yield
    metadata[key] = round(time.perf_counter() - t0, 4)


def spec_root(settings: Settings, spec: SourceSpec) -> Path:
    return spec.root(settings.sdist_dir, settings.sources_file.parent)
