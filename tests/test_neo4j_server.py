"""The local Neo4j launcher: a real JVM under a private home (jars from the shared cache)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mtrag_resources.core import processes
from mtrag_resources.core.config import Settings
from mtrag_resources.stores import neo4j_server
from mtrag_resources.stores.neo4j_server import (
    CACHE_MARKER,
    Neo4jServer,
    Neo4jServerError,
    bolt_answers,
    cache_dir,
    launch_local_server,
    neo4j_connection,
    resolve_jars,
)

REPO = Path(__file__).resolve().parents[1]


def cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("NEO4J_URI", "NEO4J_USER", "NEO4J_PASSWORD")}
    env["MTRAG_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "mtrag_resources.stores.neo4j_server", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.integration
@pytest.mark.neo4j
@pytest.mark.slow  # boots a Neo4j JVM of its own
def test_start_status_stop(tmp_path, monkeypatch):
    monkeypatch.delenv("NEO4J_URI", raising=False)
    settings = Settings(home=tmp_path)
    server = Neo4jServer(settings)
    assert server.status() == {"running": False, "uri": None}
    with pytest.raises(Neo4jServerError, match="not running"):
        neo4j_connection(settings)
    try:
        uri = server.start(timeout=180)
        assert uri.startswith("bolt://127.0.0.1:")
        assert bolt_answers(uri)
        st = server.status()
        assert st == {"running": True, "uri": uri}
        pid = int((settings.neo4j_dir / "run" / "neo4j.pid").read_text())
        assert (settings.neo4j_dir / "run" / "bolt.uri").read_text().strip() == uri
        conf = (settings.neo4j_dir / "conf" / "neo4j.conf").read_text()
        for line in ("server.http.enabled=false", "dbms.security.auth_enabled=false",
                     "dbms.usage_report.enabled=false", f"server.bolt.listen_address=127.0.0.1:{uri.rsplit(':', 1)[1]}"):
            assert line in conf

        # idempotent: same process, same uri
        assert server.start() == uri
        assert int((settings.neo4j_dir / "run" / "neo4j.pid").read_text()) == pid
        assert neo4j_connection(settings) == (uri, None, None)

        # the CLI entry sees the same server
        res = cli(tmp_path, "status", "--json")
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout) == {"running": True, "uri": uri}
        res = cli(tmp_path, "start", "--json")
        assert json.loads(res.stdout) == {"running": True, "uri": uri}

        res = cli(tmp_path, "stop")
        assert res.returncode == 0 and "stopped" in res.stdout
        assert server.status() == {"running": False, "uri": None}
        assert not bolt_answers(uri, timeout=1)
        assert json.loads(cli(tmp_path, "status", "--json").stdout) == {"running": False, "uri": None}
        assert server.stop() is False
        # a restart keeps the port when it is still free
        assert server.start(timeout=180) == uri
        assert server.stop() is True
    finally:
        server.stop()


@pytest.mark.unit
def test_stale_pid_file_is_ignored(tmp_path):
    server = Neo4jServer(Settings(home=tmp_path))
    (server.home / "run").mkdir(parents=True)
    server.pid_file.write_text(f"{os.getpid()}\n")  # alive, but not a Neo4j of this home
    server.uri_file.write_text("bolt://127.0.0.1:1\n")
    assert server.status() == {"running": False, "uri": None}
    assert server.stop() is False  # must not signal the test process
    assert not server.pid_file.exists()


@pytest.mark.unit
def test_a_found_server_is_taken_while_its_pid_file_and_process_stay(tmp_path, monkeypatch):
    """neo4j_connection's memo: the full check (the process's command line) runs once; later calls
    take the URI while the same pid file names a live process, and check fully again after a
    restart (a new pid file), a stop (none) or the process's end."""
    monkeypatch.delenv("NEO4J_URI", raising=False)
    settings = Settings(home=tmp_path)
    server = Neo4jServer(settings)
    (server.home / "run").mkdir(parents=True)
    server.pid_file.write_text(f"{os.getpid()}\n")
    server.uri_file.write_text("bolt://127.0.0.1:7999\n")
    checks = []
    alive = {"pid": os.getpid()}

    def full_check(self):  # Neo4jServer._pid's answer for a server of this home
        checks.append(1)
        return alive["pid"]

    monkeypatch.setattr(Neo4jServer, "_pid", full_check)
    assert neo4j_connection(settings) == ("bolt://127.0.0.1:7999", None, None) and len(checks) == 1
    assert neo4j_connection(settings) == ("bolt://127.0.0.1:7999", None, None) and len(checks) == 1
    time.sleep(0.01)
    server.pid_file.write_text(f"{os.getpid()}\n")  # a restart writes the pid file again
    server.uri_file.write_text("bolt://127.0.0.1:7998\n")
    assert neo4j_connection(settings) == ("bolt://127.0.0.1:7998", None, None) and len(checks) == 2
    ended = subprocess.Popen([sys.executable, "-c", "pass"])  # a child that ends: a zombie until reaped
    for _ in range(200):
        if not processes.alive(ended.pid):
            break
        time.sleep(0.05)
    neo4j_server._RUNNING[str(server.home)] = (neo4j_server._pid_file_identity(server), ended.pid, "bolt://gone:1")
    assert neo4j_connection(settings)[0] == "bolt://127.0.0.1:7998" and len(checks) == 3  # ended: checked
    ended.wait()
    server.pid_file.unlink()  # stopped
    alive["pid"] = None
    with pytest.raises(Neo4jServerError, match="not running"):
        neo4j_connection(settings)
    assert len(checks) == 4 and str(server.home) not in neo4j_server._RUNNING


