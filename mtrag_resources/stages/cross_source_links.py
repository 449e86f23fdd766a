"""cross_source_links: doc -> code MENTIONS / IMPLEMENTS edges across sources, with evidence and
confidence, to Parquet and to Neo4j under the `__links__` marker. Bridge proposals logged by the
serving side are read here and join as INFERRED links."""
from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import Counter
from itertools import chain, compress, count
from operator import attrgetter, is_, not_

from mtrag_resources.core.config import Settings
from mtrag_resources.core.session import session_cache
from mtrag_resources.ingest.doc_links import (INDEXED_LABELS, SymbolIndex, add_link, kept_resolutions, link_for,
                                              resolve_links, table_changes)
from mtrag_resources.core.models import DocReference, GraphNode, GraphRelation
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.stores.connect import open_neo4j
from mtrag_resources.stores.contract import COMMITTED, LINKS_SOURCE, Marker
from mtrag_resources.stores.table_changes import identity
from mtrag_resources.stores.table_delta import ProjectedTables, diff_tables, same_columns
from mtrag_resources.stores.tables import as_rows, column_values, read_shared, read_table, rows_where, write_rows_changed
from mtrag_resources.core.arrow import pa, pc
from mtrag_resources.stages.canonical_graph import CHUNK_NODE_PREFIX
from mtrag_resources.stages.links_state import (LinksState, file_counts, forget_state, graph_inputs, index_key,
                                                load_state, save_state, table_digest)
from mtrag_resources.stages.cas_chunks import load_facts
from mtrag_resources.stages.common import StageResult, timed
from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.core.versions import CODE_VERSIONS


def _read_proposals(settings: Settings) -> list[dict]:
    """The bridge proposals the readers logged, each line once per version of the log: the log
    only grows (appends by the serving readers), so it is not parsed again on every watch batch.
    Read-only: the dicts are shared between calls."""
    path = settings.proposals_log
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return []
    stamp = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    with _INDEX_MEMO_LOCK:
        found = _PROPOSALS.get(stamp)
        if found is not None:
            return found
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn last line from a crashed writer is skipped, not fatal
    with _INDEX_MEMO_LOCK:
        _PROPOSALS[stamp] = out
    return out


_PROPOSALS = session_cache("cross_source_links.proposals", max_entries=1)  # the log's stamp when read -> its proposals


def build_index(settings: Settings, specs: list[SourceSpec]) -> tuple[SymbolIndex, dict[str, GraphNode]]:
    """The symbol index of the specs' graph tables, and every node by id."""
    return _indexed(settings, specs)[0], _nodes_by_id(settings, specs)


def _nodes_by_id(settings: Settings, specs: list[SourceSpec], ids: set[str] | None = None) -> dict[str, GraphNode]:
    """Every node of the specs by id, or only those of `ids` (only they are decoded: a CLI build
    wants a few, not every source's nodes)."""
    def nodes(path):
        return read_shared(path, GraphNode) if ids is None else rows_where(path, GraphNode, "node_id", ids)
    return {n.node_id: n for spec in specs for n in nodes(SourceLayout(settings, spec.id).nodes)}


# The last index built, with the resolutions made on it, kept while what it was built from is the
# same: the sources' code entities, INHERITS relations and imports (compared by identity first:
# read_shared gives an unchanged table's very objects). A watch batch that changed only docs then
# resolves nothing again. One entry, "last": (inputs, index, resolved, reads).
_INDEX_MEMO = session_cache("cross_source_links.index", max_entries=1)
_INDEX_MEMO_LOCK = threading.Lock()
# What the last compute_links made of each docs file's references, for its sources (resolve_links'
# `made`): one set of sources' links kept, what the next batch compares with.
_LINKS_MADE = session_cache("cross_source_links.links_made", max_entries=1)


