"""Episodic bundle scoring (seed 002, sections 5-7), generalised to mtrag's structure.

A unit (a File or a Page) is ranked by the cheapest evidence path from the query's vector hits up
its facets (Classes, Sections), points (Functions, passages) and entities. Scores are distances:
lower is better. The node mapping, the cost model and how `best_path` reads the seed's worked
example: docs/retrieval.md#bundle-scoring.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from mtrag_resources.serving.query_text import normalize_for_keyword

#: Seed 002 defaults.
KEYWORD_MATCH_BONUS = 0.15
EDGE_MISS_COST = 0.9
HOP_COST = 0.05
DIRECT_PENALTY = 0.3

NODE_KINDS = ("unit", "facet", "point", "entity")
PATH_NAMES = ("direct", "facet", "point", "entity", "facet_entity")
_ALLOWED_EDGES = frozenset(
    frozenset(pair)
    for pair in (("unit", "facet"), ("facet", "point"), ("unit", "entity"), ("facet", "entity"))
)
INF = math.inf


def distance_from_cosine(similarity: float) -> float:
    """A vector store's cosine similarity ``s`` as the distance this module uses: ``1 - s``."""
    return 1.0 - float(similarity)


@dataclass(frozen=True)
class Hit:
    """One vector (or lexical) hit: ``distance`` is lower-is-better.

    For node collections ``node_id`` is the graph node id; for edge-label collections (the seed's
    ``RelationType_relationship_name``) ``text`` is the edge text that `edge_hit_map` keys on.
    """

    node_id: str
    collection: str
    text: str
    distance: float


def apply_keyword_bonus(
    hits: Iterable[Hit], keywords: Iterable[str], bonus: float = KEYWORD_MATCH_BONUS
) -> list[Hit]:
    """Seed 7.4: subtract ``bonus`` from the distance of every hit whose normalised text contains
    a normalised keyword (`normalize_for_keyword`: lowercase, no spaces, no punctuation).

    A hit gets the bonus once, however many keywords it contains. The subtraction is plain (the
    result may go below 0). Keywords that normalise to ``""`` are ignored. Returns new hits sorted
    by distance ascending (stable: equal distances keep input order).
    """
    norm_keys = [k for k in (normalize_for_keyword(k) for k in keywords) if k]
    out: list[Hit] = []
    for h in hits:
        text = normalize_for_keyword(h.text or "")
        if norm_keys and any(k in text for k in norm_keys):
            h = replace(h, distance=h.distance - bonus)
        out.append(h)
    out.sort(key=lambda h: h.distance)
    return out


def best_by_id(hits: Iterable[Hit]) -> dict[str, float]:
    """Seed 5.4: ``best_by_id[node_id] = min(distance over all collections)``."""
    best: dict[str, float] = {}
    for h in hits:
        if h.distance < best.get(h.node_id, INF):
            best[h.node_id] = h.distance
    return best


def edge_hit_map(edge_hits: Iterable[Hit]) -> dict[str, float]:
    """Seed 5.5: ``edge_hit_map[edge_text] = min(distance)`` over the edge-label hits, keyed by
    the hit's ``text`` (the edge text that was embedded)."""
    best: dict[str, float] = {}
    for h in edge_hits:
        key = h.text
        if h.distance < best.get(key, INF):
            best[key] = h.distance
    return best


# ---------------------------------------------------------------------------------------------
# the local graph projection


@dataclass(frozen=True)
class MemoryNode:
    node_id: str
    kind: str                    # unit | facet | point | entity
    text: str = ""


@dataclass(frozen=True)
class MemoryEdge:
    """An undirected membership edge. ``cost``, when given, overrides the edge-hit lookup."""

    a: str
    b: str
    edge_text: str = ""
    relationship: str = ""
    cost: float | None = None

    @property
    def key_text(self) -> str:
        """The text looked up in `edge_hit_map`: ``edge_text``, else the relationship name."""
        return self.edge_text or self.relationship


