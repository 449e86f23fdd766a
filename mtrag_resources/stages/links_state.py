"""What a one-shot links stage (`mtrag build`) reuses of the last one, so that a change to a few
docs files resolves those files' references, not every source's.

Two small JSON files hold it (each source's `graph/<source>/inputs.json` and `links/state.json`); a
links stage reuses a file's links only where both still describe what is on disk, and anything
else, a missing or torn file included, is the full resolution, which writes a new state. Details:
docs/incremental.md#the-links-state."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from mtrag_resources.core.atomic import write_text_atomic
from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.ingest.doc_links import INDEXED_LABELS, resolution_key
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.stages.common import digest_file, digest_json
from mtrag_resources.stores.tables import commit_file, table_exists

STATE_VERSION = 1
GRAPH_TABLES = ("nodes", "relations", "references", "imports")


def table_digest(path) -> str:
    """The digest of a table's commit file ('' where there is no table)."""
    return digest_file(commit_file(path)) if table_exists(path) else ""


def feeds_index(nodes, relations, imports) -> bool:
    """Does a source's graph give the links' symbol index anything (doc_links.SymbolIndex reads
    INDEXED_LABELS nodes, INHERITS relations and imports)?"""
    return (bool(imports) or any(n.label in INDEXED_LABELS for n in nodes)
            or any(r.rel_type == "INHERITS" for r in relations))


def write_graph_inputs(layout: SourceLayout, digests: dict[str, str], facts_keys: dict[str, str],
                       feeds: bool) -> None:
    write_text_atomic(layout.graph_inputs, json.dumps(
        {"version": STATE_VERSION, "tables": digests, "feeds_index": feeds, "files": facts_keys}))


def graph_inputs(layout: SourceLayout) -> dict | None:
    """The source's recorded graph inputs where its tables are still the ones recorded, else None."""
    try:
        doc = json.loads(layout.graph_inputs.read_text())
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("version") != STATE_VERSION:
        return None
    tables = doc.get("tables") or {}
    if any(tables.get(name) != table_digest(getattr(layout, name)) for name in GRAPH_TABLES):
        return None
    return doc


@dataclass
class LinksState:
    index_key: str
    table: str  # the links table's digest
    proposals: list[str] = field(default_factory=list)  # rel_ids the bridge proposals added
    files: dict[str, dict[str, list]] = field(default_factory=dict)  # source -> path -> [key, refs, unresolved]
    version: int = STATE_VERSION


def index_key(specs: list[SourceSpec], inputs: dict[str, dict]) -> str:
    """What the links' symbol index is made from: the tables of the sources that feed it."""
    return digest_json([CODE_VERSIONS["cross_source_links"],
                        [[s.id, inputs[s.id]["tables"] if inputs[s.id]["feeds_index"] else None] for s in specs]])


def load_state(settings: Settings) -> LinksState | None:
    try:
        doc = json.loads(settings.links_state.read_text())
        state = LinksState(**doc)
    except (FileNotFoundError, ValueError, TypeError):
        return None
    return state if state.version == STATE_VERSION else None


def save_state(settings: Settings, state: LinksState) -> None:
    write_text_atomic(settings.links_state, json.dumps(asdict(state)))


def forget_state(settings: Settings) -> None:
    """A links table written without a state (the watch keeps its own memo): the next one-shot
    stage resolves everything."""
    settings.links_state.unlink(missing_ok=True)


def file_counts(references, resolved: dict) -> dict[tuple[str, str], list[int]]:
    """(source, file) -> [references, unresolved] of `references`, resolved through `resolved`
    (resolve_links' memo: every reference's key is in it once it ran)."""
    counts: dict[tuple[str, str], list[int]] = {}
    for ref in references:
        count = counts.setdefault((ref.source_id, ref.file_path), [0, 0])
        count[0] += 1
        if not resolved.get(resolution_key(ref)):
            count[1] += 1
    return counts