def _index_inputs(settings: Settings, specs: list[SourceSpec]) -> list[tuple]:
    inputs = []
    for spec in specs:
        layout = SourceLayout(settings, spec.id)
        if layout.imports.exists():
            imports = read_shared(layout.imports)
        else:  # a graph written before the imports table: the files' facts hold them
            imports = [i for f in load_facts(layout).values() for i in f["parsed"]["imports"]]
        inputs.append((spec.id, rows_where(layout.nodes, GraphNode, "label", INDEXED_LABELS),
                       rows_where(layout.relations, GraphRelation, "rel_type", ["INHERITS"]), imports))
    return inputs


def _indexed(settings: Settings, specs: list[SourceSpec]) -> tuple[SymbolIndex, dict, dict | None]:
    """(index, memo of its resolutions, their read tokens or None) of the specs' graph tables. A
    new index (a code source changed) keeps the last one's resolutions whose read tokens name no
    entry that changed (doc_links.changed_reads): a watch batch that appended a function to
    a large source resolved every distinct reference again for a handful that could differ.
    Tokens are recorded only in a process that keeps resolutions (keep_link_resolutions)."""
    inputs = _index_inputs(settings, specs)
    with _INDEX_MEMO_LOCK:
        last = _INDEX_MEMO.get("last")
        if last is not None and last[0] == inputs:
            return last[1], last[2], last[3]
    update = _index_updated(last[0], last[1], inputs) if last else None
    index, changed = update if update is not None else (_index_of(inputs), None)
    resolved: dict = {}
    reads = {} if _KEEP_RESOLUTIONS else None
    if reads is not None and last and last[3] is not None:
        resolved, reads = kept_resolutions(last[1], index, last[2], last[3], changed)
    with _INDEX_MEMO_LOCK:
        _INDEX_MEMO["last"] = (inputs, index, resolved, reads)
    return index, resolved, reads


def _index_of(inputs: list[tuple]) -> SymbolIndex:
    index = SymbolIndex()
    for _sid, nodes, _inherits, _imports in inputs:
        index.add_nodes(nodes)
    index.bases = _bases_of(inputs)
    index.exports, index.stars = _exports_of(inputs)
    return index


def _bases_of(inputs: list[tuple]) -> dict:
    """SymbolIndex.bases of the sources' INHERITS relations, each source's resolved on the entities
    of the sources up to it."""
    index = SymbolIndex()
    entities: dict[str, GraphNode] = {}
    for _sid, nodes, inherits, _imports in inputs:
        entities.update(zip(map(_NODE_ID, nodes), nodes))  # in C, not a generator
        index.add_relations(entities, inherits)
    return index.bases


def _exports_of(inputs: list[tuple]) -> tuple[dict, dict]:
    """SymbolIndex.exports and .stars of the sources' imports."""
    index = SymbolIndex()
    for _sid, _nodes, _inherits, imports in inputs:
        index.add_imports(imports)
    return index.exports, index.stars


# A change of more nodes than this share of the sources' is indexed from scratch (_index_updated)
_UPDATE_SHARE = 0.25


def _index_updated(old_inputs: list[tuple], old: SymbolIndex,
                   inputs: list[tuple]) -> tuple[SymbolIndex, set] | None:
    """The index of `inputs` made from `old` (the index of `old_inputs`) and the tokens of its
    entries that changed, where the sources are the same and their nodes changed little: the
    nodes gone and new (by identity: an unchanged table's rows are the same objects) are taken out
    of and put into the entries they touch, the rest shared. The bases and re-exports are made
    again only where the INHERITS relations, the nodes they name or the imports changed. None where
    it cannot tell: the other sources, or nodes that kept their objects but not their order."""
    if [i[0] for i in old_inputs] != [i[0] for i in inputs]:
        return None
    gone: list[GraphNode] = []
    fresh: list[GraphNode] = []
    for (_sid, was, _, _), (_, now, _, _) in zip(old_inputs, inputs):
        if was is now:
            continue
        now_ids, was_ids = set(map(id, now)), set(map(id, was))
        kept_was = list(map(now_ids.__contains__, map(id, was)))
        kept_now = list(map(was_ids.__contains__, map(id, now)))
        # the nodes both hold in the same order, or an entry no change touched could differ
        if not all(map(is_, compress(was, kept_was), compress(now, kept_now))):
            return None
        gone += compress(was, map(not_, kept_was))
        fresh += compress(now, map(not_, kept_now))
    if len(gone) + len(fresh) > _UPDATE_SHARE * max(sum(len(i[1]) for i in inputs), 1):
        return None
    position: dict[int, int] = {}

    def order(node: GraphNode) -> int:
        if not position:  # only where an entry holds several nodes
            position.update(zip(map(id, chain.from_iterable(i[1] for i in inputs)), count()))
        return position[id(node)]

    index, changed = old.with_nodes_changed(gone, fresh, order)
    named = {i for g in (gone, fresh) for i in map(_NODE_ID, g)}
    if any(was is not now for (_, _, was, _), (_, _, now, _) in zip(old_inputs, inputs)) or \
            (named and any(r.src_id in named or r.dst_id in named for i in inputs for r in i[2])):
        index.bases = _bases_of(inputs)
        changed |= table_changes("bases", old.bases, index.bases)
    if any(was is not now for (_, _, _, was), (_, _, _, now) in zip(old_inputs, inputs)):
        index.exports, index.stars = _exports_of(inputs)
        changed |= table_changes("exports", old.exports, index.exports) | table_changes("stars", old.stars, index.stars)
    return index, changed


