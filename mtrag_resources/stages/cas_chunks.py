"""cas_chunks: parse and chunk every file of a source's snapshot; texts into the CAS, the chunk
table into Parquet, and the per-file parse facts for canonical_graph. A code child's embedding
text (`ingest/embed_text.py`: its name's words + its source) goes into the CAS beside its text;
the row carries its hash as `embed_hash`, the key of the child's vector.

Parsing is memoised per file by content hash, so a rebuild after one edit re-parses one file."""
from __future__ import annotations

import dataclasses
import gzip
import json
from collections import Counter

from mtrag_resources.core.atomic import write_bytes_atomic
from mtrag_resources.stores.cas import ContentStore
from mtrag_resources.ingest.chunking.code import chunk_code
from mtrag_resources.ingest.chunking.docs import chunk_doc
from mtrag_resources.core.config import Settings
from mtrag_resources.core.models import Chunk, DocReference, GraphNode, GraphRelation, ParsedFile
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.stores.tables import write_rows
from mtrag_resources.stages.common import StageResult, chunk_set_generation, timed
from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.core.layout import SourceLayout, update_state
from mtrag_resources.ingest.snapshot import load_inventory

DOC_MAX_TOKENS = 256  # all-MiniLM-L6-v2's max_seq_length; larger models may raise it


def parse_file(source_id: str, path: str, category: str, language: str, text: str) -> ParsedFile:
    if category == "code":
        return chunk_code(source_id, path, text, language)
    return chunk_doc(source_id, path, text, language, max_tokens=DOC_MAX_TOKENS)


def _parsed_to_json(parsed: ParsedFile) -> dict:
    return dataclasses.asdict(parsed)


def _parsed_from_json(doc: dict) -> ParsedFile:
    return ParsedFile(
        chunks=[Chunk(**c) for c in doc["chunks"]],
        nodes=[GraphNode(**n) for n in doc["nodes"]],
        relations=[GraphRelation(**r) for r in doc["relations"]],
        references=[DocReference(**r) for r in doc["references"]],
        imports=doc["imports"], calls=doc["calls"], bases=doc["bases"], warnings=doc["warnings"],
    )


def load_facts(layout: SourceLayout) -> dict:
    """{file_path: {"sha256", "category", "parsed": ParsedFile-as-dict}} from the last run."""
    try:
        with gzip.open(layout.facts.with_suffix(".json.gz"), "rt", encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        return {}
    if doc.get("code_version") != CODE_VERSIONS["cas_chunks"]:
        return {}
    return doc["files"]


def load_parsed_files(layout: SourceLayout) -> list[tuple[str, ParsedFile]]:
    return [(path, _parsed_from_json(f["parsed"])) for path, f in sorted(load_facts(layout).items())]


def _save_facts(layout: SourceLayout, files: dict) -> None:
    doc = {"code_version": CODE_VERSIONS["cas_chunks"], "files": files}
    write_bytes_atomic(layout.facts.with_suffix(".json.gz"), gzip.compress(json.dumps(doc).encode(), 3))


def build_cas_chunks(settings: Settings, spec: SourceSpec) -> StageResult:
    layout = SourceLayout(settings, spec.id)
    inventory = load_inventory(layout)
    if inventory is None:
        raise RuntimeError(f"source {spec.id!r}: no raw_source snapshot; materialize raw_source first")
    cas = ContentStore(settings.cas_dir)
    previous = load_facts(layout)
    meta: dict = {}
    files: dict = {}
    reparsed = 0
    warnings: list[str] = []
    with timed(meta, "seconds"):
        for entry in inventory.included:
            old = previous.get(entry.path)
            if old and old["sha256"] == entry.sha256 and old["category"] == entry.category:
                files[entry.path] = old
            else:
                text = cas.get_text(entry.sha256)
                parsed = parse_file(spec.id, entry.path, entry.category, entry.language, text)
                files[entry.path] = {"sha256": entry.sha256, "category": entry.category,
                                     "parsed": _parsed_to_json(parsed)}
                reparsed += 1
            warnings.extend(files[entry.path]["parsed"]["warnings"])
        rows = []
        for path in sorted(files):
            for c in files[path]["parsed"]["chunks"]:
                chunk = Chunk(**c)
                cas.put_text(chunk.text)
                if chunk.embed_text:  # the embedder's text of a code child (ingest/embed_text.py)
                    cas.put_text(chunk.embed_text)
                chunk.source_id, chunk.source_kind = spec.id, spec.kind
                chunk.cas_uri = ContentStore.uri(chunk.content_hash)
                chunk.repository = spec.repository or spec.pip_sdist or inventory.root
                chunk.commit = inventory.commit
                row = dataclasses.asdict(chunk)
                del row["text"], row["embed_text"]  # texts live once, in the CAS
                rows.append(row)
        _check_unique_ids(spec.id, rows)
        write_rows(layout.chunks, rows)
        _save_facts(layout, files)
    generation = chunk_set_generation(rows)
    update_state(layout, generation=generation)
    roles = Counter(r["role"] for r in rows)
    meta.update({
        "chunks": len(rows),
        "parents": roles.get("parent", 0),
        "children": roles.get("child", 0),
        "by_type": dict(Counter(r["chunk_type"] for r in rows)),
        "by_language": dict(Counter(r["language"] for r in rows)),
        "embedding_texts": sum(bool(r["embed_hash"]) for r in rows),  # code children (ingest/embed_text.py)
        "declarations": sum(bool(r["declaration"]) for r in rows),    # demoted below implementations
        "files_parsed": reparsed,
        "files_reused": len(files) - reparsed,
        "warnings": warnings[:50],
        "warning_count": len(warnings),
        "generation": generation,
    })
    return StageResult(data_version=generation, metadata=meta, value=rows)


def _check_unique_ids(source_id: str, rows: list[dict]) -> None:
    dupes = [cid for cid, n in Counter(r["chunk_id"] for r in rows).items() if n > 1]
    if dupes:
        clash = [r["locator"] for r in rows if r["chunk_id"] == dupes[0]]
        raise RuntimeError(f"source {source_id!r}: duplicate chunk ids ({len(dupes)}), e.g. {clash}")
