"""canonical_graph: entities and typed, directed relations with evidence for one source, plus
the references its docs and issues make (resolved across sources by cross_source_links). An
issues source's graph is its Issue nodes (CONTAINS their chunks, REFERENCES between issues)."""
from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from mtrag_resources.core.config import Settings
from mtrag_resources.core.session import session_cache
from mtrag_resources.ingest.code_graph import resolution_counts, resolve_code_graph
from mtrag_resources.core.models import DocReference, GraphNode, GraphRelation, ParsedFile, stable_id
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.stores.table_changes import describe_changes, identity, record_row_changes
from mtrag_resources.stores.bucketed import Bucketing
from mtrag_resources.stores.tables import value_counts, write_row_groups, write_rows, write_rows_changed
from mtrag_resources.stages.cas_chunks import facts_keys, load_parsed_files
from mtrag_resources.stages.common import StageResult, timed
from mtrag_resources.stages.links_state import GRAPH_TABLES, feeds_index, table_digest, write_graph_inputs
from mtrag_resources.core.layout import SourceLayout


# Nodes by their file, relations by their evidence's: a change writes the buckets of the files
# whose nodes or edges changed (a resolution change can reach other files' edges).
NODE_BUCKETS = Bucketing(key="file_path", order=("node_id",))
RELATION_BUCKETS = Bucketing(key="evidence_file", order=("rel_id",))
_LEGACY_TABLES = ("nodes.parquet", "relations.parquet")  # single files of versions before the buckets

CHUNK_NODE_PREFIX = "chunk:"  # a chunk's node in the graph (stores/neo4j_store.chunk_node_id)


def source_node_id(source_id: str) -> str:
    return f"{source_id}:source:{source_id}"


@dataclass
class _FileGraph:
    """One file version's part of its source's graph: its nodes, the source's CONTAINS edge to its
    File / Page / Issue node and its own relations, each by id, first one winning, and its import
    rows (the ParsedFile: cas_chunks' memo, the same object while the file is unchanged)."""
    parsed: ParsedFile
    nodes: dict[str, GraphNode]
    relations: dict[str, GraphRelation]
    imports: list[dict]


# Per source, the last assembly's file parts by the ParsedFile's id (the object is held): a batch
# builds the changed files' parts only, and an unchanged file's CONTAINS edge is the same object
# as before (the graph table's change finds it by identity), instead of a step per node and
# relation of every file. Evicted, a source's next assembly builds every part.
_FILE_GRAPHS = session_cache("canonical_graph.file_graphs", max_entries=256)


def _file_graph(source_node: GraphNode, source_id: str, parsed: ParsedFile, last: dict[int, _FileGraph]) -> _FileGraph:
    was = last.get(id(parsed))
    if was is not None and was.parsed is parsed:
        return was
    nodes: dict[str, GraphNode] = {}
    relations: dict[str, GraphRelation] = {}
    for n in parsed.nodes:
        n.source_id = source_id
        nodes.setdefault(n.node_id, n)
        if n.label in ("File", "Page", "Issue"):
            rel = GraphRelation(rel_id=stable_id("CONTAINS", source_node.node_id, n.node_id),
                                rel_type="CONTAINS", src_id=source_node.node_id, dst_id=n.node_id,
                                evidence_file=n.file_path, evidence_start=n.start_line,
                                evidence_end=n.end_line, evidence_hash=n.content_hash,
                                evidence_text=n.file_path, source_id=source_id)
            relations[rel.rel_id] = rel
    for r in parsed.relations:
        r.source_id = source_id
        relations.setdefault(r.rel_id, r)
    return _FileGraph(parsed, nodes, relations, _file_import_rows(parsed))


def assemble_graph(spec: SourceSpec, parsed_files) -> tuple[list[GraphNode], list[GraphRelation], list]:
    source_node = GraphNode(node_id=source_node_id(spec.id), label="Source", name=spec.id,
                            qualified_name=spec.id, source_id=spec.id)
    last = _FILE_GRAPHS.get(spec.id, {})
    parts = {}
    for _path, parsed in parsed_files:
        parts[id(parsed)] = _file_graph(source_node, spec.id, parsed, last)
    _FILE_GRAPHS[spec.id] = parts
    # the first occurrence of an id wins: the files' parts merged last to first, in C
    nodes: dict[str, GraphNode] = {}
    relations: dict[str, GraphRelation] = {}
    for part in reversed(list(parts.values())):
        nodes.update(part.nodes)
        relations.update(part.relations)
    nodes[source_node.node_id] = source_node
    references = [ref for _path, parsed in parsed_files for ref in parsed.references]
    code_files = [p for _path, p in parsed_files if p.imports or p.calls or p.bases or
                  any(n.label in ("Module", "File") for n in p.nodes)]
    extra_nodes, extra_relations = resolve_code_graph(spec.id, code_files)
    for n in extra_nodes:
        if nodes.setdefault(n.node_id, n) is n:
            n.source_id = spec.id
    for r in extra_relations:
        if relations.setdefault(r.rel_id, r) is r:
            r.source_id = spec.id
    # Drop relations whose ends are not in this source's graph (e.g. an import of a stdlib module).
    # An Issue CONTAINS its child chunks: those ends are the chunk nodes the same parse made.
    kept = [r for r in relations.values() if r.src_id in nodes and (r.dst_id in nodes or (
        r.rel_type == "CONTAINS" and r.dst_id.startswith(CHUNK_NODE_PREFIX) and nodes[r.src_id].label == "Issue"))]
    for ref in references:
        ref.source_id = spec.id
    return list(nodes.values()), kept, references


