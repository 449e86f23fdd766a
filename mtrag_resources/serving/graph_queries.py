"""What the reader asks of the code graph beside the ranked hits: a query's call paths from its
best exact code anchor, `mtrag paths` between two symbols, and whether a name is a symbol of the
published generation (with the nearest names when it is not).

Helper functions over the loaded generation (serving/generations.py); `graph_paths` and
`lookup_symbol` take the published view themselves, `query_paths` runs inside a query's."""
from __future__ import annotations

import difflib
import json

from mtrag_resources.publish import gate
from mtrag_resources.serving.generations import Generations
from mtrag_resources.serving.reader_gate import GRAPH_MOVED, gate_now, graph_unchanged, hidden_sources, without
from mtrag_resources.serving.requests import DEFAULT_PATH_RELATIONS, check_paths, validate_text


def node_source(node: dict) -> str:
    return node.get("source_id") or node.get("node_id", "").split(":", 1)[0]


def query_paths(loaded: Generations, max_hops_limit: int, exact_ids: list[str], rows: dict,
                state: gate.GateState, scope: set[str] | None = None) -> list[dict]:
    """Call paths from the best exact code anchor (2 hops), when its graph is current. A scoped
    query starts them at the anchor's own graph nodes (not every node of its name) and keeps
    only paths whose every node is in the scope."""
    for cid in exact_ids[:3]:
        row = rows.get(cid)
        neo = loaded.graph.store  # read once: a failed gate elsewhere may drop it meanwhile
        if row and row.get("source_kind") == "code" and row.get("symbol") and neo is not None \
                and not state.is_stale(row["source_id"], "neo4j"):
            anchors = [row["symbol"]]
            if scope is not None:
                graph_ids = row.get("graph_ids") or []
                graph_ids = json.loads(graph_ids) if isinstance(graph_ids, str) else graph_ids
                anchors = [g for g in graph_ids if node_source({"node_id": g}) in scope] or anchors
            # the graph itself keeps to the scope: other sources' paths take none of the limit
            paths = neo.paths(anchors, rel_types=["CALLS"], direction="out", max_hops=2,
                              verified_only=True, limit=5, hard_max_hops=max_hops_limit,
                              source_ids=None if scope is None else sorted(scope))
            if scope is not None:
                paths = [p for p in paths if all(node_source(n) in scope for n in p["nodes"])]
            return paths
    return []


def graph_paths(loaded: Generations, max_hops_limit: int, from_name: str, to_name: str | None = None,
                rel_types: list[str] | None = None, direction: str = "out", max_hops: int = 4,
                verified_only: bool = True, limit: int = 10, visible: frozenset[str] | None = None) -> dict:
    """`visible`: a team's sources; only paths whose every node is of them, asked of the graph."""
    from_name, to_name = check_paths(from_name, to_name, rel_types, direction, max_hops, max_hops_limit)
    with loaded.published_view():
        state = gate_now(loaded)
        out = {"generation": state.generation, "from": from_name, "to": to_name, "paths": [],
               "stale": without(state.stale, hidden_sources(loaded.manifest, visible))}
        neo = loaded.graph.store
        if state.generation is None or neo is None:
            return out
        stale_graph = state.stale_for("neo4j")
        # no relation named: calls, and from a web endpoint (`GET /login`) to its handler
        found = neo.paths([from_name], [to_name] if to_name else None,
                          rel_types=rel_types or list(DEFAULT_PATH_RELATIONS), direction=direction,
                          max_hops=max_hops, verified_only=verified_only, limit=limit,
                          hard_max_hops=max_hops_limit, source_ids=_readable_ids(loaded.manifest, visible))
        # Fail closed: a path touching a source whose graph is not the published one is dropped.
        published = set(loaded.manifest["sources"])
        out["paths"] = [p for p in found
                        if all(node_source(n) in published and node_source(n) not in stale_graph
                               for n in p["nodes"])]
        if out["paths"] and not graph_unchanged(loaded, state):
            out["paths"] = []
            out["stale"].append(GRAPH_MOVED)
        return out


def _readable_ids(manifest: dict, visible: frozenset[str] | None) -> list[str] | None:
    """The published sources a team's key may read, sorted (a bound `IN` list); None: every source."""
    return None if visible is None else sorted(s for s in manifest["sources"] if s in visible)


def lookup_symbol(loaded: Generations, name: str, limit: int = 5, visible: frozenset[str] | None = None) -> dict:
    """Is `name` a symbol of the published generation (a graph entity by node id, qualified
    name or name; without the graph, an FTS `symbol` alias)? And the nearest symbol names:
    the FTS store's last-part matches, then an FTS search of code chunks (at most `limit`).
    `{"generation", "known", "nearest"}`; `known` is None when nothing is published.
    `visible` (a team's sources): another source's symbol is as unknown as one never written,
    and is never named among the nearest."""
    name = validate_text(name, "symbol")
    with loaded.published_view():
        state = gate_now(loaded)
        out = {"generation": state.generation, "known": None, "nearest": []}
        if state.generation is None or loaded.fts is None:
            return out
        neo = loaded.graph.store
        ids = _readable_ids(loaded.manifest, visible)
        known = None
        if neo is not None:
            try:
                known = bool(neo.resolve_anchors([name], limit=1, source_ids=ids))
            except Exception:  # noqa: BLE001 - the FTS store answers instead
                known = None
        exact = loaded.fts.exact(name, k=50, source_ids=ids)
        if known is None:
            known = any(e["match"] == "exact" and e["alias_kind"] in ("symbol", "graph_id") for e in exact)
        # candidates: same last part, then an FTS search of code; ranked by likeness to the name
        last_part = [e["symbol"] for e in exact if e.get("symbol")]
        hits = loaded.fts.search(name, k=50, source_kind="code", source_ids=ids)
        rows = loaded.fts.get_chunks([h["chunk_id"] for h in hits])
        found = [(rows.get(h["chunk_id"]) or {}).get("symbol") for h in hits]
        candidates = [c for c in dict.fromkeys(last_part + found) if c and c != name]
        nearest = sorted(candidates, key=lambda c: -difflib.SequenceMatcher(None, name, c).ratio())[:limit]
        if len(nearest) < limit:  # nothing alike by words: the closest spellings of every symbol
            others = [c for c in loaded.fts.symbol_names(source_ids=ids) if c != name and c not in nearest]
            nearest += difflib.get_close_matches(name, others, n=limit - len(nearest), cutoff=0.0)
        out.update(known=known, nearest=nearest)
        return out
