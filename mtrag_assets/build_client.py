"""`mtrag build` through a build server, and `mtrag build-server start | stop | status`: the client
side, which imports no Dagster (the point is not to pay for it).

A build server (build_server.py) is one long-lived process per MTRAG_HOME that has paid a fresh
`mtrag build`'s fixed costs once: the imports (~1.6 s: Dagster, SQLAlchemy, pyarrow), the loaded
embedder, the stages' decoded facts and tables and the code graph's last resolution (the watch's
memos, stages/warm.py), a Neo4j driver. `mtrag build` finds it by its Unix socket and hands it the
command line; the server runs the very same command (`cli.main`: the same Dagster runs, recorded
in the same instance, the same gate) and streams its output and exit code back. Where no server
runs, or one runs another code tree or other settings (server_key), the build runs in the calling
process as before. Like Gradle's daemon or dmypy, it is opt-in and leaves by itself after an idle
timeout.

Wire format: one JSON object per line each way. The client sends {"op": "build", "key", "argv",
"cwd"}, {"op": "ping"} or {"op": "stop"}; to a build the server answers {"accepted": pid} or
{"refused": why}, then {"o": text} / {"e": text} as the build prints to stdout / stderr, then
{"exit": code}."""
from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mtrag_resources.core.config import ENVIRONMENT, Settings, env
from mtrag_resources.core.errors import MtragError
from mtrag_resources.core.processes import alive

DEFAULT_IDLE_TIMEOUT_S = 1800
READY_TIMEOUT_S = 600  # a first start resolves Neo4j's jars and exports the ONNX model
WAIT_NOTICE_S = 1.0  # no answer to a build request this long: the server is running another build
_PACKAGES = ("mtrag_assets", "mtrag_resources")
_REPO = Path(__file__).resolve().parents[1]


