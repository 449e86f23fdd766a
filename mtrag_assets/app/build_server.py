"""`mtrag build-server run`: the home's build server (build_client.py says what it is for and the
wire format). One process per MTRAG_HOME (a lock file), ready once its imports, embedder and graph
driver are loaded (each built source's memos are warmed between builds, one source at a time, so a
build never waits for the whole warm-up), then one build at a time (a
thread answers the socket: `status` and `stop` while a build runs; builds queue): each request runs
`mtrag build` (build_command.run_request) in this process with stdout and stderr relayed to the
client, so a build through the server is the same Dagster runs, gate and output as one without.
Runs carry this process's pid in their tags: a server killed mid-build leaves runs that the next
build marks failed (runner.release_dead_runs) and markers it converges, as for a killed `mtrag
build`. SIGTERM / SIGINT and `mtrag build-server stop` end it between builds; so does the idle
timeout, and so does the deletion of its home (the lock file gone or replaced: a test's temporary
home, a wiped `data/`)."""
from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable

from mtrag_resources.core.atomic import write_text_atomic
from mtrag_resources.core.config import Settings
from mtrag_resources.core.errors import MtragError
from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.core.processes import proc_start
from mtrag_resources.core.session import current_session, new_session
from mtrag_resources.publish.build_state import source_busy
from mtrag_resources.stores.connect import close_kept_neo4j_drivers, close_parked_qdrant, forget_neo4j_schemas
from mtrag_resources.stores.tables import table_exists

from mtrag_assets.app import build_client
from mtrag_assets.app.build_command import BuildProcess, run_request
from mtrag_assets.app.watch import KEEP_QDRANT_OPEN_S, LOOP_TICK_MS

ACCEPT_POLL_S = 0.5  # how often the accept thread looks at the stop flag (the build loop: every LOOP_TICK_MS)
REQUEST_TIMEOUT_S = 10.0  # a client has this long to send its request line


