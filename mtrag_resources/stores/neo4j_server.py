"""A local Neo4j Community server without Docker or a distribution tarball.

Its jars are resolved once from Maven Central into a cache outside the repository; later starts
never run Maven. `neo4j_connection(settings)` is what the rest of the project calls: `NEO4J_URI`
when set, else the local server's Bolt URI. Layout, environment knobs and why their defaults:
docs/configuration.md#the-local-neo4j (figures: docs/performance.md#neo4j).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from mtrag_resources.core.errors import StoreError
from mtrag_resources.core.config import Settings, env
from mtrag_resources.core.processes import alive, command_line
from mtrag_resources.core.session import session_cache
from mtrag_resources.stores import neo4j_cds

NEO4J_VERSION = "5.26.30"  # newest 5.26.x LTS on Maven Central when this was written; runs on Java 17/21
MAIN_CLASS = "org.neo4j.server.CommunityEntryPoint"
CACHE_MARKER = ".complete"

# What Neo4j 5's own launcher passes (server.jvm.additional in the default neo4j.conf), plus the
# opens Netty and the page cache use reflectively on newer JDKs.
JVM_FLAGS = [
    "-XX:+UseG1GC",
    "-XX:-OmitStackTraceInFastThrow",
    "-XX:+UnlockExperimentalVMOptions",
    "-XX:+TrustFinalNonStaticFields",
    "-XX:+DisableExplicitGC",
    "-Djdk.nio.maxCachedBufferSize=1024",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Djdk.tls.ephemeralDHKeySize=2048",
    "-Djdk.tls.rejectClientInitiatedRenegotiation=true",
    "-Dlog4j2.disable.jmx=true",
    "-Dlog4j.layout.jsonTemplate.maxStringLength=32768",
    "-Dfile.encoding=UTF-8",
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/java.io=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    "--add-opens=java.base/java.util.concurrent=ALL-UNNAMED",
    "--add-opens=java.base/java.net=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-opens=java.base/sun.net.dns=ALL-UNNAMED",
    "--enable-native-access=ALL-UNNAMED",
]


def jit_flags() -> list[str]:
    """JIT compiler flags (see MTRAG_NEO4J_JIT in the module docstring)."""
    mode = (env("MTRAG_NEO4J_JIT") or "tiered").strip().lower()
    if mode == "c1":
        return ["-XX:TieredStopAtLevel=1"]
    if mode == "tiered":
        return []
    raise Neo4jServerError(f"MTRAG_NEO4J_JIT={mode!r}: expected 'c1' or 'tiered'")


class Neo4jServerError(StoreError):
    """The local server could not be resolved, started or reached."""


# ----------------------------------------------------------------------------------------- jars

def neo4j_version() -> str:
    return env("MTRAG_NEO4J_VERSION") or NEO4J_VERSION


def cache_dir(version: str | None = None) -> Path:
    configured = env("MTRAG_NEO4J_CACHE")
    if configured:
        return Path(configured).expanduser().resolve()
    return Path("~/.cache/mtrag").expanduser() / f"neo4j-{version or neo4j_version()}"


def _cache_complete(cache: Path) -> bool:
    lib = cache / "lib"
    return (cache / CACHE_MARKER).is_file() and lib.is_dir() and any(lib.glob("*.jar"))


@contextlib.contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>mtrag</groupId><artifactId>neo4j-jars</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.neo4j</groupId><artifactId>neo4j</artifactId><version>{version}</version></dependency>
  </dependencies>
</project>
"""