def socket_path(settings: Settings) -> Path:
    """The server's socket for this home: under the temp folder, since a Unix socket's path is
    limited to 107 bytes and a home's path is not."""
    digest = hashlib.sha256(str(settings.home).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"mtrag-{os.getuid()}" / f"build-{digest}.sock"


def state_path(settings: Settings) -> Path:
    """{pid, socket, key, started, idle_timeout_s} of the home's running server (build_server.py)."""
    return settings.home / "build-server.json"


def log_path(settings: Settings) -> Path:
    return settings.home / "build-server.log"


def code_digest() -> str:
    """The mtrag code this interpreter would run: every module's path, size and mtime (~1 ms). A
    server started before an edit or a checkout is not used by a client after it."""
    h = hashlib.sha256(sys.executable.encode())
    for package in _PACKAGES:
        for path in sorted((_REPO / package).rglob("*.py")):
            st = path.stat()
            h.update(f"{path.relative_to(_REPO)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:24]


def server_key(settings: Settings) -> str:
    """What a build depends on besides the sources' files: the code, the home's paths (resolved
    here, so a relative MTRAG_HOME means the same folder to both) and every variable mtrag reads
    (config.ENVIRONMENT). A client uses a server only when the keys are equal."""
    values = {name: env(name) for name in sorted(ENVIRONMENT)}
    values.update(home=str(settings.home), sources=str(settings.sources_file),
                  dagster_home=str(settings.dagster_home), code=code_digest())
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:24]


def send_line(conn: socket.socket, message: dict) -> None:
    conn.sendall(json.dumps(message, ensure_ascii=False).encode() + b"\n")


def read_lines(conn: socket.socket):
    """The JSON objects the peer sends, until it closes the connection."""
    buffer = b""
    while True:
        data = conn.recv(65536)
        if not data:
            return
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield json.loads(line)


def _connect(settings: Settings, timeout: float | None = 2.0) -> socket.socket | None:
    path = socket_path(settings)
    if not path.exists():
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(str(path))
    except OSError:  # a socket file left by a killed server: nobody listens
        conn.close()
        return None
    return conn


def _ask(settings: Settings, message: dict, timeout: float = 5.0) -> dict | None:
    """One request answered by one line; None where no server answers."""
    conn = _connect(settings, timeout)
    if conn is None:
        return None
    try:
        send_line(conn, message)
        return next(read_lines(conn), None)
    except (OSError, ValueError):
        return None
    finally:
        conn.close()


def _until_reset(messages):
    """`messages` until they end or the connection is reset (a server that died mid-line)."""
    try:
        yield from messages
    except (OSError, ValueError):
        return


def build_through_server(settings: Settings, argv: list[str]) -> int | None:
    """Run `mtrag build <argv>` in the home's build server, its output printed here as it comes;
    the exit code, or None where no server for these settings and this code answers (the caller
    builds in its own process). Interrupting the client does not stop the build the server runs."""
    conn = _connect(settings, timeout=None)
    if conn is None:
        return None
    try:
        send_line(conn, {"op": "build", "key": server_key(settings), "argv": argv, "cwd": os.getcwd()})
        if not select.select([conn], [], [], WAIT_NOTICE_S)[0]:
            print("(the build server is busy with another build; this one waits for it)", flush=True)
        replies = _until_reset(read_lines(conn))
        first = next(replies, None)
        if first is None:
            return None  # it stopped between our connect and its answer
        if "refused" in first:
            print(f"mtrag: not using the build server (pid {first.get('pid')}): {first['refused']}; "
                  "building in this process", file=sys.stderr, flush=True)
            return None
        pid = first["accepted"]
        print(f"(through the build server, pid {pid})", flush=True)
        for message in replies:
            if "o" in message:
                sys.stdout.write(message["o"])
                sys.stdout.flush()
            elif "e" in message:
                sys.stderr.write(message["e"])
                sys.stderr.flush()
            elif "exit" in message:
                return int(message["exit"])
        print(f"mtrag: the build server (pid {pid}) stopped during the build; the next build converges "
              "what it left (its runs are marked failed)", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("mtrag: interrupted; the build server finishes the build it started "
              "(`mtrag build-server stop` stops it after that build)", file=sys.stderr, flush=True)
        return 130
    finally:
        conn.close()


def _state(settings: Settings) -> dict:
    try:
        return json.loads(state_path(settings).read_text())
    except (OSError, ValueError):
        return {}


def status(settings: Settings) -> dict:
    """{running, pid, builds, building (one runs now), queued, idle_s, idle_timeout_s, usable (its key
    equals this client's)}."""
    answer = _ask(settings, {"op": "ping"})
    if answer is None:
        return {"running": False}
    return {"running": True, "pid": answer["pid"], "builds": answer["builds"], "building": answer["building"],
            "queued": answer["queued"], "idle_s": answer["idle_s"], "idle_timeout_s": answer["idle_timeout_s"],
            "usable": answer["key"] == server_key(settings)}


def start(settings: Settings, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
          timeout: float = READY_TIMEOUT_S) -> dict:
    """Start the home's build server in the background (its output in build-server.log) and wait
    until it answers; a running one is reported, not doubled."""
    now = status(settings)
    if now["running"]:
        return {**now, "started": False}
    log = log_path(settings)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "mtrag_assets.cli", "build-server", "run",
                                 "--idle-timeout", str(idle_timeout_s)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=os.getcwd())
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        now = status(settings)
        if now["running"]:
            return {**now, "started": True, "ready_s": round(time.monotonic() - t0, 1)}
        if proc.poll() is not None:
            now = status(settings)
            if now["running"]:  # another start's server won the home's lock
                return {**now, "started": False}
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise MtragError(f"the build server exited with code {proc.returncode} before it was ready "
                             f"(see {log}): {' | '.join(tail)}")
        time.sleep(0.2)
    proc.terminate()
    raise MtragError(f"the build server was not ready after {timeout:.0f} s (see {log}); stopped it")


def stop(settings: Settings, timeout: float = 120.0) -> dict:
    """Ask the server to leave (after the build it runs, if any) and wait until it has; one that
    no longer answers (stopped with SIGSTOP, hung) gets SIGTERM, then SIGKILL: the process the
    state file names, by pid and start time (a reused pid is left alone)."""
    state = _state(settings)
    pid, start_ticks = int(state.get("pid") or 0), state.get("proc_start", "")
    answer = _ask(settings, {"op": "stop"}, timeout=timeout)
    if not pid or not alive(pid, start_ticks):
        return {"was_running": answer is not None}
    deadline = time.monotonic() + (timeout if answer is not None else 0)
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + 10
        while time.monotonic() < deadline and alive(pid, start_ticks):
            time.sleep(0.05)
        if not alive(pid, start_ticks):
            break
    return {"was_running": True, "pid": pid}
