"""`mtrag serve`'s query log (serving/query_log.py): one line per answered question, no hit text,
bounded by size with one older file kept; read back as a query set for `mtrag compare`, the
latest of each distinct question; a bad size or line is one error naming it."""
from __future__ import annotations

import json

import pytest

from mtrag_resources.core.errors import ConfigError
from mtrag_resources.serving.query_log import QueryLog, logged_queries

pytestmark = pytest.mark.unit
ANSWER = {"generation": 3, "hits": [{"chunk_id": "c1", "text": "SECRET BODY"}], "confidence": "normal"}


def test_a_line_per_question_without_hit_texts_and_bounded_by_size(tmp_path):
    log = QueryLog(tmp_path / "q.jsonl", max_bytes=600)
    for n in range(8):
        log.record({"text": f"question {n}", "mode": "hybrid", "kind": None, "k": 5, "sources": None}, ANSWER, 12.5, "team-a")
    current, older = log.path.read_text().splitlines(), (tmp_path / "q.jsonl.1").read_text().splitlines()
    assert log.path.stat().st_size <= 600 and (tmp_path / "q.jsonl.1").stat().st_size <= 600
    entries = [json.loads(line) for line in older + current]
    assert [e["query"] for e in entries] == [f"question {n}" for n in range(8 - len(entries), 8)]
    assert entries[-1] | {"ts": 0} == {"ts": 0, "query": "question 7", "mode": "hybrid", "kind": None, "k": 5,
                                      "sources": None, "generation": 3, "hits": 1, "confidence": "normal",
                                      "ms": 12.5, "team": "team-a"}
    assert "SECRET BODY" not in log.path.read_text() + (tmp_path / "q.jsonl.1").read_text()


def test_the_log_read_back_keeps_the_latest_of_each_question(tmp_path):
    log = QueryLog(tmp_path / "q.jsonl", max_bytes=10**6)
    for text, mode in (("a", "hybrid"), ("b", "lexical"), ("a", "hybrid"), ("a", "dense")):
        log.record({"text": text, "mode": mode, "k": 10}, ANSWER, 1.0)
    queries = logged_queries(log.path).queries
    assert [(q.query, q.mode, q.expect) for q in queries] == [("b", "lexical", ()), ("a", "hybrid", ()), ("a", "dense", ())]
    assert logged_queries(log.path, limit=1).queries[0].query == "a"


def test_a_bad_line_or_size_is_named(tmp_path, monkeypatch):
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"query": "ok"}\nnot json\n')
    with pytest.raises(ConfigError, match=r"q\.jsonl:2: not a query log line"):
        logged_queries(bad)
    monkeypatch.setenv("MTRAG_QUERY_LOG", str(tmp_path / "log.jsonl"))
    monkeypatch.setenv("MTRAG_QUERY_LOG_MAX_MB", "lots")
    with pytest.raises(ConfigError, match="MTRAG_QUERY_LOG_MAX_MB='lots'"):
        QueryLog.from_env()
    monkeypatch.delenv("MTRAG_QUERY_LOG")
    assert QueryLog.from_env() is None
