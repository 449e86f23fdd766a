"""Code chunking: real parsing of real snippets (Python via ast, five languages via tree-sitter)."""
from __future__ import annotations

import glob
import importlib.util
import os
from textwrap import dedent

import pytest

from mtrag_resources.ingest.chunking.code import (
    LANGUAGE_BY_SUFFIX, PARENT_MAX_CHARS, chunk_code, module_name_for,
)
from mtrag_resources.ingest.chunking.windows import line_windows

pytestmark = pytest.mark.unit

TAX = dedent('''\
    """Tax tables for the shop."""
    import math

    RATES = {"eu": 0.2}


    def lookup_rate(region, amount):
        """Look up the tax rate. Falls back to zero."""
        return RATES.get(region, 0) * amount


    def round_cents(value):
        """Round to cents."""
        return math.floor(value * 100) / 100


    @register
    class Cart(Base):
        """A shopping cart. Holds items."""

        currency = "EUR"

        def __init__(self):
            self.items = []

        def total(self, region):
            """Sum the items with tax."""
            def inner(x):
                return helper(x)
            return lookup_rate(region, sum(self.items))
    ''')


def chunks_by_symbol(parsed, chunk_type=None, role="child"):
    return {c.symbol: c for c in parsed.chunks
            if c.role == role and (chunk_type is None or c.chunk_type == chunk_type)}


def hashes(parsed):
    return {c.chunk_id: c.content_hash for c in parsed.chunks}


def test_module_name_for():
    assert module_name_for("src/shopcart/tax.py") == "shopcart.tax"
    assert module_name_for("lib/shopcart/__init__.py") == "shopcart"
    assert module_name_for("shopcart/cart.py") == "shopcart.cart"
    assert module_name_for("web/src/cart.ts") == "web.src.cart"
    assert module_name_for("cmd/server/main.go") == "cmd.server.main"
    assert LANGUAGE_BY_SUFFIX[".tsx"] == "tsx" and LANGUAGE_BY_SUFFIX[".cjs"] == "javascript"
    assert LANGUAGE_BY_SUFFIX[".rs"] == "rust" and LANGUAGE_BY_SUFFIX[".java"] == "java"


def test_python_symbols_titles_spans_and_parents():
    parsed = chunk_code("shop", "src/shopcart/tax.py", TAX, "python")
    assert parsed.warnings == []
    lines = TAX.splitlines(keepends=True)
    file_parent = next(c for c in parsed.chunks if c.chunk_type == "file")
    assert (file_parent.role, file_parent.symbol, file_parent.parent_id) == ("parent", "shopcart.tax", None)
    assert file_parent.text == TAX and file_parent.summary == "Tax tables for the shop."

    children = chunks_by_symbol(parsed)
    fn = children["shopcart.tax.lookup_rate"]
    assert (fn.chunk_type, fn.title) == ("function", "def lookup_rate(region, amount)")
    assert fn.summary == "Look up the tax rate."
    assert (fn.start_line, fn.end_line) == (7, 9)
    assert fn.text == "".join(lines[6:9]) and fn.parent_id == file_parent.chunk_id
    assert fn.language == "python" and fn.source_id == "shop" and fn.content_hash
    assert fn.locator == "src/shopcart/tax.py:7-9 (shopcart.tax.lookup_rate)"

    class_parent = chunks_by_symbol(parsed, "class", role="parent")["shopcart.tax.Cart"]
    class_child = children["shopcart.tax.Cart"]
    assert class_parent.start_line == 17 and class_parent.end_line == len(lines)  # decorator included
    assert class_child.title == "class Cart(Base)" and class_child.summary == "A shopping cart."
    assert class_child.parent_id == file_parent.chunk_id == class_parent.parent_id
    assert "def total(self, region):" in class_child.text and "sum(self.items)" not in class_child.text
    assert 'currency = "EUR"' in class_child.text and "sum(self.items)" in class_parent.text

    method = children["shopcart.tax.Cart.total"]
    assert method.chunk_type == "method" and method.parent_id == class_parent.chunk_id
    assert method.summary == "Sum the items with tax." and "def inner(x):" in method.text
    assert "shopcart.tax.Cart.total.inner" not in children  # nested functions fold into their parent

    module = children["shopcart.tax"]
    assert module.chunk_type == "module" and "import math" in module.text
    assert "def lookup_rate" not in module.text and module.parent_id == file_parent.chunk_id

    node = next(n for n in parsed.nodes if n.qualified_name == "shopcart.tax.Cart.total")
    assert node.node_id == "shop:method:shopcart.tax.Cart.total" and node.label == "Method"
    assert node.chunk_id == method.chunk_id and node.content_hash == method.content_hash
    assert method.graph_ids == [node.node_id]
    defines = {(r.src_id, r.dst_id) for r in parsed.relations if r.rel_type == "DEFINES"}
    assert ("shop:class:shopcart.tax.Cart", node.node_id) in defines
    assert ("shop:module:shopcart.tax", "shop:function:shopcart.tax.lookup_rate") in defines
    contains = [r for r in parsed.relations if r.rel_type == "CONTAINS"]
    assert [(r.src_id, r.dst_id) for r in contains] == [
        ("shop:file:src/shopcart/tax.py", "shop:module:shopcart.tax")]
    # nested `inner` folds: its call to `helper` belongs to `total`
    assert {"caller_qn": "shopcart.tax.Cart.total", "callee_expr": "helper"}.items() <= next(
        c for c in parsed.calls if c["callee_expr"] == "helper").items()


