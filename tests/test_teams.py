"""Teams that share one deployment: a key of MTRAG_API_KEYS_FILE reads only its team's sources
(serving/api_keys.py, reader.ScopedReader), over a real published home of two teams' sources
served by the real HTTP server. Team B's identifier, phrase and call path exist only in B's
sources; team A's key gets nothing of them in any mode, and its own queries still answer, with
the scope asked of the stores (a B hit that outranks A's leaves A with A's hit at k=1)."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.core.errors import ConfigError
from mtrag_resources.serving.api_keys import EVERY_SOURCE, ApiKeys, Principal, load_team_keys
from mtrag_resources.serving.http import UnsafeBind, make_server
from mtrag_resources.serving.reader import IndexReader
from tests.http_helpers import running_server

# A's ids sort after B's: the exact channel orders equal aliases by source id, so B's come first
A_SOURCES = {"zeta-code", "zeta-docs"}
B_SOURCES = {"bravo-code", "bravo-docs"}
B_COPIES = 30  # more B chunks than any channel recalls for k=1 (max(3k, 20)): a filter after recall leaves A nothing
ADMIN_KEY, A_KEY, B_KEY, C_KEY = "admin-key-0", "alpha-team-key", "bravo-team-key", "charlie-team-key"
B_IDENTIFIER = "bravo.secret.zanzibar_ledger_sync"
B_PHRASE = "zanzibar quokka ledger reconciliation"
B_PATH_FROM = "bravo.ledger_00.reconcile"
MODES = ("hybrid", "dense", "lexical", "exact", "bundles")

ALPHA_BILLING = '''\
"""Billing of orders."""


def round_cents(value: float) -> float:
    """Round an amount to cents."""
    return round(value, 2)


def compute_invoice(amount: float) -> float:
    """Compute the invoice total for an order."""
    return round_cents(amount)


def reconcile(entries: list) -> float:
    """Reconcile the ledger entries of an invoice."""
    return compute_invoice(sum(entries))
'''

BRAVO_LEDGER = '''\
"""Zanzibar quokka ledger, part {n}."""


def reconcile(entries: list) -> int:
    """Reconcile the zanzibar quokka ledger entries: ledger reconciliation step {n}."""
    return quokka_checksum(entries)


def quokka_checksum(entries: list) -> int:
    """Checksum of the zanzibar quokka ledger reconciliation, part {n}."""
    return sum(entries) % 97
'''

BRAVO_SECRET = '''\
"""Nightly jobs of the quokka ledger."""


def zanzibar_ledger_sync() -> int:
    """Sync the zanzibar quokka ledger reconciliation every night."""
    return 1


def quokka_vault_open() -> bool:
    """Open the quokka vault."""
    return True
'''


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def write_teams_corpus(root: Path) -> Path:
    alpha = root / "alpha" / "src" / "alpha"
    alpha.mkdir(parents=True)
    (alpha / "__init__.py").write_text('"""Alpha."""\n')
    (alpha / "billing.py").write_text(ALPHA_BILLING)
    alpha_docs = root / "zeta-docs"
    alpha_docs.mkdir()
    (alpha_docs / "guide.md").write_text("# Alpha billing\n\nUse :func:`alpha.billing.compute_invoice` to "
                                         "compute an invoice total.\n")
    # A's own notes name one of B's functions: the links may join them, A's key must not see B's end
    (alpha_docs / "vault.md").write_text("# Vault notes\n\nThe vault opens with quokka_vault_open, and the "
                                         "totals use round_cents.\n")
    bravo = root / "bravo" / "src" / "bravo"
    bravo.mkdir(parents=True)
    (bravo / "__init__.py").write_text('"""Bravo."""\n')
    (bravo / "secret.py").write_text(BRAVO_SECRET)
    for n in range(B_COPIES):
        (bravo / f"ledger_{n:02d}.py").write_text(BRAVO_LEDGER.format(n=n))
    bravo_docs = root / "bravo-docs"
    bravo_docs.mkdir()
    (bravo_docs / "ledger.md").write_text(f"# Quokka ledger\n\nThe {B_PHRASE} runs nightly through "
                                          f":func:`{B_IDENTIFIER}`.\n")
    sources = root / "sources.yaml"
    sources.write_text(textwrap.dedent("""\
        sources:
          - {id: zeta-code, kind: code, path: alpha, include: ["src/**/*.py"]}
          - {id: zeta-docs, kind: docs, path: zeta-docs}
          - {id: bravo-code, kind: code, path: bravo, include: ["src/**/*.py"]}
          - {id: bravo-docs, kind: docs, path: bravo-docs}
        """))
    return sources


def write_keys_file(path: Path) -> Path:
    # zeta-future: a source of A's not published yet (its scope is what is published of its sources)
    path.write_text(textwrap.dedent(f"""\
        keys:
          - name: team-a
            key_sha256: {_sha(A_KEY)}
            sources: [zeta-code, zeta-docs, zeta-future]
          - name: team-b
            key_sha256: {_sha(B_KEY)}
            sources: [bravo-code, bravo-docs]
          - name: team-c
            key_sha256: "{_sha(C_KEY)}"
            sources: [charlie-code]
        """))
    return path


@pytest.fixture(scope="module")
def teams(tmp_path_factory, neo4j_uri):
    """A published home of team A's and team B's sources, a keys file, and a reader that logs its
    bridge proposals."""
    from tests.build_helpers import build
    from tests.conftest import use_fresh_home
    root = tmp_path_factory.mktemp("teams")
    sources = write_teams_corpus(root / "corpus")
    home = root / "home"
    with pytest.MonkeyPatch.context() as mp:
        use_fresh_home(mp, home, sources, neo4j_uri)
        build()
        reader = IndexReader(home=str(home), log_proposals=True)
        keys_file = write_keys_file(root / "keys.yaml")
        keys = ApiKeys(ADMIN_KEY, load_team_keys(keys_file))
        with running_server(reader, keys=keys) as server:
            yield {"home": home, "reader": reader, "url": f"http://127.0.0.1:{server.server_address[1]}",
                   "keys_file": keys_file, "sources": sources}
        reader.close()


def _call(url: str, key: str | None, body: dict | None = None) -> tuple[int, dict, str]:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            raw = resp.read().decode()
            return resp.status, json.loads(raw), raw
    except urllib.error.HTTPError as err:
        raw = err.read().decode()
        return err.code, json.loads(raw), raw


def _sources_in(answer: dict) -> set[str]:
    """Every source id an answer names: hits, bridge, bundles, path nodes, stale entries."""
    from mtrag_resources.serving.graph_queries import node_source as _node_source
    return ({h["source_id"] for h in answer["hits"]} | {b["source_id"] for b in answer["bridge"]}
            | {b["source_id"] for b in answer["bundles"]}
            | {_node_source(n) for p in answer["paths"] for n in p["nodes"]}
            | {s["source"] for s in answer["stale"]})


def _leaks(raw: str) -> list[str]:
    """B's source ids, files and symbols found anywhere in an answer's JSON text (A's own notes
    name quokka_vault_open: their text is A's, only a bridge to B's symbol would be a leak)."""
    return [word for word in (*B_SOURCES, "bravo/", "quokka_checksum", "bravo.secret", "ledger_0")
            if word in raw.replace(json.dumps(B_IDENTIFIER)[1:-1], "").replace(B_PATH_FROM, "")]


def _assert_only_a(raw: str, answer: dict, what) -> None:
    assert _sources_in(answer) <= A_SOURCES, (what, _sources_in(answer))
    assert _leaks(raw) == [], (what, _leaks(raw), raw[:2000])


@pytest.mark.integration
@pytest.mark.neo4j
def test_team_a_gets_nothing_of_team_b_in_any_mode(teams):
    url = teams["url"] + "/v1/query"
    for mode in MODES:
        for text in (B_IDENTIFIER, B_PHRASE, B_PATH_FROM):
            # the same request with the key that reads every source finds B's: the test can fail
            code, every, _ = _call(url, ADMIN_KEY, {"text": text, "mode": mode, "k": 10})
            # (mode exact looks up identifiers: a phrase finds nothing there for anyone)
            assert code == 200 and ({h["source_id"] for h in every["hits"]} & B_SOURCES
                                    or mode == "exact" and text == B_PHRASE), (mode, text, every["hits"])
            code, answer, raw = _call(url, A_KEY, {"text": text, "mode": mode, "k": 10})
            assert code == 200, (mode, text, answer)
            _assert_only_a(raw, answer, (mode, text))
            # and narrowed to A's own sources, the same
            code, answer, raw = _call(url, A_KEY, {"text": text, "mode": mode, "k": 10, "sources": ["zeta-code"]})
            assert code == 200 and _sources_in(answer) <= {"zeta-code"} and _leaks(raw) == [], (mode, text)
    # the admin's answer to B's call chain has B's paths; A's has none
    code, every, _ = _call(url, ADMIN_KEY, {"text": B_PATH_FROM, "k": 5})
    assert code == 200 and every["paths"], every
    # B's own key reads B
    code, answer, _ = _call(url, B_KEY, {"text": B_IDENTIFIER, "k": 5})
    assert code == 200 and answer["hits"][0]["symbol"] == B_IDENTIFIER and _sources_in(answer) <= B_SOURCES


@pytest.mark.integration
@pytest.mark.neo4j
def test_team_a_still_answers_its_own_queries(teams):
    url = teams["url"] + "/v1/query"
    code, answer, raw = _call(url, A_KEY, {"text": "alpha.billing.reconcile", "k": 5})
    assert code == 200 and answer["hits"][0]["symbol"] == "alpha.billing.reconcile" and answer["exact"]["matched"]
    chains = [[n["qualified_name"] for n in p["nodes"]] for p in answer["paths"]]
    assert ["alpha.billing.reconcile", "alpha.billing.compute_invoice", "alpha.billing.round_cents"] in chains
    _assert_only_a(raw, answer, "own identifier")
    code, answer, raw = _call(url, A_KEY, {"text": "compute an invoice total", "k": 5, "kind": "docs"})
    assert code == 200 and answer["hits"] and "alpha.billing.compute_invoice" in {b["symbol"] for b in answer["bridge"]}
    _assert_only_a(raw, answer, "own docs")
    # A's notes name B's quokka_vault_open: their bridge and the proposals they log keep to A's code
    log = Settings(home=teams["home"]).proposals_log
    before = log.read_text() if log.exists() else ""
    code, answer, raw = _call(url, A_KEY, {"text": "vault notes and totals", "k": 3, "kind": "docs"})
    assert code == 200 and answer["hits"][0]["file_path"] == "vault.md", answer["hits"]
    bridged = {b["symbol"] for b in answer["bridge"] if b["from_title"] == "Vault notes"}
    assert bridged == {"alpha.billing.round_cents"}, answer["bridge"]
    _assert_only_a(raw, answer, "A's notes naming B")
    logged = (log.read_text() if log.exists() else "")[len(before):]
    assert "round_cents" in logged and "bravo" not in logged and "quokka" not in logged, logged


@pytest.mark.integration
@pytest.mark.neo4j
def test_a_foreign_source_is_as_unknown_as_a_missing_one(teams):
    url = teams["url"] + "/v1/query"
    foreign = _call(url, A_KEY, {"text": "ledger", "sources": ["bravo-code"]})
    missing = _call(url, A_KEY, {"text": "ledger", "sources": ["no-such-source"]})
    for code, body, raw in (foreign, missing):
        assert code == 400 and body["error"]["code"] == "unknown_source" and body["error"]["field"] == "sources"
        assert "zeta-code" in raw and "bravo-docs" not in raw, raw  # lists only what A may read
    # the same words but the id the client sent: nothing tells a B source from no source
    assert foreign[1]["error"]["message"].replace("bravo-code", "X") == \
        missing[1]["error"]["message"].replace("no-such-source", "X")
    # the admin key may name it
    assert _call(url, ADMIN_KEY, {"text": "ledger", "sources": ["bravo-code"]})[0] == 200


@pytest.mark.integration
@pytest.mark.neo4j
def test_a_team_with_nothing_published_yet_finds_nothing(teams):
    for mode in MODES:
        code, answer, raw = _call(teams["url"] + "/v1/query", C_KEY, {"text": "reconcile the ledger", "mode": mode})
        assert code == 200 and answer["hits"] == answer["bridge"] == answer["paths"] == answer["bundles"] == []
        assert answer["empty_reason"] == "the sources this API key may read hold no source", answer
        assert "zeta" not in raw and _leaks(raw) == []
    code, status, _ = _call(teams["url"] + "/v1/status", C_KEY)
    assert code == 200 and status["sources"] == {} and status["generation"] is not None


@pytest.mark.integration
@pytest.mark.neo4j
def test_status_lists_only_the_keys_sources(teams):
    code, status, raw = _call(teams["url"] + "/v1/status", A_KEY)
    assert code == 200 and set(status["sources"]) == A_SOURCES and _leaks(raw) == [], raw
    code, status, _ = _call(teams["url"] + "/v1/status", ADMIN_KEY)
    assert code == 200 and set(status["sources"]) == A_SOURCES | B_SOURCES
    assert _call(teams["url"] + "/v1/status", None)[0] == 401
    assert _call(teams["url"] + "/v1/status", "wrong")[0] == 401


@pytest.mark.integration
@pytest.mark.neo4j
def test_paths_of_another_teams_symbol_are_no_such_symbol(teams):
    url = teams["url"] + "/v1/paths"
    code, every, _ = _call(url, ADMIN_KEY, {"from": B_PATH_FROM})
    assert code == 200 and every["paths"], every
    made_up = _call(url, A_KEY, {"from": "alpha.nowhere.nothing_here"})
    for body in ({"from": B_PATH_FROM}, {"from": "quokka_checksum", "direction": "in"},
                 {"from": "alpha.billing.reconcile", "to": "bravo.ledger_00.quokka_checksum"}):
        code, answer, raw = _call(url, A_KEY, body)
        for asked in body.values():  # the message names what was asked; nothing else of B
            raw = raw.replace(asked, "")
        assert code == 404 and answer["error"]["code"] == made_up[1]["error"]["code"] == "unknown_symbol", (body, raw)
        assert _leaks(raw) == [] and "zanzibar" not in raw, (body, raw)  # its nearest symbols are A's
    code, answer, raw = _call(url, A_KEY, {"from": "alpha.billing.reconcile"})
    assert code == 200 and answer["paths"] and _leaks(raw) == [], raw


@pytest.mark.integration
@pytest.mark.neo4j
def test_the_scope_is_asked_of_the_stores(teams):
    """k=1 where B's chunks outrank A's in every channel (B_COPIES of them, more than a channel
    recalls): A's key still gets A's hit, which a filter after recall could not give it."""
    url = teams["url"] + "/v1/query"
    for mode, text in (("lexical", "ledger reconciliation"), ("dense", "reconcile the zanzibar quokka ledger entries"),
                       ("exact", "reconcile"), ("hybrid", "reconcile the ledger entries"),
                       ("bundles", "reconcile the ledger entries")):
        code, every, _ = _call(url, ADMIN_KEY, {"text": text, "mode": mode, "k": 20})
        # one channel: its 20 best are all B's; fused modes: B's is the best
        top = every["hits"] if mode in ("lexical", "dense", "exact") else every["hits"][:1]
        assert code == 200 and every["hits"] and {h["source_id"] for h in top} <= B_SOURCES, (mode, every["hits"])
        code, answer, raw = _call(url, A_KEY, {"text": text, "mode": mode, "k": 1})
        assert code == 200 and [h["source_id"] for h in answer["hits"]] == ["zeta-code"], (mode, answer["hits"])
        _assert_only_a(raw, answer, (mode, text))
    # a path from a name both teams define, limit 1: B's 30 anchors take none of it
    code, answer, raw = _call(teams["url"] + "/v1/paths", A_KEY, {"from": "reconcile", "limit": 1})
    assert code == 200 and len(answer["paths"]) == 1 and _leaks(raw) == [], raw
    assert answer["paths"][0]["nodes"][0]["qualified_name"] == "alpha.billing.reconcile"


@pytest.mark.integration
@pytest.mark.neo4j
def test_mcp_bound_to_a_team_answers_as_its_key(teams, monkeypatch):
    from mtrag_resources.serving import mcp
    monkeypatch.setenv("MTRAG_API_KEYS_FILE", str(teams["keys_file"]))
    monkeypatch.setenv("MTRAG_MCP_KEY_NAME", "team-a")
    scoped = mcp.team_reader(teams["reader"])
    result = mcp.call_tool(scoped, "search", {"query": B_PHRASE, "k": 10})
    assert not result.is_error and _sources_in(result.structured_content) <= A_SOURCES
    assert _leaks(result.content[0].text) == []
    assert set(mcp.call_tool(scoped, "status", {}).structured_content["sources"]) == A_SOURCES
    refused = mcp.call_tool(scoped, "paths", {"from": B_PATH_FROM})
    assert refused.is_error and "no such symbol" in refused.content[0].text and _leaks(refused.content[0].text) == []
    monkeypatch.setenv("MTRAG_MCP_KEY_NAME", "team-d")
    with pytest.raises(ConfigError, match="MTRAG_MCP_KEY_NAME 'team-d'.*team-a"):
        mcp.team_reader(teams["reader"])
    monkeypatch.delenv("MTRAG_MCP_KEY_NAME")
    assert mcp.team_reader(teams["reader"]) is teams["reader"]


@pytest.mark.integration
@pytest.mark.neo4j
def test_mtrag_serve_reads_the_keys_file(teams, tmp_path):
    """The real `mtrag serve`: MTRAG_API_KEYS_FILE alone lets it bind beyond loopback, and a team
    key is scoped; a bad keys file is one line and exit 2, before the port is bound."""
    env = {**os.environ, "MTRAG_HOME": str(teams["home"]), "MTRAG_SOURCES": str(teams["sources"]),
           "MTRAG_API_KEYS_FILE": str(teams["keys_file"])}
    env.pop("MTRAG_API_KEY", None)
    mtrag = [str(Path(sys.executable).with_name("mtrag"))]
    proc = subprocess.Popen([*mtrag, "serve", "--host", "0.0.0.0", "--port", "0"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = proc.stdout.readline()
        assert "team keys: team-a, team-b" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        port = int(line.split("http://0.0.0.0:", 1)[1].split(" ", 1)[0])
        code, status, raw = _call(f"http://127.0.0.1:{port}/v1/status", A_KEY)
        assert code == 200 and set(status["sources"]) == A_SOURCES and _leaks(raw) == []
        assert _call(f"http://127.0.0.1:{port}/v1/status", ADMIN_KEY)[0] == 401  # no MTRAG_API_KEY here
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    bad = tmp_path / "keys.yaml"
    bad.write_text(f"keys:\n  - name: team-a\n    key_sha256: {A_KEY}\n    sources: [zeta-code]\n")
    done = subprocess.run([*mtrag, "serve", "--port", "0"], env={**env, "MTRAG_API_KEYS_FILE": str(bad)},
                          text=True, capture_output=True, timeout=120)
    assert done.returncode == 2 and "keys[0].key_sha256" in done.stderr and A_KEY not in done.stderr, done.stderr


# ------------------------------------------------------------------ the keys file (no home)


@pytest.mark.unit
def test_keys_authenticate_by_hash(tmp_path):
    keys = ApiKeys(ADMIN_KEY, load_team_keys(write_keys_file(tmp_path / "keys.yaml")))
    assert keys.authenticate(A_KEY) == Principal("team-a", frozenset({"zeta-code", "zeta-docs", "zeta-future"}))
    assert keys.authenticate(ADMIN_KEY) is EVERY_SOURCE
    for wrong in (None, "", "alpha-team-ke", A_KEY + " ", _sha(A_KEY)):
        assert keys.authenticate(wrong) is None, wrong
    assert ApiKeys().authenticate(None) is EVERY_SOURCE and not ApiKeys().required
    assert ApiKeys(None, load_team_keys(tmp_path / "keys.yaml")).required


@pytest.mark.unit
@pytest.mark.parametrize("text, names", [
    ("keys: []\nextra: 1\n", "one field, `keys`"),
    ("- a\n", "one field, `keys`"),
    ("keys: [{name: a, key_sha256: " + "a" * 64 + "}]\n", "keys[0] must have exactly the fields"),
    ("keys: [{name: a, key_sha256: s3cret, sources: [x]}]\n", "keys[0].key_sha256 must be the 64 hex"),
    ("keys: [{name: '', key_sha256: " + "a" * 64 + ", sources: [x]}]\n", "keys[0].name"),
    ("keys: [{name: a, key_sha256: " + "a" * 64 + ", sources: []}]\n", "keys[0].sources"),
    ("keys: [{name: a, key_sha256: " + "a" * 64 + ", sources: x}]\n", "keys[0].sources"),
    ("keys: [{name: a, key_sha256: " + "a" * 64 + ", sources: [x]}, {name: a, key_sha256: " + "b" * 64
     + ", sources: [y]}]\n", "keys[1].name 'a' is given twice"),
    ("keys: [{name: a, key_sha256: " + "a" * 64 + ", sources: [x]}, {name: b, key_sha256: " + "a" * 64
     + ", sources: [y]}]\n", "keys[1].key_sha256 is 'a'"),
    ("keys: [unclosed\n", "not YAML"),
    ("keys: [{name: a, key_sha256: " + "1" * 64 + ", sources: [x]}]\n", "in quotes"),  # YAML reads an int
])
def test_a_bad_keys_file_is_refused_naming_the_entry(tmp_path, text, names):
    path = tmp_path / "keys.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"MTRAG_API_KEYS_FILE {path}") as err:
        load_team_keys(path)
    assert names in str(err.value)
    with pytest.raises(ConfigError, match="cannot read"):
        load_team_keys(tmp_path / "missing.yaml")


@pytest.mark.unit
def test_team_keys_alone_allow_a_bind_beyond_loopback(tmp_path):
    keys = ApiKeys(None, load_team_keys(write_keys_file(tmp_path / "keys.yaml")))
    with pytest.raises(UnsafeBind, match="MTRAG_API_KEYS_FILE"):
        make_server(object(), "0.0.0.0", 0)
    server = make_server(object(), "0.0.0.0", 0, keys=keys)
    server.server_close()
    with pytest.raises(ConfigError, match="MTRAG_API_KEY's"):
        ApiKeys(A_KEY, load_team_keys(tmp_path / "keys.yaml"))
