"""A process named by its pid and start time, so that a reused pid is not taken for the process a
file or a run's tags recorded (a killed build's runs, a build server's state file)."""
from __future__ import annotations

import os
import time
from pathlib import Path


def proc_start(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' where /proc is missing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def alive(pid: int, start: str = "") -> bool:
    """Whether the process `pid` (started at `start`, where given) still runs; a zombie does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return True
    return fields[0] != "Z" and (not start or fields[19] == start)


def command_line(pid: int, timeout: float = 2.0) -> list[str] | None:
    """The live process's arguments, None where it is gone or a zombie. Right after a launch its
    command line can read empty: exec closes the launcher's close-on-exec pipe, which is when
    Popen returns, before the new image's arguments are in place (seen 4 in 2000 launches on a
    loaded host), so an empty one is read again until `timeout`."""
    import psutil

    deadline = time.monotonic() + timeout
    while True:
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            cmd = proc.cmdline()
        except psutil.Error:
            return None
        if cmd or time.monotonic() >= deadline or proc.ppid() == 2:  # a kernel thread's stays empty
            return cmd
        time.sleep(0.002)
