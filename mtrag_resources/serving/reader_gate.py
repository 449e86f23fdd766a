"""The publish gate as a reader sees it, and the status it reports.

Helper functions over the loaded generation (serving/generations.py): they compare each store's
live markers with the manifest (publish/gate.py) and say which channels lag, and what a team's key
may see of that. They hold no state of their own; the caller holds the generation's shared lock."""
from __future__ import annotations

from mtrag_resources.publish import gate
from mtrag_resources.publish.golden import load_refusal
from mtrag_resources.publish.journal import batch_summary, last_batch
from mtrag_resources.serving.generations import Generations
from mtrag_resources.stores.contract import LINKS_SOURCE

# Reported when a graph write began while a query read the graph: its graph answers were dropped.
GRAPH_MOVED = {"source": "*", "store": "neo4j", "reason": "a graph write began during the query; graph results left out"}


def gate_now(loaded: Generations) -> gate.GateState:
    """Evaluate the gate on the loaded generation (the caller holds the shared lock and, for
    a query, the FTS snapshot the query then reads from)."""
    return gate_from(loaded, local_markers(loaded), loaded.graph.markers())


def local_markers(loaded: Generations) -> dict:
    """The markers of the stores this process reads locally (Qdrant copy, FTS snapshot)."""
    live = {"qdrant": {}, "fts": loaded.fts.markers() if loaded.fts else {}}
    if loaded.qdrant:
        with loaded.qdrant_lock:
            live["qdrant"] = {s: loaded.qdrant.marker(s) for s in loaded.manifest["sources"]}
    return live


def gate_from(loaded: Generations, local: dict, neo: dict | str) -> gate.GateState:
    """The gate from the local markers and the graph's (or why the graph could not be asked)."""
    if not loaded.manifest:
        return gate.evaluate(None, {})
    live, unreachable = dict(local), {}
    links_marker = None
    if isinstance(neo, dict):
        live["neo4j"] = neo
        links_marker = neo.get(LINKS_SOURCE)
    else:
        unreachable["neo4j"] = neo
    if loaded.qdrant is None:
        unreachable["qdrant"] = "no Qdrant snapshot in the manifest"
    state = gate.evaluate(loaded.manifest, live, links_marker, unreachable)
    state.graph_markers = neo if isinstance(neo, dict) else None
    return state


def graph_unchanged(loaded: Generations, state: gate.GateState) -> bool:
    """After reading the graph: did any projection marker move since the gate? A write begins
    by committing its 'begin' marker, so equal markers mean the reads saw the gated graph."""
    return state.graph_markers is not None and loaded.graph.markers() == state.graph_markers


def status(loaded: Generations, visible: frozenset[str] | None = None) -> dict:
    """The published generation, each store's marker per source and the stale channels;
    `visible` (a team's sources, serving/api_keys.py): only what those sources show, and
    nothing of the fast lane's or the golden gate's that names another source."""
    with loaded.published_view():
        state = gate_now(loaded)
    manifest = loaded.manifest
    hidden = hidden_sources(manifest, visible)
    out = {"generation": state.generation, "sources": {s: v for s, v in state.stores.items() if s not in hidden},
           "stale": without(state.stale, hidden)}
    quality = (manifest or {}).get("quality") if state.generation is not None else None
    if quality:  # the published generation's golden figures (publish/golden.py)
        out["quality"] = {k: quality.get(k) for k in ("recall", "recalled", "queries", "baseline",
                                                       "accepted_drop")}
    served = (manifest or {}).get("serving") if state.generation is not None else None
    if served:  # a cut-over profile (publish/cutover.py): its name and weights, not its settings' values
        out["serving"] = {"profile": served["profile"], "fusion": served.get("fusion") or {},
                          "cutover": (manifest.get("cutover") or {}).get("previous")}
    settings = loaded.settings
    fast_lane = batch_summary(last_batch(settings))
    if fast_lane and not hidden.intersection(fast_lane.get("sources") or ()):
        out["fast_lane"] = fast_lane  # the last batch `mtrag watch` applied (publish/journal.py)
    refusal = load_refusal(settings.quality_refusal)
    # the golden gate's refusal names the queries and hits of every source: not a team's to read
    if refusal and refusal.get("published_generation") == state.generation and visible is None:
        out["quality_refused"] = refusal  # the last candidate the golden gate refused, until a publish
    return out


def hidden_sources(manifest: dict | None, visible: frozenset[str] | None) -> set[str]:
    """The published sources a team's key may not read (none for an unscoped reader)."""
    if visible is None or not manifest:
        return set()
    return {s for s in manifest["sources"] if s not in visible}


def without(stale: list[dict], hidden: set[str]) -> list[dict]:
    """The stale entries that name no hidden source (`*` and the links projection stay)."""
    return [e for e in stale if e["source"] not in hidden] if hidden else list(stale)