def test_ids_are_stable_across_runs():
    first = chunk_code("shop", "src/shopcart/tax.py", TAX, "python")
    second = chunk_code("shop", "src/shopcart/tax.py", TAX, "python")
    assert [(c.chunk_id, c.content_hash) for c in first.chunks] == \
        [(c.chunk_id, c.content_hash) for c in second.chunks]
    assert [n.node_id for n in first.nodes] == [n.node_id for n in second.nodes]
    assert [r.rel_id for r in first.relations] == [r.rel_id for r in second.relations]
    assert len({c.chunk_id for c in first.chunks}) == len(first.chunks)


def test_inserting_a_function_changes_no_other_id_or_hash():
    before = chunk_code("shop", "src/shopcart/tax.py", TAX, "python")
    inserted = TAX.replace("def round_cents", 'def new_fn():\n    """New."""\n    return 1\n\n\ndef round_cents')
    after = chunk_code("shop", "src/shopcart/tax.py", inserted, "python")
    old, new = hashes(before), hashes(after)
    assert set(old) <= set(new) and len(new) == len(old) + 1
    changed = {cid for cid in old if old[cid] != new[cid]}
    file_parent = next(c for c in before.chunks if c.chunk_type == "file")
    assert changed == {file_parent.chunk_id}
    # line numbers moved, ids did not
    moved = chunks_by_symbol(after)["shopcart.tax.round_cents"]
    assert moved.start_line > chunks_by_symbol(before)["shopcart.tax.round_cents"].start_line


def test_inserting_a_method_changes_only_the_class_and_file():
    before = chunk_code("shop", "src/shopcart/tax.py", TAX, "python")
    inserted = TAX.replace("    def total", "    def clear(self):\n        self.items = []\n\n    def total")
    after = chunk_code("shop", "src/shopcart/tax.py", inserted, "python")
    old, new = hashes(before), hashes(after)
    assert set(old) <= set(new) and len(new) == len(old) + 1
    changed = {c.chunk_type + "/" + c.role for c in before.chunks if old[c.chunk_id] != new[c.chunk_id]}
    # the class child lists method signatures, so it changes with them
    assert changed == {"file/parent", "class/parent", "class/child"}