def _file_import_rows(parsed: ParsedFile) -> list[dict]:
    """The file's import statements as {module_qn, imported, alias, kind} (alias "" when none; kind
    import, from, star...): what cross_source_links reads to follow re-exports."""
    return [{"module_qn": imp.get("module_qn") or "", "imported": imp.get("imported") or "",
             "alias": imp.get("alias") or "", "kind": imp.get("kind") or ""} for imp in parsed.imports]


# Per source, the import rows per file last written, with the table's identity after that write.
_IMPORTS_WRITTEN = session_cache("canonical_graph.imports_written", max_entries=256)


def write_imports(layout: SourceLayout, source_id: str, parsed_files) -> list[dict]:
    """Every import statement of the source, in file order, written to its imports table unless
    it holds them already: an unchanged file's rows are the same list as last time (its _FileGraph
    from assemble_graph), and only the changed files' are compared, not every row by value."""
    parts = _FILE_GRAPHS.get(source_id, {})
    groups = [part.imports if (part := parts.get(id(parsed))) is not None and part.parsed is parsed
              else _file_import_rows(parsed) for _path, parsed in parsed_files]
    rows = [row for group in groups for row in group]
    written, table = _IMPORTS_WRITTEN.get(source_id), identity(layout.imports)
    if not (written is not None and table is not None and written[0] == table
            and len(written[1]) == len(groups) and all(a is b or a == b for a, b in zip(written[1], groups))):
        write_rows(layout.imports, rows)
        table = identity(layout.imports)
    _IMPORTS_WRITTEN[source_id] = (table, groups)
    return rows


def build_canonical_graph(settings: Settings, spec: SourceSpec) -> StageResult:
    layout = SourceLayout(settings, spec.id)
    meta: dict = {}
    with timed(meta, "seconds"):
        with timed(meta, "assemble_seconds"):  # the facts, the resolution, the graph's rows
            parsed = load_parsed_files(layout)
            nodes, relations, references = assemble_graph(spec, parsed)
            nodes.sort(key=attrgetter("node_id"))
            relations.sort(key=attrgetter("rel_id"))
        logged = {}
        for path, rows, row_type, pk, bucketing in (
                (layout.nodes, nodes, GraphNode, "node_id", NODE_BUCKETS),
                (layout.relations, relations, GraphRelation, "rel_id", RELATION_BUCKETS)):
            # Only what changed since the rows this process wrote last (`mtrag watch`) is converted
            # and logged; a fresh process converts every row (decoding the old ones first would
            # cost more than it saves), writes the buckets whose content changed, and the store
            # stages compare those buckets.
            base = identity(path)
            # sorted above; the ids are unique (dict keys)
            changes = write_rows_changed(path, rows, row_type, pk, bucketing, ordered=True)
            logged[path.stem] = describe_changes(record_row_changes(path, base, pk, changes))
        for legacy in _LEGACY_TABLES:
            (layout.graph / legacy).unlink(missing_ok=True)
        # one list per file: a watch batch converts the changed files' references only
        write_row_groups(layout.references, [p.references for _, p in parsed], DocReference)
        imports = write_imports(layout, spec.id, parsed)
    digests = {name: table_digest(getattr(layout, name)) for name in GRAPH_TABLES}
    write_graph_inputs(layout, digests, facts_keys(layout), feeds_index(nodes, relations, imports))
    digest = "".join(digests[name][:16] for name in GRAPH_TABLES)
    meta.update({
        "nodes": len(nodes),
        "relations": len(relations),
        "references": len(references),
        "imports": len(imports),
        "nodes_by_label": value_counts(layout.nodes, "label") if nodes else {},
        "relations_by_type": value_counts(layout.relations, "rel_type") if relations else {},
        "relations_by_confidence": value_counts(layout.relations, "confidence") if relations else {},
        "change_log": logged,
        # distinct calls resolved, and those a long-lived process (the watch) took from its last
        # resolution because the symbol-table entries they read did not change
        **resolution_counts(spec.id),
    })
    return StageResult(data_version=digest, metadata=meta, value=(nodes, relations, references))
