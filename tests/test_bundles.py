import math

import pytest

from mtrag_resources.serving.bundles import (
    Bundle,
    Hit,
    MemoryGraph,
    apply_keyword_bonus,
    best_by_id,
    distance_from_cosine,
    edge_hit_map,
    facet_costs,
    score_bundles,
)

pytestmark = pytest.mark.unit


def seed_graph() -> MemoryGraph:
    """Seed 002 section 6.8: E1 -> F2 -> P1; E2 alone; explicit edge costs."""
    return MemoryGraph.from_dicts(
        nodes=[
            {"id": "E1", "kind": "unit", "text": "API 流式返回改造"},
            {"id": "E2", "kind": "unit", "text": "首页文案交付"},
            {"id": "F2", "kind": "facet", "text": "变更边界"},
            {"id": "P1", "kind": "point", "text": "鉴权中间件不能改"},
        ],
        edges=[
            {"source": "F2", "target": "P1", "edge_text": "has_point", "cost": 0.04},
            {"source": "E1", "target": "F2", "edge_text": "has_facet", "cost": 0.05},
        ],
    )


SEED_HITS = {"P1": 0.08, "F2": 0.12, "E1": 0.36, "E2": 0.62}


def test_seed_worked_example():
    g = seed_graph()
    fc = facet_costs(g, SEED_HITS, {}, hop_cost=0.05)
    assert fc["F2"] == pytest.approx(0.12, abs=1e-9)  # min(0.12, 0.08+0.04+0.05)

    bundles = score_bundles(g, SEED_HITS, {}, edge_miss_cost=0.9, hop_cost=0.05, direct_penalty=0.3)
    assert [b.unit_id for b in bundles] == ["E1", "E2"]
    e1, e2 = bundles
    assert abs(e1.score - 0.22) < 1e-9  # min(0.36+0.3, 0.12+0.05+0.05)
    # the seed: "更强的解释路径其实是 Point -> Facet -> Episode, 所以 E1.best_path = point"
    assert e1.best_path == "point"
    assert e1.best_support_id == "P1"
    assert e1.best_facet_id == "F2"
    assert e1.best_point_id == "P1"
    assert e1.best_entity_id is None
    # the arithmetic stays visible: the 0.22 is attained by the facet template
    assert e1.cost_path == "facet"
    assert e1.path_costs["direct"] == pytest.approx(0.66)
    assert e1.path_costs["facet"] == pytest.approx(0.22)
    assert e1.path_costs["point"] == pytest.approx(0.27)
    # E2 only has its summary hit
    assert e2.best_path == "direct" and e2.cost_path == "direct"
    assert e2.score == pytest.approx(0.92)
    assert e2.best_support_id == "E2"


def test_facet_path_when_facet_hit_is_sharpest():
    g = seed_graph()
    hits = dict(SEED_HITS, F2=0.05)
    e1 = score_bundles(g, hits, {})[0]
    assert e1.best_path == "facet" == e1.cost_path
    assert e1.best_support_id == "F2"
    assert e1.best_point_id == "P1"   # still reported as supporting evidence
    assert e1.score == pytest.approx(0.05 + 0.05 + 0.05)


def test_point_path_when_facet_has_no_hit():
    g = seed_graph()
    hits = {"P1": 0.08}
    (e1,) = score_bundles(g, hits, {})
    assert e1.best_path == e1.cost_path == "point"
    assert e1.score == pytest.approx(0.08 + 0.04 + 0.05 + 0.05 + 0.05)


