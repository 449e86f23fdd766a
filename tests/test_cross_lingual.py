"""Questions in the other language: a Chinese question answered from English code and docs (the
question translated word by word, serving/translation.py), scoped to an English source, and an
answer that says why it is empty or unsure."""
from __future__ import annotations

import pytest

from mtrag_resources.serving.channels import names_through_package
from mtrag_resources.serving.reader import IndexReader

# Ask for Cart.total ("Total price including tax") and apply_tax ("Apply the regional tax to an
# amount and round to cents") with no character in common with their code.
TOTAL_ZH = "怎样算出购物车里所有商品的总价"
TAX_ZH = "如何按地区调整一笔金额并四舍五入到分"


@pytest.fixture(scope="module")
def reader(published):
    r = IndexReader(home=str(published["home"]), log_proposals=False)
    yield r
    r.close()


def _symbols(answer, n: int = 3) -> list[str]:
    return [h["symbol"] for h in answer["hits"][:n]]


@pytest.mark.unit
def test_a_package_names_what_its_modules_define():
    assert names_through_package("json.decoder.jsondecodeerror", "json.jsondecodeerror")
    assert names_through_package("click.core.context.invoke", "context.invoke")
    assert names_through_package("click.core.group", "click.core.group")
    assert not names_through_package("click.core.group", "click.termui.group")
    assert not names_through_package("click.core.group", "flask.group")
    assert not names_through_package("click.core.groups", "click.group")


@pytest.mark.integration
@pytest.mark.neo4j
def test_a_chinese_question_finds_english_code_with_no_shared_character(reader, published):
    code = "".join(p.read_text() for p in published["pkg"].glob("*.py"))
    for question, symbol in ((TOTAL_ZH, "shopcart.cart.Cart.total"), (TAX_ZH, "shopcart.tax.apply_tax")):
        assert not set(question) & set(code)
        answer = reader.query(question, k=5, kind="code")
        assert answer["translation"], question
        assert _symbols(answer)[0] == symbol, (question, answer["translation"], _symbols(answer, 5))
        assert answer["confidence"] == "normal"


@pytest.mark.integration
@pytest.mark.neo4j
def test_a_chinese_question_scoped_to_an_english_source_is_answered_there(reader):
    answer = reader.query(TAX_ZH, k=5, sources=["shop"])
    assert answer["hits"] and {h["source_id"] for h in answer["hits"]} == {"shop"}
    assert _symbols(answer)[0] == "shopcart.tax.apply_tax"
    assert "empty_reason" not in answer.to_dict()


@pytest.mark.integration
@pytest.mark.neo4j
def test_an_unanswerable_chinese_question_is_low_confidence(reader):
    answer = reader.query("怎么在家里烤出好吃的面包", k=5)
    assert answer["translation"] and answer["confidence"] == "low"


@pytest.mark.integration
@pytest.mark.neo4j
def test_an_empty_answer_says_why(reader):
    answer = reader.query(TAX_ZH, k=5, kind="docs", sources=["shop"])
    assert answer["hits"] == []
    assert "no source of kind 'docs'" in answer["empty_reason"]


@pytest.mark.integration
@pytest.mark.neo4j
def test_an_exact_lookup_of_a_sentence_or_an_unknown_name_says_why(reader):
    sentence = reader.query("how is the regional tax applied to an amount", k=5, mode="exact")
    assert sentence["hits"] == [] and "mode exact looks up identifiers" in sentence["empty_reason"]
    unknown = reader.query("frobnicate_the_widget", k=5, mode="exact")
    assert unknown["hits"] == [] and "is named 'frobnicate_the_widget'" in unknown["empty_reason"]
    assert reader.query("apply_tax", k=5, mode="exact")["hits"]


@pytest.mark.integration
@pytest.mark.neo4j
def test_a_name_its_package_re_exports_is_found(reader):
    # `shopcart.apply_tax` names what a module of the package `shopcart` defines, as `json.JSONDecodeError`
    # names `json.decoder.JSONDecodeError` (the rule does not read the package `__init__`)
    answer = reader.query("shopcart.apply_tax", k=5)
    assert answer["exact"] == {"identifier": True, "matched": True}
    assert _symbols(answer, 1) == ["shopcart.tax.apply_tax"]
    assert reader.query("shopcart.apply_vat", k=5)["exact"]["matched"] is False


@pytest.mark.integration
@pytest.mark.neo4j
def test_a_section_named_by_its_title_is_one_hit_not_a_parent_and_its_child(reader):
    answer = reader.query("Shopcart guide", k=10)
    assert answer["exact"]["matched"]
    texts = [h["text"] for h in answer["hits"]]
    assert len(texts) == len(set(texts))
    assert all(h["parent"] is None or h["parent"]["chunk_id"] != h["chunk_id"] for h in answer["hits"])
    assert not {h["chunk_id"] for h in answer["hits"]} & {h["parent"]["chunk_id"] for h in answer["hits"] if h["parent"]}