def test_docstring_edit_changes_exactly_the_chunk_and_its_parents():
    before = chunk_code("shop", "src/shopcart/tax.py", TAX, "python")
    old = hashes(before)
    edited = chunk_code("shop", "src/shopcart/tax.py", TAX.replace("Sum the items", "Add up the items"), "python")
    changed = {(c.chunk_type, c.role, c.symbol) for c in edited.chunks if old[c.chunk_id] != c.content_hash}
    assert changed == {("method", "child", "shopcart.tax.Cart.total"),
                       ("class", "parent", "shopcart.tax.Cart"), ("file", "parent", "shopcart.tax")}
    edited = chunk_code("shop", "src/shopcart/tax.py", TAX.replace("Round to cents", "Round it"), "python")
    changed = {(c.chunk_type, c.role, c.symbol) for c in edited.chunks if old[c.chunk_id] != c.content_hash}
    assert changed == {("function", "child", "shopcart.tax.round_cents"), ("file", "parent", "shopcart.tax")}
    node = next(n for n in edited.nodes if n.qualified_name == "shopcart.tax.round_cents")
    assert node.content_hash != next(n for n in before.nodes if n.node_id == node.node_id).content_hash


def test_conditional_redefinitions_get_distinct_ids():
    text = dedent('''\
        import sys
        if sys.platform == "win32":
            def path_sep():
                return "\\\\"
        else:
            def path_sep():
                return "/"
        ''')
    parsed = chunk_code("s", "pkg/paths.py", text, "python")
    fns = [c for c in parsed.chunks if c.chunk_type == "function"]
    assert [c.symbol for c in fns] == ["pkg.paths.path_sep"] * 2
    assert len({c.chunk_id for c in fns}) == 2
    assert [n.node_id for n in parsed.nodes if n.label == "Function"] == [
        "s:function:pkg.paths.path_sep", "s:function:pkg.paths.path_sep#2"]


def test_syntax_error_falls_back_to_windows():
    text = "def ok():\n    return 1\n\ndef broken(:\n    pass\n" + "x = 1\n" * 100
    parsed = chunk_code("s", "pkg/bad.py", text, "python")
    assert len(parsed.warnings) == 1
    assert parsed.warnings[0].startswith("pkg/bad.py: SyntaxError line 4")
    assert "fell back to line windows" in parsed.warnings[0]
    file_parent = parsed.chunks[0]
    windows = parsed.chunks[1:]
    assert file_parent.chunk_type == "file" and file_parent.role == "parent"
    assert windows and all(c.chunk_type == "window" and c.role == "child" for c in windows)
    assert all(c.parent_id == file_parent.chunk_id for c in windows)
    assert windows[0].start_line == 1 and windows[-1].end_line == len(text.splitlines())
    assert {n.label for n in parsed.nodes} == {"File", "Module"}


@pytest.mark.parametrize("text", [
    "x = " + "(" * 500 + "1" + ")" * 500 + "\n",
    "".join("    " * i + f"if x{i}:\n" for i in range(200)) + "    " * 200 + "pass\n",
    "def f():\n    return " + "[" * 3000 + "]" * 3000 + "\n",
    "def f():\n    return " + "-" * 50000 + "1\n",
    "def f(x=1" + "+1" * 20000 + "):\n    return g()\n",
    "def f(x=" + "-" * 900 + "1):\n    pass\n",
])
def test_deep_nesting_does_not_raise(text):
    parsed = chunk_code("s", "pkg/deep.py", text, "python")
    assert parsed.chunks and parsed.chunks[0].chunk_type == "file"
    assert all(c.content_hash for c in parsed.chunks)


def test_deep_nesting_in_treesitter_does_not_raise():
    text = "function f() { return " + "[" * 5000 + "]" * 5000 + "; }\n"
    parsed = chunk_code("s", "web/deep.js", text, "javascript")
    assert any(c.symbol == "web.deep.f" for c in parsed.chunks)


def test_empty_file_gives_nothing():
    parsed = chunk_code("s", "pkg/empty.py", "", "python")
    assert (parsed.chunks, parsed.nodes, parsed.relations, parsed.warnings) == ([], [], [], [])
    assert chunk_code("s", "pkg/blank.go", "\n\n  \n", "go").chunks == []


