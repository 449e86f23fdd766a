"""Hostile and careless inputs (issue #58), the sources file, snapshots and HTTP: a key given twice
or an unknown top-level key in `sources.yaml`, a `path` folder that is gone, an include glob that
selects nothing, git trees that name paths outside their root, binary files without a NUL byte, and
HTTP clients that hang up mid-request or send lone surrogates. Issue exports and the terminal
views: tests/test_hostile_text.py.

Each input is read through the module that meets it first; no store, model or Dagster instance."""
from __future__ import annotations

import json
import random
import socket
import struct
import textwrap
import threading
import time
from pathlib import Path

import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.ingest import git_source
from mtrag_resources.ingest.git_source import GitRepository, scan_git
from mtrag_resources.ingest.inventory import NOT_TEXT, scan
from mtrag_resources.ingest.snapshot import source_problem
from mtrag_resources.ingest.sources import SourceConfigError, load_sources
from mtrag_resources.serving.requests import validate_text


# ------------------------------------------------------------------------ the sources file (unit)

def _sources(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sources.yaml"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.unit
def test_a_key_given_twice_or_an_unknown_top_level_key_refuses_the_file_naming_the_line(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    path = _sources(tmp_path, """\
        sources:
          - id: one
            kind: code
            path: a
            include: ["**/*.py"]
            path: b
        """)
    with pytest.raises(SourceConfigError, match=r"line 6 column 5: duplicate key 'path' \(first at line 4\)"):
        load_sources(path)
    path = _sources(tmp_path, """\
        sources:
          - {id: one, kind: code, path: a}
        sources:
          - {id: two, kind: code, path: b}
        """)
    with pytest.raises(SourceConfigError, match=r"line 3 column 1: duplicate key 'sources' \(first at line 1\)"):
        load_sources(path)
    path = _sources(tmp_path, "sources:\n  - {id: one, kind: code, path: a}\nsource_defaults: {}\n")
    with pytest.raises(SourceConfigError, match=r"unknown top-level keys \['source_defaults'\]"):
        load_sources(path)
    # a merge key is a default the entry's own keys override, not a duplicate
    path = _sources(tmp_path, """\
        sources:
          - &first {id: one, kind: code, path: a, include: ["x/**"]}
          - {<<: *first, id: two, include: ["y/**"]}
        """)
    assert [(s.id, s.path, s.include) for s in load_sources(path)] == [("one", "a", ("x/**",)), ("two", "a", ("y/**",))]


@pytest.mark.unit
def test_a_missing_folder_is_its_source_error_alone(tmp_path):
    from mtrag_resources.publish.build_state import changed_sources
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "m.py").write_text("X = 1\n")
    path = _sources(tmp_path, """\
        sources:
          - {id: good, kind: code, path: good}
          - {id: gone, kind: code, path: not/here}
          - {id: afile, kind: docs, path: sources.yaml}
        """)
    specs = {s.id: s for s in load_sources(path)}  # the file loads: no folder is looked at yet
    settings = Settings(home=tmp_path / "home", sources=path)
    problems = {sid: source_problem(settings, spec) for sid, spec in specs.items()}
    assert problems["good"] is None
    assert problems["gone"] == (f"{path}: source id='gone': path 'not/here': does not exist or is not a directory "
                                f"({tmp_path / 'not' / 'here'})")
    assert problems["afile"].startswith(f"{path}: source id='afile': path 'sources.yaml': does not exist or is not")
    # nothing published: every source is to build, and a missing folder is no refusal of the build
    assert sorted(changed_sources(settings, list(specs.values()), None)[0]) == ["afile", "gone", "good"]


@pytest.mark.unit
def test_an_include_glob_that_selects_nothing_and_a_source_with_no_file_are_warned_by_name(tmp_path):
    from mtrag_resources.stages.raw_source import build_raw_source
    (tmp_path / "shop" / "src").mkdir(parents=True)
    (tmp_path / "shop" / "src" / "m.py").write_text("X = 1\n")
    (tmp_path / "empty").mkdir()
    path = _sources(tmp_path, """\
        sources:
          - {id: shop, kind: code, path: shop, include: ["src/**/*.py", "lib/**/*.js"]}
          - {id: empty, kind: docs, path: empty, include: ["docs/**/*.md"]}
        """)
    settings = Settings(home=tmp_path / "home", sources=path).ensure()
    shop, empty = load_sources(path)
    assert build_raw_source(settings, shop).metadata["source_warnings"] == [
        "source 'shop': include glob 'lib/**/*.js' matches no file"]
    assert build_raw_source(settings, empty).metadata["source_warnings"] == [
        "source 'empty': include glob 'docs/**/*.md' matches no file",
        f"source 'empty': no file to index under {tmp_path / 'empty'} (no file matches its include globs)"]


# ------------------------------------------------------------------------ snapshots (unit)

def _crafted_repo(root: Path, files: dict) -> None:
    """A repository whose one commit's tree is `files` (nested dicts are trees; names are taken as
    written, `..` and `/` included, as only a hand-made tree holds them)."""
    from dulwich.objects import Blob, Commit, Tree
    from dulwich.repo import Repo
    repo = Repo.init(str(root), mkdir=True)
    store = repo.object_store

    def tree(entries: dict) -> Tree:
        t = Tree()
        for name, value in entries.items():
            if isinstance(value, dict):
                t.add(name.encode(), 0o040000, tree(value).id)
            else:
                blob = Blob.from_string(value)
                store.add_object(blob)
                t.add(name.encode(), 0o100644, blob.id)
        store.add_object(t)
        return t

    commit = Commit()
    commit.tree = tree(files).id
    commit.author = commit.committer = b"t <t@example.com>"
    commit.commit_time = commit.author_time = 1_700_000_000
    commit.commit_timezone = commit.author_timezone = 0
    commit.message = b"crafted"
    store.add_object(commit)
    repo.refs[b"refs/heads/main"] = commit.id
    repo.close()


@pytest.mark.unit
def test_a_crafted_git_tree_naming_paths_outside_the_root_is_skipped_with_its_reason(tmp_path):
    code = b"def escaped():\n    return 1\n"
    _crafted_repo(tmp_path / "repo", {
        "ok.py": b"def ok():\n    return 1\n",
        "..": {"evil.py": code},                                        # ../evil.py
        "": {"abs.py": code},                                           # /abs.py
        "/rooted.py": code,                                             # a name with a slash
        "x": {"..": {"..": {"..": {"tmp": {"escaped.py": code}}}}},     # x/../../../tmp/escaped.py
        ".": {"dot.py": code},
    })
    with GitRepository(tmp_path / "repo") as repo:
        inventory, _ = scan_git("s", repo, "main", ("**/*",), (), 10_000, "repo")
    assert [f.path for f in inventory.included] == ["ok.py"]
    assert {f.path: f.reason for f in inventory.skipped} == {
        path: git_source.UNSAFE_PATH for path in ("../evil.py", "/abs.py", "/rooted.py",
                                                  "x/../../../tmp/escaped.py", "./dot.py")}


def _garbage(size: int = 6000) -> bytes:
    """Bytes of a compressed or image file that happen to hold no NUL."""
    rng = random.Random(58)
    return bytes(rng.randrange(1, 256) for _ in range(size))


@pytest.mark.unit
def test_a_binary_file_without_a_nul_byte_is_skipped_not_indexed_as_garbage(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    (root / "packed.py").write_bytes(_garbage())
    (root / "ok.py").write_text("def ok():\n    return 'caf\u00e9 \u7a0e\u7387'\n")
    (root / "latin.md").write_bytes("# Caf\xe9 notes\n\nInvalid \xff bytes in prose.\n".encode("latin-1"))
    (root / "colors.txt").write_bytes(b"\x1b[31mred\x1b[0m and plain text\n" * 50)  # a log with colours
    inventory = scan("s", root, ("**/*",), (), 1_000_000)
    assert {f.path: f.reason for f in inventory.skipped} == {"packed.py": NOT_TEXT}
    assert {f.path for f in inventory.included} == {"ok.py", "latin.md", "colors.txt"}
    _crafted_repo(tmp_path / "repo", {"packed.py": _garbage(), "ok.py": b"X = 1\n"})
    with GitRepository(tmp_path / "repo") as repo:
        inventory, _ = scan_git("s", repo, "main", ("**/*",), (), 10_000, "repo")
    assert {f.path: f.reason for f in inventory.skipped} == {"packed.py": NOT_TEXT}


# ------------------------------------------------------------------------ HTTP (unit)

class _SlowReader:
    """The reader's query, answered slowly and at length: a client may leave before the answer."""

    max_hops_limit = 4

    def __init__(self, delay: float = 0.0):
        self.delay, self.texts = delay, []
        self.started, self.answered = threading.Event(), threading.Event()

    def query(self, text, k, kind, mode, sources):
        self.texts.append(text)
        self.started.set()
        time.sleep(self.delay)
        self.answered.set()
        return {"generation": 1, "query": text, "hits": [], "padding": "x" * 2_000_000}


def _post(port: int, body: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"POST /v1/query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


@pytest.mark.unit
def test_a_client_that_hangs_up_mid_request_leaves_no_traceback(capfd):
    from tests.http_helpers import running_server
    reader = _SlowReader(delay=0.5)
    with running_server(reader) as server:
        sock = _post(server.server_address[1], b'{"text": "tax"}')
        assert reader.started.wait(10)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        sock.close()
        assert reader.answered.wait(10)
        deadline = time.monotonic() + 10
        err = ""
        while "mtrag-http" not in err and time.monotonic() < deadline:  # the access line comes last
            time.sleep(0.1)
            err += capfd.readouterr().err
        time.sleep(0.3)
        err += capfd.readouterr().err
    assert "POST /v1/query 200" in err
    assert "Traceback" not in err and "BrokenPipe" not in err and "ConnectionReset" not in err, err


@pytest.mark.unit
def test_a_lone_surrogate_in_a_query_is_answered_not_a_500():
    import urllib.request
    from tests.http_helpers import running_server
    assert validate_text("tax \ud800 rate") == "tax \ufffd rate"
    reader = _SlowReader()
    with running_server(reader) as server:
        request = urllib.request.Request(f"http://127.0.0.1:{server.server_address[1]}/v1/query",
                                         data=b'{"text": "tax \\ud800 rate"}',
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200 and json.loads(response.read())["query"] == "tax \ufffd rate"
    assert reader.texts == ["tax \ufffd rate"]
