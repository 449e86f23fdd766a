"""Bad inputs, made here: hostile files in the sources, broken `sources.yaml`, injection through the
reader and HTTP, and the HTTP server's limits (body size, stalled clients, loopback, API key).

tests/test_build_e2e.py::test_bad_inputs... covers a NUL in the first bytes, a 2.4 MB file,
latin-1, a syntax error, an escaping symlink and a directory loop; this module adds the rest.
The module publishes one generation of a hostile corpus by running the stage functions directly
(the same code the Dagster assets call), which is cheaper than a Dagster run and enough here."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from mtrag_assets.app.cli import build_parser, main
from mtrag_resources.core.config import Settings
from mtrag_resources.publish.manifest import load_current
from mtrag_resources.core.layout import current_path
from mtrag_resources.serving.http import MAX_BODY_BYTES, UnsafeBind, make_server
from mtrag_resources.serving.reader import IndexReader, QueryError
from mtrag_resources.ingest.sources import load_sources
from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.stores.connect import open_fts, open_neo4j
from mtrag_resources.stores.tables import read_rows
from tests.conftest import use_fresh_home
from tests.corpus import write_corpus
from tests.http_helpers import running_server

REPO = Path(__file__).resolve().parents[1]
SOCKET_TIMEOUT = 3.0  # the HTTP tests' server drops a stalled client after this

INJECT_MD = """\
# Robert'); DROP TABLE chunks;--

Text about the bobby tables heading.

## }) MATCH (n) DETACH DELETE n //

A heading written as Cypher.

## "NEAR(tax rate)" OR title:* AND {symbol text}: ^x -y

A heading written as FTS5 syntax.

## `backticked` name with ``double`` ticks

The end.
"""
HOSTILE_HEADINGS = ["Robert'); DROP TABLE chunks;--", "}) MATCH (n) DETACH DELETE n //",
                    '"NEAR(tax rate)" OR title:* AND {symbol text}: ^x -y']


def write_hostile(root: Path) -> dict:
    paths = write_corpus(root)
    pkg, docs = paths["pkg"], paths["docs"]
    (pkg / "logo.py").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    (pkg / "late_nul.py").write_bytes(b"x = 1\n" * 1500 + b"y = '\x00'\n")      # NUL after the 8 KiB sniff
    (pkg / "huge.py").write_bytes(b"z = 2\n" * 200_000)                         # 1.2 MB > max_file_bytes
    (pkg / "lines100k.py").write_text("x = 1\n" * 100_000)                       # 600 KB, 100,000 lines
    (pkg / "deep.py").write_text("x = " + "(" * 300 + "1" + ")" * 300 + "\n")   # deeper than the parser allows
    (pkg / "nested.py").write_text("def f():\n" + "".join("    " * i + "if x:\n" for i in range(1, 90))
                                   + "    " * 90 + "pass\n")
    (pkg / "broken.js").write_text("const a = " + "[" * 2000 + "]" * 2000 + ";\nfunction g( {\n  return 1;\n")
    (pkg / "empty.py").write_text("")
    for i in range(12):
        d = pkg / f"copy{i}"
        d.mkdir()
        (d / "same.py").write_text('def same():\n    """One content at many paths."""\n    return 42\n')
    (pkg / "a_loop.py").symlink_to(pkg / "b_loop.py")
    (pkg / "b_loop.py").symlink_to(pkg / "a_loop.py")
    (pkg / "dangling.py").symlink_to(pkg / "nowhere.py")
    (pkg / "passwd.py").symlink_to("/etc/passwd")
    (pkg / "etc").symlink_to("/etc", target_is_directory=True)
    os.mkfifo(pkg / "pipe.py")                                                   # opening it would block
    (docs / "inject.md").write_text(INJECT_MD)
    (docs / "helpers.md").write_text("# Helpers\n\nThe helper lookup_rate returns the rate of a region code.\n")
    (docs / "latin.md").write_bytes("# Caf\xe9 notes\n\nInvalid \xff bytes in prose.\n".encode("latin-1"))
    (docs / "empty.md").write_text("")
    (docs / "nul.md").write_bytes(b"# Nul\n\ntext\x00more\n")
    paths["sources"].write_text(textwrap.dedent("""\
        sources:
          - {id: shop, kind: code, path: shop, include: ["src/**"], max_file_bytes: 1000000}
          - {id: shop-docs, kind: docs, path: shop-docs}
        """))
    return paths


def publish_with_stages(settings: Settings) -> dict:
    """Every stage of every source, the links and the manifest; returns each source's chunk warnings."""
    from mtrag_assets.resources import MtragResource
    from mtrag_resources.stages.canonical_graph import build_canonical_graph
    from mtrag_resources.stages.cas_chunks import build_cas_chunks
    from mtrag_resources.stages.cross_source_links import build_cross_source_links
    from mtrag_resources.stages.embedding_cache import build_embedding_cache
    from mtrag_resources.stages.fts_db import build_fts_db
    from mtrag_resources.stages.index_manifest import build_index_manifest
    from mtrag_resources.stages.neo4j_graph import build_neo4j_graph
    from mtrag_resources.stages.qdrant_collection import build_qdrant_collection
    from mtrag_resources.stages.raw_source import build_raw_source
    embedder = MtragResource().embedder()
    specs = load_sources(settings.sources_file)
    warnings = {}
    for spec in specs:
        build_raw_source(settings, spec)
        warnings[spec.id] = build_cas_chunks(settings, spec).metadata["warnings"]
        build_canonical_graph(settings, spec)
        build_embedding_cache(settings, spec, embedder)
        build_qdrant_collection(settings, spec, embedder)
        build_fts_db(settings, spec)
        build_neo4j_graph(settings, spec)
    build_cross_source_links(settings, specs)
    build_index_manifest(settings, specs, embedder)
    return warnings


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, neo4j_uri):
    root = tmp_path_factory.mktemp("hostile")
    paths = write_hostile(root / "corpus")
    paths["home"] = root / "home"
    with pytest.MonkeyPatch.context() as mp:
        use_fresh_home(mp, paths["home"], paths["sources"], neo4j_uri)
        settings = Settings.from_env().ensure()
        paths["warnings"] = publish_with_stages(settings)
        paths["settings"] = settings
        reader = IndexReader(home=str(paths["home"]), log_proposals=False)
        paths["reader"] = reader
        try:
            yield paths
        finally:
            reader.close()


