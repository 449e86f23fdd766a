"""qdrant_collection: a source's child chunks as dense points with their full payload, in the
collection of the source's kind, bracketed by a generation marker."""
from __future__ import annotations

from mtrag_resources.core.arrow import pc
from mtrag_resources.core.config import Settings
from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.stores.table_delta import ProjectedTables, diff_tables
from mtrag_resources.stores.tables import held_table
from mtrag_resources.embedding.embedder import Embedder
from mtrag_resources.embedding.multilingual import MultilingualEmbedder, collection_kind
from mtrag_resources.stores.embedding_cache import EmbeddingCache
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.stores.connect import open_qdrant
from mtrag_resources.stages.common import StageResult, projected_tables, timed
from mtrag_resources.core.layout import SourceLayout, read_state
from mtrag_resources.core.models import cjk_children, vector_hash
from mtrag_resources.stages.embedding_cache import child_rows

PAYLOAD_FIELDS = ("source_id", "chunk_id", "parent_id", "title", "summary", "locator", "graph_ids",
                  "content_hash", "cas_uri", "repository", "commit_sha", "ref", "file_path", "symbol",
                  "start_line", "end_line", "chunk_type", "language", "source_kind", "declaration")


def payload_for(row: dict) -> dict:
    """A point's payload: PAYLOAD_FIELDS, and `page` for a chunk of a PDF (its 1-based page; the key
    is absent on every other point, so their payloads, and digests, stay as they were)."""
    payload = {k: row.get(k, False) if k == "declaration" else row[k] for k in PAYLOAD_FIELDS}
    if row.get("page"):
        payload["page"] = int(row["page"])
    if row.get("issue_key"):  # a chunk of an issue-tracker export: its issue's key and state
        payload.update(issue_key=row["issue_key"], state=row.get("state") or "")
    return payload


def _points(fingerprint_id: str, rows: list[dict], key=vector_hash) -> list[dict]:
    """One point per row, named by its vector's cache key (the embedding text's hash for the
    default embedder, the content hash for the multilingual one): the store looks vectors up only
    for the points it writes."""
    return [{"chunk_id": r["chunk_id"], "vector_key": f"{fingerprint_id}:{key(r)}", "payload": payload_for(r)}
            for r in rows]


def _resolver(cache: EmbeddingCache, source_id: str):
    def resolve(keys: list[str]) -> dict:
        by_fp: dict[str, list[str]] = {}
        for k in keys:
            fp, h = k.split(":", 1)
            by_fp.setdefault(fp, []).append(h)
        out = {}
        for fp, hashes in by_fp.items():
            found = cache.lookup(fp, hashes)
            missing = [h for h in hashes if h not in found]
            if missing:
                raise RuntimeError(f"source {source_id!r}: {len(missing)} chunks have no cached vector for "
                                   f"embedder {fp}; materialize embedding_cache first")
            out.update((f"{fp}:{h}", v) for h, v in found.items())
        return out
    return resolve


def _content_hash(row: dict) -> str:
    return row["content_hash"]


def build_qdrant_collection(settings: Settings, spec: SourceSpec, embedder: Embedder,
                            multilingual: MultilingualEmbedder | None = None) -> StageResult:
    layout = SourceLayout(settings, spec.id)
    generation = read_state(layout)["generation"]
    meta: dict = {}
    snapshot = projected_tables(layout, "qdrant")
    version = {**{v: CODE_VERSIONS[v] for v in ("cas_chunks", "qdrant_collection")}, "kind": spec.kind,
               "embedder": embedder.fingerprint_id, "multilingual": multilingual.fingerprint_id if multilingual else ""}
    with timed(meta, "seconds"):
        resolve = _resolver(EmbeddingCache(settings.embeddings_dir), spec.id)
        with open_qdrant(settings) as store:
            store.ensure_collection(spec.kind, embedder.dim)
            stats = _write_delta(store, layout, spec, generation, snapshot, version, embedder, multilingual, resolve)
            if stats is None:
                rows = child_rows(layout)
                points = _points(embedder.fingerprint_id, rows)
                ml_rows = cjk_children(rows) if multilingual is not None else []
                # Always written (empty when the source has no CJK text), so a source that loses its CJK
                # chunks leaves no multilingual points behind.
                extra = {collection_kind(spec.kind): _points(multilingual.fingerprint_id, ml_rows, key=_content_hash)
                         if ml_rows else []}
                stats = store.write_source(spec.id, spec.kind, generation, points, extra=extra,
                                           resolve_vectors=resolve)
            marker = store.marker(spec.id)
        snapshot.save_if_committed(marker, generation, {"chunks": layout.chunks}, extra=version)
    meta.update({k: v for k, v in stats.items() if isinstance(v, (int, float, str, bool))})
    meta.update({"collection": f"mtrag_{spec.kind}", "generation": generation,
                 "write": "delta" if stats.get("delta_from") else "full",
                 "marker": marker.state if marker else "none",
                 "location": settings.qdrant_url or str(settings.qdrant_path)})
    return StageResult(data_version=generation, metadata=meta)


def _write_delta(store, layout: SourceLayout, spec: SourceSpec, generation: str, snapshot: ProjectedTables,
                 version: dict, embedder: Embedder, multilingual: MultilingualEmbedder | None, resolve) -> dict | None:
    """Upsert the points of the child rows that changed since the chunk table the collection last
    committed and delete those that went; None where only the full write is right."""
    last = snapshot.base_for(generation, version, {"chunks": layout.chunks})
    if last is None:
        return None
    delta = diff_tables(layout.chunks, last.tables["chunks"], key=("chunk_id",))
    changed = delta.changed.to_pylist()
    children = [r for r in changed if r["role"] == "child"]
    gone = [k[0] for k in delta.removed] + [r["chunk_id"] for r in changed]  # kept if upserted again
    changes = {spec.kind: (_points(embedder.fingerprint_id, children), gone)}
    if multilingual is not None:
        changes[collection_kind(spec.kind)] = (
            _points(multilingual.fingerprint_id, cjk_children(children), key=_content_hash), gone)
    stats = store.write_source_delta(spec.id, spec.kind, generation, last.generation, changes, resolve_vectors=resolve)
    if stats is not None:
        roles = held_table(layout.chunks, columns=["role", "script"])
        child = pc.equal(roles["role"], "child")
        stats["points"] = pc.sum(child).as_py() or 0
        if multilingual is not None:
            stats[f"{collection_kind(spec.kind)}_points"] = pc.sum(
                pc.and_(child, pc.equal(pc.fill_null(roles["script"], ""), "cjk"))).as_py() or 0
        stats["skipped"] = stats["points"] - stats["upserted"]
        stats["delta_read"] = delta.via  # the change log's difference, or the tables compared
    return stats
