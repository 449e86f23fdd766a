import pytest

from mtrag_resources.serving.query_text import (
    PreprocessedQuery,
    identifiers_in,
    is_identifier_query,
    normalize_for_keyword,
    preprocess_query,
)

pytestmark = pytest.mark.unit


def test_seed_mixed_lang():
    q = preprocess_query("API 流式返回那个任务有哪些约束")
    assert isinstance(q, PreprocessedQuery)
    assert q.original == "API 流式返回那个任务有哪些约束"
    assert q.vector_query == "API 流式返回那个任务有哪些约束"
    assert q.keywords == ["API"]
    assert q.hybrid_reason == "mixed_lang"
    assert q.use_hybrid is True


def test_seed_number():
    q = preprocess_query("40万预算那个方案后来怎么改了")
    assert q.hybrid_reason == "number"
    assert "40万" in q.keywords
    assert q.use_hybrid


def test_mixed_lang_drops_english_question_words_and_keeps_identifiers():
    q = preprocess_query("what is click.echo 的作用")
    assert q.hybrid_reason == "mixed_lang"
    assert q.keywords == ["click.echo"]
    q = preprocess_query("GPT-4 怎么用")
    assert q.keywords == ["GPT-4"]  # no stray "4" number


def test_number_units_and_identifier_digits():
    assert preprocess_query("预算40k够吗").keywords == ["40k"]
    assert preprocess_query("timeout is 30s by default for every request here").keywords == ["30s"]
    q = preprocess_query("utf8 encoding errors when reading files from stdin")
    assert q.hybrid_reason is None and q.keywords == []


def test_short_query():
    q = preprocess_query("什么是上下文")
    assert q.hybrid_reason == "short_query" and q.keywords == ["上下文"]
    q = preprocess_query("有哪些约束？")
    assert q.keywords == ["约束"]
    q = preprocess_query("What is the Context?")
    assert q.hybrid_reason == "short_query" and q.keywords == ["Context"]


def test_long_query_is_not_hybrid():
    q = preprocess_query("how do I register a subcommand with a group in click")
    assert q == PreprocessedQuery(q.original, q.vector_query, [], None, False)
    q = preprocess_query("内存泄漏有哪些常见原因和排查方法")
    assert not q.use_hybrid and q.hybrid_reason is None


def test_normalize_for_keyword():
    assert normalize_for_keyword("API 流式返回改造的变更边界。") == "api流式返回改造的变更边界"
    assert normalize_for_keyword("首页 hero 文案，交付时间！") == "首页hero文案交付时间"
    assert normalize_for_keyword("ＡＰＩ（v2）: a-b_c") == "apiv2abc"


def test_identifiers_in_chinese_text():
    text = "先用best_by_id把同一节点的分数取最小，再用 edge_hit_map 给边打分，e.g. 见 best_by_id。"
    assert identifiers_in(text) == ["best_by_id", "edge_hit_map"]


def test_identifiers_in_english_text():
    text = ("Use `click.echo()` instead of print(s), and pass the `Context` object. "
            "Context.invoke(other) calls a command; HTTPServer and MemoryGraph are classes. "
            "API and Context alone, i.e. plain words, are not identifiers.")
    assert identifiers_in(text) == [
        "click.echo", "Context", "Context.invoke", "HTTPServer", "MemoryGraph",
    ]


def test_identifiers_in_calls_and_empty():
    assert identifiers_in("call get_current_context() or main()") == ["get_current_context", "main"]
    assert identifiers_in("") == []
    assert identifiers_in("纯中文没有标识符") == []


@pytest.mark.parametrize("text,expected", [
    ("#8", True), (" acme/shop#12 ", True), ("PROJ-12", True), ("MY_PROJ-12", True), ("click.prompt", True),
    ("# 8", False), ("issue #8", False), ("prompt", False), ("proj-12", False), ("#0", False),
    (f"#{2**63}", False),
])
def test_an_issue_key_is_a_whole_query_name(text, expected):
    assert is_identifier_query(text) is expected