def _inventory(settings: Settings, source_id: str) -> dict:
    doc = json.loads(SourceLayout(settings, source_id).inventory.read_text())
    return {f["path"]: f for f in doc["files"]}


# ------------------------------------------------------------------------------ hostile files

@pytest.mark.integration
@pytest.mark.neo4j
def test_every_bad_file_is_skipped_or_warned_by_name_and_rule(hostile):
    s = hostile["settings"]
    inv = _inventory(s, "shop")
    p = "src/shopcart/"

    def skipped(name: str, rule: str) -> None:
        entry = inv[p + name]
        assert entry["status"] == "skipped" and rule in entry["reason"], entry

    skipped("logo.py", "binary file")
    skipped("huge.py", "larger than max_file_bytes (1200000 > 1000000)")
    skipped("a_loop.py", "broken or looping symlink")
    skipped("b_loop.py", "broken or looping symlink")
    skipped("dangling.py", "broken or looping symlink")
    skipped("passwd.py", "symlink leaves the source root (-> /etc/passwd)")
    skipped("etc", "symlinked directory not followed")
    skipped("pipe.py", "not a regular file")
    assert inv[p + "lines100k.py"]["status"] == inv[p + "empty.py"]["status"] == "ok"
    docs = _inventory(s, "shop-docs")
    assert "invalid UTF-8 at byte 5" in docs["latin.md"]["reason"] and docs["latin.md"]["status"] == "ok"
    assert docs["nul.md"]["status"] == "skipped" and "binary file" in docs["nul.md"]["reason"]

    text = "\n".join(hostile["warnings"]["shop"])
    assert f"{p}late_nul.py: SyntaxError" in text and "null bytes" in text
    assert f"{p}deep.py: SyntaxError" in text and "too many nested parentheses" in text
    assert f"{p}lines100k.py: module-level code (600000 chars, lines 1-100000) is over 12000 chars" in text
    assert f"{p}broken.js: tree-sitter syntax errors from line" in text and "fell back to line windows" in text
    rows = read_rows(SourceLayout(s, "shop").chunks)
    by_file: dict[str, list] = {}
    for r in rows:
        by_file.setdefault(r["file_path"], []).append(r)
    assert {r["chunk_type"] for r in by_file[p + "late_nul.py"]} == {"file", "window"}
    assert all(1 <= r["start_line"] <= r["end_line"] <= 100_000 for r in by_file[p + "lines100k.py"])
    assert p + "empty.py" not in by_file and not any(n in f for f in by_file for n in
                                                     ("logo", "huge", "loop", "dangling", "passwd", "pipe"))
    # nested ifs parse (Python's limit is on parentheses): one function chunk for f
    assert [r["symbol"] for r in by_file[p + "nested.py"] if r["role"] == "child"] == ["shopcart.nested.f"]