_KEEP_RESOLUTIONS = False  # keep_link_resolutions()
_NODE_ID = attrgetter("node_id")


def keep_link_resolutions() -> None:
    """Record what each link resolution read, so that the next index keeps those that still hold
    (a long-lived process: the watch). Recording costs a resolution from scratch a little; a
    one-shot `mtrag build` has no next index to keep them for."""
    global _KEEP_RESOLUTIONS
    _KEEP_RESOLUTIONS = True


def compute_links(settings: Settings, specs: list[SourceSpec]) -> tuple[list[GraphRelation], dict]:
    """Every source's references resolved on the index of every source's tables, and the bridge
    proposals joined."""
    links, stats, _state = _resolve_all(settings, specs)
    return links, stats


def _resolve_all(settings: Settings, specs: list[SourceSpec],
                 inputs: dict[str, dict] | None = None) -> tuple[list[GraphRelation], dict, LinksState | None]:
    """compute_links, with the state a later one-shot stage may start from, made from the sources'
    graph `inputs` (_graph_inputs; None where one is not recorded, or this process keeps its own
    memo, the watch: no state)."""
    index, resolved, reads = _indexed(settings, specs)
    references: list[DocReference] = []
    for spec in specs:
        references.extend(read_shared(SourceLayout(settings, spec.id).references, DocReference))
    chunk_hash, chunk_ids = _chunk_evidence(settings, specs)
    with _INDEX_MEMO_LOCK:
        made = _LINKS_MADE.pop(tuple(s.id for s in specs), {})
    kept = len(resolved)
    links, unresolved = resolve_links(index, references, resolved, evidence=chunk_hash, made=made, reads=reads)
    with _INDEX_MEMO_LOCK:
        _LINKS_MADE[tuple(s.id for s in specs)] = made
    links, proposals_used, proposal_ids = _with_proposals(settings, specs, links, chunk_hash, chunk_ids)
    # distinct references resolved by this run, and those taken from the last index's (the watch);
    # the files whose references it resolved, the links kept as they were (_resolve_changed)
    stats = {"references": len(references), "unresolved": unresolved, "proposals_used": proposals_used,
             "targets_resolved": len(resolved) - kept, "targets_kept": kept, "files_resolved": len(made),
             "links_reused": 0}
    state = None
    if inputs is not None:
        counts = file_counts(references, resolved)
        state = LinksState(index_key=index_key(specs, inputs), table="", proposals=proposal_ids, files={
            s.id: {path: [key, *counts.get((s.id, path), (0, 0))] for path, key in inputs[s.id]["files"].items()}
            for s in specs})
    return links, stats, state


def _graph_inputs(settings: Settings, specs: list[SourceSpec]) -> dict[str, dict] | None:
    inputs = {}
    for spec in specs:
        found = graph_inputs(SourceLayout(settings, spec.id))
        if found is None:
            return None
        inputs[spec.id] = found
    return inputs


