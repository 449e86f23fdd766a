"""The query pipeline: one query's answer from the loaded generation, in order - the scope, the
gate on the local stores, recall and fusion (serving/recall.py) beside the graph markers and the
embedding on the side pool, the full gate, the parents, the doc-to-code bridge and call paths
(dropped when a graph write began meanwhile), then what the answer says of itself: its
confidence, and why it is empty.

Helper functions over the reader's parts (`ReaderCore`: its generations, embedders, ranker and
side pool); the caller holds the published view (`Generations.published_view`)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from mtrag_resources.core.config import chosen, serving_environment
from mtrag_resources.core.scripts import is_cjk_query
from mtrag_resources.publish import gate
from mtrag_resources.serving import channels as channels_
from mtrag_resources.serving.bridge import code_named, doc_to_code_bridge, docs_default_role, log_proposals
from mtrag_resources.serving.generations import Generations
from mtrag_resources.serving.graph_queries import query_paths
from mtrag_resources.serving.query_text import is_identifier_query, preprocess_query
from mtrag_resources.serving.reader_gate import GRAPH_MOVED, gate_from, graph_unchanged, local_markers
from mtrag_resources.serving.recall import (bundles, fuse, hydrate_parents, name_commits, recall,
                                            recall_multilingual, rows_for)
from mtrag_resources.serving.requests import MODES, check_known_sources
from mtrag_resources.serving.translation import Translation

if TYPE_CHECKING:
    from mtrag_resources.serving.reader import ReaderCore

# A query whose best three hits are all farther than this (cosine, in the query's vector space) is
# answered with confidence "low": calibrated on the dev sets (bench/eval), see MIN_TOP_COSINE's note
# in docs/maintainers.md.
MIN_TOP_COSINE = {"default": 0.30, "multilingual": 0.855}


def answer(core: ReaderCore, text: str, k: int, kind: str | None, mode: str, scope_ids: list[str] | None = None,
           visible: frozenset[str] | None = None) -> dict:
    """The plain dict of `mtrag query --json` for `text` (the caller holds the published view)."""
    loaded = core.generations
    t = {}
    out = {"generation": None, "query": text, "mode": mode, "hits": [], "bridge": [], "paths": [],
           "bundles": [], "stale": [], "channels": {},
           "exact": {"identifier": is_identifier_query(text), "matched": False}, "confidence": "low"}
    if not loaded.manifest:
        out["stale"] = list(gate_from(loaded, {}, {}).stale)
        out["empty_reason"] = "nothing is published yet: run `mtrag build`"
        return out
    scope = _scope(loaded.manifest, scope_ids, visible)
    # The gate's graph markers (a Neo4j round trip) and the query embedding are read beside the
    # FTS and dense searches, which need only the local stores' markers; the graph markers are
    # joined before the first graph read, so "markers before == markers after" still brackets it.
    graph = core.side_pool.submit(loaded.graph.markers)
    # A Chinese question's English words: the lexical channel and the default embedder read
    # English; the original question still reaches the Chinese index and the multilingual one.
    translation = core.embedders.translate(text)
    english = translation.english
    embedding = ml_embedding = None
    multilingual, space_stale = core.embedders.multilingual_channel(loaded.manifest)
    if "dense" in MODES[mode] or mode == "bundles":
        embedding = core.side_pool.submit(core.embedders.embed, english or text, loaded.manifest)
        if multilingual and _multilingual_answers(loaded.manifest, text, kind, scope):
            ml_embedding = core.side_pool.submit(core.embedders.embed_multilingual, text)
    local = local_markers(loaded)
    state = gate_from(loaded, local, "graph markers not read yet")  # qdrant and fts verdicts only
    out["generation"] = state.generation
    sources = loaded.manifest["sources"]
    kinds = [kind] if kind else sorted({e["kind"] for s, e in sources.items() if scope is None or s in scope})
    pre = preprocess_query(text)
    # the exact channel and the bridge share them
    lookups = channels_.AliasLookups(loaded.fts, channels_.scope_ids(sources, state.stale_for("fts"), scope))
    rankings, cosines, dense_kind, qvec, exact_found = recall(loaded, text, translation, k, kind, mode, state, kinds,
                                                                    embedding, t, lookups, scope)
    ml_cosines = recall_multilingual(loaded, ml_embedding, k, kinds, state, scope, rankings, dense_kind, t)
    recalled = list(dict.fromkeys(cid for r in rankings.values() for cid in
                                  (x[0] if isinstance(x, tuple) else x for x in r)))
    rows, payloads = rows_for(loaded, recalled, dense_kind, state.stale_for("fts"))
    stale_f = state.stale_for("fts")
    # a single-channel mode (dense, lexical) stays that channel's ranking alone
    named = set(channels_.exactly_named(exact_found, text)) \
        if is_identifier_query(text) and "exact" in MODES[mode] else set()
    hits = fuse(core, rankings, cosines, rows, payloads, recalled, kinds, qvec, k, state.stale_for("qdrant"),
                      text if mode == "hybrid" and _ranker_served(loaded.manifest) else None, named)
    state = gate_from(loaded, local, graph.result())  # the full gate: the graph's verdicts too
    out["stale"] = list(state.stale)
    hydrate_parents(loaded, hits, stale_f)
    name_commits(loaded, hits)
    out["hits"] = hits
    out["exact"], out["confidence"] = _honesty(text, hits, exact_found, ml_cosines)
    out["bridge"], proposals = doc_to_code_bridge(loaded.graph.store, loaded.fts, loaded.manifest, hits, state,
                                                  _query_code(loaded, text, state, lookups, scope), text, scope)
    if proposals and core.log_proposals:
        log_proposals(core.settings.proposals_log, proposals)
    out["paths"] = query_paths(loaded, core.max_hops_limit, rankings.get("exact", []), rows, state, scope)
    if (out["paths"] or any(b["via"] == "graph" for b in out["bridge"])) and not graph_unchanged(loaded, state):
        out["paths"] = []
        out["bridge"] = [b for b in out["bridge"] if b["via"] != "graph"]
        out["stale"].append(GRAPH_MOVED)
    if mode == "bundles":
        out["bundles"] = bundles(loaded, pre, rows, cosines, recalled)
    out["channels"] = {c: {"hits": len(r)} for c, r in rankings.items()}
    if "dense" in out["channels"]:
        out["channels"]["dense"]["embedder"] = "default"
    if "dense_ml" in out["channels"]:
        out["channels"]["dense_ml"]["embedder"] = "multilingual"
    if english:
        out["translation"] = english
    out["stale"].extend(space_stale)
    if not hits:
        out["empty_reason"] = _why_empty(loaded.manifest, text, mode, kind, kinds, scope, state, translation)
    out["timings_ms"] = t
    return out


def _query_code(loaded: Generations, text: str, state: gate.GateState, lookups: channels_.AliasLookups,
                scope: set[str] | None = None) -> list[dict]:
    """Code rows the query names (bridge.named_in_query: a pasted doc section's references,
    never its literals or examples; a question's identifiers), each naming exactly one code
    chunk, with the text that names it (`matched_text`): what a pasted doc section is about.
    An identifier query is answered by its hits, not bridged."""
    if is_identifier_query(text):
        return []
    code = {s for s, e in loaded.manifest["sources"].items() if e["kind"] == "code" and (scope is None or s in scope)}
    found = code_named(loaded.fts, text, lookups, code - state.stale_for("fts"),
                       docs_default_role(loaded.manifest, scope), channels_.MAX_QUERY_IDENTIFIERS)
    rows = loaded.fts.get_chunks([c for c, _ in found]) if found else {}
    return [dict(rows[c], matched_text=matched) for c, matched in found if c in rows]


def _ranker_served(manifest: dict) -> bool:
    """The learned ranker orders this generation's answers unless MTRAG_RANKER, or else the
    profile the generation serves (a cut-over), says off."""
    return (chosen("MTRAG_RANKER") or serving_environment(manifest).get("MTRAG_RANKER") or "on") != "off"


def _multilingual_answers(manifest: dict, text: str, kind: str | None, scope: set[str] | None) -> bool:
    """Whether the multilingual collections may answer: always a Chinese question; an English one
    only where they hold Chinese prose (docs, issues) of the sources and kind it reads. A Chinese
    code chunk is in the default collection too, where an English question finds it. A manifest
    that does not count them (written before the count) is searched as before."""
    if is_cjk_query(text):
        return True
    read = [e for s, e in manifest["sources"].items() if (scope is None or s in scope)
            and (kind is None or e["kind"] == kind) and e["kind"] != "code"]
    return any(e.get("counts", {}).get("multilingual", 1) for e in read)


def _honesty(text: str, hits: list[dict], exact_found: list[dict],
             ml_cosines: dict[str, float]) -> tuple[dict, str]:
    """Say when nothing answers: an identifier-shaped query with no symbol of that name is
    `exact.matched: false` and low confidence (a made-up name never looks like a hit); other
    queries are low confidence when no top hit is as close as a calibrated cosine in either
    vector space (the default one, or the multilingual one for a Chinese chunk)."""
    identifier = is_identifier_query(text)
    if identifier:
        matched = channels_.exact_matched(exact_found, text)
        return {"identifier": True, "matched": matched}, "high" if matched else "low"
    exact = {"identifier": False, "matched": bool(exact_found)}
    top = hits[:3]
    close = any(h.get("cosine") is not None and h["cosine"] >= MIN_TOP_COSINE["default"] for h in top) \
        or any(ml_cosines.get(h["chunk_id"], 0.0) >= MIN_TOP_COSINE["multilingual"] for h in top)
    return exact, "normal" if exact_found or close else "low"


def _why_empty(manifest: dict, text: str, mode: str, kind: str | None, kinds: list[str], scope: set[str] | None,
               state: gate.GateState, translation: Translation) -> str:
    """One sentence on why a query found nothing: the scope, the kind, lagging stores, the exact
    mode given a sentence or an unknown name, or words neither the index nor the dictionary knows."""
    sources = {s: e for s, e in manifest["sources"].items()
               if (scope is None or s in scope) and (kind is None or e["kind"] == kind)}
    where = f"the sources {sorted(scope)}" if scope else "the published sources" if scope is None \
        else "the sources this API key may read"
    if not sources:
        return f"{where} hold no source of kind {kind!r}" if kind else f"{where} hold no source"
    if all(state.is_stale(s, "fts") and state.is_stale(s, "qdrant") for s in sources):
        return f"every store of {where} lags the published generation (see `stale`)"
    if mode == "exact":
        if not is_identifier_query(text):
            return ("mode exact looks up identifiers (a name such as `Group` or `pkg.mod.func`) and the "
                    "query is a sentence: ask it in mode hybrid, the default")
        return f"no symbol, file or alias of {where} is named {text.strip()!r}"
    if translation.words and not translation.english:
        return (f"no chunk of {where} shares a word with the question, and its Chinese words "
                f"{translation.unknown} have no English translation in the dictionary")
    searched = ", ".join(sorted(kinds))
    return f"no chunk of {where} ({searched}) shares a word with the question or is close to it"


def _scope(manifest: dict, scope_ids: list[str] | None, visible: frozenset[str] | None) -> set[str] | None:
    """A scoped query: every channel (dense, FTS, exact, bridge, paths, bundles) reads only these
    published sources; an id the manifest does not hold is refused before any store is read.
    A team's key (`visible`) scopes every query to its sources, and makes the others unknown."""
    readable = {s for s in manifest["sources"] if visible is None or s in visible}
    scope = None if scope_ids is None else set(check_known_sources(scope_ids, readable))
    if scope is None and visible is not None:
        scope = readable
    return scope
