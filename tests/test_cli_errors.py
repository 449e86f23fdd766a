"""The `mtrag` command's refusals as real processes of the installed console script: each user
error is one line on stderr naming the input (and what is allowed) with exit code 2 (usage) or 1
(a runtime failure), never a traceback unless --debug; `--help` states every limit; a read of a
home with nothing published creates nothing; `mtrag build` prints its stages with counts."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mtrag_resources.serving.requests import MAX_K, MAX_QUERY_BYTES, MODES, PATH_RELATIONS

REPO = Path(__file__).resolve().parents[1]
MTRAG = str(Path(sys.executable).with_name("mtrag"))


def mtrag(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([MTRAG, *args], env={**os.environ, **(env or {})}, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def one_line(out: subprocess.CompletedProcess, code: int) -> str:
    """The single stderr line of a refused command (and nothing on stdout, no traceback)."""
    assert out.returncode == code, (out.returncode, out.stdout[-2000:], out.stderr[-3000:])
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = out.stderr.splitlines()
    assert len(lines) == 1, lines
    assert out.stdout == "", out.stdout[-2000:]
    return lines[0]


@pytest.fixture
def no_home(tmp_path):
    """An MTRAG_HOME that does not exist (and must not be created by a read command)."""
    home = tmp_path / "no-home"
    return home, {"MTRAG_HOME": str(home), "DAGSTER_HOME": str(home / "dagster_home"), "MTRAG_SOURCES": ""}


# ---------------------------------------------------------------------------------- usage (exit 2)
USAGE = [
    (("query", ""), "mtrag: query is empty"),
    (("query", "   "), "mtrag: query is empty"),
    (("query", "tax", "--k", "0"), f"mtrag: k must be an integer from 1 to {MAX_K}, got 0"),
    (("query", "tax", "--k", "100000"), f"mtrag: k must be an integer from 1 to {MAX_K}, got 100000"),
    (("query", "x" * 100 * 1024), f"mtrag: query is {100 * 1024} bytes of UTF-8; the limit is {MAX_QUERY_BYTES} "
                                  "bytes (16 KB)"),
    (("query", "tax", *[a for i in range(51) for a in ("--source", f"s{i}")]),
     "mtrag: sources names 51 ids; the limit is 50"),
    (("query", "tax", "--source", "shop", "--source", ""), "mtrag: sources[1] is empty"),
    (("paths", "--from", "a.b", "--rel", "FOO"), f"mtrag: unknown relation type(s) ['FOO']; allowed: "
                                                 f"{list(PATH_RELATIONS)}"),
    (("paths", "--from", "a.b", "--rel", "calls,"), "mtrag: unknown relation type(s) ['']; allowed: "
                                                    f"{list(PATH_RELATIONS)}"),
    (("paths", "--from", "a.b", "--max-hops", "50"), "mtrag: max_hops must be from 1 to 6, got 50"),
    (("paths", "--from", "a.b", "--max-hops", "0"), "mtrag: max_hops must be from 1 to 6, got 0"),
    (("paths", "--from", ""), "mtrag: from is empty"),
    (("paths", "--from", "a.b", "--to", " "), "mtrag: to is empty"),
]


@pytest.mark.unit
@pytest.mark.parametrize("args,line", USAGE, ids=[" ".join(a)[:40] for a, _ in USAGE])
def test_bad_arguments_are_one_line_exit_2_before_the_home_is_read(no_home, args, line):
    home, env = no_home
    assert one_line(mtrag(*args, env=env), 2) == line
    assert not home.exists()


ARGPARSE = [
    (("query", "tax", "--k", "ten"), ["argument --k", "invalid int value: 'ten'", "mtrag query --help"]),
    (("query", "tax", "--mode", "telepathy"), ["argument --mode", "'telepathy'", *MODES]),
    (("query", "tax", "--kind", "video"), ["argument --kind", "'video'", "code", "docs"]),
    (("paths",), ["--from"]),
    (("paths", "--from", "a", "--direction", "up"), ["argument --direction", "'up'", "out", "in"]),
    (("frobnicate",), ["argument COMMAND", "'frobnicate'", "build", "query", "paths"]),
    (("query", "tax", "--bogus"), ["unrecognized arguments: --bogus"]),
]


@pytest.mark.unit
@pytest.mark.parametrize("args,parts", ARGPARSE, ids=[" ".join(a) for a, _ in ARGPARSE])
def test_argparse_refusals_are_one_line_naming_the_allowed_values(no_home, args, parts):
    home, env = no_home
    line = one_line(mtrag(*args, env=env), 2)
    assert line.startswith("mtrag"), line
    for part in parts:
        assert part in line, (part, line)
    assert not home.exists()


# ------------------------------------------------------------------------- nothing published (exit 1)
@pytest.mark.unit
@pytest.mark.parametrize("args", [("query", "how is tax computed"), ("paths", "--from", "a.b"), ("status",),
                                  ("status", "--json")])
def test_a_home_without_a_generation_is_one_line_and_creates_nothing(no_home, args):
    home, env = no_home
    line = one_line(mtrag(*args, env=env), 1)
    assert line == f"mtrag: MTRAG_HOME={home} has no published generation; run mtrag build"
    assert not home.exists()


@pytest.mark.unit
def test_an_empty_home_is_reported_the_same_and_stays_empty(tmp_path):
    home = tmp_path / "empty"
    home.mkdir()
    line = one_line(mtrag("query", "tax", env={"MTRAG_HOME": str(home)}), 1)
    assert line == f"mtrag: MTRAG_HOME={home} has no published generation; run mtrag build"
    assert list(home.iterdir()) == []


@pytest.mark.unit
def test_servers_on_a_home_without_a_generation_create_nothing(tmp_path):
    """`mtrag mcp` (stdio: it ends at EOF) and `mtrag serve` (stopped by a signal) on a home that
    does not exist yet: they start, and the home stays absent."""
    home = tmp_path / "not-yet"
    env = {**os.environ, "MTRAG_HOME": str(home)}
    env.pop("MTRAG_SOURCES", None)
    done = subprocess.run([MTRAG, "mcp"], input="", env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    server = subprocess.Popen([MTRAG, "serve", "--port", "0"], env=env, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        assert "mtrag serving on" in server.stdout.readline()
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert not home.exists()


@pytest.mark.unit
def test_serve_stops_on_sigterm_and_sigint_even_when_its_parent_ignored_them(tmp_path):
    """A background job of a non-interactive shell (or a supervisor) may start the server with
    SIGTERM and SIGINT ignored; an ignored disposition survives exec, and a server that left it as
    it was outlived every stop by its pid."""
    import signal

    env = {**os.environ, "MTRAG_HOME": str(tmp_path / "home")}
    env.pop("MTRAG_SOURCES", None)

    def ignoring():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)

    for stop in (signal.SIGTERM, signal.SIGINT):
        server = subprocess.Popen([MTRAG, "serve", "--port", "0"], env=env, cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, preexec_fn=ignoring)
        try:
            assert "mtrag serving on" in server.stdout.readline()
            server.send_signal(stop)
            assert server.wait(timeout=60) == 0, server.stdout.read()[-2000:]
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()


@pytest.mark.unit
def test_an_unexpected_error_is_one_line_unless_debug(tmp_path):
    """A home whose CURRENT names a manifest that is gone: not a refusal mtrag foresaw."""
    home = tmp_path / "broken"
    (home / "08-manifest").mkdir(parents=True)
    (home / "08-manifest" / "CURRENT").write_text("manifest-000007.json\n")
    env = {"MTRAG_HOME": str(home)}
    line = one_line(mtrag("status", env=env), 1)
    assert re.fullmatch(r"mtrag: internal error: FileNotFoundError: .*manifest-000007\.json.* "
                        r"\(run with --debug for the traceback\)", line), line
    for args in (("--debug", "status"), ("status", "--debug")):
        out = mtrag(*args, env=env)
        assert out.returncode == 1 and "Traceback" in out.stderr and "FileNotFoundError" in out.stderr, out.stderr


# ------------------------------------------------------------------------------------------ build
@pytest.mark.unit
def test_an_unknown_source_is_one_line_exit_2(tmp_path):
    from tests.corpus import write_corpus
    paths = write_corpus(tmp_path / "corpus")
    env = {"MTRAG_HOME": str(tmp_path / "home"), "MTRAG_SOURCES": str(paths["sources"]),
           "DAGSTER_HOME": str(tmp_path / "home" / "dagster_home")}
    line = one_line(mtrag("build", "--source", "nope", env=env), 2)
    assert "unknown source id(s) ['nope']" in line and "['shop', 'shop-docs']" in line, line


@pytest.mark.unit
@pytest.mark.parametrize("value", ["ten", "20", "-5"])
def test_a_bad_watch_niceness_is_one_line_exit_2_before_anything_starts(tmp_path, value):
    from tests.corpus import write_corpus
    paths = write_corpus(tmp_path / "corpus")
    home = tmp_path / "home"
    env = {"MTRAG_HOME": str(home), "MTRAG_SOURCES": str(paths["sources"]),
           "DAGSTER_HOME": str(home / "dagster_home"), "MTRAG_WATCH_NICE": value}
    line = one_line(mtrag("watch", env=env), 2)
    assert f"MTRAG_WATCH_NICE={value!r}" in line and "0 to 19" in line, line
    assert not (home / "neo4j").exists()  # refused before the local Neo4j is launched


# ------------------------------------------------------------------------------------------- help
@pytest.mark.unit
def test_help_states_every_option_its_default_and_limits():
    def help_of(*args: str) -> str:
        out = mtrag(*args, "--help")
        assert out.returncode == 0 and out.stderr == "", out.stderr
        return " ".join(out.stdout.split())  # argparse wraps lines

    text = help_of("query")
    for part in (f"1 to {MAX_K} (default: 10)", f"{MAX_QUERY_BYTES} bytes of UTF-8 (16 KB)", "(default: hybrid)",
                 "--kind {code,docs,issues}", "--debug", "--json", "--source ID", "repeatable, at most 50", *MODES):
        assert part in text, (part, text)
    text = help_of("paths")
    for part in ("1 to 6 hops (default: 4)", "default: CALLS", "(default: out)", "--to", "--json",
                 "no verified path", "nearest symbol names"):
        assert part in text, (part, text)
    assert ",".join(PATH_RELATIONS) in text.replace(", ", ",").replace("- ", "-").replace(" ", ""), text
    text = help_of("build")
    for part in ("--source ID", "--force", "--accept-quality-drop", "counts and seconds"):
        assert part in text, (part, text)
    assert "(default: 8765)" in help_of("serve") and "(default: 127.0.0.1)" in help_of("serve")
    assert "start" in help_of("neo4j") and "--debug" in help_of()


# ----------------------------------------------------------------------- against a published home
@pytest.mark.integration
@pytest.mark.neo4j
def test_paths_tells_no_such_symbol_from_no_verified_path(published):
    line = one_line(mtrag("paths", "--from", "no.such.symbol"), 1)
    assert line.startswith("mtrag: --from 'no.such.symbol': no such symbol in generation 1; nearest symbols: "), line
    assert "shopcart" in line.split("nearest symbols: ")[1]

    line = one_line(mtrag("paths", "--from", "shopcart.cart.Cart.totl"), 1)
    assert line.split("nearest symbols: ")[1].split(", ")[0] == "shopcart.cart.Cart.total", line

    line = one_line(mtrag("paths", "--from", "shopcart.cart.Cart.total", "--to", "shopcart.nowhere"), 1)
    assert line.startswith("mtrag: --to 'shopcart.nowhere': no such symbol"), line

    out = mtrag("paths", "--from", "shopcart.tax.lookup_rate")  # a symbol that calls nothing
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout.splitlines() == ["generation 1  paths from 'shopcart.tax.lookup_rate'", "  (no verified path)"]


@pytest.mark.integration
@pytest.mark.neo4j
def test_refusals_against_a_published_home(published):
    assert one_line(mtrag("query", "tax", "--k", "0"), 2) == f"mtrag: k must be an integer from 1 to {MAX_K}, got 0"
    assert one_line(mtrag("paths", "--from", "shopcart.cart.Cart", "--rel", "OWNS"), 2).startswith(
        "mtrag: unknown relation type(s) ['OWNS']; allowed: ")
    # --source: an id the published generation does not hold is named, with the known ones
    assert one_line(mtrag("query", "tax", "--source", "shop", "--source", "nope"), 2) == (
        "mtrag: sources: unknown source id(s) ['nope']; the published generation's sources are ['shop', 'shop-docs']")
    out = mtrag("query", "apply tax", "--json", "--source", "shop-docs", "--source", "shop-docs")  # repeats collapse
    assert out.returncode == 0 and out.stderr == "", out.stderr[-3000:]
    hits = json.loads(out.stdout)["hits"]
    assert hits and {h["source_id"] for h in hits} == {"shop-docs"}


@pytest.mark.integration
@pytest.mark.neo4j
def test_build_prints_each_stage_with_counts_and_seconds(mtrag_env):
    out = mtrag("build", timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and out.stderr == "", out.stderr[-3000:]
    lines = out.stdout.splitlines()
    for sid in ("shop", "shop-docs"):
        for stage in ("raw_source", "cas_chunks", "canonical_graph", "embedding_cache", "fts_db", "neo4j_graph",
                      "qdrant_collection"):
            start = lines.index(f"[{sid}] {stage} ...")
            done = [i for i, ln in enumerate(lines) if re.match(rf"^\[{re.escape(sid)}\] {stage} done in \d+\.\d s", ln)]
            assert done and done[0] > start, (sid, stage, lines)
    assert any(re.match(r"^\[shop\] cas_chunks done in \d+\.\d s: chunks 18, .*children 12", ln) for ln in lines), lines
    assert any(re.match(r"^\[shop\] embedding_cache done in \d+\.\d s: .*embedded 12", ln) for ln in lines), lines
    assert any(re.match(r"^\[shop\] check \w+ ok in \d+\.\d s$", ln) for ln in lines), lines
    assert any(re.match(r"^\[shop-docs\] index_manifest done in \d+\.\d s: generation 1, sources 2", ln)
               for ln in lines), lines
    assert lines[-1].startswith("built ['shop', 'shop-docs']; removed nothing; published generation 1 in ")


@pytest.mark.integration
@pytest.mark.neo4j
def test_a_bad_pip_sdist_pin_is_one_line_before_any_run(mtrag_env):
    mtrag_env["sources"].write_text("sources:\n  - {id: gone, kind: code, pip_sdist: 'nosuchpkg-mtrag-test==0.0.1'}\n")
    out = mtrag("build", env={"PIP_NO_INDEX": "1"}, timeout=300)
    assert out.returncode == 2, (out.stdout[-2000:], out.stderr[-3000:])
    assert "Traceback" not in out.stderr and "dagster" not in out.stderr.lower(), out.stderr[-3000:]
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtrag: pip_sdist 'nosuchpkg-mtrag-test==0.0.1': pip download "
                                                   "failed"), lines
    assert "[gone] raw_source" not in out.stdout  # refused before the source's run started


@pytest.mark.integration
@pytest.mark.neo4j
def test_embedding_progress_reaches_the_build_log_and_the_run_log(mtrag_env, monkeypatch):
    """An embedding pass longer than PROGRESS_AFTER_S prints done/total, texts/s and an ETA; here
    the threshold is 0 so the small corpus's pass qualifies."""
    import dagster as dg

    import mtrag_assets.embedding_cache as asset
    from mtrag_assets.runner import run_build
    from mtrag_resources.core.config import Settings
    from mtrag_resources.ingest.sources import load_sources
    monkeypatch.setattr(asset, "PROGRESS_AFTER_S", 0.0)
    settings = Settings.from_env().ensure()
    lines: list[str] = []
    summary = run_build(settings, load_sources(settings.sources_file), only=["shop"], log=lines.append)
    progress = [ln for ln in lines if ln.startswith("[shop] embedding_cache: embedded ")]
    assert progress and re.fullmatch(r"\[shop\] embedding_cache: embedded 12/12 \(\d+ texts/s, ETA 0 s\)",
                                     progress[-1]), lines
    logs = [e.user_message for e in dg.DagsterInstance.get().all_logs(summary["runs"]["shop"])
            if e.dagster_event is None and e.step_key == "embedding_cache"]
    assert any(re.fullmatch(r"embedded 12/12 \(\d+ texts/s, ETA 0 s\)", m) for m in logs), logs