def _chunk_evidence(settings: Settings, specs: list[SourceSpec]) -> tuple[dict[str, str], set[str]]:
    """(chunk id -> content hash, every chunk id) of the specs' chunk tables: a link's evidence."""
    chunk_hash: dict[str, str] = {}
    chunk_ids: set[str] = set()
    for spec in specs:
        # two columns, not another source's whole chunk table decoded
        chunks = column_values(SourceLayout(settings, spec.id).chunks, ["chunk_id", "content_hash"])
        chunk_hash.update(zip(chunks["chunk_id"], chunks["content_hash"]))
        chunk_ids.update(chunks["chunk_id"])
    return chunk_hash, chunk_ids


def _with_proposals(settings: Settings, specs: list[SourceSpec], links: list[GraphRelation],
                    chunk_hash: dict[str, str], chunk_ids: set[str]) -> tuple[list[GraphRelation], int, list[str]]:
    """`links` (sorted by rel_id) with the bridge proposals' INFERRED links they do not have;
    (links, proposals used, the rel_ids those added)."""
    by_id = {l.rel_id: l for l in links}
    added: list[str] = []
    proposals = _read_proposals(settings)
    nodes_by_id = _nodes_by_id(settings, specs, {p.get("node_id", "") for p in proposals}) if proposals else {}
    for p in proposals:
        node = nodes_by_id.get(p.get("node_id", ""))
        if node is None or p.get("from_chunk_id") not in chunk_ids:
            continue
        ref = DocReference(chunk_id=p["from_chunk_id"], file_path=p.get("file_path", ""), line=int(p.get("line", 0)),
                           ref_kind="proposal", role="", target=node.qualified_name,
                           matched_text=p.get("matched_text", ""), source_id=p.get("source_id", ""))
        link = link_for(ref, [node], confidence_override="INFERRED",
                        evidence_hash=chunk_hash.get(ref.chunk_id))
        if link.rel_id not in by_id:
            by_id[link.rel_id] = link
            added.append(link.rel_id)
    if added:
        links = sorted(by_id.values(), key=_REL_ID)
    return links, len(added), added


# A one-shot stage resolves the changed files alone up to this share of the files (beyond it the
# full resolution costs about the same and needs no state).
MAX_CHANGED_SHARE = 0.25


def _resolve_changed(settings: Settings, specs: list[SourceSpec],
                     inputs: dict[str, dict]) -> tuple[list[GraphRelation], dict, LinksState] | None:
    """compute_links from the last links stage's state (stages/links_state.py) and the sources'
    graph `inputs`: the last links of the files whose facts are the same, the changed files'
    references resolved, the proposals joined again. None where the state does not describe what
    is on disk (then resolve all)."""
    state = load_state(settings)
    if state is None or state.index_key != index_key(specs, inputs) \
            or state.table != table_digest(settings.links_table):
        return None
    changed: dict[str, set[str]] = {}
    gone: set[tuple[str, str]] = set()
    for spec in specs:
        now, was = inputs[spec.id]["files"], state.files.get(spec.id, {})
        changed[spec.id] = {p for p, key in now.items() if was.get(p, [None])[0] != key}
        gone.update((spec.id, p) for p in was if now.get(p) != was[p][0])
    total = sum(len(i["files"]) for i in inputs.values())
    if sum(map(len, changed.values())) > MAX_CHANGED_SHARE * max(total, 1):
        return None
    table = read_table(settings.links_table)
    redo = pa.array(sorted(f"{sid}\0{path}" for sid, path in gone), type=pa.string())
    stale = pc.or_(pc.is_in(table["rel_id"], value_set=pa.array(state.proposals, type=pa.string())),
                   pc.is_in(pc.binary_join_element_wise(table["source_id"], table["evidence_file"], "\0"),
                            value_set=redo))
    kept = as_rows(table.filter(pc.invert(pc.fill_null(stale, False))).to_pylist(), GraphRelation)
    chunk_hash, chunk_ids = _chunk_evidence(settings, specs)
    for link in kept:  # a kept link's chunk must still have the content it was resolved from
        chunk_id = link.src_id.removeprefix(CHUNK_NODE_PREFIX)
        if chunk_hash.get(chunk_id, chunk_id) != link.evidence_hash:
            return None
    references = [ref for spec in specs if changed[spec.id]
                  for ref in rows_where(SourceLayout(settings, spec.id).references, DocReference, "file_path",
                                        sorted(changed[spec.id]))]
    fresh: list[GraphRelation] = []
    resolved: dict = {}
    if references:
        index, resolved, _reads = _indexed(settings, specs)
        fresh, _unresolved = resolve_links(index, references, resolved, evidence=chunk_hash)
    by_id = {l.rel_id: l for l in kept}
    for link in fresh:
        add_link(by_id, link)
    links = sorted(by_id.values(), key=lambda r: r.rel_id)
    links, proposals_used, proposal_ids = _with_proposals(settings, specs, links, chunk_hash, chunk_ids)
    counts = file_counts(references, resolved)
    files = {s.id: {path: (state.files[s.id][path] if path not in changed[s.id]
                           else [key, *counts.get((s.id, path), (0, 0))])
                    for path, key in inputs[s.id]["files"].items()} for s in specs}
    stats = {"references": sum(f[1] for per in files.values() for f in per.values()),
             "unresolved": sum(f[2] for per in files.values() for f in per.values()),
             "proposals_used": proposals_used, "targets_resolved": len(resolved), "targets_kept": 0,
             "files_resolved": len(counts), "links_reused": len(kept)}
    return links, stats, LinksState(index_key=state.index_key, table="", proposals=proposal_ids, files=files)


