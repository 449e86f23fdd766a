"""cas_chunks: parse and chunk every file of a source's snapshot; texts into the CAS, the chunk
table into Parquet, and the per-file parse facts for canonical_graph. A code child's embedding
text (`ingest/embed_text.py`: its name's words + its source) goes into the CAS beside its text;
the row carries its hash as `embed_hash`, the key of the child's vector.

Work follows the change: a file whose content hash is unchanged keeps its rows of the chunk table
and its facts file (`tables/<source>/facts/`, graph facts only), so a rebuild after one edit parses
one file and writes its texts, not the source's."""
from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import posixpath
from collections import Counter
from operator import itemgetter
from pathlib import Path

from mtrag_resources.core.arrow import pa, pc
from mtrag_resources.core.atomic import write_bytes_atomic
from mtrag_resources.stores.cas import ContentStore
from mtrag_resources.ingest.chunking.code import chunk_code
from mtrag_resources.ingest.chunking.docs import chunk_doc
from mtrag_resources.ingest.issues import IssueExportError, chunk_issue_export
from mtrag_resources.ingest.chunking.pdf import chunk_pdf
from mtrag_resources.core.config import Settings
from mtrag_resources.core.session import session_cache
from mtrag_resources.core.models import Chunk, DocReference, GraphNode, GraphRelation, ParsedFile
from mtrag_resources.ingest.chunking.limits import DEFAULT_MAX_FILE_CHUNKS, DEFAULT_MAX_ISSUES, cap_chunks, is_cut
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.stores.table_changes import describe_changes, forget_changes, identity, record_changes, rows_outside
from mtrag_resources.stores.bucketed import Bucketing
from mtrag_resources.stores.tables import (_schema_for, cached_rows, column_counts, held_table, hold_table, table_exists,
                                           truthy_count, write_table)
from mtrag_resources.stages.common import StageResult, chunk_set_generation, timed
from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.core.layout import SourceLayout, update_state
from mtrag_resources.ingest.pdf import PDF_LANGUAGE, PdfSkip, is_pdf_skip
from mtrag_resources.ingest.snapshot import load_inventory
from mtrag_resources.ingest.sphinx_conf import CONF_NAME, conf_reader, default_roles

DOC_MAX_TOKENS = 256  # all-MiniLM-L6-v2's max_seq_length; larger models may raise it


def parse_file(source_id: str, path: str, category: str, language: str, text: str | bytes,
               default_role: str = "", max_chunks: int = DEFAULT_MAX_FILE_CHUNKS,
               max_issues: int = DEFAULT_MAX_ISSUES) -> ParsedFile:
    """A file's chunks and facts. A PDF is parsed from its bytes (raises ingest.pdf.PdfSkip when it
    gives no text); every other file from its text. `default_role`: a doc's Sphinx default role.
    A code, doc or PDF file gives at most `max_chunks` chunks, an issue export `max_issues` issues
    (the source's limits; a file cut says so in its warnings: chunking/limits.py)."""
    if category == "code":
        return chunk_code(source_id, path, text, language, max_chunks=max_chunks)
    if category == "issues":  # an issue-tracker export (ingest/issues.py); a build checks it first
        try:
            return chunk_issue_export(source_id, path, text, max_tokens=DOC_MAX_TOKENS, max_issues=max_issues)
        except IssueExportError as exc:
            raise IssueExportError(f"source {source_id!r}: {path}: {exc}") from None
    if language == PDF_LANGUAGE:
        return cap_chunks(chunk_pdf(source_id, path, text, max_tokens=DOC_MAX_TOKENS), max_chunks, path)
    return cap_chunks(chunk_doc(source_id, path, text, language, max_tokens=DOC_MAX_TOKENS,
                                default_role=default_role), max_chunks, path)


_GRAPH_FACTS = ("nodes", "relations", "references", "imports", "calls", "bases", "routes")


