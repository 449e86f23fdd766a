"""fts_db: a source's chunks in SQLite FTS5 (trigram + CJK bigram indexes), its exact aliases and
its parent rows for hydration, replaced in one transaction under a generation marker. Besides the
chunk rows' standard aliases, each web endpoint of the canonical graph (`GET /login`, `/login`)
is an alias of its handler's chunk, and each issue of an issues source (`#12`, `owner/repo#12`,
`PROJ-12`) of its first body passage."""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from mtrag_resources.core.arrow import pa, pc
from mtrag_resources.stores.cas import ContentStore
from mtrag_resources.core.config import Settings
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.stores.connect import open_fts
from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.stores.fts_query import (delta_aliases, derive_aliases, endpoint_aliases, entry_alias,
                                              issue_aliases, rows_to_rewrite)
from mtrag_resources.stores.table_delta import ProjectedTables, diff_tables
from mtrag_resources.stores.tables import held_table, read_shared, read_table, table_exists
from mtrag_resources.stages.common import StageResult, digest_json, projected_tables, timed
from mtrag_resources.core.layout import SourceLayout, read_state


def build_fts_db(settings: Settings, spec: SourceSpec) -> StageResult:
    layout = SourceLayout(settings, spec.id)
    generation = read_state(layout)["generation"]
    cas = ContentStore(settings.cas_dir)
    meta: dict = {}
    with timed(meta, "seconds"):
        rows = read_shared(layout.chunks)  # shared, read-only: a write below copies what it changes
        chunk_ids = {r["chunk_id"] for r in rows}  # a graph older than the chunks names none of theirs
        endpoints = [a for a in _endpoint_aliases(layout) if a[2] in chunk_ids]
        issues = issue_aliases(rows)  # an issues source's keys (`#12`, `owner/repo#12`, `PROJ-12`)
        # The chunk-set generation digests every row's id, content hash and place (and this stage's
        # code version): what the store holds besides is the endpoints' and issues' aliases, so no
        # digest of every row again each watch batch.
        input_sha = digest_json([["generation", generation]]
                                + ([["endpoints", endpoints]] if endpoints else [])
                                + ([["issues", issues, [r.get("state") for r in rows]]] if issues else []))
        snapshot = projected_tables(layout, "fts")
        store = open_fts(settings)
        try:
            held = store.holds(spec.id, generation, input_sha)
            stats = None
            if not issues and not held:
                stats = _write_delta(store, layout, spec.id, generation, input_sha, rows, endpoints, cas, snapshot)
            if stats is None:
                rows = [dict(r) for r in rows]
                if not held:  # texts only when something is written
                    for r in rows:
                        r["text"] = cas.get_text(r["content_hash"])
                # standard aliases (fts_query.derive_aliases), and the endpoints' and issues' where the source has some
                aliases = _with_endpoints(rows, spec.id, endpoints + issues) if endpoints or issues else None
                stats = store.write_source(spec.id, generation, input_sha, rows, aliases)
            marker = store.marker(spec.id)
        finally:
            store.close()
        snapshot.save_if_committed(marker, generation, {"chunks": layout.chunks},
                                   extra={**_snapshot_version(), "input_sha256": input_sha})
    meta.update({k: v for k, v in stats.items() if isinstance(v, (int, float, str, bool))})
    meta.update({"generation": generation, "marker": marker.state if marker else "none",
                 "write": "delta" if stats.get("delta_from") else "skipped" if stats.get("skipped") else "full",
                 "path": str(settings.fts_path),
                 "db_bytes": os.path.getsize(settings.fts_path) if settings.fts_path.exists() else 0})
    return StageResult(data_version=generation, metadata=meta)


# The aliases derived from the whole source rather than from one file's rows: a delta write
# replaces all of them (they are few).
SOURCE_WIDE_KINDS = ("source_id", "endpoint", "endpoint_path")


def _snapshot_version() -> dict:
    return {v: CODE_VERSIONS[v] for v in ("cas_chunks", "fts_db")}


