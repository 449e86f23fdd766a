"""Query translation, Chinese -> English (serving/translation.py): the dictionary and jieba that
ship in wheels, no store."""
import pytest

from mtrag_resources.serving.translation import QueryTranslator, clean_sense, has_cjk, parse_cedict_line

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def translator():
    t = QueryTranslator()
    t.load()
    return t


def test_cedict_line_and_senses():
    trad, simp, proper, senses = parse_cedict_line("密碼 密码 [mi4 ma3] /secret code/ciphertext/password/PIN/")
    assert (trad, simp, proper) == ("密碼", "密码", False)
    assert senses == ["secret code", "ciphertext", "password", "PIN"]
    assert parse_cedict_line("# CC-CEDICT") is None
    assert parse_cedict_line("組 组 [Zu3] /surname Zu/")[2] is True
    assert clean_sense("to point out") == "point out"
    assert clean_sense("CL:個|个[ge4]") == ""
    assert clean_sense("surname Zu") == ""
    assert clean_sense("to remind (sb of sth)") == "remind"
    assert clean_sense("a very long explanation of what this word means") == ""


def test_question_words_and_glossary_terms(translator):
    tr = translator.translate("如何提示用户输入密码")
    words = tr.english.split()
    assert words[0] == "how"
    assert {"prompt", "user", "input", "password"} <= set(words)
    assert translator.translate("如何显示进度条").english.endswith("progress bar")
    assert "command group" in translator.translate("怎样定义一个命令组").english


def test_english_words_kept_exact(translator):
    tr = translator.translate("API 流式返回那个任务有哪些约束")
    assert tr.english.split()[0] == "API"
    assert "return" in tr.english.split()
    assert translator.translate("怎么给 click.Group 加子命令").english.split()[1] == "click.Group"


def test_no_chinese_no_translation(translator):
    assert not has_cjk("how do I prompt for a password")
    assert translator.translate("how do I prompt for a password").english == ""


def test_unknown_word_falls_back_to_known_pieces(translator):
    # not one dictionary word, but made of known ones
    english = translator.word("密码输入框")
    assert "password" in english.split() and "input" in english.split()
    assert translator.word("的") == ""


def test_a_question_searches_the_chinese_index_by_its_content_words(translator):
    # words, not the question's bigrams across word boundaries (示用, 户输); question words dropped
    assert translator.translate("如何提示用户输入密码").segmented == "提示 用户 输入 密码"
    assert translator.translate("API 流式返回那个任务有哪些约束").segmented == "API 流式 返回 任务 约束"
    assert translator.translate("how do I prompt").segmented == ""


def test_the_multilingual_channel_embeds_a_long_query_s_first_words():
    from mtrag_resources.serving.query_embedding import ML_QUERY_CJK_CHARS, ML_QUERY_WORDS, multilingual_query_text
    long_en = " ".join(f"w{i}" for i in range(100))
    assert multilingual_query_text(long_en).split() == long_en.split()[:ML_QUERY_WORDS]
    assert multilingual_query_text("how do I prompt for a password") == "how do I prompt for a password"
    long_zh = "如何提示用户输入密码" * 30
    assert multilingual_query_text(long_zh) == long_zh[:ML_QUERY_CJK_CHARS]
