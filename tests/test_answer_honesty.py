"""What an answer says about itself: a made-up identifier is `not found` (never a hit), a far-off
question is low confidence, and a whole doc section (up to 16 KB) is a query whose bridge names
the code it references, in order, with the doc hit each entry came from."""
from __future__ import annotations

import pytest

from mtrag_resources.serving.bridge import BRIDGE_CAP
from mtrag_resources.serving.query_text import is_identifier_query, prose_of
from mtrag_resources.serving.reader import IndexReader, QueryError
from mtrag_resources.serving.render import render_query
from mtrag_resources.serving.requests import MAX_QUERY_BYTES


@pytest.mark.unit
def test_identifier_shaped_queries():
    for q in ("shopcart.tax.apply_tax", "apply_tax", "ShopCart", "lookup_rate()", "`Cart.total`"):
        assert is_identifier_query(q), q
    for q in ("apply", "how do I apply tax", "Cart", "税率", "e.g"):
        assert not is_identifier_query(q), q


@pytest.mark.unit
def test_prose_of_drops_fenced_examples():
    text = "Use `apply_tax` here.\n\n```python\nlookup_rate('eu')\n```\nThen `Cart.total`.\n"
    assert "lookup_rate" not in prose_of(text) and "apply_tax" in prose_of(text) and "Cart.total" in prose_of(text)


@pytest.fixture(scope="module")
def reader(published):
    r = IndexReader(home=str(published["home"]), log_proposals=False)
    yield r
    r.close()


@pytest.mark.integration
@pytest.mark.neo4j
def test_real_identifiers_are_matched_and_made_up_ones_are_not(reader):
    for real in ("shopcart.tax.apply_tax", "apply_tax", "Cart.total", "shopcart.cart.Cart.total", "lookup_rate()"):
        answer = reader.query(real, k=5)
        assert answer["exact"] == {"identifier": True, "matched": True}, real
        assert answer["confidence"] == "high"
    for fake in ("shopcart.tax.apply_vat", "apply_taxes", "Cart.item_total", "shopcart.cart.Basket.total",
                 "ShoppingBasket"):
        answer = reader.query(fake, k=5)
        assert answer["exact"] == {"identifier": True, "matched": False}, fake
        assert answer["confidence"] == "low"
        assert "not found: no symbol is named" in render_query(answer)


@pytest.mark.integration
@pytest.mark.neo4j
def test_a_far_off_question_is_low_confidence_and_a_near_one_is_not(reader):
    far = reader.query("how do I bake sourdough bread at home", k=5)
    assert far["confidence"] == "low" and far["exact"]["identifier"] is False
    assert "low confidence" in render_query(far)
    near = reader.query("add the regional tax to an amount", k=5)
    assert near["confidence"] == "normal"


@pytest.mark.integration
@pytest.mark.neo4j
def test_a_whole_doc_section_is_a_query_and_its_bridge_names_its_references(reader, published):
    section = (published["docs"] / "guide.md").read_text()
    padded = section + "\n" + "\n".join(f"Further prose line {i} about carts and taxes." for i in range(200))
    assert 8 * 1024 < len(padded.encode()) <= MAX_QUERY_BYTES
    answer = reader.query(padded, k=10)
    symbols = [b["symbol"] for b in answer["bridge"]]
    # :meth:`shopcart.cart.Cart.item_count` is inherited: the links resolve it to where it is defined;
    # `Cart.total()` is a literal (no conf.py gives these docs an object default role)
    assert {"shopcart.tax.apply_tax", "shopcart.cart.BaseCart.item_count", "shopcart.cart.Cart"} <= set(symbols)
    assert "shopcart.cart.Cart.total" not in symbols
    assert len(symbols) == len(set(symbols)) <= BRIDGE_CAP
    first = answer["bridge"][0]
    assert first["from_title"] and first["confidence"] == "VERIFIED"
    ranks = [b["from_rank"] for b in answer["bridge"]]
    assert ranks == sorted(ranks)
    with pytest.raises(QueryError, match=f"limit is {MAX_QUERY_BYTES} bytes"):
        reader.query("x" * (MAX_QUERY_BYTES + 1))