# The chunk table's buckets: by file, so a one-file change writes one part (a file's rows keep
# their chunker's order in it); the table's order is by file path.
CHUNK_BUCKETS = Bucketing(key="file_path", order=("file_path",))
_LEGACY_TABLE = "chunks.parquet"  # the single file of versions before the buckets


def _facts_key(path: str, entry_sha: str, category: str, default_role: str = "", limits: str = "") -> str:
    role = f"\0{default_role}" if default_role else ""  # a doc's references follow its Sphinx default role
    limits = f"\0{limits}" if limits else ""  # a source's non-default chunk or issue limits
    return hashlib.sha256(f"{CODE_VERSIONS['cas_chunks']}\0{category}\0{path}\0{entry_sha}{role}{limits}".encode()).hexdigest()[:32]


def _limits(spec: SourceSpec) -> str:
    """The source's chunk and issue limits where they are not the defaults ("" where they are):
    part of a file's facts key, so a changed limit parses the file again."""
    if (spec.max_file_chunks, spec.max_issues) == (DEFAULT_MAX_FILE_CHUNKS, DEFAULT_MAX_ISSUES):
        return ""
    return f"{spec.max_file_chunks}/{spec.max_issues}"


def _default_roles(spec: SourceSpec, inventory, cas: ContentStore) -> dict[str, str]:
    """{rST doc path: its Sphinx project's default role} (ingest/sphinx_conf.py): only rST
    interpreted text takes one. The conf.py is the snapshot's, else the one beside the pages on disk
    (a docs source often includes its pages alone); a git source's, the snapshot's only."""
    pages = [e.path for e in inventory.included if e.category == "doc" and e.language == "rst"]
    if not pages:
        return {}
    included = {e.path: (lambda sha=e.sha256: cas.get_text(sha)) for e in inventory.included
                if posixpath.basename(e.path) == CONF_NAME}
    root = Path(inventory.root) if inventory.root and spec.git is None else None
    return default_roles(pages, conf_reader(root, included))


# The facts index by its file's identity (path, inode, mtime, size): the graph and link stages of
# every batch read the one the chunk stage just wrote. Read-only to the callers. One per source.
_INDEX = session_cache("cas_chunks.facts_index", max_entries=256)


