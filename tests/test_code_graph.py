"""Source-level code graph: IMPORTS, INHERITS and CALLS resolved across real parsed files."""
from __future__ import annotations

import glob
import importlib.util
import os
from collections import Counter
from dataclasses import asdict
from textwrap import dedent

import pytest

from mtrag_resources.ingest.chunking.code import LANGUAGE_BY_SUFFIX, chunk_code
from mtrag_resources.ingest.code_graph import resolve_code_graph

pytestmark = pytest.mark.unit

SHOPCART = {
    "src/shopcart/__init__.py": '''\
        """Shopcart."""
        from .tax import lookup_rate
        ''',
    "src/shopcart/tax.py": '''\
        def lookup_rate(region, amount):
            """Rate for a region."""
            return 0.2 * amount
        ''',
    "src/shopcart/base.py": '''\
        class BaseCart:
            def subtotal(self):
                return sum(self.items)
        ''',
    "src/shopcart/cart.py": '''\
        import os
        import shopcart.tax as t
        from .tax import lookup_rate
        from .base import BaseCart


        class Cart(BaseCart):
            def discount(self):
                return 0

            def total(self, region):
                net = self.subtotal() - self.discount()
                return lookup_rate(region, net) + t.lookup_rate(region, 0)

            def debug(self):
                # `save` exists only on unrelated classes: a dynamic attribute, no edge
                return os.getcwd(), undefined_helper(), self.save(1)


        def make_cart():
            return Cart()
        ''',
    "src/shopcart/store.py": '''\
        from shopcart import lookup_rate as rate


        class FileStore:
            def save(self, item):
                return item


        class DbStore:
            def save(self, item):
                return item


        def persist(store, item):
            store.save(item)
            return rate("eu", 1)
        ''',
}


def build(files: dict[str, str], source_id: str = "shop"):
    parsed = []
    for path, text in files.items():
        language = LANGUAGE_BY_SUFFIX[os.path.splitext(path)[1]]
        pf = chunk_code(source_id, path, dedent(text), language)
        assert pf.warnings == [], pf.warnings
        parsed.append(pf)
    nodes, relations = resolve_code_graph(source_id, parsed)
    return parsed, {n.node_id: n for n in nodes}, relations


def edges(relations, nodes, rel_type):
    """{(src qualified name, dst qualified name): relation}"""
    return {(nodes[r.src_id].qualified_name, nodes[r.dst_id].qualified_name): r
            for r in relations if r.rel_type == rel_type}


@pytest.fixture(scope="module")
def shop():
    return build(SHOPCART)


def test_calls_resolve_through_imports_self_and_inheritance(shop):
    parsed, nodes, relations = shop
    calls = edges(relations, nodes, "CALLS")
    for src, dst in [
        ("shopcart.cart.Cart.total", "shopcart.tax.lookup_rate"),      # from .tax import
        ("shopcart.cart.Cart.total", "shopcart.cart.Cart.discount"),   # self.method()
        ("shopcart.cart.Cart.total", "shopcart.base.BaseCart.subtotal"),  # inherited method
        ("shopcart.cart.make_cart", "shopcart.cart.Cart"),             # calling a class
        ("shopcart.store.persist", "shopcart.tax.lookup_rate"),        # re-export via __init__
    ]:
        assert calls[(src, dst)].confidence == "VERIFIED", (src, dst)
        assert calls[(src, dst)].candidates == []
    # `t.lookup_rate` (import shopcart.tax as t) lands on the same edge; check it resolves alone
    only_alias = dict(SHOPCART)
    only_alias["src/shopcart/cart.py"] = SHOPCART["src/shopcart/cart.py"].replace(
        "lookup_rate(region, net) + ", "")
    _, nodes2, relations2 = build(only_alias)
    alias_edge = edges(relations2, nodes2, "CALLS")[("shopcart.cart.Cart.total", "shopcart.tax.lookup_rate")]
    assert alias_edge.confidence == "VERIFIED" and alias_edge.evidence_text == "t.lookup_rate(region, 0)"
    # external and unknown callees get no edge
    assert not [k for k in calls if k[0] == "shopcart.cart.Cart.debug"]


