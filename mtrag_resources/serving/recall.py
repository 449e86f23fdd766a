"""The query pipeline's recall and ranking: each channel's ranking (dense, multilingual dense,
FTS, exact), their fusion into the top k hits with true cosines, the rows behind them (FTS, or
the Qdrant payload and the CAS text where FTS lags), and the bundles of a `bundles` query.

Helper functions over the loaded generation (serving/generations.py): the caller holds its
shared lock and the FTS snapshot the gate read; they keep no state."""
from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING

from mtrag_resources.embedding.multilingual import collection_kind
from mtrag_resources.publish import gate
from mtrag_resources.serving import channels as channels_
from mtrag_resources.serving.bundles import (Hit as BundleHit, MemoryGraph, apply_keyword_bonus, best_by_id,
                                             distance_from_cosine, score_bundles)
from mtrag_resources.serving.fusion import demote_declarations, merge_exact_into_dense, named_first, weighted_rrf
from mtrag_resources.serving.generations import Generations
from mtrag_resources.serving.query_embedding import ms_since
from mtrag_resources.serving.query_text import is_identifier_query, lexical_text
from mtrag_resources.serving.requests import MODES
from mtrag_resources.serving.translation import Translation
from mtrag_resources.stores.cas import ContentStore
from mtrag_resources.stores.contract import LINKS_SOURCE

if TYPE_CHECKING:
    from mtrag_resources.serving.reader import ReaderCore


def recall_multilingual(loaded: Generations, ml_embedding, k: int, kinds: list[str], state: gate.GateState,
                        scope: set[str] | None, rankings: dict, dense_kind: dict, t: dict) -> dict[str, float]:
    """The multilingual collections' ranking (`dense_ml`, Chinese chunks) added to `rankings`;
    returns its cosines (a space of its own: not comparable with the default one's)."""
    if ml_embedding is None or loaded.qdrant is None:
        return {}
    qvec, t["embed_ml_ms"] = ml_embedding.result()
    t0 = time.perf_counter()
    found, ml_kind = channels_.dense(loaded.qdrant, loaded.qdrant_lock, qvec, k, kinds, loaded.manifest["sources"],
                                     state.stale_for("qdrant"), partial(unpublished, loaded), collection_kind, scope)
    for cid, kd in ml_kind.items():
        dense_kind.setdefault(cid, kd)
    rankings["dense_ml"] = [cid for cid, _ in found]
    t["dense_ml_ms"] = ms_since(t0)
    return dict(found)


def recall(loaded: Generations, text: str, translation: Translation, k: int, kind: str | None, mode: str,
           state: gate.GateState, kinds: list[str], embedding, t: dict, lookups,
           scope: set[str] | None = None) -> tuple[dict, dict, dict, object, list[dict]]:
    """Each channel's ranking for the query (the dense one with cosines), the collection kind of
    each dense hit, the query vector (None when no dense channel runs) and the exact matches
    (looked up for an identifier-shaped query even when the mode has no exact channel).
    `translation`: a Chinese question's content words (its lexical query: words, not bigrams
    across word boundaries) and its translated keywords, searched lexically beside it (`fts_en`).
    `scope`: a scoped query's sources, which each store is asked to restrict itself to."""
    sources = loaded.manifest["sources"]
    channels = MODES[mode]
    rankings: dict[str, list[str]] = {}
    cosines: dict[str, float] = {}
    dense_kind: dict[str, str] = {}  # dense hit -> collection kind (its payload is fetched only if needed)
    stale_q, stale_f = state.stale_for("qdrant"), state.stale_for("fts")
    fts_hits = None
    if "fts" in channels:  # before waiting for the embedding, which runs meanwhile
        t0 = time.perf_counter()
        lexical = translation.segmented or lexical_text(text)
        fts_hits = channels_.fts(loaded.fts, lexical, k, kind, sources, stale_f, scope)
        english = translation.keywords
        if english:
            rankings["fts_en"] = [h["chunk_id"] for h in
                                  channels_.fts(loaded.fts, lexical_text(english), k, kind, sources, stale_f, scope)]
        t["fts_ms"] = ms_since(t0)
    qvec = None
    if embedding is not None:
        t0 = time.perf_counter()
        qvec, t["embed_ms"] = embedding.result()
        t["embed_wait_ms"] = ms_since(t0)
    if "dense" in channels and loaded.qdrant is not None:
        t0 = time.perf_counter()
        dense, dense_kind = channels_.dense(loaded.qdrant, loaded.qdrant_lock, qvec, k, kinds, sources,
                                            stale_q, partial(unpublished, loaded), scope=scope)
        dense.sort(key=lambda x: -x[1])
        cosines.update(dict(dense))
        rankings["dense"] = dense
        t["dense_ms"] = ms_since(t0)
    if fts_hits is not None:
        rankings["fts"] = [h["chunk_id"] for h in fts_hits]
    exact_found: list[dict] = []
    if "exact" in channels or is_identifier_query(text):
        t0 = time.perf_counter()
        exact_found = channels_.exact_hits(loaded.fts, text, k, kind, sources, stale_f, lookups, scope)
        if "exact" in channels:
            rankings["exact"] = [h["chunk_id"] for h in exact_found]
        t["exact_ms"] = ms_since(t0)
    return rankings, cosines, dense_kind, qvec, exact_found


