"""qdrant_collection: a source's child chunks as dense points with their full payload, in the
collection of the source's kind, bracketed by a generation marker."""
from __future__ import annotations


from mtrag_resources.core.config import Settings
from mtrag_resources.embedding.embedder import Embedder
from mtrag_resources.embedding.multilingual import MultilingualEmbedder, collection_kind
from mtrag_resources.stores.embedding_cache import EmbeddingCache
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.stores.connect import open_qdrant
from mtrag_resources.stages.common import StageResult, timed
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
    with timed(meta, "seconds"):
        rows = child_rows(layout)
        cache = EmbeddingCache(settings.embeddings_dir)
        points = _points(embedder.fingerprint_id, rows)
        ml_rows = cjk_children(rows) if multilingual is not None else []
        # Always written (empty when the source has no CJK text), so a source that loses its CJK
        # chunks leaves no multilingual points behind.
        extra = {collection_kind(spec.kind): _points(multilingual.fingerprint_id, ml_rows, key=_content_hash)
                 if ml_rows else []}
        with open_qdrant(settings) as store:
            store.ensure_collection(spec.kind, embedder.dim)
            stats = store.write_source(spec.id, spec.kind, generation, points, extra=extra,
                                       resolve_vectors=_resolver(cache, spec.id))
            marker = store.marker(spec.id)
    meta.update({k: v for k, v in stats.items() if isinstance(v, (int, float, str, bool))})
    meta.update({"collection": f"mtrag_{spec.kind}", "generation": generation,
                 "marker": marker.state if marker else "none",
                 "location": settings.qdrant_url or str(settings.qdrant_path)})
    return StageResult(data_version=generation, metadata=meta)