@pytest.mark.integration
@pytest.mark.neo4j
def test_one_content_at_many_paths_keeps_every_path(hostile):
    s = hostile["settings"]
    rows = [r for r in read_rows(SourceLayout(s, "shop").chunks) if r["file_path"].endswith("/same.py")]
    funcs = [r for r in rows if r["chunk_type"] == "function"]
    assert len(funcs) == 12
    assert len({r["chunk_id"] for r in funcs}) == 12 and len({r["content_hash"] for r in funcs}) == 1
    assert len(list((s.cas_dir / "blobs").rglob("*"))) > 0
    reader = hostile["reader"]
    for i in (0, 7, 11):
        hits = reader.query(f"shopcart.copy{i}.same.same", mode="exact")["hits"]
        assert hits[0]["file_path"] == f"src/shopcart/copy{i}/same.py"  # then the other `same`s, by last part
        assert hits[0]["channels"]["exact"]["rank"] == 1
    lexical = reader.query("One content at many paths", mode="lexical", k=20)["hits"]
    assert len({h["file_path"] for h in lexical}) == 12


@pytest.mark.integration
@pytest.mark.neo4j
def test_published_generation_serves_the_bad_files_content_safely(hostile):
    reader = hostile["reader"]
    status = reader.status()
    assert status["generation"] == 1 and status["stale"] == []
    latin = reader.query("Invalid bytes in prose", mode="lexical")["hits"]
    assert latin and latin[0]["file_path"] == "latin.md" and "\ufffd" in latin[0]["text"]
    # A NUL past the 8 KiB sniff: the file is text with a NUL; every store took it.
    assert reader.query("src/shopcart/late_nul.py", mode="exact")["hits"]
    ids = [r["chunk_id"] for r in read_rows(SourceLayout(hostile["settings"], "shop").chunks)
           if r["file_path"] == "src/shopcart/late_nul.py"]
    fts = open_fts(hostile["settings"])
    try:
        assert any("\x00" in row["text"] for row in fts.get_chunks(ids).values())
    finally:
        fts.close()
    big = reader.query("src/shopcart/lines100k.py", mode="exact")["hits"]
    assert big and big[0]["end_line"] <= 100_000
    with pytest.raises(QueryError, match="NUL"):
        reader.query("text\x00more")


@pytest.mark.integration
@pytest.mark.neo4j
def test_bridge_proposals_that_cannot_be_logged_do_not_fail_the_query(hostile):
    """A doc hit without a graph edge proposes a link through the alias table and logs it; when the
    log cannot be written (a full disk, a read-only home) the query still answers."""
    log = hostile["settings"].proposals_log
    reader = IndexReader(home=str(hostile["home"]), log_proposals=True)
    try:
        # The question names no identifier itself: the bridge comes from the doc hit's text.
        out = reader.query("The helper returns the rate of a region code", kind="docs", k=3)
        assert any(b["via"] == "alias" and b["symbol"] == "shopcart.tax.lookup_rate" for b in out["bridge"])
        assert "shopcart.tax.lookup_rate" in log.read_text()
        log.unlink()
        log.mkdir()  # now opening the log for writing fails with an OSError
        try:
            again = reader.query("The helper returns the rate of a region code", kind="docs", k=3)
            assert again["bridge"] == out["bridge"]
        finally:
            log.rmdir()
    finally:
        reader.close()


# ------------------------------------------------------------------------------ sources.yaml

def _good_entry(root: Path) -> str:
    return f"  - {{id: good, kind: code, path: {root / 'corpus' / 'shop'}}}\n"


