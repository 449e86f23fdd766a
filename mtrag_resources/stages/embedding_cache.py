"""embedding_cache: one vector per (embedder fingerprint, text hash) for a source's child chunks;
only hashes the cache lacks are embedded. A code child's vector embeds its embedding text
(`embed_hash`, ingest/embed_text.py; an issue's passage: its issue's title and state, then its text),
every other child's its text (`content_hash`); the multilingual embedder embeds CJK children's
texts by content hash."""
from __future__ import annotations

from mtrag_resources.stores.cas import ContentStore
from mtrag_resources.core.config import Settings
from mtrag_resources.embedding.embedder import Embedder
from mtrag_resources.embedding.multilingual import MultilingualEmbedder
from mtrag_resources.stores.embedding_cache import EmbeddingCache, embed_missing
from mtrag_resources.ingest.sources import SourceSpec
from mtrag_resources.stores.tables import read_shared
from mtrag_resources.stages.common import StageResult, digest_json, timed
from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.core.models import cjk_children, vector_hash


def child_rows(layout: SourceLayout) -> list[dict]:
    """The chunk table's child rows, shared with the process's other readers: read-only."""
    return [r for r in read_shared(layout.chunks) if r["role"] == "child"]


def build_embedding_cache(settings: Settings, spec: SourceSpec, embedder: Embedder, log=None,
                          multilingual: MultilingualEmbedder | None = None) -> StageResult:
    layout = SourceLayout(settings, spec.id)
    cas = ContentStore(settings.cas_dir)
    cache = EmbeddingCache(settings.embeddings_dir)
    meta: dict = {}
    with timed(meta, "seconds"):
        rows = child_rows(layout)
        hashes = sorted({vector_hash(r) for r in rows})
        texts = {h: cas.get_text(h) for h in cache.missing(embedder.fingerprint_id, hashes)}
        stats = embed_missing(cache, embedder, texts, progress=log) if texts else {
            "embedded": 0, "seconds": 0.0, "texts_per_s": 0.0}
        ml_rows = cjk_children(rows) if multilingual is not None else []
        ml_stats = {"embedded": 0}
        if ml_rows:
            ml_hashes = sorted({r["content_hash"] for r in ml_rows})
            ml_texts = {h: cas.get_text(h) for h in cache.missing(multilingual.fingerprint_id, ml_hashes)}
            if ml_texts:
                ml_stats = embed_missing(cache, multilingual, ml_texts, progress=log)
    meta.update({
        "children": len(rows),
        "multilingual_children": len(ml_rows),
        "multilingual_embedded": ml_stats["embedded"],
        "unique_texts": len(hashes),
        "embedded": stats["embedded"],
        "cache_hits": len(hashes) - stats["embedded"],
        "texts_per_s": stats.get("texts_per_s", 0.0),
        "embed_seconds": stats.get("seconds", 0.0),
        "model": embedder.fingerprint["model_id"],
        "fingerprint": embedder.fingerprint_id,
        "dim": embedder.fingerprint["dim"],
    })
    if ml_rows:
        meta["multilingual_fingerprint"] = multilingual.fingerprint_id
    version = [embedder.fingerprint_id, hashes] + ([multilingual.fingerprint_id, len(ml_rows)] if ml_rows else [])
    return StageResult(data_version=digest_json(version)[:24], metadata=meta)