def test_call_evidence_points_at_the_caller_chunk(shop):
    parsed, nodes, relations = shop
    edge = edges(relations, nodes, "CALLS")[("shopcart.cart.Cart.total", "shopcart.cart.Cart.discount")]
    caller = next(c for pf in parsed for c in pf.chunks if c.symbol == "shopcart.cart.Cart.total")
    assert edge.evidence_file == "src/shopcart/cart.py"
    assert edge.evidence_start == edge.evidence_end == 12
    assert edge.evidence_hash == caller.content_hash
    assert edge.evidence_text == "self.discount()" and edge.source_id == "shop"


def test_ambiguous_call_is_inferred_with_candidates(shop):
    _, nodes, relations = shop
    save = [r for r in relations if r.rel_type == "CALLS"
            and nodes[r.src_id].qualified_name == "shopcart.store.persist"
            and nodes[r.dst_id].name == "save"]
    assert len(save) == 1
    assert save[0].confidence == "INFERRED"
    assert save[0].candidates == ["shopcart.store.DbStore.save", "shopcart.store.FileStore.save"]
    assert nodes[save[0].dst_id].qualified_name == "shopcart.store.DbStore.save"


def test_imports_and_inherits(shop):
    _, nodes, relations = shop
    imports = edges(relations, nodes, "IMPORTS")
    assert imports[("shopcart.cart", "shopcart.tax")].confidence == "VERIFIED"        # import ... as t
    assert imports[("shopcart.cart", "shopcart.tax.lookup_rate")].evidence_text == \
        "from .tax import lookup_rate"
    assert ("shopcart.cart", "shopcart.base.BaseCart") in imports
    assert ("shopcart.store", "shopcart.tax.lookup_rate") in imports                  # via re-export
    assert not [k for k in imports if k[1] in ("os", "shopcart.cart")]                # external / self
    inherits = edges(relations, nodes, "INHERITS")
    assert list(inherits) == [("shopcart.cart.Cart", "shopcart.base.BaseCart")]
    assert inherits[("shopcart.cart.Cart", "shopcart.base.BaseCart")].confidence == "VERIFIED"


def test_graph_is_complete_deduplicated_and_textless(shop):
    parsed, nodes, relations = shop
    assert len({r.rel_id for r in relations}) == len(relations)
    assert all(r.src_id in nodes and r.dst_id in nodes for r in relations)
    assert {r.rel_id for pf in parsed for r in pf.relations} <= {r.rel_id for r in relations}
    assert all(len(str(v)) < 200 for n in nodes.values() for v in asdict(n).values())
    assert Counter(n.label for n in nodes.values())["Module"] == 5
    chunk_ids = {c.chunk_id for pf in parsed for c in pf.chunks}
    assert all(n.chunk_id in chunk_ids for n in nodes.values())
    _, nodes_again, relations_again = build(SHOPCART)
    assert sorted(r.rel_id for r in relations_again) == sorted(r.rel_id for r in relations)


def test_javascript_cross_file():
    _, nodes, relations = build({
        "web/tax.js": "export function lookupRate(r) { return 0.2; }\n",
        "web/cart.js": dedent('''\
            import { lookupRate as rate } from './tax';
            import * as taxes from './tax.js';
            class Base { sub() { return 1; } }
            class Cart extends Base {
              total() { return rate('eu') + taxes.lookupRate('us') + this.sub(); }
            }
            class Box { size() { return 1; } }
            class Bag { size() { return 2; } }
            function measure(thing) { return thing.size(); }
            '''),
    })
    calls = edges(relations, nodes, "CALLS")
    assert calls[("web.cart.Cart.total", "web.tax.lookupRate")].confidence == "VERIFIED"
    assert calls[("web.cart.Cart.total", "web.cart.Base.sub")].confidence == "VERIFIED"
    ambiguous = next(r for (src, _), r in calls.items() if src == "web.cart.measure")
    assert ambiguous.confidence == "INFERRED"
    assert ambiguous.candidates == ["web.cart.Bag.size", "web.cart.Box.size"]
    assert ("web.cart", "web.tax.lookupRate") in edges(relations, nodes, "IMPORTS")
    assert ("web.cart.Cart", "web.cart.Base") in edges(relations, nodes, "INHERITS")