SOURCES_ERRORS = [
    # (name, sources.yaml text (or bytes), what stderr must say)
    ("invalid_yaml", "sources: [ {id: a, kind: code\n", ["invalid YAML"]),
    ("not_utf8", b"sources:\n  - {id: caf\xe9, kind: code, path: x}\n", ["not UTF-8"]),
    ("empty_file", "", ["expected a mapping with a 'sources' list"]),
    ("sources_not_list", "sources: {id: a}\n", ["expected a mapping with a 'sources' list"]),
    ("entry_not_mapping", "sources:\n  - just-a-string\n", ["sources[0]", "expected a mapping, got str"]),
    ("unknown_kind", "sources:\n  - {id: imgs, kind: images, path: .}\n", ["sources[0] id='imgs'", "unknown kind 'images'"]),
    ("missing_kind", "sources:\n  - {id: nokind, path: .}\n", ["id='nokind'", "unknown kind None"]),
    ("path_and_sdist", "sources:\n  - {id: both, kind: code, path: ., pip_sdist: click==8.5.1}\n",
     ["id='both'", "exactly one of 'path', 'pip_sdist' or 'git'"]),
    ("no_path_no_sdist", "sources:\n  - {id: none, kind: code}\n", ["id='none'", "exactly one of"]),
    ("duplicate_ids", "GOOD  - {id: good, kind: docs, path: .}\n", ["sources[1] id='good'", "duplicate source id"]),
    ("bad_id", "sources:\n  - {id: 'Bad ID!', kind: code, path: .}\n", ["sources[0]", "id 'Bad ID!' must match"]),
    ("id_not_string", "sources:\n  - {id: 123, kind: code, path: .}\n", ["id 123 must match"]),
    ("unknown_key", "sources:\n  - {id: typo, kind: code, path: ., exclde: ['x']}\n", ["id='typo'", "unknown keys ['exclde']"]),
    ("include_not_list", "sources:\n  - {id: inc, kind: code, path: ., include: 5}\n", ["id='inc'", "include must be a list"]),
    ("max_bytes_negative", "sources:\n  - {id: mb, kind: code, path: ., max_file_bytes: -1}\n",
     ["id='mb'", "max_file_bytes must be a positive integer"]),
    ("unpinned_sdist", "sources:\n  - {id: sd, kind: code, pip_sdist: click}\n", ["id='sd'", "must be a pinned requirement"]),
    # a key given twice: YAML keeps the last value, so one source would silently replace another
    ("duplicate_key", "sources:\n  - id: twice\n    kind: code\n    path: .\n    path: corpus\n",
     ["line 5 column 5: duplicate key 'path' (first at line 4)"]),
    ("duplicate_key_in_flow", "sources:\n  - {id: twice, kind: code, path: ., path: corpus}\n",
     ["line 2", "duplicate key 'path'"]),
    ("unknown_top_level_key", "GOOD" + "defaults: {kind: code}\nsorces: []\n",
     ["unknown top-level keys ['defaults', 'sorces']"]),
]
# A `path` folder that does not exist (or is a file) is that source's error alone, the others
# build: tests/test_hostile_inputs.py.


@pytest.fixture
def fake_published(tmp_path, monkeypatch):
    """A home whose CURRENT names a manifest (no stores needed: config errors stop before them)."""
    home = tmp_path / "home"
    s = Settings(home=home).ensure()
    (s.manifest_dir / "manifest-7.json").write_text(json.dumps({"generation": 7, "sources": {}}))
    current_path(s.manifest_dir).write_text("manifest-7.json\n")
    monkeypatch.setenv("MTRAG_HOME", str(home))
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster_home"))
    monkeypatch.setenv("NEO4J_URI", "bolt://127.0.0.1:1")  # nothing may be started or reached
    return s


def _snapshot(s: Settings) -> tuple:
    cur = current_path(s.manifest_dir)
    return cur.read_bytes(), cur.stat().st_mtime_ns, sorted(p.name for p in s.manifest_dir.iterdir()), \
        sorted(p.name for p in (s.home / "locks").glob("*")) if (s.home / "locks").exists() else []


