"""Hostile text (issue #58): issue exports whose numbers no store can hold (past 64 bits, past
int()'s 4,300 digits) or whose text no encoder takes (a lone surrogate), two issues with one
number, and file names and text that a terminal would obey.

The unit tests read each export through ingest/issues.py and render answers with
serving/render.py; the integration test builds the exports that crashed the whole build, and
folders that are gone, beside a good source through `mtrag build` (Dagster runs, Qdrant, SQLite
FTS, Neo4j): each fails alone in one line, the good source's change is published, and no store
holds a row of a failed source."""
from __future__ import annotations

import json

import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.ingest.issues import MAX_ISSUE_NUMBER, check_export, chunk_issue_export, parse_export
from mtrag_resources.serving.render import render_paths, render_query


REPO = "acme/shopcart"
WHOLE_NUMBER = f"\"number\" must be a whole number from 1 to {MAX_ISSUE_NUMBER}"


def _export(*issues: dict, comments: list | None = None) -> str:
    return json.dumps({"repository": REPO, "issues": list(issues), **({"comments": comments} if comments else {})})


def _issue(number, title: str = "a title", **fields) -> dict:
    return {"number": number, "title": title, "state": "open", "body": "The body.", **fields}


def _with_raw_number(digits: str) -> bytes:
    """An export whose second issue's number is `digits`, written as a JSON number (json.dumps of
    an int past 4,300 digits raises)."""
    return _export(_issue(1), _issue(999_999)).replace("999999", digits).encode()


# ------------------------------------------------------------------------ issue exports (unit)

@pytest.mark.unit
@pytest.mark.parametrize("data, shown", [
    (_with_raw_number(str(2**64 + 1)), "got 18446744073709551617"),      # past 64 bits: Neo4j's OverflowError
    (_with_raw_number(str(2**63)), "got 9223372036854775808"),           # one past a signed 64-bit integer
    (_with_raw_number("1" + "0" * 5000), "got a number of 5001 digits"),  # past int()'s 4,300 digits
    (_with_raw_number("0"), "got 0"),
    (_with_raw_number("-3"), "got -3"),
    (_export(_issue(1), _issue("1" + "0" * 5000)).encode(), "got '1000000000"),  # a string of digits
])
def test_an_issue_number_no_store_can_hold_is_the_export_check_naming_its_place(data, shown):
    why = check_export(data)
    assert why is not None and f"issues[1]: {WHOLE_NUMBER}" in why and shown in why, why
    assert "\n" not in why and len(why) < 300


@pytest.mark.unit
def test_a_comment_naming_an_impossible_issue_number_is_refused_not_converted():
    huge = "1" + "0" * 5000
    for comment in ({"issue_url": f"https://api.github.com/repos/{REPO}/issues/{huge}", "body": "x"},
                    {"issue_number": huge, "body": "x"}):
        why = check_export(_export(_issue(1), comments=[comment]))
        assert why is not None and "comments[0]" in why and "a number of 5001 digits is no issue number" in why
    assert check_export(_export(_issue(MAX_ISSUE_NUMBER), comments=[{"issue_number": MAX_ISSUE_NUMBER,
                                                                      "body": "the largest number is fine"}])) is None


@pytest.mark.unit
def test_a_lone_surrogate_in_an_export_becomes_a_replacement_character():
    text = _export(_issue(1, "Crash \ud800 here", body="before \udc00 after, an emoji \ud83d\ude00 stays"),
                   comments=[{"issue_number": 1, "body": "lone \udbff", "user": {"login": "x\ud800"}}])
    assert "\\ud800" in text  # json.dumps wrote the escapes a tracker's export holds
    assert check_export(text.encode()) is None
    issue = parse_export(text.encode()).issues[0]
    assert issue.title == "Crash \ufffd here" and issue.body == "before \ufffd after, an emoji \U0001F600 stays"
    assert issue.comments[0].body == "lone \ufffd" and issue.comments[0].author == "x\ufffd"
    parsed = chunk_issue_export("tracker", "tracker.json", text)
    for chunk in parsed.chunks:  # what the chunk table, FTS and Qdrant encode
        (chunk.text + chunk.title + chunk.summary).encode("utf-8")
    for node in parsed.nodes:
        node.properties.encode("utf-8")