def resolve_jars(version: str | None = None, cache: Path | None = None, *, quiet: bool = True) -> Path:
    """Return the folder of jars for `org.neo4j:neo4j:<version>` and its runtime dependencies,
    running Maven only when the cache is not complete yet (concurrent callers wait on a lock)."""
    version = version or neo4j_version()
    cache = Path(cache) if cache else cache_dir(version)
    if _cache_complete(cache):
        return cache / "lib"
    with _file_lock(cache.parent / f".{cache.name}.lock"):
        if _cache_complete(cache):
            return cache / "lib"
        mvn = env("MTRAG_MVN") or shutil.which("mvn")
        if not mvn:
            raise Neo4jServerError(
                f"Neo4j jars are not cached in {cache} and Maven (`mvn`) is not on PATH; install Maven "
                "once, or set NEO4J_URI to use an existing server")
        cache.mkdir(parents=True, exist_ok=True)
        staging = cache / "lib.partial"
        shutil.rmtree(staging, ignore_errors=True)
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="mtrag-neo4j-pom-") as tmp:
            Path(tmp, "pom.xml").write_text(_POM.format(version=version))
            cmd = [mvn, "-B", "dependency:copy-dependencies", "-DincludeScope=runtime",
                   f"-DoutputDirectory={staging}"]
            if quiet:
                cmd.insert(1, "-q")
            proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        if proc.returncode != 0 or not any(staging.glob("*.jar")):
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
            raise Neo4jServerError(f"resolving org.neo4j:neo4j:{version} with Maven failed "
                                   f"(rc={proc.returncode}):\n{tail}")
        lib = cache / "lib"
        shutil.rmtree(lib, ignore_errors=True)
        staging.rename(lib)
        jars = sorted(p.name for p in lib.glob("*.jar"))
        (cache / CACHE_MARKER).write_text(json.dumps({
            "artifact": f"org.neo4j:neo4j:{version}", "jars": len(jars),
            "seconds": round(time.monotonic() - t0, 1), "resolved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }, indent=2))
        return lib


# ----------------------------------------------------------------------------------------- java

def find_java() -> str:
    configured = env("MTRAG_JAVA")
    if configured:
        return configured
    java_home = env("JAVA_HOME")
    if java_home and Path(java_home, "bin", "java").is_file():
        return str(Path(java_home, "bin", "java"))
    java = shutil.which("java")
    if not java:
        raise Neo4jServerError("no Java found: set MTRAG_JAVA or JAVA_HOME, or put java (17 or 21) on PATH")
    return java


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # like Netty: connections of the previous run lingering in TIME_WAIT do not block the port
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bolt_answers(uri: str, user: str | None = None, password: str | None = None, timeout: float = 5.0) -> bool:
    from mtrag_resources.stores.neo4j_driver import GraphDatabase  # only needed once a server exists

    auth = (user, password or "") if user else None
    try:
        with GraphDatabase.driver(uri, auth=auth, connection_timeout=timeout,
                                  connection_acquisition_timeout=timeout) as driver:
            driver.verify_connectivity()
        return True
    except Exception:  # noqa: BLE001 - any failure means "not (yet) answering"
        return False


# --------------------------------------------------------------------------------------- server

class Neo4jServer:
    """One local Neo4j Community server whose home is `settings.neo4j_dir`."""

    def __init__(self, settings: Settings, version: str | None = None, heap: str | None = None):
        self.settings = settings
        self.version = version or neo4j_version()
        self.heap = heap or env("MTRAG_NEO4J_HEAP") or "1g"
        self.pagecache = env("MTRAG_NEO4J_PAGECACHE") or "64m"
        self.home = Path(settings.neo4j_dir).resolve()

    # paths
    @property
    def conf_file(self) -> Path:
        return self.home / "conf" / "neo4j.conf"

    @property
    def pid_file(self) -> Path:
        return self.home / "run" / "neo4j.pid"

    @property
    def uri_file(self) -> Path:
        return self.home / "run" / "bolt.uri"

    @property
    def console_log(self) -> Path:
        return self.home / "logs" / "console.log"

    def _lock(self):
        return _file_lock(self.home / "run" / "server.lock")

    # process bookkeeping
    def _pid(self) -> int | None:
        """The pid of OUR server process if it is alive, else None (stale pid files are ignored)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        cmd = command_line(pid)
        if cmd and MAIN_CLASS in cmd and f"--home-dir={self.home}" in cmd:
            return pid
        return None

    def _uri(self) -> str | None:
        try:
            return self.uri_file.read_text().strip() or None
        except OSError:
            return None

    def status(self) -> dict:
        return self.status_of(self._pid())

    def status_of(self, pid: int | None) -> dict:
        """status() for the server's pid as `_pid()` just read it (None: not running)."""
        return {"running": pid is not None, "uri": self._uri() if pid is not None else None}

    def log_tail(self, lines: int = 40) -> str:
        out = []
        for f in (self.console_log, self.home / "logs" / "neo4j.log"):
            try:
                text = f.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            out.append(f"--- {f}\n" + "\n".join(text))
        return "\n".join(out)

    # config
    def _choose_port(self) -> int:
        configured = env("MTRAG_NEO4J_BOLT_PORT")
        if configured:
            return int(configured)
        try:  # keep the previous port across restarts when it is still free
            for line in self.conf_file.read_text().splitlines():
                if line.startswith("server.bolt.listen_address="):
                    port = int(line.rsplit(":", 1)[1])
                    if _port_free(port):
                        return port
        except (OSError, ValueError):
            pass
        return _free_port()

    def write_conf(self, port: int) -> None:
        h = self.home
        for d in ("conf", "data", "logs", "run", "plugins", "import"):
            (h / d).mkdir(parents=True, exist_ok=True)
        conf = f"""# written by mtrag_resources.stores.neo4j_server; rewritten on every start
server.default_listen_address=127.0.0.1
server.default_advertised_address=127.0.0.1
server.bolt.enabled=true
server.bolt.listen_address=127.0.0.1:{port}
server.bolt.advertised_address=127.0.0.1:{port}
server.bolt.tls_level=DISABLED
server.http.enabled=false
server.https.enabled=false
dbms.security.auth_enabled=false
dbms.usage_report.enabled=false
internal.dbms.usage_report.udc_network_enabled=false
server.memory.pagecache.size={self.pagecache}
server.memory.heap.initial_size={self.heap}
server.memory.heap.max_size={self.heap}
db.tx_log.rotation.retention_policy=100M size
server.directories.data={h / 'data'}
server.directories.logs={h / 'logs'}
server.directories.run={h / 'run'}
server.directories.plugins={h / 'plugins'}
server.directories.import={h / 'import'}
# stop within ~1 s instead of Netty's default 2 x 5 s graceful Bolt shutdown
internal.dbms.bolt.netty_server_shutdown_quiet_period=0
internal.dbms.bolt.netty_server_shutdown_timeout=2
"""
        self.conf_file.write_text(conf)

    def command(self, lib: Path) -> list[str]:
        java = find_java()
        return [java, f"-Xms{min_heap(self.heap)}", f"-Xmx{self.heap}", *JVM_FLAGS, *jit_flags(),
                *neo4j_cds.archive_flags(java, lib, self.version),
                "-cp", f"{lib}/*", MAIN_CLASS, f"--home-dir={self.home}",
                f"--config-dir={self.home / 'conf'}", "--console-mode"]

    # lifecycle
    def start(self, timeout: float = 120) -> str:
        """Start the server (idempotent) and return its Bolt URI once Bolt answers."""
        uri, proc = self.launch()
        return self.wait(uri, proc, timeout)

    def launch(self) -> tuple[str, subprocess.Popen | None]:
        """Start the server if it is not running, without waiting for Bolt: (its URI, the new
        process or None when one was running). A build launches it first thing and waits only when
        a step first needs the graph, so the JVM boots while sources are chunked and embedded."""
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "run").mkdir(parents=True, exist_ok=True)
        with self._lock():
            pid = self._pid()
            if pid is not None:
                uri = self._uri()
                if uri:
                    return uri, None
                raise Neo4jServerError(f"Neo4j (pid {pid}) is running but recorded no Bolt URI\n" + self.log_tail())
            lib = resolve_jars(self.version)
            port = self._choose_port()
            self.write_conf(port)
            uri = f"bolt://127.0.0.1:{port}"
            self.console_log.parent.mkdir(parents=True, exist_ok=True)
            with open(self.console_log, "ab") as log:
                log.write(f"\n=== mtrag start {time.strftime('%Y-%m-%d %H:%M:%S')} {uri}\n".encode())
                log.flush()
                proc = subprocess.Popen(self.command(lib), stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, cwd=self.home, start_new_session=True)
            self.pid_file.write_text(f"{proc.pid}\n")
            self.uri_file.write_text(uri + "\n")
            return uri, proc

    def wait(self, uri: str, proc: subprocess.Popen | None = None, timeout: float = 120) -> str:
        """`uri` once Bolt answers there; a server that died or never answered is cleaned up and
        reported with its log."""
        pid = proc.pid if proc is not None else self._pid()
        if pid is not None and self._wait_bolt(uri, pid, proc, timeout):
            return uri
        with self._lock():
            rc = proc.poll() if proc is not None else None
            if pid is not None and self._pid() == pid:
                self._terminate(pid, grace=10)
            if self._pid() is None:
                self._clear_run_files()
        why = f"exited with code {rc}" if rc is not None else f"did not answer on {uri} within {timeout:.0f}s"
        raise Neo4jServerError(f"Neo4j {why}\n{self.log_tail()}")

    def _wait_bolt(self, uri: str, pid: int, proc: subprocess.Popen | None, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                return False
            if proc is None and self._pid() != pid:
                return False
            if bolt_answers(uri, timeout=2.0):
                return True
            time.sleep(0.5)
        return False

    def stop(self, timeout: float = 30) -> bool:
        """Stop the server: SIGTERM to its process group, SIGKILL after `timeout`. True if it was running."""
        (self.home / "run").mkdir(parents=True, exist_ok=True)
        with self._lock():
            pid = self._pid()
            if pid is None:
                self._clear_run_files()
                return False
            self._terminate(pid, grace=timeout)
            self._clear_run_files()
            return True

    def _terminate(self, pid: int, grace: float) -> None:
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        if _wait_gone(pid, grace):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        _wait_gone(pid, 10)

    def _clear_run_files(self) -> None:
        for f in (self.pid_file, self.uri_file):
            with contextlib.suppress(FileNotFoundError):
                f.unlink()


def min_heap(heap: str) -> str:
    """-Xms: 256m, or the max heap when that is smaller."""
    units = {"k": 1 / 1024, "m": 1, "g": 1024}
    try:
        mb = float(heap[:-1]) * units[heap[-1].lower()]
    except (KeyError, ValueError, IndexError):
        return heap
    return heap if mb < 256 else "256m"


def _wait_gone(pid: int, timeout: float) -> bool:
    import psutil

    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            # reap it if it is our child, else poll its state
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    return True
            if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False


# ------------------------------------------------------------------------------------ connection

# server home -> (uri, process) this process launched and has not yet seen answer on Bolt. Not in
# the session: a child process to wait for is a fact of the process, not a cache.
_BOOTING: dict[str, tuple[str, subprocess.Popen]] = {}
_BOOTING_LOCK = threading.Lock()


def launch_local_server(settings: Settings) -> None:
    """Boot the local server in the background unless NEO4J_URI names one or it runs already; the
    first neo4j_connection of this process then waits for it (a fresh home's build chunks and embeds
    its first source meanwhile, instead of waiting for the JVM first)."""
    if settings.neo4j_connection:
        return
    server = Neo4jServer(settings)
    uri, proc = server.launch()
    if proc is not None:
        with _BOOTING_LOCK:
            _BOOTING[str(server.home)] = (uri, proc)


# Per home, the local server this process last found running: (its pid file's identity, pid, Bolt
# URI). While the same pid file names a live process, a connection takes the URI without reading
# the process's command line again (its state alone): a long-lived process (the watch) opens Neo4j
# several times a batch, and each read, in a thread beside a busy one, waits for the GIL.
# A restart writes a new pid file; a stop removes it. Evicted: the next connection checks in full.
_RUNNING = session_cache("neo4j_server.running", max_entries=16)
_RUNNING_LOCK = threading.Lock()


def _pid_file_identity(server: "Neo4jServer") -> tuple | None:
    try:
        st = os.stat(server.pid_file)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def _still_running(server: "Neo4jServer") -> str | None:
    """The URI this process found the server at, where its pid file and process are still those."""
    key = str(server.home)
    with _RUNNING_LOCK:
        found = _RUNNING.get(key)
    if found is None:
        return None
    # alive: not gone and not a zombie (a server this process launched and that died answers
    # kill(pid, 0) until it is reaped)
    same = alive(found[1]) and _pid_file_identity(server) == found[0]
    if not same:
        with _RUNNING_LOCK:
            _RUNNING.pop(key, None)
        return None
    return found[2]


def _found_running(server: "Neo4jServer") -> str | None:
    """The running server's URI from its full check (Neo4jServer.status), kept for _still_running."""
    identity = _pid_file_identity(server)  # before the check: a restart meanwhile makes it not match
    pid = server._pid()
    uri = server._uri() if pid is not None else None
    if pid is not None and uri and identity is not None:
        with _RUNNING_LOCK:
            _RUNNING[str(server.home)] = (identity, pid, uri)
    return uri if pid is not None else None


def running_pid(settings: Settings) -> int | None:
    """The pid of the local server this process last found running for the home (None: none found,
    or NEO4J_URI names another server)."""
    if settings.neo4j_connection:
        return None
    with _RUNNING_LOCK:
        found = _RUNNING.get(str(Neo4jServer(settings).home))
    return found[1] if found else None


def neo4j_connection(settings: Settings, start: bool = False) -> tuple[str, str | None, str | None]:
    """(uri, user, password): NEO4J_URI/NEO4J_USER/NEO4J_PASSWORD when NEO4J_URI is set (nothing
    local is started), else the local server's Bolt URI (user and password None: auth is off).
    With start=True a local server that is not running is started."""
    if settings.neo4j_connection:
        return settings.neo4j_connection
    server = Neo4jServer(settings)
    with _BOOTING_LOCK:  # launched by this process and maybe still booting: wait for Bolt once
        booting = _BOOTING.pop(str(server.home), None)
        if booting is not None:
            return server.wait(*booting), None, None
    uri = _still_running(server) or _found_running(server)
    if uri:
        return uri, None, None
    if start:
        return server.start(), None, None
    raise Neo4jServerError("no NEO4J_URI set and the local Neo4j server is not running; "
                           "start it with `mtrag neo4j start`")


# ------------------------------------------------------------------------------------------- CLI

def cli_start(settings: Settings, timeout: float = 120) -> dict:
    server = Neo4jServer(settings)
    t0 = time.monotonic()
    uri = server.start(timeout=timeout)
    return {"running": True, "uri": uri, "seconds": round(time.monotonic() - t0, 1), "home": str(server.home)}


def cli_stop(settings: Settings) -> dict:
    was = Neo4jServer(settings).stop()
    return {"running": False, "uri": None, "was_running": was}


def cli_status(settings: Settings) -> dict:
    server = Neo4jServer(settings)
    pid = server._pid()  # read once: the status and the archive are of the same process
    status = server.status_of(pid)
    # the class-data archive its JVM maps (stores/neo4j_cds.py): None before one is made
    return {**status, "class_data_archive": neo4j_cds.mapped_archive(pid) if pid else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mtrag neo4j", description="local Neo4j Community server")
    ap.add_argument("action", choices=["start", "stop", "status"])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--timeout", type=float, default=120)
    args = ap.parse_args(argv)
    settings = Settings.from_env()
    try:
        if args.action == "start":
            res = cli_start(settings, args.timeout)
        elif args.action == "stop":
            res = cli_stop(settings)
        else:
            res = cli_status(settings)
    except Neo4jServerError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    if args.json:
        out = {"running": res["running"], "uri": res["uri"]}
        print(json.dumps(out))
    elif args.action == "start":
        print(f"neo4j running at {res['uri']} (home {res['home']}, {res['seconds']} s)")
    elif args.action == "stop":
        print("neo4j stopped" if res["was_running"] else "neo4j was not running")
    else:
        print(f"neo4j running at {res['uri']}" if res["running"] else "neo4j not running")
    return 0


if __name__ == "__main__":
    sys.exit(main())