@pytest.mark.unit  # config errors stop before any store, model or Dagster instance
@pytest.mark.parametrize("name,content,expect", SOURCES_ERRORS, ids=[c[0] for c in SOURCES_ERRORS])
def test_sources_yaml_errors_exit_2_naming_the_entry(name, content, expect, tmp_path, fake_published,
                                                     monkeypatch, capsys):
    sources = tmp_path / "sources.yaml"
    if isinstance(content, str):
        content = content.replace("GOOD", "sources:\n" + _good_entry(tmp_path))
        sources.write_text(content)
    else:
        sources.write_bytes(content)
    (tmp_path / "corpus" / "shop").mkdir(parents=True)
    monkeypatch.setenv("MTRAG_SOURCES", str(sources))
    before = _snapshot(fake_published)
    assert main(["build"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mtrag: {sources}"), err
    for part in expect:
        assert part in err, (part, err)
    assert "Traceback" not in err
    assert _snapshot(fake_published) == before
    assert load_current(fake_published.manifest_dir)["generation"] == 7


@pytest.mark.unit  # config errors stop before any store, model or Dagster instance
def test_cli_process_exit_codes_for_config_errors(tmp_path, fake_published):
    (tmp_path / "corpus" / "shop").mkdir(parents=True)
    sources = tmp_path / "sources.yaml"
    env = {**os.environ, "MTRAG_SOURCES": str(sources)}
    before = _snapshot(fake_published)
    sources.write_text("sources:\n" + _good_entry(tmp_path) + "  - {id: good, kind: docs, path: .}\n")
    out = subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", "build"], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "sources[1] id='good': duplicate source id" in out.stderr, out.stderr
    # an unknown --source is refused before Dagster, Neo4j or a model is touched
    sources.write_text("sources:\n" + _good_entry(tmp_path))
    out = subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", "build", "--source", "nope"], env=env,
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "unknown source id(s) ['nope']" in out.stderr, out.stderr
    missing = {**env, "MTRAG_SOURCES": str(tmp_path / "absent.yaml")}
    out = subprocess.run([sys.executable, "-m", "mtrag_assets.app.cli", "build"], env=missing, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "sources file not found" in out.stderr
    assert _snapshot(fake_published) == before


# ------------------------------------------------------------------------------ injection

HOSTILE_QUERIES = [
    "a\" OR 1=1 --", "'; DROP TABLE chunks; --", "x'}) DETACH DELETE n //", "MATCH (n) DETACH DELETE n",
    "`lookup_rate`) RETURN 1 UNION MATCH (m) DETACH DELETE m //", "NEAR(tax rate, 2)", "tax* OR rate*",
    "{title symbol}: tax", "title:tax AND NOT rate", "^tax", "\"unterminated", "(((", ")))", "{{}}", "税率 OR (",
    "shopcart.tax.lookup_rate\" OR \"1\"=\"1", "$param", "\\u0000", "/* comment */ tax", "tax -- comment",
] + HOSTILE_HEADINGS


def _graph_counts(settings: Settings) -> dict:
    neo = open_neo4j(settings)
    fts = open_fts(settings)
    try:
        return {sid: (neo.counts(sid), fts.counts(sid)) for sid in ("shop", "shop-docs")}
    finally:
        neo.close()
        fts.close()


@pytest.mark.integration
@pytest.mark.neo4j
def test_identifiers_and_queries_with_cypher_sql_fts_syntax_are_inert(hostile):
    reader, s = hostile["reader"], hostile["settings"]
    before = _graph_counts(s)
    for heading in HOSTILE_HEADINGS:  # identifiers carrying the syntax were stored and are found as text
        hits = reader.query(heading, mode="exact")["hits"]
        assert hits and hits[0]["file_path"] == "inject.md" and hits[0]["title"] == heading, (heading, hits[:1])
    for q in HOSTILE_QUERIES:
        for mode in ("hybrid", "lexical", "exact", "bundles"):
            out = reader.query(q, mode=mode, k=5)
            assert out["generation"] == 1 and out["stale"] == []
        out = reader.paths(q, to_name=q, max_hops=2)
        assert out["paths"] == []
        with pytest.raises(QueryError, match="relation"):
            reader.paths("shopcart.cart.Cart.total", rel_types=[q])
    near = reader.query("NEAR(tax rate)", mode="lexical")["hits"]  # operator words are words
    assert near and near[0]["file_path"] == "inject.md"
    assert _graph_counts(s) == before
    assert reader.query("shopcart.tax.lookup_rate", mode="exact")["hits"][0]["symbol"] == "shopcart.tax.lookup_rate"


# ------------------------------------------------------------------------------ HTTP

@pytest.fixture(scope="module")
def server(hostile):
    with running_server(hostile["reader"], socket_timeout=SOCKET_TIMEOUT) as srv:
        yield srv


def _url(srv, path: str) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}{path}"


def _call(url, body=None, raw: bytes | None = None, headers: dict | None = None, method: str | None = None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def _raw(srv, data: bytes, read_timeout: float = 20) -> bytes:
    with socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=read_timeout) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                b = sock.recv(65536)
            except socket.timeout:
                break
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)


@pytest.mark.integration
@pytest.mark.neo4j
def test_http_injection_and_path_traversal(server, hostile):
    for q in HOSTILE_QUERIES:
        code, body = _call(_url(server, "/v1/query"), {"text": q, "k": 3, "mode": "lexical"})
        assert code == 200 and body["generation"] == 1, (q, body)
        code, body = _call(_url(server, "/v1/paths"), {"from": q, "to": q})  # a hostile heading is a symbol
        assert (code == 200 and body["paths"] == []) or \
            (code == 404 and (body["error"]["code"], body["error"]["field"]) == ("unknown_symbol", "from")), (q, body)
        code, body = _call(_url(server, "/v1/paths"), {"from": "shopcart.cart.Cart.total", "rel": q})
        assert code == 422 and "relation" in body["error"]["message"] and body["error"]["field"] == "rel", (q, body)
    for bad in ({"text": "x", "k": "10; DROP TABLE chunks"}, {"text": "x", "kind": "code' OR '1'='1"},
                {"text": "x", "mode": "lexical) OR (1"}, {"text": ["a"]}, {"text": {"$ne": 1}},
                {"text": "x", "k": 10**30}, {"from": "x"}):
        code, body = _call(_url(server, "/v1/query"), bad)
        assert code == 422 and body["error"]["code"] == "unprocessable" and body["error"]["message"], (bad, body)
    code, body = _call(_url(server, "/v1/paths"), {"from": "x", "max_hops": "4 OR 1=1"})
    assert code == 422 and body["error"]["field"] == "max_hops"
    for path in ("/../../etc/passwd", "/v1/status/../../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd",
                 "//etc/passwd", "/v1/../v1/status/..%2f..%2fetc%2fpasswd", "/healthz/../../etc/shadow",
                 "/v1/query/../../../../proc/self/environ", "/..\\..\\etc\\passwd"):
        for method in ("GET", "POST"):
            raw = _raw(server, f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{{}}".encode())
            status = raw.split(b" ", 2)[1]
            assert status == b"404", (method, path, raw[:200])
            assert b"root:" not in raw and b"PATH=" not in raw
    assert _call(_url(server, "/v1/status"))[1]["stale"] == []


@pytest.mark.integration
@pytest.mark.neo4j
def test_http_request_size_limits(server):
    code, body = _call(_url(server, "/v1/query"), raw=b'{"text": "' + b"a" * MAX_BODY_BYTES + b'"}')
    assert code == 413 and str(MAX_BODY_BYTES) in body["error"]["message"] and body["error"]["code"] == "payload_too_large"
    # A huge Content-Length is refused from the header alone: the server reads no body and answers.
    # (Waiting for the promised body would end in the socket timeout, which drops the connection
    # with no answer at all, never with this 413.)
    raw = _raw(server, b"POST /v1/query HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\n")
    assert raw.split(b" ", 2)[1] == b"413" and b"the limit is" in raw
    for length, status in ((b"-5", b"400"), (b"abc", b"400"), (b"9" * 5000, b"413"), (b"", b"400"), (b"1e3", b"400")):
        raw = _raw(server, b"POST /v1/query HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n{}")
        assert raw.split(b" ", 2)[1] == status, (length, raw[:200])
    raw = _raw(server, b"POST /v1/query HTTP/1.1\r\nHost: x\r\n\r\n{}")
    assert raw.split(b" ", 2)[1] == b"411" and b"Content-Length is required" in raw
    raw = _raw(server, b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert raw.split(b" ", 2)[1] == b"414"
    raw = _raw(server, b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(150)) + b"\r\n")
    assert raw.split(b" ", 2)[1] == b"431"
    code, body = _call(_url(server, "/v1/query"), raw="{\"text\": \"\ud800\"}".encode("utf-8", "surrogatepass"))
    assert code == 400


def _stall(port: int) -> tuple[socket.socket, socket.socket]:
    """Two clients that hold a connection: one sent headers and promised a body, one sent nothing."""
    stalled = socket.create_connection(("127.0.0.1", port), timeout=60)
    idle = socket.create_connection(("127.0.0.1", port), timeout=60)  # connects, never sends a byte
    stalled.sendall(b"POST /v1/query HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"text\":")
    return stalled, idle


@pytest.mark.integration
@pytest.mark.neo4j
def test_stalled_client_does_not_hold_the_server_and_is_dropped(server, hostile):
    """Headers sent, body promised, then silence: other requests are served meanwhile, the stalled
    connections get no answer while the socket timeout has not passed, and are closed once it has
    (the one that began a request with a 408 saying so)."""
    # A server whose socket timeout cannot pass during the test: whatever this machine's speed,
    # both connections must still be open (no answer, no EOF) after the other requests were served.
    with running_server(hostile["reader"], socket_timeout=600, read_deadline=600) as patient:
        stalled, idle = _stall(patient.server_address[1])
        try:
            assert _call(_url(patient, "/healthz")) == (200, {"ok": True})
            code, body = _call(_url(patient, "/v1/query"), {"text": "shopcart.tax.lookup_rate", "mode": "exact"})
            assert code == 200 and body["hits"]
            for sock in (stalled, idle):
                sock.setblocking(False)
                with pytest.raises(BlockingIOError):
                    sock.recv(1)
        finally:
            stalled.close()
            idle.close()
    # The module's server (SOCKET_TIMEOUT) closes such connections; recv's own timeout is only
    # there so that a server that never closes them fails instead of hanging.
    stalled, idle = _stall(server.server_address[1])
    try:
        assert _call(_url(server, "/healthz")) == (200, {"ok": True})
        for sock in (stalled, idle):
            sock.settimeout(SOCKET_TIMEOUT + 60)
        until_closed = [b"".join(iter(lambda: sock.recv(65536), b"")) for sock in (stalled, idle)]
        assert until_closed[0].startswith(b"HTTP/1.0 408 Request Timeout\r\n"), until_closed[0][:200]
        assert b'"code": "request_timeout"' in until_closed[0]
        assert until_closed[1] == b""  # sent nothing: closed without an answer
    finally:
        stalled.close()
        idle.close()


@pytest.mark.integration
@pytest.mark.neo4j
def test_loopback_default_and_api_key(hostile, monkeypatch):
    reader = hostile["reader"]
    assert build_parser().parse_args(["serve"]).host == "127.0.0.1"
    srv = make_server(reader, port=0)
    try:
        assert srv.server_address[0] == "127.0.0.1"
    finally:
        srv.server_close()
    for host in ("0.0.0.0", "::", "10.0.0.1", "127.0.0.1.example.com", "localhost.evil"):
        with pytest.raises(UnsafeBind, match="MTRAG_API_KEY"):
            make_server(reader, host, 0)
    calls = []
    real = hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    from mtrag_resources.serving import api_keys
    monkeypatch.setattr(api_keys.hmac, "compare_digest", spy)
    key = "s3cret-key-0123456789"
    with running_server(reader, "0.0.0.0", api_key=key) as srv:
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        assert _call(base + "/v1/status")[0] == 401
        assert _call(base + "/v1/query", {"text": "tax"})[0] == 401
        assert _call(base + "/nope")[0] == 401  # no route is revealed without the key
        for wrong in ("s3cret", key.upper(), "\u00e9" + key[1:], "x" * 1000, ""):
            assert _call(base + "/v1/status", headers={"X-API-Key": wrong.encode().decode("latin-1")})[0] == 401
        raw = _raw(srv, b"GET /v1/status HTTP/1.1\r\nHost: x\r\nX-API-Key: " + key.encode() + b"\r\n\r\n")
        assert raw.split(b" ", 2)[1] == b"200"
        raw = _raw(srv, b"GET /healthz HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode() + b"\r\n\r\n")
        assert raw.split(b" ", 2)[1] == b"200"
        assert calls and all(isinstance(a, bytes) and isinstance(b, bytes) for a, b in calls)
        # the key's SHA-256 is compared, so the comparison's length never depends on the key sent
        assert all(b == hashlib.sha256(key.encode()).digest() and len(a) == 32 for a, b in calls)
