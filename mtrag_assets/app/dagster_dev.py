"""`python -m mtrag_assets.app.dagster_dev [dagster dev options]`: the Dagster UI and daemon
(`dagster dev -w workspace.yaml`, the options passed on), ended within seconds by Ctrl-C or
SIGTERM.

Run from a terminal, `dagster dev` shares the terminal's process group with its code servers,
so Ctrl-C reaches them too: a code server ends before `dagster dev` has begun its shutdown, its
monitor starts a new one, and `dagster dev` waits for that one to load the code location before
it exits (and leaves it running); a webserver or daemon that does not stop is waited for up to
a minute each, which is what Dagster's telemetry upload does where it is on (an instance without
mtrag's dagster.yaml) and its host never answers: it posts without a timeout. Here `dagster dev` runs in a session of its own: Ctrl-C (or SIGTERM) reaches this process
alone, which asks `dagster dev` to shut down (SIGINT to it only: its orderly path, webserver and
daemon through their shutdown pipes, code servers through gRPC), gives it GRACE_S, then
interrupts what is left of its session (run workers mark their runs failed on it) and kills what
still runs after LEFTOVER_S more."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE_S = 8.0  # well beyond dagster dev's own orderly shutdown (docs/performance.md#the-dagster-instance)
LEFTOVER_S = 3.0
WORKSPACE_OPTIONS = ("-w", "--workspace", "-m", "--module-name", "-f", "--python-file", "-d", "--working-directory")


def dagster_dev_command(args: list[str]) -> list[str]:
    """`dagster dev` from this interpreter's environment, with the repository's workspace.yaml
    unless the options name a code location."""
    dagster = str(Path(sys.executable).with_name("dagster"))
    named = any(a.split("=", 1)[0] in WORKSPACE_OPTIONS for a in args)
    return [dagster, "dev", *([] if named else ["-w", "workspace.yaml"]), *args]


def session_pids(sid: int) -> list[int]:
    """The processes of session `sid` (Linux /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # the session id; zombies are gone already
            pids.append(int(entry.name))
    return pids


def signal_session(sid: int, sig: int) -> list[int]:
    pids = session_pids(sid)
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return pids


def wait_session_empty(sid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not session_pids(sid):
            return True
        time.sleep(0.1)
    return not session_pids(sid)


def stop(proc: subprocess.Popen, log=print) -> None:
    """Shut `dagster dev` (the leader of its own session) and everything in its session down."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            log(f"mtrag: dagster dev did not exit within {GRACE_S:.0f} s of SIGINT; stopping its processes")
    if signal_session(proc.pid, signal.SIGINT) and not wait_session_empty(proc.pid, LEFTOVER_S):
        signal_session(proc.pid, signal.SIGKILL)
        wait_session_empty(proc.pid, 2.0)
    if proc.poll() is None:
        proc.wait(timeout=5)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    stopping: list[int] = []

    def on_signal(signum, _frame) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    # start_new_session: the terminal's Ctrl-C reaches this process only (the module docstring says why).
    proc = subprocess.Popen(dagster_dev_command(args), start_new_session=True)
    try:
        while not stopping and proc.poll() is None:
            time.sleep(0.2)
    finally:
        stop(proc, log=lambda line: print(line, file=sys.stderr, flush=True))
    return 0 if stopping else (proc.returncode or 0)


if __name__ == "__main__":
    sys.exit(main())