# The links a process that keeps resolutions (the fast lane) resolved ahead of its links stage,
# beside the store writes that stage waits for (prepare_links): [what they were resolved from
# (_reads_key), links, figures] under "last". Taken once, by the next stage whose reads are the same.
_PREPARED = session_cache("cross_source_links.prepared", max_entries=1)


def _reads_key(settings: Settings, specs: list[SourceSpec]) -> tuple | None:
    """What a resolution of `specs`' links reads, by file identity: each source's graph and chunk
    tables (every write replaces a table's file) and the proposals log; None where a table is
    missing (a graph from before the imports table: its facts files are read instead)."""
    tables = [identity(path) for spec in specs for layout in (SourceLayout(settings, spec.id),)
              for path in (layout.nodes, layout.relations, layout.imports, layout.references, layout.chunks)]
    if any(t is None for t in tables):
        return None
    try:
        st = os.stat(settings.proposals_log)
        proposals = (st.st_ino, st.st_size, st.st_mtime_ns)
    except FileNotFoundError:
        proposals = None
    return tuple(s.id for s in specs), tuple(map(tuple, tables)), proposals


def prepare_links(settings: Settings, specs: list[SourceSpec]) -> bool:
    """Resolve `specs`' links now, for the links stage to take if nothing it reads changes before
    it runs. The fast lane calls this once the sources' graphs are written, while their stores
    are (they wait mostly on the Neo4j server and SQLite): the resolution leaves the batch's
    critical path (docs/performance.md#stages). Only in a
    process that keeps resolutions (the watch); returns whether it prepared."""
    if not _KEEP_RESOLUTIONS:
        return False
    key = _reads_key(settings, specs)  # before the reads: a write meanwhile makes it not match
    if key is None:
        return False
    links, stats, _state = _resolve_all(settings, specs)
    with _INDEX_MEMO_LOCK:
        _PREPARED["last"] = (key, links, stats)
    return True


def _take_prepared(settings: Settings, specs: list[SourceSpec]) -> tuple[list[GraphRelation], dict, None] | None:
    with _INDEX_MEMO_LOCK:
        prepared = _PREPARED.pop("last", None)
    if not prepared or prepared[0] != _reads_key(settings, specs):
        return None
    return prepared[1], dict(prepared[2]), None


