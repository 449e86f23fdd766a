"""One function per retrieval channel of a query (lexical FTS, dense Qdrant, exact aliases) and the
true cosine of candidates the dense channel did not return. Each reads only the published
sources it is given and leaves out the ones whose store the gate found stale."""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from mtrag_resources.serving.query_text import identifiers_in
from mtrag_resources.stores.fts_query import normalize_alias

# Identifiers of a long query (a pasted doc section) looked up one by one in the exact channel.
MAX_QUERY_IDENTIFIERS = 32


def _recall_k(k: int) -> int:
    # Each channel recalls more than k so the fusion has candidates to reorder.
    return max(k * 3, 20)


def scope_ids(sources: dict, stale: set[str], scope: set[str] | None) -> list[str] | None:
    """The source ids a scoped query's store lookups are restricted to (the scope's current
    ones, sorted: a bound `IN (...)` list), or None for an unscoped query (every source; the
    results are filtered afterwards)."""
    return None if scope is None else sorted(s for s in sources if s in scope and s not in stale)


def fts(store, text: str, k: int, kind: str | None, sources: dict, stale: set[str],
        scope: set[str] | None = None) -> list[dict]:
    """bm25 hits of published, current sources; `scope`: only these sources, asked of the store
    itself (`WHERE source_id IN (...)`) so other sources take none of the recall budget."""
    ids = scope_ids(sources, stale, scope)
    return [h for h in store.search(text, k=_recall_k(k), source_kind=kind, source_ids=ids)
            if h["source_id"] in sources and h["source_id"] not in stale
            and (scope is None or h["source_id"] in scope)]


def same_kind(kind: str) -> str:
    return kind


def dense(store, lock: threading.Lock, qvec, k: int, kinds: list[str], sources: dict, stale: set[str],
          unpublished: Callable[[str], bool], collection_of: Callable[[str], str] = same_kind,
          scope: set[str] | None = None) -> tuple[list[tuple[str, float]], dict[str, str]]:
    """(chunk id, cosine) best first, and each hit's collection kind. `collection_of` maps a source
    kind to the collection searched (the multilingual one for a CJK query). `sources`: every
    published source; `scope`: only these (a Qdrant `source_id` filter)."""
    ok_sources = [s for s, e in sources.items() if e["kind"] in kinds and s not in stale
                  and (scope is None or s in scope)]
    found_all: list[tuple[str, float]] = []
    kind_of: dict[str, str] = {}
    for kd in kinds:
        ids = [s for s in ok_sources if sources[s]["kind"] == kd]
        if not ids:
            continue
        # Embedded Qdrant evaluates filters point by point in Python: filter only when a source of
        # this kind must be left out (stale, unpublished or out of the query's scope).
        every = sorted(s for s, e in sources.items() if e["kind"] == kd) == sorted(ids) and not unpublished(kd)
        with lock:
            found = store.search(collection_of(kd), qvec, k=_recall_k(k), source_ids=None if every else ids,
                                 payload_fields=[])
        for h in found:
            found_all.append((h["chunk_id"], float(h["score"])))
            kind_of[h["chunk_id"]] = collection_of(kd)
    found_all.sort(key=lambda x: -x[1])
    return found_all, kind_of


class AliasLookups:
    """The exact-alias lookups of one query's identifiers, each asked of the store once: the exact
    channel and the bridge both resolve the identifiers a query writes."""

    K = 8  # enough to tell one symbol from several and to keep the last-part candidates

    def __init__(self, store, source_ids: list[str] | None = None) -> None:
        self.store = store
        self.source_ids = source_ids  # a scoped query's sources (None: every source)
        self._hits: dict[str, list[dict]] = {}

    def __call__(self, ident: str) -> list[dict]:
        if ident not in self._hits:
            self._hits[ident] = self.store.exact(ident, k=self.K, source_ids=self.source_ids)
        return self._hits[ident]