class _Relay:
    """A text stream whose writes go to the client as {"o"|"e": text} lines, one line whole however
    many threads print (`lock`, shared by a connection's streams). Once the client has gone
    (interrupted), writes are dropped: the build goes on and ends as it would have."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, conn: socket.socket, channel: str, lock: threading.Lock | None = None):
        self.conn, self.channel, self.gone = conn, channel, False
        self.lock = lock or threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            if text and not self.gone:
                try:
                    build_client.send_line(self.conn, {self.channel: text})
                except OSError:
                    self.gone = True
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True


def warm(settings: Settings, log) -> list[tuple[list[str], Callable[[], None]]]:
    """A fresh build's one-time costs, paid before the first request: the imports, the embedder,
    the local Neo4j (launched when no NEO4J_URI names one) and a kept driver. Returns the rest, one
    step per built source (its stage memos and its Neo4j plans and pages: stages/warm.py,
    fast_lane.warm_up), each with the sources no other process may be building while it runs
    (the graph's rehearsals; the `mtrag build` that started the server may still run), which the
    server takes between requests: a build that comes meanwhile waits for one step at most, not
    for the whole warm-up."""
    from mtrag_assets.app.build_command import load_specs
    from mtrag_assets.fast_lane import warm_up
    from mtrag_assets.resources import MtragResource
    from mtrag_assets.runner import dagster_instance
    from mtrag_resources.ingest.code_graph import keep_resolutions
    from mtrag_resources.stages.cross_source_links import keep_link_resolutions
    from mtrag_resources.stores.connect import keep_neo4j_drivers
    from mtrag_resources.stores.neo4j_server import launch_local_server
    specs = load_specs(settings)
    launch_local_server(settings)
    dagster_instance(settings, log=log)
    MtragResource().embedder().encode(["mtrag build server warm-up"])
    warm_up()  # the ephemeral instance and one context
    keep_neo4j_drivers()  # one driver and its pooled connections for every build of this process
    keep_resolutions()  # every build records what its resolutions read, for the next one to reuse
    keep_link_resolutions()
    built = [s.id for s in specs if table_exists(SourceLayout(settings, s.id).nodes)]
    return [*(([], functools.partial(_warm_memos, settings, sid, specs)) for sid in built),
            ([], functools.partial(_warm_links, settings, specs)),
            *(([sid], functools.partial(_warm_graph, settings, sid)) for sid in built)]


def _warm_memos(settings: Settings, source_id: str, specs: list) -> None:
    """One built source's stage memos. Read beside a build of that source by another process too:
    its tables are replaced whole, and this server's first build reads again the ones it replaced.
    A failure is the next build's to meet and report (a source whose tables went)."""
    from mtrag_resources.stages.warm import warm_stage_memos
    with contextlib.suppress(Exception):
        warm_stage_memos(settings, [source_id], specs, links=False)


def _warm_graph(settings: Settings, source_id: str) -> None:
    """One built source's Neo4j plans and pages: rehearsed transactions, so never beside a build
    of that source (see serve's loop), whose writes they would wait for."""
    from mtrag_resources.stores.connect import open_neo4j
    with contextlib.suppress(Exception), open_neo4j(settings) as store:
        store.warm_up([source_id])


def _warm_links(settings: Settings, specs: list) -> None:
    """The links stage's resolutions of every published source (its first run would resolve every reference)."""
    from mtrag_resources.stages.warm import warm_stage_memos
    with contextlib.suppress(Exception):
        warm_stage_memos(settings, [], specs)


def serve(settings: Settings, idle_timeout_s: float, log=print) -> int:
    """Hold the home's lock, warm up, answer requests until stopped or idle; 0 on a clean stop."""
    lock = _take_lock(settings)
    state = {"pid": os.getpid(), "proc_start": proc_start(os.getpid()), "state": "starting"}
    write_text_atomic(build_client.state_path(settings), json.dumps(state))  # a client waits for the warm-up
    session = new_session()  # what the builds keep for the next one, closed as the server leaves
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    t0 = time.monotonic()
    # Its runs carry its pid (the UI filters the server's runs by it); the embedded Qdrant stays open
    # from one build to the next (an opening is a build's fixed cost), as in the watch: closed once
    # another process waits for its lock, or after KEEP_QDRANT_OPEN_S.
    process = BuildProcess(tags={"mtrag/build_server": str(os.getpid())}, keep_qdrant=True)
    warm_steps = warm(settings, log)
    key, parts = build_client.server_key(settings), build_client.server_key_parts(settings)
    path = build_client.socket_path(settings)
    listener = _listen(path)
    bound = path.stat().st_ino
    state.update(state="ready", socket=str(path), key=key, started=time.time(), idle_timeout_s=idle_timeout_s)
    write_text_atomic(build_client.state_path(settings), json.dumps(state))
    build_client.spawned_path(settings).unlink(missing_ok=True)  # `mtrag build`'s note of this start
    log(f"build server pid {os.getpid()} ready in {time.monotonic() - t0:.1f} s at {path} "
        f"(idle timeout {idle_timeout_s:g} s; {len(warm_steps)} source(s) to warm up between builds)")
    counts = {"builds": 0, "last": time.monotonic(), "building": False, "warming": len(warm_steps)}
    home_gone = False
    queued: queue.Queue = queue.Queue()
    answering = threading.Thread(target=_answer, name="mtrag-build-server-accept", daemon=True,
                                 args=(listener, key, parts, idle_timeout_s, counts, queued, stop))
    answering.start()
    try:
        while not stop.is_set():
            if warm_steps and queued.empty() and not any(source_busy(settings, sid) for sid in warm_steps[0][0]):
                warm_steps.pop(0)[1]()
                counts["warming"] = len(warm_steps)
                continue
            try:
                conn, request = queued.get(timeout=LOOP_TICK_MS / 1000)
            except queue.Empty:
                close_parked_qdrant(idle_s=KEEP_QDRANT_OPEN_S)
                if time.monotonic() - counts["last"] >= idle_timeout_s and queued.empty():
                    break
                if not _holds(lock, build_client.lock_path(settings)):
                    home_gone = True
                    break
                continue
            with conn:
                counts["builds"] += 1
                counts["building"] = True
                try:
                    _build(conn, request, process, log)
                finally:
                    counts["building"] = False
                    counts["last"] = time.monotonic()
    finally:
        idle = not stop.is_set()
        stop.set()
        listener.close()
        answering.join(timeout=5)
        while not queued.empty():  # builds that came as it left: their clients build themselves
            queued.get_nowait()[0].close()
        if _inode(path) == bound:  # not a socket a server of a remade home has bound since
            path.unlink(missing_ok=True)
        if not home_gone:
            build_client.state_path(settings).unlink(missing_ok=True)
        close_parked_qdrant()
        close_kept_neo4j_drivers()
        session.close()
        why = ("its home was deleted" if home_gone else f"idle for {idle_timeout_s:g} s" if idle else "stopped")
        log(f"build server pid {os.getpid()} leaves ({why}) after {counts['builds']} build(s)")
    return 0


def _take_lock(settings: Settings):
    """The home's single-server lock, held open for the server's life; refused when another holds it."""
    settings.home.mkdir(parents=True, exist_ok=True)
    lock = open(build_client.lock_path(settings), "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise MtragError(f"a build server already runs for MTRAG_HOME={settings.home} "
                         f"(mtrag build-server status)") from None
    return lock


def _listen(path) -> socket.socket:
    """The server's Unix socket at `path`, in a folder only this user owns."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.parent.stat().st_uid != os.getuid():  # another user's folder: they could listen in our place
        raise MtragError(f"{path.parent} belongs to another user; the build server's socket cannot go there")
    path.unlink(missing_ok=True)  # a killed server's: the lock says none runs
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(8)
    listener.settimeout(ACCEPT_POLL_S)
    return listener


def _inode(path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _holds(lock, path) -> bool:
    """Whether the lock file this server holds is still the home's (not deleted, not replaced)."""
    st = os.fstat(lock.fileno())
    try:
        now = os.stat(path)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


def _answer(listener: socket.socket, key: str, parts: dict, idle_timeout_s: float, counts: dict,
            queued: queue.Queue, stop: threading.Event) -> None:
    """The socket's side, on its own thread so that `status` and `stop` are answered while a build
    runs: ping and stop at once, a build request of this key queued for the main thread (builds
    run one at a time, in the order they came), any other refused."""
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        except OSError:  # the listener was closed: the server leaves
            return
        request = _request(conn)
        op = request.get("op") if request else None
        try:
            if op == "build" and request.get("key") == key:
                queued.put((conn, request))
                continue
            if op == "ping":
                build_client.send_line(conn, {"pid": os.getpid(), "key": key, "builds": counts["builds"],
                                              "building": counts["building"], "queued": queued.qsize(),
                                              "warming": counts["warming"],
                                              "idle_s": 0.0 if counts["building"] else
                                              round(time.monotonic() - counts["last"], 1),
                                              "idle_timeout_s": idle_timeout_s, "session": current_session().stats()})
            elif op == "stop":
                build_client.send_line(conn, {"pid": os.getpid(), "stopping": True})
                stop.set()
            elif op == "build":
                differ = build_client.differing_parts(parts, request.get("parts") or {})
                build_client.send_line(conn, {"pid": os.getpid(), "refused": (
                    f"it was started for other settings ({', '.join(differ) or 'another client'}); "
                    "`mtrag build-server stop` and start it again")})
        except OSError:
            pass
        conn.close()


def _request(conn: socket.socket) -> dict | None:
    conn.settimeout(REQUEST_TIMEOUT_S)
    try:
        request = next(build_client.read_lines(conn), None)
    except (OSError, ValueError):
        return None
    conn.settimeout(None)
    return request if isinstance(request, dict) else None


def _build(conn: socket.socket, request: dict, process: BuildProcess, log) -> None:
    """`mtrag build --no-server <argv>` in this process, its output relayed. A client found gone
    when its turn comes (interrupted while it waited) gets no build; one that leaves later gets
    it, its output dropped."""
    argv = [str(a) for a in request.get("argv", [])]
    try:
        build_client.send_line(conn, {"accepted": os.getpid()})
    except OSError:
        log("build request dropped: its client left before its turn")
        return
    lock = threading.Lock()
    out, err = _Relay(conn, "o", lock), _Relay(conn, "e", lock)
    saved, here = (sys.stdout, sys.stderr), os.getcwd()
    t0 = time.monotonic()
    sys.stdout, sys.stderr = out, err
    try:
        try:
            os.chdir(request.get("cwd") or here)
        except OSError:
            pass
        code = run_request(argv, process)
    finally:
        sys.stdout, sys.stderr = saved
        os.chdir(here)
    if code != 0:  # an index dropped under the server, say: checked again before the next write
        forget_neo4j_schemas()
    log(f"build {' '.join(argv) or '(all changed sources)'}: exit {code} in {time.monotonic() - t0:.2f} s"
        + (" (the client left before the end)" if out.gone or err.gone else ""))
    try:
        build_client.send_line(conn, {"exit": code})
    except OSError:
        pass

