"""`mtrag build-server` and `mtrag build` through it, as real processes of the console script on a
test home: builds run in the server (its output, exit codes and refusals relayed), publish what an
in-process build would (a later in-process build finds nothing to do), are Dagster runs tagged with
the server's pid; a client of other settings builds in its own process; a server killed by
SIGKILL in the middle of a build leaves the last generation served and the next build converges;
stop and the idle timeout end it and remove its socket and state file; `mtrag build` starts one by
itself (MTRAG_BUILD_SERVER=auto), which deleting its home ends."""
from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from mtrag_assets.app import build_client
from mtrag_resources.core.config import Settings
from mtrag_resources.stores.qdrant_folder import lock_path_for

REPO = Path(__file__).resolve().parents[1]
MTRAG = str(Path(sys.executable).with_name("mtrag"))


def mtrag(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([MTRAG, *args], env=env or dict(os.environ), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def files_of(symbol: str) -> set[str]:
    out = mtrag("query", symbol, "--mode", "exact", "--json")
    assert out.returncode == 0, out.stderr
    return {h["file_path"] for h in json.loads(out.stdout)["hits"] if h.get("symbol") == symbol}


def server_pid() -> int:
    out = mtrag("build-server", "status", "--json")
    return json.loads(out.stdout)["pid"]


def qdrant_lock_held(settings: Settings) -> bool:
    """Whether a process holds the embedded Qdrant folder's writer lock (this one does not)."""
    with open(lock_path_for(settings.qdrant_path), "a") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
        return False


def gone(pid: int, timeout: float = 60) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def stop_server_after():
    yield
    mtrag("build-server", "stop")  # whatever a test left running


@pytest.mark.integration
@pytest.mark.neo4j
def test_builds_run_in_the_server_publish_what_a_build_would_and_it_stops_cleanly(mtrag_env, stop_server_after):
    pkg, docs = mtrag_env["pkg"], mtrag_env["docs"]
    started = mtrag("build-server", "start")
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith("build server: running (pid "), started.stdout
    pid = server_pid()
    settings = Settings.from_env()
    assert build_client.socket_path(settings).exists() and build_client.state_path(settings).exists()
    t0 = time.monotonic()  # ready before its sources are warmed: it warms them between builds
    while json.loads(mtrag("build-server", "status", "--json").stdout)["warming"] > 0:
        assert time.monotonic() - t0 < 120, "the server never finished warming its sources"
        time.sleep(0.2)
    again = mtrag("build-server", "start")  # a second start reports the running one
    assert again.returncode == 0 and f"pid {pid}" in again.stdout

    first = mtrag("build")
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.splitlines()[0] == f"(through the build server, pid {pid})"
    assert "[shop] cas_chunks done" in first.stdout and "published generation 1 " in first.stdout

    tax = pkg / "tax.py"
    tax.write_text(tax.read_text() + '\n\ndef server_added(x):\n    """Added for the build server."""\n    return x\n')
    removed = sorted(docs.glob("*.md"))[0]
    removed_text = removed.read_text()
    removed.unlink()
    second = mtrag("build")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "published generation 2 " in second.stdout
    assert files_of("shopcart.tax.server_added") == {"src/shopcart/tax.py"}
    fts_hits = json.loads(mtrag("query", removed_text.split("\n")[0].strip("# "), "--mode", "lexical",
                                "--kind", "docs", "--json").stdout)["hits"]
    assert removed.name not in {Path(h["file_path"]).name for h in fts_hits}

    # what the server published is what this process would have: an in-process build has nothing to do
    local = mtrag("build", "--no-server")
    assert local.returncode == 0 and local.stdout.splitlines()[:1] == ["(building in this process: --no-server)"]
    assert local.stdout.splitlines()[1].startswith("nothing changed since the published generation"), local.stdout
    status = json.loads(mtrag("status", "--json").stdout)
    assert status["generation"] == 2 and status["stale"] == []

    # the server keeps the embedded Qdrant open from one build to the next, and closes it when
    # another process's build waits for its lock; its next build opens it again
    assert qdrant_lock_held(settings)
    tax.write_text(tax.read_text() + '\n\ndef local_added(x):\n    return x\n')
    local_change = mtrag("build", "--no-server")
    assert local_change.returncode == 0, local_change.stdout + local_change.stderr
    assert "published generation 3 " in local_change.stdout
    assert files_of("shopcart.tax.local_added") == {"src/shopcart/tax.py"}
    assert not qdrant_lock_held(settings)
    tax.write_text(tax.read_text() + '\n\ndef server_again(x):\n    return x\n')
    third = mtrag("build")
    assert third.returncode == 0 and "published generation 4 " in third.stdout, third.stdout + third.stderr
    assert files_of("shopcart.tax.server_again") == {"src/shopcart/tax.py"} and qdrant_lock_held(settings)

    # a refusal is relayed as it is given in process: one line, its exit code
    refused = mtrag("build", "--source", "nope")
    local_refused = mtrag("build", "--source", "nope", "--no-server")
    assert refused.returncode == local_refused.returncode == 2
    assert refused.stderr.strip() == local_refused.stderr.strip() and "unknown source id(s) ['nope']" in refused.stderr

    # another value of a variable mtrag reads: not this server's build; it runs in the calling process
    other = mtrag("build", env={**os.environ, "MTRAG_WATCH_NICE": "5"})
    assert other.returncode == 0, other.stderr
    assert f"not using the build server (pid {pid})" in other.stderr and "(through the build server" not in other.stdout

    # the runs are the instance's, tagged with the server's pid
    import dagster as dg
    from mtrag_assets.policies import PID_TAG
    runs = dg.DagsterInstance.get().get_runs(filters=dg.RunsFilter(tags={"mtrag/build_server": str(pid)}))
    assert len(runs) >= 2 and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    assert {r.tags[PID_TAG] for r in runs} == {str(pid)} and any(r.tags["mtrag/publish"] == "true" for r in runs)

    shown = json.loads(mtrag("build-server", "status", "--json").stdout)
    # the builds it ran: a refused one never reached it (bad input is refused by the client)
    assert shown["running"] and shown["usable"] and shown["builds"] == 3
    # what its builds keep for the next one is its build session's, by cache
    kept = build_client._ask(settings, {"op": "ping"})["session"]
    assert kept["tables.decoded"] > 0 and kept["cas_chunks.parsed_files"] > 0, kept

    stopped = mtrag("build-server", "stop")
    assert stopped.stdout.strip() == "build server: stopped" and gone(pid)
    assert not qdrant_lock_held(settings)
    assert not build_client.socket_path(settings).exists() and not build_client.state_path(settings).exists()
    after = mtrag("build-server", "status")
    assert after.returncode == 3 and after.stdout.strip() == "build server: not running"
    assert f"build server pid {pid} leaves (stopped) after" in build_client.log_path(settings).read_text()


@pytest.mark.integration
@pytest.mark.neo4j
def test_a_server_killed_mid_build_leaves_the_generation_served_and_the_next_build_converges(mtrag_env, stop_server_after):
    env = {k: v for k, v in os.environ.items() if k != "MTRAG_FAULT"}
    assert mtrag("build", "--no-server", env=env).returncode == 0
    faulty = {**env, "MTRAG_FAULT": "qdrant:after_begin"}  # the server kills itself after Qdrant's begin
    assert mtrag("build-server", "start", env=faulty).returncode == 0
    pid = server_pid()
    tax = mtrag_env["pkg"] / "tax.py"
    tax.write_text(tax.read_text() + '\n\ndef after_kill(x):\n    return x\n')
    died = mtrag("build", env=faulty)
    assert died.returncode == 1
    assert f"the build server (pid {pid}) stopped during the build" in died.stderr, died.stderr
    assert gone(pid)
    status = json.loads(mtrag("status", "--json").stdout)
    assert status["generation"] == 1 and not files_of("shopcart.tax.after_kill")

    # its socket file is left, nobody listens: the next build runs in its own process and converges
    converged = mtrag("build", env=env)
    assert converged.returncode == 0, converged.stderr
    assert "(through the build server" not in converged.stdout
    assert "released 1 run(s) of build processes that died" in converged.stdout
    assert files_of("shopcart.tax.after_kill") == {"src/shopcart/tax.py"}
    assert json.loads(mtrag("status", "--json").stdout)["stale"] == []

    # a server with a short idle timeout leaves by itself, taking its socket and state file along
    assert mtrag("build-server", "start", "--idle-timeout", "1", env=env).returncode == 0
    pid = server_pid()
    assert gone(pid, timeout=60)
    settings = Settings.from_env()
    assert not build_client.socket_path(settings).exists() and not build_client.state_path(settings).exists()
    assert f"build server pid {pid} leaves (idle for 1 s) after 0 build(s)" in build_client.log_path(settings).read_text()


@pytest.mark.unit
def test_the_key_follows_the_code_the_home_and_every_variable_mtrag_reads(tmp_path, monkeypatch):
    for package in ("mtrag_assets", "mtrag_resources"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "m.py").write_text("x = 1\n")
    monkeypatch.setattr(build_client, "_REPO", tmp_path)
    monkeypatch.setenv("MTRAG_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MTRAG_WATCH_NICE", raising=False)
    key = build_client.server_key(Settings.from_env())
    assert build_client.server_key(Settings.from_env()) == key
    monkeypatch.setenv("MTRAG_WATCH_NICE", "3")
    assert build_client.server_key(Settings.from_env()) != key
    monkeypatch.delenv("MTRAG_WATCH_NICE")
    monkeypatch.setenv("MTRAG_BUILD_SERVER", "auto")  # whether a client uses a server, not what it builds
    assert build_client.server_key(Settings.from_env()) == key
    (tmp_path / "mtrag_resources" / "m.py").write_text("x = 22\n")  # an edit of the code
    edited = build_client.server_key(Settings.from_env())
    assert edited != key
    monkeypatch.setenv("MTRAG_HOME", str(tmp_path / "other"))
    assert build_client.server_key(Settings.from_env()) != edited
    # the socket is per home and short enough for AF_UNIX whatever the home's path
    monkeypatch.setenv("MTRAG_HOME", str(tmp_path / ("x" * 200)))
    assert len(str(build_client.socket_path(Settings.from_env()))) < 100


@pytest.mark.unit
def test_the_mode_is_read_from_the_environment_and_a_bad_value_is_named(monkeypatch):
    from mtrag_resources.core.errors import MtragError
    monkeypatch.delenv("MTRAG_BUILD_SERVER")
    assert build_client.mode() == "auto"
    monkeypatch.setenv("MTRAG_BUILD_SERVER", " OFF ")
    assert build_client.mode() == "off"
    monkeypatch.setenv("MTRAG_BUILD_SERVER", "sometimes")
    with pytest.raises(MtragError, match="MTRAG_BUILD_SERVER='sometimes': expected one of auto, use, off"):
        build_client.mode()


@pytest.mark.unit
def test_a_server_spawned_but_not_answering_yet_is_reported_as_warming_up(tmp_path, monkeypatch):
    from mtrag_assets.app.cli import _build_server_line
    from mtrag_resources.core.processes import proc_start
    monkeypatch.setenv("MTRAG_HOME", str(tmp_path))
    settings = Settings.from_env()
    sleeper = subprocess.Popen(["sleep", "30"])  # stands in for a server still importing
    try:
        build_client.spawned_path(settings).write_text(json.dumps({"pid": sleeper.pid,
                                                                   "proc_start": proc_start(sleeper.pid)}))
        assert build_client.status(settings) == {"running": False, "starting": sleeper.pid}
        assert _build_server_line(build_client.status(settings)) == f"build server: warming up (pid {sleeper.pid})"
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
    assert build_client.status(settings) == {"running": False}  # its process gone: nothing starts
    assert _build_server_line({"running": False}) == "build server: not running"


@pytest.mark.unit
def test_a_relay_drops_output_once_the_client_has_gone():
    import socket
    from mtrag_assets.app.build_server import _Relay
    mine, theirs = socket.socketpair()
    relay = _Relay(mine, "o")
    relay.write("one\n")
    assert json.loads(theirs.recv(100)) == {"o": "one\n"}
    theirs.close()
    for _ in range(3):  # the first write after the peer left may still be buffered; then EPIPE
        assert relay.write("two\n") == 4
    assert relay.gone
    mine.close()


@pytest.mark.unit
def test_stop_leaves_a_reused_pid_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("MTRAG_HOME", str(tmp_path))
    settings = Settings.from_env()
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        # a state file naming this pid with another start time: the server it named is gone
        build_client.state_path(settings).write_text(json.dumps({"pid": sleeper.pid, "proc_start": "1"}))
        assert build_client.stop(settings) == {"was_running": False}
        assert sleeper.poll() is None
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()


@pytest.mark.integration
@pytest.mark.neo4j
def test_status_answers_while_a_build_runs_and_a_second_build_waits_its_turn(mtrag_env, stop_server_after):
    assert mtrag("build-server", "start").returncode == 0
    assert mtrag("build").returncode == 0
    settings = Settings.from_env()
    tax = mtrag_env["pkg"] / "tax.py"
    tax.write_text(tax.read_text() + '\n\ndef queued_one(x):\n    return x\n')
    from mtrag_resources.stores.qdrant_store import QdrantStore
    held = QdrantStore(path=settings.qdrant_path)  # the embedded Qdrant's lock: the server's build waits for it
    first = second = None
    try:
        first = subprocess.Popen([MTRAG, "build"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        while not build_client.status(settings).get("building"):
            assert time.monotonic() - t0 < 60 and first.poll() is None, "the build never started"
            time.sleep(0.05)
        t1 = time.monotonic()
        shown = mtrag("build-server", "status")  # answered by the socket's thread, the build still waiting
        assert shown.returncode == 0 and "building, 0 queued" in shown.stdout, shown.stdout
        assert time.monotonic() - t1 < 30 and first.poll() is None
        second = subprocess.Popen([MTRAG, "build"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert second.stdout.readline().startswith("(the build server is busy with another build")
        t0 = time.monotonic()
        while build_client.status(settings).get("queued") != 1:
            assert time.monotonic() - t0 < 30, "the second build was not queued"
            time.sleep(0.05)
    finally:
        held.close()
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0 and "published generation 2 " in out, out + err
    out, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    assert "nothing changed since the published generation" in out  # the first one built it
    assert files_of("shopcart.tax.queued_one") == {"src/shopcart/tax.py"}


@pytest.mark.integration
@pytest.mark.neo4j
def test_build_starts_a_server_for_the_next_build_which_leaves_when_its_home_is_deleted(mtrag_env, stop_server_after):
    """MTRAG_BUILD_SERVER=auto (the default outside the tests): a build in its own process leaves a
    server warming up; the next build waits for it if need be and runs in it; `off` neither uses
    nor starts one; deleting the home ends it."""
    import re
    import shutil
    # as a user types it: DAGSTER_HOME left to its default (the server's own environment holds it)
    auto = {**{k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}, "MTRAG_BUILD_SERVER": "auto"}
    settings = Settings.from_env()
    assert settings.dagster_home == settings.home / "dagster_home"
    first = mtrag("build", env=auto)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stdout.splitlines()[0] == "(building in this process: no build server runs for this home)"
    assert "(through the build server" not in first.stdout and "published generation 1 " in first.stdout
    started = re.search(r"^\(started the build server, pid (\d+), for the next builds", first.stdout, re.M)
    assert started, first.stdout
    pid = int(started.group(1))

    tax = mtrag_env["pkg"] / "tax.py"
    tax.write_text(tax.read_text() + '\n\ndef auto_added(x):\n    return x\n')
    second = mtrag("build", env=auto)  # right away: the server may still be warming up, then it waits
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"(through the build server, pid {pid})" in second.stdout and "published generation 2 " in second.stdout
    assert "not using the build server" not in second.stderr, second.stderr
    assert "started the build server" not in second.stdout
    assert files_of("shopcart.tax.auto_added") == {"src/shopcart/tax.py"}
    assert json.loads(mtrag("build-server", "status", "--json").stdout)["idle_timeout_s"] == \
        build_client.AUTO_IDLE_TIMEOUT_S
    shown = mtrag("status")  # a server nobody started by name is said where the home's state is
    assert shown.returncode == 0 and f"build server: running (pid {pid}, " in shown.stdout, shown.stdout

    tax.write_text(tax.read_text() + '\n\ndef built_alone(x):\n    return x\n')
    alone = mtrag("build", env={**auto, "MTRAG_BUILD_SERVER": "off"})
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert alone.stdout.splitlines()[0] == "(building in this process: MTRAG_BUILD_SERVER=off)"
    assert "(through the build server" not in alone.stdout and "started the build server" not in alone.stdout
    assert "published generation 3 " in alone.stdout and files_of("shopcart.tax.built_alone") == {"src/shopcart/tax.py"}

    # on a published home the server starts beside the build, so it is ready for the next change
    assert mtrag("build-server", "stop").returncode == 0 and gone(pid, timeout=60)
    tax.write_text(tax.read_text() + '\n\ndef beside_it(x):\n    return x\n')
    beside = mtrag("build", env=auto)
    assert beside.returncode == 0, beside.stdout + beside.stderr
    assert beside.stdout.splitlines()[0] == "(building in this process: no build server runs for this home)"
    started = re.search(r"^\(started the build server, pid (\d+), for the next builds: it warms up beside this build",
                        beside.stdout, re.M)
    assert started and "published generation 4 " in beside.stdout, beside.stdout
    pid = int(started.group(1))
    published_at = (settings.manifest_dir / "manifest-4.json").stat().st_mtime
    assert psutil.Process(pid).create_time() < published_at  # started before the build wrote its manifest

    # a deleted home takes its server along (no process lives on for a wiped `data/`)
    shutil.rmtree(settings.home)
    assert gone(pid, timeout=30)
    assert not build_client.socket_path(settings).exists()