def _index_identity(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _load_index(layout: SourceLayout) -> dict:
    """{file_path: {"sha256", "category", "language", "key", "warnings"}} of the last run ({} after
    a code version change: every file is parsed again). Shared: read it, do not change it."""
    path = os.path.abspath(layout.facts)
    key = _index_identity(path)
    held = _INDEX.get(path)
    if key is not None and held is not None and held[0] == key:
        return held[1]
    try:
        doc = json.loads(layout.facts.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    files = doc["files"] if doc.get("code_version") == CODE_VERSIONS["cas_chunks"] else {}
    _hold_index(path, key, files)
    return files


def facts_keys(layout: SourceLayout) -> dict[str, str]:
    """{file_path: its facts key} of the last run: a file's graph facts, references and chunks
    follow from its key ({} where there is no index)."""
    return {path: entry["key"] for path, entry in _load_index(layout).items()}


def _write_index(layout: SourceLayout, files: dict) -> None:
    write_bytes_atomic(layout.facts, json.dumps({"code_version": CODE_VERSIONS["cas_chunks"], "files": files}).encode())
    path = os.path.abspath(layout.facts)
    _hold_index(path, _index_identity(path), files)


def _hold_index(path: str, key: tuple | None, files: dict) -> None:
    if key is not None:
        _INDEX[path] = (key, files)


def _facts_file(layout: SourceLayout | str, key: str) -> str:
    """The facts file of `key` in the layout's facts folder (or that folder, _facts_folder's): a
    string, as a Path built per file of every batch adds up."""
    return f"{layout if type(layout) is str else _facts_folder(layout)}/{key}.json.gz"


def _facts_folder(layout: SourceLayout) -> str:
    return os.path.abspath(layout.facts_dir)


# Decoded facts files by their file (a source's folder and the key). A key names one parse of one
# file version (_facts_key: code version, category, path, content hash, default role), so an entry never goes
# stale; but two sources holding the same file share the key, and their facts differ (node ids and
# source ids are the source's): the memo is per file, never per key. The graph and link stages of a
# build (and every batch of `mtrag watch`) read every file's facts, and decoding them again each
# time was slow. Read-only to the callers; bounded by entries.
FACTS_MAX_ENTRIES = 20_000
_FACTS = session_cache("cas_chunks.facts", max_entries=FACTS_MAX_ENTRIES)


def _read_facts(layout: SourceLayout | str, key: str) -> dict:
    """`layout`: the source's layout or its facts folder (_facts_folder)."""
    path = name = _facts_file(layout, key)  # absolute; no resolve(): an lstat per part, every batch
    parsed = _FACTS.get(name)  # a hit is the most recently used
    if parsed is None:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            parsed = json.load(fh)
        _FACTS[name] = parsed
    return parsed


def load_facts(layout: SourceLayout) -> dict:
    """{file_path: {"sha256", "category", "parsed": graph facts as a dict}} of every file (what the
    graph and link stages resolve across files; chunk texts are in the chunk table and the CAS).
    The facts' lists are shared with a memo: read them, do not change them."""
    out, folder = {}, _facts_folder(layout)
    for path, entry in _load_index(layout).items():
        parsed = _read_facts(folder, entry["key"])
        out[path] = {"sha256": entry["sha256"], "category": entry["category"],
                     "parsed": {**parsed, "language": entry.get("language", ""), "warnings": entry["warnings"]}}
    return out


# Graph facts as the graph stage's objects, by facts file, language and warnings (what a
# ParsedFile holds beside the facts), not built again per watch batch. Shared with the graph stage and the tables it writes: read-only.
_PARSED = session_cache("cas_chunks.parsed_files", max_entries=FACTS_MAX_ENTRIES)


def load_parsed_files(layout: SourceLayout) -> list[tuple[str, ParsedFile]]:
    """Every file's graph facts as a ParsedFile (no chunks), in path order. The objects are shared
    with a memo (and with the graph tables written from them): read them, do not change them."""
    out, folder, memo = [], _facts_folder(layout), _PARSED.mapping()  # one lookup per file: no handle
    for path, entry in sorted(_load_index(layout).items()):
        name = _facts_file(folder, entry["key"])
        memo_key = (name, entry.get("language", ""), tuple(entry["warnings"]))
        parsed = memo.get(memo_key)  # a hit is the most recently used
        if parsed is None:
            doc = _read_facts(folder, entry["key"])
            parsed = memo[memo_key] = ParsedFile(
                nodes=[GraphNode(**n) for n in doc["nodes"]],
                relations=[GraphRelation(**r) for r in doc["relations"]],
                references=[DocReference(**r) for r in doc["references"]], imports=doc["imports"],
                calls=doc["calls"], bases=doc["bases"], routes=doc.get("routes", []),
                warnings=list(entry["warnings"]), language=entry.get("language", ""))
        out.append((path, parsed))
    return out


def _chunk_rows(parsed: ParsedFile, spec: SourceSpec, cas: ContentStore) -> list[dict]:
    rows = []
    for chunk in parsed.chunks:
        cas.put_text(chunk.text)
        if chunk.embed_text:  # the embedder's text of a code child (ingest/embed_text.py)
            cas.put_text(chunk.embed_text)
        chunk.source_id, chunk.source_kind = spec.id, spec.kind
        chunk.cas_uri = ContentStore.uri(chunk.content_hash)
        row = dataclasses.asdict(chunk)
        del row["text"], row["embed_text"]  # texts live once, in the CAS
        rows.append(row)
    return rows


def _previous_rows(layout: SourceLayout, kept: set[str]) -> tuple[pa.Table | None, pa.Table | None]:
    """(the previous chunk table's rows of the files that did not change (no re-parse, no CAS
    writes, no dataclass round trip for them), the previous table whole); (None, None) when there
    is none."""
    if not table_exists(layout.chunks):
        return None, None
    table = held_table(layout.chunks)  # the watch: the table it wrote last, where the file's schema is its
    if not kept:
        return None, table
    return table.filter(pc.is_in(table["file_path"], value_set=pa.array(sorted(kept)))), table


def _records(table: pa.Table, previous: list[dict] | None, previous_table: pa.Table | None,
             kept: set[str]) -> list[dict]:
    """table.to_pylist(), with the kept files' records taken from the previous table's (this
    process wrote or read it: `mtrag watch`) instead of decoded again. `previous_table`: the
    previous table, None where its kept rows are not as they were. Converting every chunk row
    again cost a batch far more than the one file that changed."""
    if not previous or not kept or previous_table is None or list(previous[0]) != table.schema.names:
        return table.to_pylist()
    by_file: dict[str, list[dict]] = {}
    for record in previous:
        if record["file_path"] in kept:
            by_file.setdefault(record["file_path"], []).append(record)
    fresh = table.filter(pc.invert(pc.is_in(table["file_path"], value_set=pa.array(sorted(kept))))).to_pylist()
    for record in fresh:
        by_file.setdefault(record["file_path"], []).append(record)
    # the table's order: file path (UTF-8 byte order is code point order), then each file's own
    records = [r for path in sorted(by_file) for r in by_file[path]]
    return records if len(records) == table.num_rows else table.to_pylist()


def _source_wide_changed(previous: pa.Table, table: pa.Table) -> bool:
    """Does a column _assemble sets for every row (repository, ref) differ from the previous table's?"""
    return any(set(previous.column(name).unique().to_pylist()) - set(table.column(name).unique().to_pylist())
               for name in ("repository", "ref"))


def _log_changes(layout: SourceLayout, base: list | None, previous: pa.Table | None, table: pa.Table,
                 rows: list[dict], kept: set[str]) -> dict:
    """The chunk table's change log (stores/table_changes.py): the rows of the files parsed again
    or gone, before and after. `previous`: the previous table, None where there is none or its
    kept rows changed too (a source-wide column): then the readers compare tables."""
    if previous is None:
        forget_changes(layout.chunks)
        return {}
    return record_changes(layout.chunks, base, "chunk_id", rows_outside(previous, "file_path", kept),
                          [r for r in rows if r["file_path"] not in kept], table.schema)


def build_cas_chunks(settings: Settings, spec: SourceSpec) -> StageResult:
    """Parse the files whose content changed since the last run; every other file keeps its rows
    of the chunk table and its facts file, so a one-file edit costs one file's parse and writes
    (plus reading and writing the chunk table, a columnar file)."""
    layout = SourceLayout(settings, spec.id)
    inventory = load_inventory(layout)
    if inventory is None:
        raise RuntimeError(f"source {spec.id!r}: no raw_source snapshot; materialize raw_source first")
    cas = ContentStore(settings.cas_dir)
    # No chunk table (a first build, or one left by a version before the buckets): every file is
    # parsed, as a kept file's rows come from that table.
    previous = indexed_before = _load_index(layout) if table_exists(layout.chunks) else {}
    meta: dict = {}
    index: dict = {}
    new_rows: list[dict] = []
    kept: set[str] = set()
    with timed(meta, "seconds"):
        layout.facts_dir.mkdir(parents=True, exist_ok=True)
        facts_folder = _facts_folder(layout)
        roles = _default_roles(spec, inventory, cas)
        limits = _limits(spec)
        for entry in inventory.included:
            old = previous.get(entry.path)
            role = roles.get(entry.path, "")
            if old and old["sha256"] == entry.sha256 and old["category"] == entry.category \
                    and old.get("default_role", "") == role and old.get("limits", "") == limits \
                    and os.path.exists(_facts_file(facts_folder, old["key"])):
                index[entry.path] = old
                kept.add(entry.path)
                continue
            index[entry.path], file_rows = _parse_entry(layout, spec, entry, role, limits, cas)
            new_rows.extend(file_rows)
        kept_rows, previous_table = _previous_rows(layout, kept)
        table = _assemble(kept_rows, new_rows, spec, inventory)
        del new_rows  # in the table now; the records below are decoded from it
        # A kept file's rows are the previous table's as they were, unless a column _assemble sets
        # for every row (repository, ref) changed: then every row changed.
        previous = None if previous_table is None or _source_wide_changed(previous_table, table) else previous_table
        rows = _records(table, cached_rows(layout.chunks), previous, kept)
        _check_unique_ids(spec.id, rows)
        base = identity(layout.chunks)
        # the stages after this one read `rows` shared; only the buckets of changed files are
        # digested and written (a kept file's rows are the previous table's where `previous` is)
        changed_files = None if previous is None else (set(index) | set(indexed_before)) - kept
        written = write_table(layout.chunks, table, records=rows, bucketing=CHUNK_BUCKETS,
                              changed_keys=changed_files)
        hold_table(layout.chunks, table)  # the store stages' column reads (the file's order: by path)
        (layout.tables / _LEGACY_TABLE).unlink(missing_ok=True)
        logged = _log_changes(layout, base, previous, table, rows, kept)
        _write_index(layout, index)
        _remove_unused_facts(layout, {e["key"] for e in index.values()})
    reparsed = len(index) - len(kept)
    generation = chunk_set_generation(rows, spec.id)
    # the serving side reads a pasted section of these docs by the same rule (index_manifest)
    update_state(layout, generation=generation, default_role=_source_role(roles))
    # counted in the Arrow table, not over the row dicts (five passes in Python, every watch batch)
    roles = column_counts(table, "role")
    meta.update({
        "chunks": len(rows),
        "parents": roles.get("parent", 0),
        "children": roles.get("child", 0),
        "by_type": column_counts(table, "chunk_type"),
        "by_language": column_counts(table, "language"),
        "embedding_texts": truthy_count(table, "embed_hash"),  # code children (ingest/embed_text.py)
        "declarations": truthy_count(table, "declaration"),    # demoted below implementations
        "files_parsed": reparsed,
        "files_reused": len(kept),
        **_file_report(index, kept, inventory),
        "generation": generation,
        "change_log": describe_changes(logged),
        "table_parts_written": f"{written['written']} of {written['parts']} ({written['bytes_written']} bytes)",
    })
    return StageResult(data_version=generation, metadata=meta, value=rows)


def _parse_entry(layout: SourceLayout, spec: SourceSpec, entry, role: str, limits: str,
                 cas: ContentStore) -> tuple[dict, list[dict]]:
    """Parse one changed file of the snapshot: its facts file written, and (its entry of the
    index, its chunk rows)."""
    pdf = entry.language == PDF_LANGUAGE
    content = cas.get_bytes(entry.sha256) if pdf else cas.get_text(entry.sha256)
    skipped = ""
    try:
        parsed = parse_file(spec.id, entry.path, entry.category, entry.language, content, role,
                            max_chunks=spec.max_file_chunks, max_issues=spec.max_issues)
    except PdfSkip as skip:  # the inventory's probe read a page; the whole file gives none
        parsed, skipped = ParsedFile(warnings=[f"{entry.path}: skipped: {skip.reason}"]), skip.reason
    del content  # a large file's text is not needed past its parse
    key = _facts_key(entry.path, entry.sha256, entry.category, role, limits)
    facts = {k: [dataclasses.asdict(x) if dataclasses.is_dataclass(x) else x for x in getattr(parsed, k)]
             for k in _GRAPH_FACTS}
    write_bytes_atomic(_facts_file(layout, key), gzip.compress(json.dumps(facts).encode(), 3))
    del facts
    indexed = {"sha256": entry.sha256, "category": entry.category, "language": entry.language,
               "key": key, "warnings": parsed.warnings, **({"skipped": skipped} if skipped else {}),
               **({"default_role": role} if role else {}), **({"limits": limits} if limits else {})}
    # one file's objects at a time: its rows are all the table needs
    return indexed, _chunk_rows(parsed, spec, cas)


def _file_report(index: dict, kept: set[str], inventory) -> dict:
    """The stage's metadata on its files: the warnings, the documents that gave no text and the
    files indexed only in part."""
    warnings = [w for path in sorted(index) for w in index[path]["warnings"]]
    # what the files parsed by this run warned: the asset logs these, not every kept file's again
    # (a watch printed django's two long modules' warnings on every batch)
    new_warnings = [w for path in sorted(index) if path not in kept for w in index[path]["warnings"]]
    # Documents that give no text (a scanned, encrypted or unreadable PDF): the snapshot's, and any
    # this stage found with no text on any page; none of them has a chunk.
    skipped_docs = {f.path: f.reason for f in inventory.skipped if is_pdf_skip(f.reason)}
    skipped_docs.update((path, e["skipped"]) for path, e in sorted(index.items()) if e.get("skipped"))
    # Files indexed only in part (past max_file_chunks, an export past max_issues): each by name.
    cut_files = {path: w for path in sorted(index) for w in index[path]["warnings"] if is_cut(w)}
    return {"skipped_documents": dict(sorted(skipped_docs.items())[:50]),
            "files_cut": dict(list(cut_files.items())[:50]),
            "files_cut_count": len(cut_files),
            "warnings": warnings[:50],
            "warning_count": len(warnings),
            "new_warnings": new_warnings[:50]}


def _assemble(kept: pa.Table | None, new_rows: list[dict], spec: SourceSpec, inventory) -> pa.Table:
    """Kept and new rows in file order (each file's rows in its chunker's order), with the
    source-wide columns (repository, ref) set for all of them; `commit_sha` is the snapshot's on
    the new rows, and a kept row keeps its own (the text is the same at both commits), so a commit
    that changes one file changes the payload of that file's rows only."""
    for row in new_rows:
        row["commit_sha"] = inventory.commit
    parts = [t for t in (kept, pa.Table.from_pylist(new_rows) if new_rows else None) if t is not None and t.num_rows]
    if not parts:
        return pa.Table.from_pylist([], schema=pa.schema(
            [f for f in _schema_for(Chunk) if f.name not in ("text", "embed_text")]))
    table = pa.concat_tables(parts, promote_options="permissive") if len(parts) > 1 else parts[0]
    n = table.num_rows
    for name, value in (("repository", spec.repository or spec.pip_sdist or inventory.root),
                        ("ref", inventory.ref)):
        column = pa.array([value] * n, type=pa.string())
        table = table.set_column(table.schema.get_field_index(name), name, column)
    order = pa.array(range(n))
    table = table.append_column("_order", order)
    table = table.sort_by([("file_path", "ascending"), ("_order", "ascending")])
    return table.drop_columns(["_order"])


def _source_role(roles: dict[str, str]) -> str:
    """The default role of most of a source's rST pages ("" where none has one)."""
    return Counter(roles.values()).most_common(1)[0][0] if roles else ""


def _remove_unused_facts(layout: SourceLayout, keys: set[str]) -> None:
    for path in layout.facts_dir.glob("*.json.gz"):
        if path.name[:-len(".json.gz")] not in keys:
            path.unlink(missing_ok=True)
    layout.tables.joinpath("facts.json.gz").unlink(missing_ok=True)  # the single file of older versions


_CHUNK_ID = itemgetter("chunk_id")


def _check_unique_ids(source_id: str, rows: list[dict]) -> None:
    ids = list(map(_CHUNK_ID, rows))
    if len(set(ids)) == len(ids):  # the usual case, in C (a Counter only when there are duplicates)
        return
    dupes = [cid for cid, n in Counter(ids).items() if n > 1]
    if dupes:
        clash = [r["locator"] for r in rows if r["chunk_id"] == dupes[0]]
        raise RuntimeError(f"source {source_id!r}: duplicate chunk ids ({len(dupes)}), e.g. {clash}")
