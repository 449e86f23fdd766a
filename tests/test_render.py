"""The terminal views of reader answers (mtrag_resources.serving.render): pure functions over the
dicts the reader returns, checked line by line on answers built here."""
from __future__ import annotations

import pytest

from mtrag_resources.serving.render import render_paths, render_query, render_status

pytestmark = pytest.mark.unit


def _hit(rank: int, **over) -> dict:
    hit = {"rank": rank, "chunk_id": f"c{rank}", "source_id": "shop", "source_kind": "code",
           "file_path": "src/shopcart/tax.py", "start_line": 10, "end_line": 12,
           "symbol": "shopcart.tax.apply_tax", "title": "apply_tax",
           "text": "def apply_tax(amount, region):\n\n    \"\"\"Apply the tax.\"\"\"\n    return 1\n    # four\n",
           "channels": {"dense": {"rank": 2, "score": 0.5}, "fts": {"rank": 1, "score": 0.03}}}
    hit.update(over)
    return hit


def test_query_header_hits_channels_and_first_three_text_lines():
    out = render_query({"generation": 7, "query": "apply tax", "mode": "hybrid", "hits": [_hit(1)]})
    lines = out.splitlines()
    assert lines[0] == "generation 7  query: 'apply tax'  mode: hybrid"
    assert lines[1] == "   1. shopcart.tax.apply_tax  [shop:src/shopcart/tax.py:10-12]  (dense#2, fts#1)"
    # blank lines are dropped, at most three lines, each indented by six spaces
    assert lines[2:] == ["      def apply_tax(amount, region):", '          """Apply the tax."""',
                         "          return 1"]


def test_query_falls_back_to_title_and_cuts_long_lines():
    long = "x" * 200
    out = render_query({"generation": 1, "query": "q", "mode": "lexical",
                        "hits": [_hit(12, symbol="", title="Totals", text=long, channels={"exact": {"rank": 3}})]})
    lines = out.splitlines()
    assert lines[1] == "  12. Totals  [shop:src/shopcart/tax.py:10-12]  (exact#3)"
    assert lines[2] == "      " + "x" * 107 + "..."
    assert len(lines[2]) == 6 + 110


def test_query_bridge_paths_bundles_and_stale_lines():
    result = {
        "generation": 3, "query": "totals", "mode": "bundles", "hits": [],
        "bridge": [{"from_chunk_id": "0123456789abcdef", "relation": "MENTIONS", "confidence": "VERIFIED",
                    "symbol": "shopcart.cart.Cart.total", "file_path": "src/shopcart/cart.py", "start_line": 25}],
        "paths": [{"nodes": [{"qualified_name": "shopcart.cart.Cart.total", "name": "total"},
                             {"qualified_name": "", "name": "apply_tax"}]}],
        "bundles": [{"source_id": "shop", "unit": "src/shopcart/cart.py", "score": 0.123456, "best_path": "facet"}],
        "stale": [{"source": "shop", "store": "fts", "reason": "write in progress (begin abc)"}],
    }
    lines = render_query(result).splitlines()
    assert lines == [
        "generation 3  query: 'totals'  mode: bundles",
        "  bridge: 01234567 -MENTIONS/VERIFIED-> shopcart.cart.Cart.total (src/shopcart/cart.py:25)",
        "  path: shopcart.cart.Cart.total -> apply_tax",   # a node without a qualified name shows its name
        "  bundle: shop:src/shopcart/cart.py score 0.123 via facet",
        "  STALE shop/fts: write in progress (begin abc)",
    ]


def test_query_without_generation_or_mode_still_renders():
    out = render_query({"generation": None, "query": "x", "hits": [],
                        "stale": [{"source": "*", "store": "*", "reason": "no published generation"}]})
    assert out.splitlines() == ["generation None  query: 'x'  mode: None",
                                "  STALE */*: no published generation"]


