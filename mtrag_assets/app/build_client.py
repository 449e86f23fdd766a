"""`mtrag build` through a build server, and `mtrag build-server start | stop | status`: the client
side, which imports no Dagster (the point is not to pay for it). The server and when it is used:
docs/build-server.md.

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
from mtrag_resources.core.atomic import write_text_atomic
from mtrag_resources.core.processes import alive, proc_start

DEFAULT_IDLE_TIMEOUT_S = 1800
AUTO_IDLE_TIMEOUT_S = 900  # a server nobody asked for by name leaves sooner
MODES = ("auto", "use", "off")
READY_TIMEOUT_S = 600  # a first start resolves Neo4j's jars and exports the ONNX model
WAIT_NOTICE_S = 1.0  # no answer to a build request this long: the server is running another build
_PACKAGES = ("mtrag_assets", "mtrag_resources")
_NOT_IN_KEY = ("MTRAG_BUILD_SERVER",)  # whether a client uses a server, not what a build does
# Variables that name paths: the key holds the paths they resolve to (Settings), not their raw
# values, so a server whose environment holds DAGSTER_HOME (a build sets it for Dagster) serves a
# shell that leaves it to the default.
_RESOLVED_IN_KEY = ("MTRAG_HOME", "MTRAG_SOURCES", "MTRAG_GOLDEN", "DAGSTER_HOME")
_REPO = Path(__file__).resolve().parents[1]


def socket_path(settings: Settings) -> Path:
    """The server's socket for this home: under the temp folder, since a Unix socket's path is
    limited to 107 bytes and a home's path is not."""
    digest = hashlib.sha256(str(settings.home).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"mtrag-{os.getuid()}" / f"build-{digest}.sock"


def state_path(settings: Settings) -> Path:
    """{pid, socket, key, started, idle_timeout_s} of the home's running server (build_server.py)."""
    return settings.home / "build-server.json"


def spawned_path(settings: Settings) -> Path:
    """{pid, proc_start} of a server `mtrag build` spawned that has not taken the lock yet (its
    imports take a second or two): a build meanwhile waits for it rather than building beside it."""
    return settings.home / "build-server.spawned"


def log_path(settings: Settings) -> Path:
    return settings.home / "build-server.log"


def lock_path(settings: Settings) -> Path:
    """The server's single-instance lock; the server leaves once this file is gone or replaced
    (its home deleted, or wiped and made again)."""
    return settings.home / "build-server.lock"


def mode() -> str:
    """MTRAG_BUILD_SERVER: auto (use a running server, start one after a build without), use, off."""
    value = env("MTRAG_BUILD_SERVER", "auto").strip().lower()
    if value not in MODES:
        raise MtragError(f"MTRAG_BUILD_SERVER={value!r}: expected one of {', '.join(MODES)}")
    return value


def code_digest() -> str:
    """The mtrag code this interpreter would run: every module's path, size and mtime (cheap). A
    server started before an edit or a checkout is not used by a client after it."""
    h = hashlib.sha256(sys.executable.encode())
    for package in _PACKAGES:
        for path in sorted((_REPO / package).rglob("*.py")):
            st = path.stat()
            h.update(f"{path.relative_to(_REPO)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:24]


def server_key_parts(settings: Settings) -> dict[str, str]:
    """What a build depends on besides the sources' files, each part a short digest: the code, the
    home's paths (resolved here, so a relative MTRAG_HOME, or DAGSTER_HOME left to its default,
    means the same folder to both) and every other variable mtrag reads (config.ENVIRONMENT)."""
    values = {name: env(name) for name in sorted(ENVIRONMENT) if name not in _NOT_IN_KEY + _RESOLVED_IN_KEY}
    values.update(home=str(settings.home), sources=str(settings.sources_file), golden=str(settings.golden_file),
                  dagster_home=str(settings.dagster_home), code=code_digest())
    return {name: hashlib.sha256(value.encode()).hexdigest()[:12] for name, value in values.items()}


def server_key(settings: Settings) -> str:
    """server_key_parts in one digest: a client uses a server only when the keys are equal."""
    return hashlib.sha256(json.dumps(server_key_parts(settings), sort_keys=True).encode()).hexdigest()[:24]


def differing_parts(mine: dict, theirs: dict) -> list[str]:
    """The names of the key parts two sides disagree on (a refusal names them)."""
    return sorted(name for name in set(mine) | set(theirs) if mine.get(name) != theirs.get(name))


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
    builds in its own process). A server still warming up is waited for (a build beside its
    warm-up would wait for the stores it opens anyway). Interrupting the client does not stop the
    build the server runs."""
    conn = _connect(settings, timeout=None)
    if conn is None and _starting_pid(settings):
        print("(the build server is warming up; this build waits for it)", flush=True)
        conn = _wait_for_socket(settings, READY_TIMEOUT_S)
    if conn is None:
        print("(building in this process: no build server runs for this home)", flush=True)
        return None
    try:
        send_line(conn, {"op": "build", "key": server_key(settings), "parts": server_key_parts(settings),
                         "argv": argv, "cwd": os.getcwd()})
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


def _state(settings: Settings, path: Path | None = None) -> dict:
    try:
        return json.loads((path or state_path(settings)).read_text())
    except (OSError, ValueError):
        return {}


def _starting_pid(settings: Settings) -> int | None:
    """The pid of a server of this home that does not answer yet: spawned and still importing, or
    holding the lock and warming up."""
    state = _state(settings)
    if state.get("state") != "starting":
        state = _state(settings, spawned_path(settings))
    pid = int(state.get("pid") or 0)
    if pid and alive(pid, state.get("proc_start", "")):
        return pid
    return None


def _wait_for_socket(settings: Settings, timeout: float) -> socket.socket | None:
    """A connection to the server once it answers; None if it leaves (or takes `timeout`) first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conn = _connect(settings, timeout=None)
        if conn is not None:
            return conn
        if not _starting_pid(settings):
            return _connect(settings, timeout=None)  # it may have become ready just now
        time.sleep(0.1)
    return None


def status(settings: Settings) -> dict:
    """{running, pid, builds, building (one runs now), queued, warming (built sources whose memos it
    has yet to warm between builds), idle_s, idle_timeout_s, session (entries per cache it keeps),
    usable (its key equals this client's)};
    {running: false, starting: pid} for one still starting."""
    answer = _ask(settings, {"op": "ping"})
    if answer is None:
        starting = _starting_pid(settings)
        return {"running": False, **({"starting": starting} if starting else {})}
    return {"running": True, "pid": answer["pid"], "builds": answer["builds"], "building": answer["building"],
            "queued": answer["queued"], "warming": answer.get("warming", 0), "idle_s": answer["idle_s"],
            "idle_timeout_s": answer["idle_timeout_s"], "session": answer.get("session") or {},
            "usable": answer["key"] == server_key(settings)}


def start(settings: Settings, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
          timeout: float = READY_TIMEOUT_S) -> dict:
    """Start the home's build server in the background (its output in build-server.log) and wait
    until it answers; a running one is reported, not doubled."""
    now = status(settings)
    if now["running"]:
        return {**now, "started": False}
    proc = None if _starting_pid(settings) else _spawn(settings, idle_timeout_s)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        now = status(settings)
        if now["running"]:
            return {**now, "started": proc is not None, "ready_s": round(time.monotonic() - t0, 1)}
        if proc is None:
            if not _starting_pid(settings):  # the one that was warming up left
                proc = _spawn(settings, idle_timeout_s)
        elif proc.poll() is not None:
            now = status(settings)
            if now["running"]:  # another start's server won the home's lock
                return {**now, "started": False}
            if _starting_pid(settings):  # another start's server won the lock and warms up
                proc = None
                continue
            log = log_path(settings)
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise MtragError(f"the build server exited with code {proc.returncode} before it was ready "
                             f"(see {log}): {' | '.join(tail)}")
        time.sleep(0.2)
    if proc is not None:
        proc.terminate()
    raise MtragError(f"the build server was not ready after {timeout:.0f} s (see {log_path(settings)}); "
                     "stopped it")


def start_in_background(settings: Settings) -> int | None:
    """After a build in its own process (MTRAG_BUILD_SERVER=auto): start the home's server for the
    next build without waiting for its warm-up; its pid, or None where one runs or warms up."""
    if _starting_pid(settings):
        return None
    conn = _connect(settings)
    if conn is not None:
        conn.close()
        return None
    pid = _spawn(settings, AUTO_IDLE_TIMEOUT_S).pid
    write_text_atomic(spawned_path(settings), json.dumps({"pid": pid, "proc_start": proc_start(pid)}))
    return pid


def _spawn(settings: Settings, idle_timeout_s: float) -> subprocess.Popen:
    """`mtrag build-server run` in its own session, its output appended to build-server.log."""
    log = log_path(settings)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "mtrag_assets.app.cli", "build-server", "run",
                                 "--idle-timeout", str(idle_timeout_s)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=os.getcwd())


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