def test_edge_costs_from_edge_hit_map_and_miss_cost():
    g = MemoryGraph.from_dicts(
        nodes=[
            {"id": "U", "kind": "unit"},
            {"id": "F", "kind": "facet"},
            {"id": "EN", "kind": "entity", "text": "click.echo"},
            {"id": "EN2", "kind": "entity", "text": "Context"},
        ],
        edges=[
            {"source": "U", "target": "F", "edge_text": "defines class"},
            {"source": "F", "target": "EN", "relationship": "MENTIONS"},
            {"source": "U", "target": "EN2", "edge_text": "mentions Context"},
        ],
    )
    ehm = {"defines class": 0.2, "MENTIONS": 0.1}
    (b,) = score_bundles(g, {"EN": 0.1, "EN2": 0.3}, ehm, edge_miss_cost=0.9, hop_cost=0.05)
    # facet_entity: 0.1 + 0.1 (MENTIONS, relationship fallback) + 0.05 + 0.2 + 0.05 = 0.5
    # entity: 0.3 + 0.9 (miss) + 0.05 = 1.25
    assert b.score == pytest.approx(0.5)
    assert b.best_path == b.cost_path == "facet_entity"
    assert b.best_entity_id == "EN" and b.best_facet_id == "F"
    assert b.path_costs["entity"] == pytest.approx(1.25)

    # a unit-level entity path wins when its edge text was hit
    (b,) = score_bundles(g, {"EN": 0.1, "EN2": 0.3}, dict(ehm, **{"mentions Context": 0.0}))
    assert b.score == pytest.approx(0.35)
    assert b.best_path == "entity" and b.best_entity_id == "EN2" and b.best_support_id == "EN2"


def test_units_without_evidence_are_skipped_and_top_limits():
    g = MemoryGraph.from_dicts(
        nodes=[{"id": f"U{i}", "kind": "unit"} for i in range(5)],
    )
    bundles = score_bundles(g, {"U1": 0.3, "U3": 0.1, "U4": 0.2}, {}, top=2)
    assert [b.unit_id for b in bundles] == ["U3", "U4"]
    assert all(isinstance(b, Bundle) for b in bundles)
    assert score_bundles(MemoryGraph(), {}, {}) == []


def test_graph_rejects_non_membership_edges():
    g = MemoryGraph.from_dicts(
        nodes=[{"id": "U", "kind": "unit"}, {"id": "P", "kind": "point"}, {"id": "U2", "kind": "unit"}]
    )
    with pytest.raises(ValueError):
        g.add_edge("U", "P")
    with pytest.raises(ValueError):
        g.add_edge("U", "U2")
    with pytest.raises(KeyError):
        g.add_edge("U", "nope")
    with pytest.raises(ValueError):
        g.add_node("U", "facet")
    with pytest.raises(ValueError):
        g.add_node("X", "episode")


def test_keyword_bonus_seed_example():
    hits = [
        Hit("A", "FacetPoint_search_text", "鉴权中间件保持不变。", 0.22),
        Hit("B", "Facet_search_text", "API 流式返回改造的变更边界。", 0.24),
        Hit("C", "Episode_summary", "首页 hero 文案交付时间。", 0.30),
    ]
    out = apply_keyword_bonus(hits, ["API"], bonus=0.15)
    assert [h.node_id for h in out] == ["B", "A", "C"]
    by_id = {h.node_id: h.distance for h in out}
    assert by_id["A"] == pytest.approx(0.22)
    assert by_id["B"] == pytest.approx(0.09)
    assert by_id["C"] == pytest.approx(0.30)
    # inputs untouched
    assert hits[1].distance == 0.24


def test_keyword_bonus_once_per_hit_and_plain_subtraction():
    h = Hit("X", "c", "API api A.P.I", 0.05)
    (out,) = apply_keyword_bonus([h], ["API", "a p i", ""])
    assert out.distance == pytest.approx(0.05 - 0.15)  # below zero, once
    (same,) = apply_keyword_bonus([h], [])
    assert same.distance == 0.05


def test_best_by_id_and_edge_hit_map():
    hits = [
        Hit("F2", "Facet_search_text", "变更边界", 0.12),
        Hit("F2", "Facet_anchor_text", "鉴权中间件保持不变只改响应层和测试", 0.10),
        Hit("P1", "FacetPoint_search_text", "鉴权中间件不能改", 0.08),
    ]
    assert best_by_id(hits) == {"F2": 0.10, "P1": 0.08}
    edges = [
        Hit("r1", "RelationType_relationship_name", "has_point", 0.4),
        Hit("r2", "RelationType_relationship_name", "has_point", 0.3),
        Hit("r3", "RelationType_relationship_name", "involves_entity", 0.5),
    ]
    assert edge_hit_map(edges) == {"has_point": 0.3, "involves_entity": 0.5}


def test_distance_from_cosine():
    assert distance_from_cosine(0.9) == pytest.approx(0.1)
    assert distance_from_cosine(-1.0) == 2.0
    assert math.isclose(distance_from_cosine(1.0), 0.0)