def test_large_file_parent_is_capped_but_tracks_every_edit():
    body = "".join(f"def f{i}():\n    return {i}\n\n" for i in range(1500))
    parsed = chunk_code("s", "pkg/big.py", body, "python")
    file_parent = parsed.chunks[0]
    assert len(body) > 2 * PARENT_MAX_CHARS
    assert len(file_parent.text) < PARENT_MAX_CHARS + 200 and "[truncated:" in file_parent.text
    edited = chunk_code("s", "pkg/big.py", body.replace("return 1499", "return -1"), "python")
    assert edited.chunks[0].content_hash != file_parent.content_hash
    assert len([c for c in parsed.chunks if c.chunk_type == "function"]) == 1500


def test_line_windows_overlap_and_unknown_language():
    text = "".join(f"line {i}\n" for i in range(1, 131))
    windows = line_windows("notes/x.txt", text, "text", window=60, overlap=10)
    assert [(w.start_line, w.end_line) for w in windows] == [(1, 60), (51, 110), (101, 130)]
    assert windows[1].text.startswith("line 51\n") and all(w.chunk_type == "window" for w in windows)
    parsed = chunk_code("s", "scripts/run.sh", text, "shell")
    assert [c.chunk_type for c in parsed.chunks] == ["file", "window", "window", "window"]


# click is installed with Dagster (its CLI), so its real source is always here to parse.
CLICK = os.path.dirname(importlib.util.find_spec("click").origin)


def test_click_package_parses_cleanly():
    parsed = []
    for path in sorted(glob.glob(f"{CLICK}/*.py")):
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
        pf = chunk_code("click", f"click/{os.path.basename(path)}", text, "python")
        assert pf.warnings == [], pf.warnings
        lines = text.splitlines(keepends=True)
        for chunk in pf.chunks:
            assert 1 <= chunk.start_line <= chunk.end_line <= len(lines)
            if chunk.chunk_type in ("function", "method"):
                assert chunk.text == "".join(lines[chunk.start_line - 1:chunk.end_line])
        parsed.append(pf)
    chunks = [c for pf in parsed for c in pf.chunks]
    assert len(parsed) >= 15
    assert len({c.chunk_id for c in chunks}) == len(chunks)
    symbols = {c.symbol for c in chunks}
    assert {"click.core.Context", "click.core.Context.invoke", "click.utils.echo", "click"} <= symbols
    kinds = [c.chunk_type for c in chunks]
    assert kinds.count("method") > 200 and kinds.count("function") > 100 and kinds.count("class") > 100
    assert kinds.count("file") == len(parsed)
    context = next(c for c in chunks if c.symbol == "click.core.Context" and c.role == "child")
    assert context.title == "class Context" and len(context.text) <= 4100
    assert next(c for c in chunks if c.symbol == "click.utils.echo").summary.startswith("Print a message")


# -- tree-sitter languages ------------------------------------------------------------------

def spans(parsed):
    return {c.symbol: (c.chunk_type, c.start_line, c.end_line) for c in parsed.chunks if c.role == "child"}


def parent_symbol(parsed, symbol):
    chunk = next(c for c in parsed.chunks if c.symbol == symbol and c.role == "child")
    return next(c for c in parsed.chunks if c.chunk_id == chunk.parent_id)


def test_javascript():
    text = dedent('''\
        const tax = require('./tax');

        /** A cart. Holds items. */
        class Cart extends Base {
          total() {
            return tax.rate() + this.sub();
          }
          sub() { return 1; }
        }

        function helper(x) {
          return x * 2;
        }

        export const twice = (x) => helper(x) * 2;
        ''')
    parsed = chunk_code("s", "web/cart.js", text, "javascript")
    assert parsed.warnings == []
    assert spans(parsed) == {
        "web.cart": ("module", 1, 1),
        "web.cart.Cart": ("class", 3, 9),
        "web.cart.Cart.total": ("method", 5, 7),
        "web.cart.Cart.sub": ("method", 8, 8),
        "web.cart.helper": ("function", 11, 13),
        "web.cart.twice": ("function", 15, 15),
    }
    cart = next(c for c in parsed.chunks if c.symbol == "web.cart.Cart" and c.role == "child")
    assert cart.summary == "A cart." and cart.title == "class Cart extends Base"
    assert parent_symbol(parsed, "web.cart.Cart.total").chunk_type == "class"
    assert next(c for c in parsed.chunks if c.symbol == "web.cart.twice").text.startswith("export const")
    calls = {(c["caller_qn"], c["callee_expr"]) for c in parsed.calls}
    assert {("web.cart.Cart.total", "tax.rate"), ("web.cart.Cart.total", "self.sub"),
            ("web.cart.twice", "helper")} <= calls
    assert parsed.imports[0]["bound"] == "web.tax" and parsed.imports[0]["alias"] == "tax"
    assert [(b["class_qn"], b["base_expr"]) for b in parsed.bases] == [("web.cart.Cart", "Base")]


