"""A process named by its pid and start time, so that a reused pid is not taken for the process a
file or a run's tags recorded (a killed build's runs, a build server's state file)."""
from __future__ import annotations

import os
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