def test_paths_with_evidence_on_each_edge():
    result = {"generation": 2, "from": "shopcart.cart.Cart.total", "to": "shopcart.tax.lookup_rate",
              "paths": [{"nodes": [{"qualified_name": "shopcart.cart.Cart.total"},
                                   {"qualified_name": "shopcart.tax.apply_tax"},
                                   {"qualified_name": "shopcart.tax.lookup_rate"}],
                         "edges": [{"type": "CALLS", "evidence": {"file": "src/shopcart/cart.py", "start_line": 27}},
                                   {"type": "CALLS", "evidence": None}]}],
              "stale": []}
    lines = render_paths(result).splitlines()
    assert lines == [
        "generation 2  paths from 'shopcart.cart.Cart.total' to 'shopcart.tax.lookup_rate'",
        "  shopcart.cart.Cart.total -[CALLS src/shopcart/cart.py:27]-> shopcart.tax.apply_tax "
        "-[CALLS :]-> shopcart.tax.lookup_rate",
    ]


def test_paths_none_found_and_stale():
    result = {"generation": 2, "from": "a.b", "to": None, "paths": [],
              "stale": [{"source": "shop", "store": "neo4j", "reason": "no marker"}]}
    assert render_paths(result).splitlines() == ["generation 2  paths from 'a.b'",
                                                 "  (no path: the graph is not available, see STALE)",
                                                 "  STALE shop/neo4j: no marker"]
    result["stale"] = []
    assert render_paths(result).splitlines()[1:] == ["  (no verified path)"]


def test_one_stale_line_per_store_and_cause_and_the_reason_for_no_hit():
    down = "Neo4j unreachable: ServiceUnavailable: Couldn't connect to 127.0.0.1:7687"
    result = {"generation": 2, "query": "x", "mode": "hybrid", "hits": [],
              "empty_reason": "the sources ['click'] hold no source of kind 'docs'",
              "stale": [{"source": s, "store": "neo4j", "reason": down + "\n(details)"} for s in ("a", "b", "c")]
              + [{"source": "a", "store": "fts", "reason": "write in progress"}]}
    assert render_query(result).splitlines()[1:] == [
        "  no hits: the sources ['click'] hold no source of kind 'docs'",
        f"  STALE neo4j of 3 sources (a, b, c): {down}",
        "  STALE a/fts: write in progress"]


def test_an_issue_hit_is_located_by_its_key_not_its_export_lines():
    hit = {"rank": 1, "source_id": "tracker", "file_path": "issues.json", "start_line": 1, "end_line": 1,
           "issue_key": "#8", "title": "#8 reader stalls", "state": "open", "symbol": None,
           "channels": {"exact": {"rank": 1}}, "text": "body"}
    line = render_query({"generation": 1, "query": "#8", "mode": "hybrid", "hits": [hit]}).splitlines()[1]
    assert line == "   1. #8 reader stalls [open]  [tracker:#8]  (exact#1)"


def test_status_rows_per_source_and_all_current_line():
    result = {"generation": 4, "stale": [], "sources": {
        "shop": {"qdrant": {"state": "committed", "generation": "2cae08db133b1c16"},
                 "fts": {"state": "committed", "generation": "2cae08db133b1c16"},
                 "neo4j": {"state": "missing", "generation": None}}}}
    lines = render_status(result).splitlines()
    assert lines == [
        "published generation 4",
        "  shop                 qdrant=committed@2cae08db  fts=committed@2cae08db  neo4j=missing@-",
        "  every store matches the manifest",
    ]


def test_status_stale_lines_replace_the_all_current_line():
    result = {"generation": 4, "sources": {}, "stale": [
        {"source": "shop", "store": "neo4j", "reason": "no marker; the manifest expects generation 2cae"},
        {"source": "__links__", "store": "neo4j", "reason": "write in progress"}]}
    lines = render_status(result).splitlines()
    assert lines == ["published generation 4",
                     "  STALE shop/neo4j: no marker; the manifest expects generation 2cae",
                     "  STALE __links__/neo4j: write in progress"]


def test_status_without_a_generation():
    assert render_status({"generation": None, "sources": {}, "stale": []}) == \
        "no published generation; run `mtrag build`"