def test_typescript_and_tsx():
    text = dedent('''\
        import { lookupRate } from './tax';

        export interface Priced { price(): number; }

        export class Cart implements Priced {
          private items: number[] = [];
          /** The price. */
          price(): number { return lookupRate('eu') * this.items.length; }
        }

        export function render(cart: Cart): string {
          return String(cart.price());
        }
        ''')
    parsed = chunk_code("s", "web/src/cart.ts", text, "typescript")
    assert parsed.warnings == []
    got = spans(parsed)
    assert got["web.src.cart.Cart"] == ("class", 5, 9)
    assert got["web.src.cart.Cart.price"] == ("method", 7, 8)
    assert got["web.src.cart.render"] == ("function", 11, 13)
    assert got["web.src.cart.Priced"][0] == "class"
    price = next(c for c in parsed.chunks if c.symbol == "web.src.cart.Cart.price")
    assert price.summary == "The price." and price.title == "price(): number"
    assert parsed.imports[0]["bound"] == "web.src.tax.lookupRate"
    tsx = chunk_code("s", "web/src/View.tsx", "export function View() {\n  return <div>{title()}</div>;\n}\n", "tsx")
    assert spans(tsx)["web.src.View.View"] == ("function", 1, 3) and tsx.warnings == []


def test_java():
    text = dedent('''\
        package com.shop;

        import com.shop.tax.Tax;

        /**
         * A cart. Holds items.
         */
        public class Cart extends Base implements Priced {
            private int n;

            /** Total with tax. */
            @Override
            public int total(String region) {
                return Tax.lookup(region) + this.sub();
            }

            static class Line {
                int qty() { return 1; }
            }
        }
        ''')
    parsed = chunk_code("s", "src/com/shop/Cart.java", text, "java")
    assert parsed.warnings == []
    got = spans(parsed)
    assert got["src.com.shop.Cart.Cart"] == ("class", 5, 20)
    assert got["src.com.shop.Cart.Cart.total"] == ("method", 11, 15)
    assert got["src.com.shop.Cart.Cart.Line"] == ("class", 17, 19)
    assert got["src.com.shop.Cart.Cart.Line.qty"] == ("method", 18, 18)
    cart = next(c for c in parsed.chunks if c.symbol == "src.com.shop.Cart.Cart" and c.role == "child")
    assert cart.summary == "A cart."
    assert parent_symbol(parsed, "src.com.shop.Cart.Cart.Line.qty").symbol == "src.com.shop.Cart.Cart.Line"
    assert {b["base_expr"] for b in parsed.bases} == {"Base", "Priced"}
    assert {c["callee_expr"] for c in parsed.calls} >= {"Tax.lookup", "self.sub"}


def test_go():
    text = dedent('''\
        package shop

        import (
        \t"fmt"
        \tt "github.com/acme/shop/tax"
        )

        // Cart holds items.
        type Cart struct {
        \titems []int
        }

        // Total sums the cart. With tax.
        func (c *Cart) Total(region string) int {
        \treturn t.Lookup(region) + c.sub() + helper()
        }

        func helper() int { fmt.Println("x"); return 1 }
        ''')
    parsed = chunk_code("s", "shop/cart.go", text, "go")
    assert parsed.warnings == []
    got = spans(parsed)
    assert got["shop.cart.Cart"] == ("class", 8, 11)
    assert got["shop.cart.Cart.Total"] == ("method", 13, 16)
    assert got["shop.cart.helper"] == ("function", 18, 18)
    total = next(c for c in parsed.chunks if c.symbol == "shop.cart.Cart.Total")
    assert total.summary == "Total sums the cart." and total.title.startswith("func (c *Cart) Total(")
    assert parent_symbol(parsed, "shop.cart.Cart.Total").chunk_type == "class"
    assert {c["callee_expr"] for c in parsed.calls if c["caller_qn"] == "shop.cart.Cart.Total"} == {
        "t.Lookup", "self.sub", "helper"}
    assert {(i["alias"], i["bound"]) for i in parsed.imports} == {
        ("fmt", "fmt"), ("t", "github.com/acme/shop/tax")}