def update_links_table(settings: Settings, specs: list[SourceSpec]) -> tuple[list[GraphRelation], dict]:
    """The links table brought up to date, and (links, figures): in a one-shot process from the
    last stage's state where it still describes what is on disk (only the changed files'
    references resolved), else every reference resolved; then the state for the next one. In a
    process that keeps resolutions, the links prepare_links resolved from the same reads."""
    # each graph table digested once per stage: both paths start from the same inputs
    inputs = None if _KEEP_RESOLUTIONS else _graph_inputs(settings, specs)
    found = _take_prepared(settings, specs) if inputs is None else _resolve_changed(settings, specs, inputs)
    links, stats, state = found if found is not None else _resolve_all(settings, specs, inputs)
    forget_state(settings)  # the table changes first: a state is never read beside another table
    write_rows_changed(settings.links_table, links, GraphRelation, "rel_id")  # links: sorted by rel_id
    if state is not None:
        state.table = table_digest(settings.links_table)
        save_state(settings, state)
    return links, stats


def build_cross_source_links(settings: Settings, specs: list[SourceSpec]) -> StageResult:
    meta: dict = {}
    with timed(meta, "seconds"):
        links, stats = update_links_table(settings, specs)
        generation = links_generation(links)
        store = open_neo4j(settings)
        try:
            store.ensure_schema_once()
            neo = _write_links(store, settings, generation, links)
            # both writes end with this marker committed or raise (neo4j_graph's stage: not read back)
            marker = Marker(LINKS_SOURCE, generation, COMMITTED)
        finally:
            store.close()
        if not neo.get("skipped_relationships"):  # a skipped link is tried again by the next full write
            _snapshot(settings).save_if_committed(marker, generation, {"links": settings.links_table},
                                                  extra=_snapshot_version())
    meta.update(stats)
    meta.update({
        "links": len(links),
        "by_type": dict(Counter(map(_REL_TYPE, links))),
        "by_confidence": dict(Counter(map(attrgetter("confidence"), links))),
        "generation": generation,
        "marker": marker.state if marker else "none",
        "neo4j_seconds": neo.get("seconds", 0.0) if isinstance(neo, dict) else 0.0,
        "write": "delta" if neo.get("delta_from") else "full",
    })
    return StageResult(data_version=generation, metadata=meta, value=links)


_REL_TYPE = attrgetter("rel_type")
_REL_ID = attrgetter("rel_id")


def links_generation(links: list[GraphRelation]) -> str:
    """The links' generation: a digest of every link's id (its type and ends), confidence and
    evidence. Joined strings rather than JSON: the stage runs on every watch batch, and JSON is
    the slower encoding."""
    text = "\n".join(f"{l.rel_id}\0{l.confidence}\0{l.evidence_hash}" for l in links)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _snapshot(settings: Settings) -> ProjectedTables:
    """The links table as Neo4j last committed it (stores/table_delta.py)."""
    return ProjectedTables(settings.links_dir / "projected" / "neo4j")


def _snapshot_version() -> dict:
    return {v: CODE_VERSIONS[v] for v in ("cross_source_links", "neo4j_graph")}


def _write_links(store, settings: Settings, generation: str, links: list[GraphRelation]) -> dict:
    """Only the links that changed since the table Neo4j last committed, where it still holds that
    generation (the same generation too: nothing to write, the store's counts are checked); else,
    or when the counts after the delta disagree, the full write, which reads what the projection
    holds and repairs it."""
    table = settings.links_table
    last = _snapshot(settings).load()
    if (last is not None and set(last.tables) == {"links"} and same_columns(table, last.tables["links"])
            and all(last.extra.get(k) == v for k, v in _snapshot_version().items())):
        if last.generation == generation:
            changed, removed = [], []
        else:
            delta = diff_tables(table, last.tables["links"], key=("rel_type", "rel_id"))
            changed, removed = as_rows(delta.changed.to_pylist(), GraphRelation), delta.removed
        expected = dict(Counter(map(_REL_TYPE, links)))
        stats = store.write_links_delta(generation, last.generation, changed, removed, expected)
        if stats is not None:
            return stats
    return store.write_links(generation, links)