@pytest.mark.unit
def test_two_issues_with_one_number_are_refused_naming_both_places():
    why = check_export(_export(_issue(7, "first"), _issue(3), _issue(7, "second")))
    assert why is not None and "issues[0] and issues[2] are both acme/shopcart#7" in why and "\n" not in why
    why = check_export(_export(_issue(7, "first", id=1), _issue(7, "second", id=2)))
    assert "issues[0] and issues[1] are both acme/shopcart#7: different ids" in why
    jira = json.dumps({"issues": [{"key": "P-1", "id": "10", "fields": {"summary": "a"}},
                                  {"key": "P-1", "id": "11", "fields": {"summary": "b"}}]})
    assert "issues[0] and issues[1] are both P-1" in check_export(jira)
    # one issue on two overlapping pages (the same id): the later update is kept, as before
    pages = _export(_issue(7, "old", id=1, updated_at="2025-01-01"), _issue(7, "new", id=1, updated_at="2025-02-01"))
    assert [i.title for i in parse_export(pages).issues] == ["new"]


# ------------------------------------------------------------------------ the terminal (unit)

HOSTILE = "\x1b[2J\x1b]0;owned\x07\u202eyp.live\u2066\x9b"


@pytest.mark.unit
def test_the_terminal_views_escape_control_and_bidi_characters_and_keep_snippet_lines():
    hit = {"rank": 1, "chunk_id": "c1", "source_id": "shop", "source_kind": "code",
           "file_path": f"src/{HOSTILE}.py", "start_line": 1, "end_line": 3, "symbol": f"mod.f{HOSTILE}",
           "title": "f", "text": f"def f():\r\n    return '{HOSTILE}'\n    # bell\x07\n",
           "channels": {"fts": {"rank": 1}}}
    bridge = {"from_chunk_id": "c1", "from_title": f"t{HOSTILE}", "relation": "MENTIONS", "confidence": "VERIFIED",
              "symbol": f"s{HOSTILE}", "file_path": f"p{HOSTILE}.py", "start_line": 2}
    out = render_query({"generation": 1, "query": f"q{HOSTILE}", "mode": "hybrid", "hits": [hit],
                        "bridge": [bridge]})
    escaped = "\\x1b[2J\\x1b]0;owned\\x07\\u202eyp.live\\u2066\\x9b"
    lines = out.splitlines()
    assert lines[1] == f"   1. mod.f{escaped}  [shop:src/{escaped}.py:1-3]  (fts#1)"
    assert lines[2:5] == ["      def f():", f"          return '{escaped}'", "          # bell\\x07"]
    assert lines[5] == f"  bridge: t{escaped} -MENTIONS/VERIFIED-> s{escaped} (p{escaped}.py:2)"
    paths = render_paths({"generation": 1, "from": "a", "to": None, "paths": [{
        "nodes": [{"qualified_name": f"a{HOSTILE}", "name": "a"}, {"qualified_name": "", "name": f"b{HOSTILE}"}],
        "edges": [{"type": "CALLS", "evidence": {"file": f"f{HOSTILE}.py", "start_line": 4}}]}]})
    assert paths.splitlines()[1] == f"  a{escaped} -[CALLS f{escaped}.py:4]-> b{escaped}"
    for text in (out, paths):
        assert not any(c in text for c in "\x1b\x07\x9b\u202e\u2066\r")


# ------------------------------------------------------------------------ integration

SHOP_TAX = '''\
"""Tax rules."""


def compute_tax(amount: float) -> float:
    """The tax on an amount."""
    return round(amount * 0.2, 2)
'''
SHOP_REFUND = '''\


def refund_tax_on_returns(amount: float) -> float:
    """The tax given back when goods are returned."""
    return -compute_tax(amount)
'''


