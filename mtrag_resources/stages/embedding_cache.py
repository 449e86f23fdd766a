"""embedding_cache: one vector per (embedder fingerprint, content hash) for a source's child
chunks; only hashes the cache lacks are embedded."""
from __future__ import annotations

from mtrag_resources.stores.cas import ContentStore
from mtrag_resources.core.config import Settings
from mtrag_resources.embedding.embedder import Embedder
from mtrag_resources.stores.embedding_cache import EmbeddingCache, embed_missing
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.stores.tables import read_rows
from mtrag_resources.stages.common import StageResult, digest_json, timed
from mtrag_resources.core.layout import SourceLayout


def child_rows(layout: SourceLayout) -> list[dict]:
    return [r for r in read_rows(layout.chunks) if r["role"] == "child"]


def build_embedding_cache(settings: Settings, spec: SourceSpec, embedder: Embedder, log=None) -> StageResult:
    layout = SourceLayout(settings, spec.id)
    cas = ContentStore(settings.cas_dir)
    cache = EmbeddingCache(settings.embeddings_dir)
    meta: dict = {}
    with timed(meta, "seconds"):
        rows = child_rows(layout)
        hashes = sorted({r["content_hash"] for r in rows})
        texts = {h: cas.get_text(h) for h in cache.missing(embedder.fingerprint_id, hashes)}
        stats = embed_missing(cache, embedder, texts, progress=log) if texts else {
            "embedded": 0, "seconds": 0.0, "texts_per_s": 0.0}
    meta.update({
        "children": len(rows),
        "unique_texts": len(hashes),
        "embedded": stats["embedded"],
        "cache_hits": len(hashes) - stats["embedded"],
        "texts_per_s": stats.get("texts_per_s", 0.0),
        "embed_seconds": stats.get("seconds", 0.0),
        "model": embedder.fingerprint["model_id"],
        "fingerprint": embedder.fingerprint_id,
        "dim": embedder.fingerprint["dim"],
    })
    return StageResult(data_version=digest_json([embedder.fingerprint_id, hashes])[:24], metadata=meta)