def fuse(core: ReaderCore, rankings: dict, cosines: dict, rows: dict, payloads: dict, recalled: list[str],
         kinds: list[str], qvec, k: int, stale_q: set[str], rerank_for: str | None = None,
         named: set[str] = frozenset()) -> list[dict]:
    """The channels' rankings fused into the top k hits, each with its true cosine; the head
    reordered by the learned ranker for the question `rerank_for` (hybrid queries); what the
    whole query names first."""
    loaded = core.generations
    if qvec is not None and loaded.qdrant is not None:
        # Exact and lexical candidates get their true cosine by point id: no invented ranks.
        cosines.update(channels_.true_cosines(loaded.qdrant, loaded.qdrant_lock, qvec, recalled, cosines, rows,
                                              kinds, stale_q))
        if "dense" in rankings and "exact" in rankings:
            exact_cos = {c: cosines[c] for c in rankings["exact"] if c in cosines}
            rankings["dense"] = merge_exact_into_dense(rankings["dense"][: max(k * 3, 20)], exact_cos)
    if "dense" in rankings:
        rankings["dense"] = [cid for cid, _ in rankings["dense"]]
    weights = core.fusion_weights(loaded.manifest)
    fused = weighted_rrf(rankings, {c: weights.get(c, 1.0) for c in rankings})
    if rerank_for is not None:
        fused = core.ranker.reorder(rerank_for, fused, {**payloads, **rows}, cosines)
    fused = named_first(fused, named)
    fused = demote_declarations(fused, lambda cid: rows.get(cid) or payloads.get(cid), k)
    hits = []
    for cid, score, per_channel in fused:
        row = rows.get(cid) or row_from_payload(core.cas, cid, payloads.get(cid))
        if row is None:
            continue
        hits.append(hit(len(hits) + 1, row, score, per_channel, cosines.get(cid)))
        if len(hits) >= k:
            break
    return hits


def rows_for(loaded: Generations, recalled: list[str], dense_kind: dict, stale_f: set[str]) -> tuple[dict, dict]:
    """Rows for everything recalled, and the Qdrant payloads of dense hits that have no row."""
    payloads: dict[str, dict] = {}
    # FTS rows for sources whose FTS is current, else the
    # Qdrant payload plus the CAS text (the CAS is append-only, so always consistent).
    rows = {cid: r for cid, r in loaded.fts.get_chunks(recalled).items() if r["source_id"] not in stale_f}
    # Dense hits of sources whose FTS is stale: their row is the Qdrant payload (+ CAS text).
    need: dict[str, list[str]] = {}
    for cid, kd in dense_kind.items():
        if cid not in rows:
            need.setdefault(kd, []).append(cid)
    for kd, ids in need.items():
        with loaded.qdrant_lock:
            payloads.update(loaded.qdrant.payloads_for(kd, ids))
    return rows, payloads


def unpublished(loaded: Generations, kind: str) -> bool:
    """Does the Qdrant copy hold sources of `kind` that the manifest does not publish?"""
    if loaded.qdrant_copy is not None:
        return False  # the copy was taken at publish time and holds exactly the manifest's sources
    published = {s for s, e in loaded.manifest["sources"].items() if e["kind"] == kind}
    return bool(set(loaded.qdrant.markers()) - published - {LINKS_SOURCE})