def _write_delta(store, layout: SourceLayout, source_id: str, generation: str, input_sha: str,
                 rows: list[dict], endpoints: list, cas: ContentStore, snapshot: ProjectedTables) -> dict | None:
    """Rewrite only the chunk rows that changed since the chunk table the store last committed
    (their FTS entries and aliases; a parent whose having children changed too), and the changed
    files' own aliases; None where only a full write is right. An edit of one function of a long
    module rewrote all the module's rows before (django's text.py: 48 rows for one appended)."""
    last = snapshot.base_for(generation, _snapshot_version(), {"chunks": layout.chunks})
    if last is None:
        return None
    delta = diff_tables(layout.chunks, last.tables["chunks"], key=("chunk_id", "file_path"))
    files = set(delta.changed.column("file_path").to_pylist()) | {k[1] for k in delta.removed}
    # the changed files' buckets of the snapshot only (the chunk table is bucketed by file path)
    old = read_table(last.tables["chunks"], columns=["chunk_id", "file_path", "role", "parent_id"],
                     keys=("file_path", files))
    old = old.filter(pc.is_in(old["file_path"], value_set=pa.array(sorted(files), type=pa.string()))).to_pylist()
    plan = plan_delta(source_id, rows, old, delta.changed.column("chunk_id").to_pylist(),
                      [k[0] for k in delta.removed], lambda r: cas.get_text(r["content_hash"]))
    stats = store.write_source_delta(source_id, generation, input_sha, (last.generation, last.extra.get("input_sha256")),
                                     plan.drop, plan.rows, plan.aliases + endpoints, SOURCE_WIDE_KINDS,
                                     refiled_chunk_ids=plan.refiled)
    if stats is not None:
        stats["delta_read"] = delta.via  # the change log's difference, or the tables compared
    return stats


@dataclass
class DeltaPlan:
    """What write_source_delta gets for a change (see plan_delta)."""
    drop: list[str]            # chunk ids whose rows, FTS entries and own aliases go
    rows: list[dict]           # the rows (with their text) written again or new
    aliases: list[tuple]       # their aliases, the changed files' own and the source's id
    refiled: list[str]         # the changed files' chunk ids before: their file aliases go


def plan_delta(source_id: str, rows: list[dict], old_file_rows: list[dict], changed_ids: list[str],
               removed_ids: list[str], text_of: Callable[[dict], str]) -> DeltaPlan:
    """A change as rows to rewrite: `rows` the source's chunk rows now, `old_file_rows` the rows
    before (chunk_id, file_path, role, parent_id) of every file with a changed or removed row,
    `changed_ids` the rows new or different, `removed_ids` the rows gone. Only the rewritten rows'
    texts are read (`text_of`)."""
    changed = set(changed_ids)
    files = {r["file_path"] for r in old_file_rows} | {r["file_path"] for r in rows if r["chunk_id"] in changed}
    file_rows = [r for r in rows if r["file_path"] in files]
    rewrite = rows_to_rewrite(file_rows, old_file_rows, changed)
    file_rows = [dict(r, text=text_of(r)) if r["chunk_id"] in rewrite else r for r in file_rows]
    aliases = delta_aliases(file_rows, rewrite)
    alias = entry_alias(rows, source_id)
    if alias:
        aliases.append(alias)
    return DeltaPlan(drop=sorted(rewrite | set(removed_ids)), rows=[r for r in file_rows if r["chunk_id"] in rewrite],
                     aliases=aliases, refiled=[r["chunk_id"] for r in old_file_rows])


def _endpoint_aliases(layout: SourceLayout) -> list[tuple[str, str, str]]:
    """The endpoint aliases of the source's canonical graph (none before it is built): its
    ROUTES_TO edges and their ends only, read column-wise."""
    if not table_exists(layout.relations) or not table_exists(layout.nodes):
        return []
    rels = held_table(layout.relations, columns=["rel_type", "src_id", "dst_id"],
                      filters=[("rel_type", "=", "ROUTES_TO")]).to_pylist()
    if not rels:
        return []
    nodes = held_table(layout.nodes, columns=["node_id", "name", "chunk_id"])
    ends = sorted({r["src_id"] for r in rels} | {r["dst_id"] for r in rels})
    nodes = nodes.filter(pc.is_in(nodes["node_id"], value_set=pa.array(ends, type=pa.string()))).to_pylist()
    return endpoint_aliases(nodes, rels)


def _with_endpoints(rows: list[dict], source_id: str, endpoints: list[tuple[str, str, str]]):
    """The standard aliases, then the endpoints'; a generator, so nothing is derived when the store
    holds the generation already (it writes nothing then)."""
    yield from derive_aliases(rows, source_id)
    yield from endpoints