@pytest.mark.integration
@pytest.mark.neo4j
def test_crashing_exports_and_missing_folders_fail_alone_and_the_good_change_is_published(
        tmp_path, monkeypatch, neo4j_uri, capsys):
    from mtrag_assets.app.cli import main
    from mtrag_resources.publish.manifest import load_current
    from mtrag_resources.serving.reader import IndexReader
    from mtrag_resources.stores.connect import open_fts, open_neo4j, open_qdrant
    from tests.conftest import use_fresh_home

    pkg = tmp_path / "shop" / "shopcart"
    pkg.mkdir(parents=True)
    (pkg / "tax.py").write_text(SHOP_TAX)
    sources = tmp_path / "sources.yaml"
    good = "sources:\n  - {id: shop, kind: code, path: shop}\n"
    sources.write_text(good)
    use_fresh_home(monkeypatch, tmp_path / "home", sources, neo4j_uri)
    assert main(["build"]) == 0
    capsys.readouterr()

    # the good source changes; beside it, exports that crashed the whole build and folders that are gone
    (pkg / "tax.py").write_text(SHOP_TAX + SHOP_REFUND)
    (tmp_path / "overflow.json").write_bytes(_with_raw_number(str(2**64 + 1)))
    (tmp_path / "digits.json").write_bytes(_with_raw_number("9" * 5000))
    (tmp_path / "dupes.json").write_text(_export(_issue(7, "first"), _issue(7, "second")))
    (tmp_path / "surrogate.json").write_text(_export(_issue(12, "Refund \ud800 crashes", body="text \udc00 more")))
    failing = {"overflow": "overflow.json", "digits": "digits.json", "dupes": "dupes.json",
               "gone": "not/here", "afile": "sources.yaml"}
    sources.write_text(good + "".join(
        f"  - {{id: {sid}, kind: {'issues' if path.endswith('.json') else 'code'}, path: {path}}}\n"
        for sid, path in failing.items()) + "  - {id: surrogate, kind: issues, path: surrogate.json}\n")
    assert main(["build"]) == 1
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err, err
    for sid, path in failing.items():
        lines = [line for line in err.splitlines() if f"source id='{sid}'" in line]
        assert len(lines) == 1 and lines[0].startswith(f"mtrag: {sources}: source id='{sid}': path '{path}': "), (sid, err)
        assert lines[0].endswith("; not built (the other sources are)"), lines[0]
    assert f"{WHOLE_NUMBER}, got 18446744073709551617" in err and "got a number of 5000 digits" in err
    assert "issues[0] and issues[1] are both acme/shopcart#7" in err and "does not exist or is not a directory" in err

    settings = Settings.from_env()
    manifest = load_current(settings.manifest_dir)
    assert set(manifest["sources"]) == {"shop", "surrogate"}
    reader = IndexReader(home=str(tmp_path / "home"), log_proposals=False)
    try:  # the good source's change is served
        top = reader.query("refund_tax_on_returns", k=3, mode="exact").to_dict()["hits"][0]
        assert top["symbol"] == "shopcart.tax.refund_tax_on_returns"
        issue = reader.query("#12", k=3, mode="exact").to_dict()["hits"][0]
        assert issue["title"] == "#12 Refund \ufffd crashes"
    finally:
        reader.close()
    fts, neo = open_fts(settings), open_neo4j(settings)
    try:  # no store holds a row of a source that failed (the overflow once left FTS and Qdrant rows)
        with open_qdrant(settings) as q:
            assert all(q.count(kind, sid) == 0 for sid in failing for kind in ("code", "issues"))
        assert all(fts.counts(sid)["child_rows"] == 0 for sid in failing)
        assert all(neo.counts(sid)["total_nodes"] == 0 for sid in failing)
        assert neo.counts("surrogate")["nodes"]["Issue"] == 1
    finally:
        fts.close()
        neo.close()