def test_rust():
    text = dedent('''\
        use crate::tax::lookup_rate;

        /// A cart. Holds items.
        #[derive(Debug)]
        pub struct Cart {
            items: Vec<u32>,
        }

        impl Cart {
            /// Make an empty cart.
            pub fn new() -> Self {
                Cart { items: vec![] }
            }

            pub fn total(&self) -> u32 {
                self.sub() + lookup_rate(1)
            }
        }

        fn main() {
            let c = Cart::new();
        }
        ''')
    parsed = chunk_code("s", "src/cart.rs", text, "rust")
    assert parsed.warnings == []
    got = spans(parsed)
    assert got["src.cart.Cart"] == ("class", 3, 7)
    assert got["src.cart.Cart.new"] == ("method", 10, 13)
    assert got["src.cart.Cart.total"] == ("method", 15, 17)
    assert got["src.cart.main"] == ("function", 20, 22)
    new = next(c for c in parsed.chunks if c.symbol == "src.cart.Cart.new")
    assert new.summary == "Make an empty cart." and new.title == "pub fn new() -> Self"
    assert parent_symbol(parsed, "src.cart.Cart.total").symbol == "src.cart.Cart"
    module = next(c for c in parsed.chunks if c.chunk_type == "module")
    assert "self.sub()" not in module.text  # methods in impl blocks are not module-level code
    assert {c["callee_expr"] for c in parsed.calls} >= {"self.sub", "lookup_rate", "Cart.new"}


def test_treesitter_errors_keep_what_parsed_or_fall_back():
    partial = "function good() { return 1; }\n\nfunction bad( { oops\n"
    parsed = chunk_code("s", "web/partial.js", partial, "javascript")
    assert "web.partial.good" in spans(parsed)
    assert len(parsed.warnings) == 1 and parsed.warnings[0].startswith("web/partial.js:")
    garbage = chunk_code("s", "web/garbage.js", "}}} ((( %%% )))\n" * 5, "javascript")
    assert [c.chunk_type for c in garbage.chunks] == ["file", "window"]
    assert "fell back to line windows" in garbage.warnings[0]


def test_form_feeds_crlf_and_bom_keep_line_numbers_exact():
    text = "\ufeff# header\r\nx = 1\r\n\x0c\r\ndef f():\r\n    return 1\r\n"
    parsed = chunk_code("s", "pkg/ff.py", text, "python")
    fn = next(c for c in parsed.chunks if c.chunk_type == "function")
    assert (fn.start_line, fn.end_line) == (4, 5)
    assert fn.text == "def f():\r\n    return 1\r\n" and fn.title == "def f()"
    go = chunk_code("s", "pkg/ff.go", "package p\n\x0c\n// F does it.\nfunc F() {}\n", "go")
    f = next(c for c in go.chunks if c.chunk_type == "function")
    assert (f.start_line, f.end_line, f.summary) == (3, 4, "F does it.")


def test_minified_javascript_gets_exact_spans_not_whole_lines():
    text = "".join(f"function f{i}(a){{return a+{i}}}" for i in range(300)) + "\n"
    parsed = chunk_code("s", "web/app.min.js", text, "javascript")
    fns = [c for c in parsed.chunks if c.chunk_type == "function"]
    assert len(fns) == 300 and fns[7].text == "function f7(a){return a+7}"
    assert all(c.start_line == 1 for c in fns) and max(len(c.text) for c in fns) < 40