def row_from_payload(cas: ContentStore, cid: str, payload: dict | None) -> dict | None:
    if not payload:
        return None
    row = dict(payload)
    try:
        row["text"] = cas.get_text(payload["content_hash"])
    except FileNotFoundError:
        row["text"] = ""
    return row


def hit(rank: int, row: dict, score: float, per_channel: dict, cosine: float | None) -> dict:
    return {"rank": rank, "chunk_id": row["chunk_id"], "source_id": row["source_id"],
            "source_kind": row.get("source_kind", ""), "file_path": row["file_path"],
            "start_line": row["start_line"], "end_line": row["end_line"], "symbol": row.get("symbol", ""),
            "title": row.get("title", ""), "text": row.get("text", ""), "score": round(score, 6),
            "cosine": None if cosine is None else round(cosine, 6),
            "channels": {c: {"rank": v["rank"], "score": round(v["score"], 6)} for c, v in per_channel.items()},
            "parent": None, "parent_id": row.get("parent_id"),
            **({"page": int(row["page"])} if row.get("page") else {}),  # a PDF's chunk: its 1-based page
            # an issue's chunk: the key and its state (a closed issue is found, and says so)
            **({"issue_key": row["issue_key"], "state": row.get("state") or ""} if row.get("issue_key") else {})}


def name_commits(loaded: Generations, hits: list[dict]) -> None:
    """A git source's hits name the snapshot the generation published: its `commit_sha`,
    `repository` and `ref` (the manifest's entry; each chunk's text is its file's at that
    commit, rows carry the commit they were parsed at)."""
    sources = loaded.manifest["sources"]
    for h in hits:
        entry = sources.get(h["source_id"]) or {}
        if entry.get("ref"):
            h.update(commit_sha=entry["commit_sha"], repository=entry["repository"], ref=entry["ref"])


def hydrate_parents(loaded: Generations, hits: list[dict], stale_f: set[str]) -> None:
    """Parent text is context for a hit, not a new scored hit."""
    ids = [h["chunk_id"] for h in hits if h["parent_id"] and h["source_id"] not in stale_f]
    parents = loaded.fts.parents_of(ids) if ids else {}
    for h in hits:
        p = parents.get(h["chunk_id"])
        if p:
            h["parent"] = {"chunk_id": p["chunk_id"], "title": p["title"], "symbol": p["symbol"],
                           "start_line": p["start_line"], "end_line": p["end_line"], "text": p["text"]}
        del h["parent_id"]


def bundles(loaded: Generations, pre, rows: dict, cosines: dict, recalled: list[str]) -> list[dict]:
    """A `bundles` query's answer: the recalled chunks grouped by file (seed 002's scoring)."""
    hits = []
    for cid in recalled:
        row = rows.get(cid)
        if row is None or cid not in cosines:
            continue
        hits.append(BundleHit(cid, "chunk", f"{row.get('title', '')} {row.get('text', '')}",
                              distance_from_cosine(cosines[cid])))
    hits = apply_keyword_bonus(hits, pre.keywords)
    best = best_by_id(hits)
    graph = MemoryGraph()
    parents = loaded.fts.parents_of(list(best))
    for cid in best:
        row = rows[cid]
        unit = f"unit:{row['source_id']}:{row['file_path']}"
        graph.add_node(unit, "unit", row["file_path"])
        parent = parents.get(cid)
        facet = parent["chunk_id"] if parent else f"facet:{cid}"
        graph.add_node(facet, "facet", parent["title"] if parent else "")
        graph.add_node(cid, "point", row.get("title", ""))
        # Containment comes from the chunk table and is certain: it costs a hop, never a miss.
        graph.add_edge(unit, facet, relationship="CONTAINS", cost=0.0)
        graph.add_edge(facet, cid, relationship="CONTAINS", cost=0.0)
    out = []
    for b in score_bundles(graph, best, {}, top=10):
        _, source_id, file_path = b.unit_id.split(":", 2)
        out.append({"unit": file_path, "source_id": source_id, "score": round(b.score, 6),
                    "best_path": b.best_path, "cost_path": getattr(b, "cost_path", b.best_path),
                    "best_support_id": b.best_support_id, "best_facet_id": b.best_facet_id,
                    "best_point_id": b.best_point_id})
    return out