@pytest.mark.unit
def test_env_uri_wins_and_starts_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("NEO4J_URI", "neo4j://db.example:7687")
    monkeypatch.setenv("NEO4J_USER", "reader")
    monkeypatch.setenv("NEO4J_PASSWORD", "secret")
    settings = Settings(home=tmp_path)
    assert neo4j_connection(settings, start=True) == ("neo4j://db.example:7687", "reader", "secret")
    assert not settings.neo4j_dir.exists()


@pytest.mark.integration
@pytest.mark.neo4j  # the jars that starting the suite's Neo4j resolved into the cache
def test_cached_jars_need_no_maven(monkeypatch):
    lib = resolve_jars()  # already resolved by the fixtures / the test above
    monkeypatch.setenv("MTRAG_MVN", "/nonexistent/mvn")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert resolve_jars() == lib
    assert (cache_dir() / CACHE_MARKER).is_file()
    jars = {p.name for p in lib.glob("*.jar")}
    assert any(j.startswith("neo4j-bolt-") for j in jars) and any(j.startswith("neo4j-5.") for j in jars)


@pytest.mark.integration
@pytest.mark.neo4j
@pytest.mark.slow  # boots a Neo4j JVM of its own
def test_launch_returns_before_bolt_and_the_first_connection_waits(tmp_path, monkeypatch):
    """A build launches the server and goes on chunking and embedding; the first step that needs the
    graph waits for Bolt. A launch that cannot boot is reported with its log when first needed."""
    monkeypatch.delenv("NEO4J_URI", raising=False)
    settings = Settings(home=tmp_path)
    server = Neo4jServer(settings)
    waited = []  # every wait for Bolt goes through Neo4jServer._wait_bolt
    real_wait = Neo4jServer._wait_bolt

    def spy(self, uri, *args, **kwargs):
        waited.append(uri)
        return real_wait(self, uri, *args, **kwargs)

    monkeypatch.setattr(Neo4jServer, "_wait_bolt", spy)
    try:
        launch_local_server(settings)
        assert server.status()["running"]
        uri = server.status()["uri"]
        assert waited == []  # the launch waited for nothing: the JVM boots in the background
        assert neo4j_connection(settings) == (uri, None, None)
        assert waited == [uri]  # the first connection waited for Bolt, once
        assert bolt_answers(uri)
        launch_local_server(settings)  # running: nothing new
        assert neo4j_connection(settings) == (uri, None, None)
    finally:
        server.stop()

    broken = Settings(home=tmp_path / "broken")
    monkeypatch.setenv("MTRAG_NEO4J_HEAP", "12zz")  # the JVM refuses it and exits
    launch_local_server(broken)
    with pytest.raises(Neo4jServerError, match="exited with code"):
        neo4j_connection(broken)
    assert Neo4jServer(broken).status() == {"running": False, "uri": None}


@pytest.mark.unit
def test_memory_settings_reach_the_server_conf(tmp_path, monkeypatch):
    server = Neo4jServer(Settings(home=tmp_path))
    server.write_conf(7687)
    conf = server.conf_file.read_text()
    assert "server.memory.pagecache.size=64m" in conf and "server.memory.heap.max_size=1g" in conf
    monkeypatch.setenv("MTRAG_NEO4J_PAGECACHE", "512m")  # a graph whose store files outgrow 64 MB
    monkeypatch.setenv("MTRAG_NEO4J_HEAP", "2g")
    server = Neo4jServer(Settings(home=tmp_path))
    server.write_conf(7687)
    conf = server.conf_file.read_text()
    assert "server.memory.pagecache.size=512m" in conf and "server.memory.heap.max_size=2g" in conf
