"""`core.processes.command_line`: what the local servers' pid files are checked against."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from mtrag_resources.core.processes import command_line

pytestmark = pytest.mark.unit


def test_a_launched_process_reads_its_own_arguments_and_a_reaped_one_none():
    args = [sys.executable, "-c", "import time; time.sleep(30)", "--marker"]
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        assert command_line(proc.pid) == args
    finally:
        proc.kill()
        proc.wait()
    assert command_line(proc.pid) is None


def test_a_zombie_has_no_command_line():
    proc = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:  # exited, not yet reaped
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert command_line(proc.pid) is None
    finally:
        proc.wait()


def test_an_empty_command_line_read_mid_exec_is_read_again(monkeypatch):
    """Popen returns when exec closes the close-on-exec pipe, before the new arguments are in place:
    a read in that window gets [] (4 in 2000 launches on a loaded host), which is not an answer."""
    expected = psutil.Process().cmdline()
    real = psutil.Process.cmdline
    reads = []

    def mid_exec_twice(self):
        reads.append(self.pid)
        return [] if len(reads) <= 2 else real(self)

    monkeypatch.setattr(psutil.Process, "cmdline", mid_exec_twice)
    assert command_line(os.getpid()) == expected
    assert reads == [os.getpid()] * 3