class MemoryGraph:
    """A local subgraph projection: units, facets, points and entities with membership edges.

    Built from plain data (`from_dicts`, or `add_node` / `add_edge`); the reader fills it from
    Neo4j and the chunk tables. Edges are undirected; only unit-facet, facet-point, unit-entity
    and facet-entity edges are accepted. Parallel edges between one pair are kept; the cheapest
    one is used.
    """

    def __init__(self) -> None:
        self.nodes: dict[str, MemoryNode] = {}
        self._edges: dict[frozenset[str], list[MemoryEdge]] = {}
        self._adj: dict[str, dict[str, set[str]]] = {}

    @classmethod
    def from_dicts(
        cls, nodes: Iterable[Mapping], edges: Iterable[Mapping] = ()
    ) -> "MemoryGraph":
        """``nodes``: ``{"id", "kind", "text"?}``; ``edges``: ``{"source", "target",
        "edge_text"?, "relationship"?, "cost"?}`` (``cost`` None or absent = look it up)."""
        g = cls()
        for n in nodes:
            g.add_node(n["id"], n["kind"], n.get("text", "") or "")
        for e in edges:
            g.add_edge(
                e["source"],
                e["target"],
                edge_text=e.get("edge_text", "") or "",
                relationship=e.get("relationship", "") or "",
                cost=e.get("cost"),
            )
        return g

    def add_node(self, node_id: str, kind: str, text: str = "") -> MemoryNode:
        if kind not in NODE_KINDS:
            raise ValueError(f"node {node_id!r}: kind must be one of {NODE_KINDS}, got {kind!r}")
        old = self.nodes.get(node_id)
        if old is not None:
            if old.kind != kind:
                raise ValueError(f"node {node_id!r} is already a {old.kind}, not a {kind}")
            if text and not old.text:
                self.nodes[node_id] = old = MemoryNode(node_id, kind, text)
            return old
        node = MemoryNode(node_id, kind, text)
        self.nodes[node_id] = node
        self._adj[node_id] = {k: set() for k in NODE_KINDS}
        return node

    def add_edge(
        self,
        source: str,
        target: str,
        edge_text: str = "",
        relationship: str = "",
        cost: float | None = None,
    ) -> MemoryEdge:
        for nid in (source, target):
            if nid not in self.nodes:
                raise KeyError(f"edge endpoint {nid!r} is not a node of the graph")
        ka, kb = self.nodes[source].kind, self.nodes[target].kind
        if frozenset((ka, kb)) not in _ALLOWED_EDGES or source == target:
            raise ValueError(f"no membership edge between a {ka} and a {kb} ({source!r}-{target!r})")
        edge = MemoryEdge(source, target, edge_text, relationship, None if cost is None else float(cost))
        self._edges.setdefault(frozenset((source, target)), []).append(edge)
        self._adj[source][kb].add(target)
        self._adj[target][ka].add(source)
        return edge

    def ids(self, kind: str) -> list[str]:
        return sorted(n for n, node in self.nodes.items() if node.kind == kind)

    def neighbors(self, node_id: str, kind: str) -> list[str]:
        return sorted(self._adj.get(node_id, {}).get(kind, ()))

    def edges_between(self, a: str, b: str) -> list[MemoryEdge]:
        return list(self._edges.get(frozenset((a, b)), ()))

    def edge_cost(
        self, a: str, b: str, edge_hits: Mapping[str, float], edge_miss_cost: float = EDGE_MISS_COST
    ) -> float:
        """Cost of the cheapest edge a-b: its explicit cost, else ``edge_hits[key_text]``, else
        ``edge_miss_cost``. ``inf`` when a and b are not connected."""
        best = INF
        for e in self._edges.get(frozenset((a, b)), ()):
            if e.cost is not None:
                c = e.cost
            else:
                c = edge_hits.get(e.key_text, edge_miss_cost) if e.key_text else edge_miss_cost
            best = min(best, c)
        return best


# ---------------------------------------------------------------------------------------------
# scoring


@dataclass
class Bundle:
    """One scored containing unit (the seed's EpisodeBundle). See the module docstring for how
    ``best_path`` relates to ``cost_path``."""

    unit_id: str
    score: float
    best_path: str                          # direct | facet | point | entity | facet_entity
    best_support_id: str
    best_facet_id: str | None = None
    best_point_id: str | None = None
    best_entity_id: str | None = None
    cost_path: str = ""                     # the template whose chain attains `score`
    path_costs: dict[str, float] = field(default_factory=dict)   # cheapest chain per template


# specificity order for exact ties (more specific first)
_TEMPLATE_RANK = {"point": 0, "facet_entity": 1, "facet": 2, "entity": 3, "direct": 4}
_KIND_RANK = {"point": 0, "entity": 1, "facet": 2}
_KIND_TO_PATH = {"point": "point", "entity": "facet_entity", "facet": "facet"}


