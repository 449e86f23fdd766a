"""`python -m mtrag_assets.app.dagster_dev`: real `dagster dev` (webserver, daemon, code servers) on
a private instance, stopped by Ctrl-C the way a terminal sends it (SIGINT to the foreground
process group), exits within seconds and leaves no process of its session behind, even where
Dagster's own shutdown hangs: its telemetry upload (on in an instance without mtrag's
dagster.yaml) posts without a timeout, so a telemetry host that never answers (a firewall that
drops packets) holds the webserver and the daemon past their shutdown; `dagster dev` waits 60 s
for each before it kills them."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from mtrag_assets.app.dagster_dev import dagster_dev_command, session_pids

ON_LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads sessions from /proc")

REPO = Path(__file__).resolve().parents[1]
EXIT_WITHIN_S = 15
LOCATIONS = "{ workspaceOrError { ... on Workspace { locationEntries { loadStatus } } } }"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loaded(base: str) -> bool:
    req = urllib.request.Request(f"{base}/graphql", data=json.dumps({"query": LOCATIONS}).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            entries = json.load(resp)["data"]["workspaceOrError"]["locationEntries"]
    except (OSError, KeyError, TypeError, ValueError):
        return False
    return bool(entries) and all(e["loadStatus"] == "LOADED" for e in entries)


def _child_pids(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


@pytest.fixture
def silent_server():
    """A TCP port that accepts connections and never answers (its port)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()
    for conn in held:
        conn.close()


@pytest.mark.unit
def test_the_command_is_dagster_dev_over_the_workspace_unless_told_otherwise():
    dagster = str(Path(sys.executable).with_name("dagster"))
    assert dagster_dev_command(["-p", "3001"]) == [dagster, "dev", "-w", "workspace.yaml", "-p", "3001"]
    assert dagster_dev_command(["-m", "pkg.defs"]) == [dagster, "dev", "-m", "pkg.defs"]
    assert dagster_dev_command(["--workspace=other.yaml"]) == [dagster, "dev", "--workspace=other.yaml"]


@pytest.mark.integration
@pytest.mark.slow
@ON_LINUX
def test_ctrl_c_ends_dagster_dev_within_seconds_and_leaves_nothing(tmp_path, silent_server):
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "dagster_home"), "MTRAG_HOME": str(tmp_path / "home"),
           "MTRAG_SOURCES": str(tmp_path / "no-sources.yaml"),  # the sensors skip: nothing is built
           "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO),
           # an empty DAGSTER_HOME: telemetry on, uploaded at once to a host that never answers
           "DAGSTER_TELEMETRY_URL": f"http://127.0.0.1:{silent_server}/actions"}
    env.pop("DAGSTER_DISABLE_TELEMETRY", None)
    (tmp_path / "dagster_home").mkdir()
    log = tmp_path / "dagster_dev.log"
    with open(log, "wb") as out:
        # A session of its own, as a terminal's foreground job: Ctrl-C is SIGINT to its process group.
        launcher = subprocess.Popen([sys.executable, "-m", "mtrag_assets.app.dagster_dev", "-h", "127.0.0.1",
                                     "-p", str(port)], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
    dev_session = None
    try:
        deadline = time.monotonic() + 240
        while not _loaded(base):
            assert launcher.poll() is None, f"exited {launcher.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"not loaded:\n{log.read_text()[-3000:]}"
            time.sleep(1)
        time.sleep(5)  # the daemon's sensors take their first ticks
        (dev_session,) = _child_pids(launcher.pid)  # dagster dev, leader of its own session
        assert len(session_pids(dev_session)) >= 4  # dagster dev, webserver, daemon, a code server

        t0 = time.monotonic()
        os.killpg(launcher.pid, signal.SIGINT)
        launcher.wait(timeout=60)
        took = time.monotonic() - t0
        assert launcher.returncode == 0, log.read_text()[-3000:]
        assert took < EXIT_WITHIN_S, f"exited {took:.1f} s after Ctrl-C:\n{log.read_text()[-3000:]}"
        assert session_pids(dev_session) == [], "processes of dagster dev's session outlived it"
    finally:
        for group in (launcher.pid, dev_session):
            for pid in session_pids(group) if group else []:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=10)


STUCK = """
import signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a dagster dev that does not stop, and a child that ignores it too
subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(300)"])
print("ready", flush=True)
time.sleep(300)
"""


@pytest.mark.integration  # real processes and signals
@ON_LINUX
def test_stop_ends_a_session_that_ignores_sigint_within_its_bounds(monkeypatch):
    """What Dagster's own shutdown cannot promise (it waits up to a minute for a webserver or
    daemon, and leaves a code server it restarted): stop() ends the whole session, SIGINT first,
    SIGKILL after GRACE_S + LEFTOVER_S."""
    from mtrag_assets.app import dagster_dev
    monkeypatch.setattr(dagster_dev, "GRACE_S", 1.0)
    monkeypatch.setattr(dagster_dev, "LEFTOVER_S", 1.0)
    proc = subprocess.Popen([sys.executable, "-c", STUCK], start_new_session=True, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while len(session_pids(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(session_pids(proc.pid)) == 2
        lines: list[str] = []
        t0 = time.monotonic()
        dagster_dev.stop(proc, log=lines.append)
        assert time.monotonic() - t0 < 5
        assert proc.returncode == -signal.SIGKILL and session_pids(proc.pid) == []
        assert lines == ["mtrag: dagster dev did not exit within 1 s of SIGINT; stopping its processes"]
    finally:
        for pid in session_pids(proc.pid):
            os.kill(pid, signal.SIGKILL)