def exact(store, text: str, k: int, kind: str | None, sources: dict, stale: set[str],
          scope: set[str] | None = None) -> list[str]:
    return [h["chunk_id"] for h in exact_hits(store, text, k, kind, sources, stale, scope=scope)]


def exact_hits(store, text: str, k: int, kind: str | None, sources: dict, stale: set[str],
               lookups: AliasLookups | None = None, scope: set[str] | None = None) -> list[dict]:
    """Chunks named exactly by the query, then by each identifier written in it (a pasted doc
    section names the symbols it is about), in the order the query names them. `scope`: only
    aliases of these sources, asked of the store itself (`lookups` then carries the same scope)."""
    ids = scope_ids(sources, stale, scope)
    lookups = lookups or AliasLookups(store, ids)
    hits = store.exact(text, k=max(k, 20), source_ids=ids)
    for ident in identifiers_in(text)[:MAX_QUERY_IDENTIFIERS]:
        if ident != text:
            # only what the identifier names exactly (at most 3 chunks); a guess on its last part
            # would be noise here
            hits.extend([h for h in lookups(ident) if h["match"] == "exact"][:3])
    # An alias of a parent (a doc section's title, a class, a file) answers with its first child:
    # a parent is the context of its children, never a hit beside them.
    first_child = store.first_children(h["chunk_id"] for h in hits)
    hits = [{**h, "chunk_id": first_child.get(h["chunk_id"], h["chunk_id"])} for h in hits]
    out, seen = [], set()
    for h in hits:
        if h["chunk_id"] in seen or h["source_id"] not in sources or h["source_id"] in stale \
                or scope is not None and h["source_id"] not in scope:
            continue
        if kind is not None and sources[h["source_id"]]["kind"] != kind:
            continue
        seen.add(h["chunk_id"])
        out.append(h)
    return out


def exactly_named(hits: list[dict], text: str) -> list[str]:
    """The exact channel's chunks the query's own identifier names: an alias equal to it, a symbol
    ending with it (`Context.invoke` names `click.core.Context.invoke`), or a symbol its package
    re-exports (`json.JSONDecodeError` names `json.decoder.JSONDecodeError`)."""
    norm = normalize_alias(text)
    return [h["chunk_id"] for h in hits
            if h["match"] == "exact" and normalize_alias(h["alias"]) == norm
            or h["match"] == "last_part" and names_through_package(normalize_alias(h.get("symbol") or ""), norm)]


def exact_matched(hits: list[dict], text: str) -> bool:
    """Did the query's own identifier resolve (exactly_named)?"""
    return bool(exactly_named(hits, text))


def names_through_package(symbol: str, name: str) -> bool:
    """Is `symbol` what the dotted `name` means: the same, ending with it, or defined in a module
    under the package `name` writes (`json.JSONDecodeError` -> `json.decoder.JSONDecodeError`: a
    package's `__init__` re-exports what its modules define)?"""
    if symbol == name or symbol.endswith("." + name):
        return True
    package, _, last = name.rpartition(".")
    return bool(package) and symbol.startswith(package + ".") and symbol.endswith("." + last)


def true_cosines(store, lock: threading.Lock, qvec, recalled: list[str], known: dict, rows: dict,
                 kinds: list[str], stale: set[str], collection_of: Callable[[str], str] = same_kind) -> dict[str, float]:
    """Exact and lexical candidates get their true cosine by point id, in the vector space of the
    query (`collection_of`): no invented ranks."""
    missing = [cid for cid in recalled if cid not in known and cid in rows
               and rows[cid]["role"] == "child" and rows[cid]["source_id"] not in stale]
    out: dict[str, float] = {}
    qnorm = np.linalg.norm(qvec)
    for kd in kinds:
        ids = [c for c in missing if rows[c]["source_kind"] == kd]
        with lock:
            vecs = store.vectors_for(collection_of(kd), ids) if ids else {}
        for cid, vec in vecs.items():
            out[cid] = float(np.dot(vec, qvec) / (np.linalg.norm(vec) * qnorm + 1e-12))
    return out