def facet_costs(
    graph: MemoryGraph,
    best_by_id: Mapping[str, float],
    edge_hit_map: Mapping[str, float],
    edge_miss_cost: float = EDGE_MISS_COST,
    hop_cost: float = HOP_COST,
) -> dict[str, float]:
    """``FacetCost(f)`` for every facet with some evidence (seed 6.4)."""
    out: dict[str, float] = {}
    for f in graph.ids("facet"):
        cost = min(
            (c for _, c, _ in _facet_chains(graph, f, best_by_id, edge_hit_map, edge_miss_cost, hop_cost)),
            default=INF,
        )
        if math.isfinite(cost):
            out[f] = cost
    return out


def _facet_chains(graph, f, bbi, ehm, miss, hop):
    """(kind, cost up to f, evidence node) for each way f is supported."""
    if f in bbi:
        yield "facet", bbi[f], f
    for p in graph.neighbors(f, "point"):
        if p in bbi:
            yield "point", bbi[p] + graph.edge_cost(f, p, ehm, miss) + hop, p
    for en in graph.neighbors(f, "entity"):
        if en in bbi:
            yield "entity", bbi[en] + graph.edge_cost(f, en, ehm, miss) + hop, en


def _sharpest(graph: MemoryGraph, f: str, bbi: Mapping[str, float], kinds: tuple[str, ...]):
    cands = [(bbi[f], _KIND_RANK["facet"], f, "facet")] if "facet" in kinds and f in bbi else []
    for kind in ("point", "entity"):
        if kind in kinds:
            cands += [(bbi[n], _KIND_RANK[kind], n, kind) for n in graph.neighbors(f, kind) if n in bbi]
    if not cands:
        return None
    d, _, node, kind = min(cands)
    return node, kind


def score_bundles(
    graph: MemoryGraph,
    best_by_id: Mapping[str, float],
    edge_hit_map: Mapping[str, float],
    edge_miss_cost: float = EDGE_MISS_COST,
    hop_cost: float = HOP_COST,
    direct_penalty: float = DIRECT_PENALTY,
    top: int | None = 10,
) -> list[Bundle]:
    """Score every unit of ``graph`` by its cheapest evidence chain (seed 6), lowest first.

    Units without any evidence (no hit on the unit, its facets, their points or entities, or its
    entities) are skipped. Ties on score are broken by unit id. ``top=None`` returns all.
    """
    bbi, ehm = best_by_id, edge_hit_map
    bundles: list[Bundle] = []
    for u in graph.ids("unit"):
        # chains: (cost, template rank, template, facet id or None, evidence id)
        chains: list[tuple[float, int, str, str | None, str]] = []
        if u in bbi:
            chains.append((bbi[u] + direct_penalty, _TEMPLATE_RANK["direct"], "direct", None, u))
        for f in graph.neighbors(u, "facet"):
            up = graph.edge_cost(u, f, ehm, edge_miss_cost) + hop_cost
            for kind, c, ev in _facet_chains(graph, f, bbi, ehm, edge_miss_cost, hop_cost):
                tpl = _KIND_TO_PATH[kind]
                chains.append((c + up, _TEMPLATE_RANK[tpl], tpl, f, ev))
        for en in graph.neighbors(u, "entity"):
            if en in bbi:
                c = bbi[en] + graph.edge_cost(u, en, ehm, edge_miss_cost) + hop_cost
                chains.append((c, _TEMPLATE_RANK["entity"], "entity", None, en))
        chains = [ch for ch in chains if not math.isnan(ch[0])]
        if not chains:
            continue
        path_costs: dict[str, float] = {}
        for c, _, tpl, _, _ in chains:
            if c < path_costs.get(tpl, INF):
                path_costs[tpl] = c
        score, _, cost_path, win_facet, win_ev = min(chains, key=lambda ch: (ch[0], ch[1], ch[3] or "", ch[4]))

        b = Bundle(u, score, cost_path, win_ev, cost_path=cost_path, path_costs=path_costs)
        if win_facet is not None:
            node, kind = _sharpest(graph, win_facet, bbi, ("facet", "point", "entity"))
            b.best_path = _KIND_TO_PATH[kind]
            b.best_support_id = node
            b.best_facet_id = win_facet
            pt = _sharpest(graph, win_facet, bbi, ("point",))
            b.best_point_id = pt[0] if pt else None
            en = _sharpest(graph, win_facet, bbi, ("entity",))
            b.best_entity_id = en[0] if en else None
        elif cost_path == "entity":
            b.best_entity_id = win_ev
        bundles.append(b)
    bundles.sort(key=lambda b: (b.score, b.unit_id))
    return bundles if top is None else bundles[: max(top, 0)]