@pytest.mark.unit
def test_neo4j_stop_of_a_home_without_a_server_says_not_running(tmp_path):
    out = mtrag("neo4j", "stop", env={"MTRAG_HOME": str(tmp_path / "home"), "NEO4J_URI": ""})
    assert out.returncode == 0 and out.stdout == "neo4j: not running\n" and out.stderr == "", out


@pytest.mark.integration
@pytest.mark.neo4j
@pytest.mark.slow
def test_neo4j_stop_says_stopped_when_it_stopped_a_server(tmp_path):
    env = {"MTRAG_HOME": str(tmp_path / "home"), "NEO4J_URI": ""}
    out = mtrag("neo4j", "start", env=env, timeout=300)
    try:
        assert out.returncode == 0 and out.stdout.startswith("neo4j: running at bolt://"), out
    finally:
        out = mtrag("neo4j", "stop", env=env, timeout=120)
    assert out.returncode == 0 and out.stdout == "neo4j: stopped\n", out
    out = mtrag("neo4j", "stop", env=env, timeout=120)
    assert out.returncode == 0 and out.stdout == "neo4j: not running\n", out


@pytest.mark.unit
def test_serve_names_a_bad_or_busy_port_in_one_line(no_home):
    import socket
    for port in ("70000", "-1", "http"):
        line = one_line(mtrag("serve", "--port", port, env={"MTRAG_HOME": str(no_home)}), 2)
        assert line == f"mtrag serve: argument --port: {port!r} is not a TCP port (0 to 65535) (see mtrag serve --help)"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        line = one_line(mtrag("serve", "--port", str(port), env={"MTRAG_HOME": str(no_home)}, timeout=60), 2)
    assert line.startswith(f"mtrag: --host 127.0.0.1 --port {port}: cannot listen there: "), line


@pytest.mark.unit
def test_serve_names_a_bad_http_limit_in_one_line(no_home):
    for name, value, allowed in (("MTRAG_HTTP_READ_DEADLINE_S", "soon", "a number of seconds from 0 to 3600"),
                                 ("MTRAG_HTTP_READ_DEADLINE_S", "0", "a number of seconds from 0 to 3600"),
                                 ("MTRAG_HTTP_CONNECTIONS_PER_CLIENT", "-3", "a whole number from 1 to 10000")):
        line = one_line(mtrag("serve", "--port", "0", env={"MTRAG_HOME": str(no_home), name: value}, timeout=60), 2)
        assert line == f"mtrag: {name}={value!r}: not {allowed}", line