def test_go_package_and_import_path():
    _, nodes, relations = build({
        "tax/tax.go": "package tax\n\nfunc Lookup(r string) int { return 1 }\n",
        "shop/cart.go": dedent('''\
            package shop

            import t "github.com/acme/shop/tax"

            type Cart struct{}

            func (c *Cart) Total() int { return t.Lookup("eu") + c.sub() + helper() }
            '''),
        "shop/util.go": "package shop\n\nfunc helper() int { return 1 }\n\nfunc (c *Cart) sub() int { return 0 }\n",
    })
    calls = edges(relations, nodes, "CALLS")
    assert calls[("shop.cart.Cart.Total", "tax.tax.Lookup")].confidence == "VERIFIED"
    assert calls[("shop.cart.Cart.Total", "shop.util.helper")].confidence == "VERIFIED"
    assert calls[("shop.cart.Cart.Total", "shop.util.Cart.sub")].confidence == "VERIFIED"
    assert ("shop.cart", "tax.tax") in edges(relations, nodes, "IMPORTS")


def test_java_imports_and_inheritance():
    _, nodes, relations = build({
        "src/com/shop/tax/Tax.java": "package com.shop.tax;\npublic class Tax { static int lookup(String r) { return 1; } }\n",
        "src/com/shop/Base.java": "package com.shop;\npublic class Base { int sub() { return 1; } }\n",
        "src/com/shop/Cart.java": dedent('''\
            package com.shop;
            import com.shop.tax.Tax;
            public class Cart extends Base {
                int total() { return Tax.lookup("eu") + sub() + this.sub(); }
            }
            '''),
    })
    calls = edges(relations, nodes, "CALLS")
    assert calls[("src.com.shop.Cart.Cart.total", "src.com.shop.tax.Tax.Tax.lookup")].confidence == "VERIFIED"
    assert calls[("src.com.shop.Cart.Cart.total", "src.com.shop.Base.Base.sub")].confidence == "VERIFIED"
    assert edges(relations, nodes, "INHERITS")[("src.com.shop.Cart.Cart", "src.com.shop.Base.Base")]
    assert ("src.com.shop.Cart", "src.com.shop.tax.Tax.Tax") in edges(relations, nodes, "IMPORTS")


def test_rust_use_and_impl_methods():
    _, nodes, relations = build({
        "src/tax.rs": "pub fn lookup_rate(x: u32) -> u32 { x }\n",
        "src/cart.rs": dedent('''\
            use crate::tax::lookup_rate;
            pub struct Cart {}
            impl Cart {
                pub fn new() -> Self { Cart {} }
                pub fn total(&self) -> u32 { self.sub() + lookup_rate(1) }
                fn sub(&self) -> u32 { 0 }
            }
            fn main() { let c = Cart::new(); }
            '''),
    })
    calls = edges(relations, nodes, "CALLS")
    assert calls[("src.cart.Cart.total", "src.tax.lookup_rate")].confidence == "VERIFIED"
    assert calls[("src.cart.Cart.total", "src.cart.Cart.sub")].confidence == "VERIFIED"
    assert calls[("src.cart.main", "src.cart.Cart.new")].confidence == "VERIFIED"
    assert calls[("src.cart.Cart.new", "src.cart.Cart")].confidence == "VERIFIED"


# click is installed with Dagster (its CLI), so its real source is always here to parse.
CLICK = os.path.dirname(importlib.util.find_spec("click").origin)


def test_click_graph():
    files = {}
    for path in sorted(glob.glob(f"{CLICK}/*.py")):
        with open(path, encoding="utf-8") as handle:
            files[f"click/{os.path.basename(path)}"] = handle.read()
    _, nodes, relations = build(files, source_id="click")
    counts = Counter((r.rel_type, r.confidence) for r in relations)
    assert counts[("CALLS", "VERIFIED")] > 200 and counts[("IMPORTS", "VERIFIED")] > 50
    assert counts[("INHERITS", "VERIFIED")] > 20
    assert all(len(r.candidates) <= 5 for r in relations)
    inherits = edges(relations, nodes, "INHERITS")
    assert ("click.core.Group", "click.core.Command") in inherits
    assert ("click.exceptions.UsageError", "click.exceptions.ClickException") in inherits
    calls = edges(relations, nodes, "CALLS")
    assert calls[("click.core.Group.to_info_dict", "click.core.Group.list_commands")].confidence == "VERIFIED"
    assert any(dst == "click.globals.get_current_context" for (_, dst) in calls)
    assert all(r.evidence_hash and r.evidence_file and r.evidence_start > 0 for r in relations)
