"""The `mtrag` command's exit without the interpreter's teardown (mtrag_resources/core/process_exit.py):
what CPython's exit does before its teardown still happens (non-daemon threads finish, executor
work queued before the exit is done, atexit callbacks run, buffered output reaches the reader),
the exit code is the command's, and `mtrag` itself exits that way with its usual codes."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.unit

PROGRAM = textwrap.dedent("""
    import atexit, sys, threading, time
    from concurrent.futures import ThreadPoolExecutor
    from mtrag_resources.core.process_exit import exit_now

    out = sys.argv[1]

    def slow_writer():
        time.sleep(0.3)
        with open(out + ".thread", "w") as fh:
            fh.write("thread done")

    threading.Thread(target=slow_writer).start()           # non-daemon: waited for
    pool = ThreadPoolExecutor(max_workers=1)
    pool.submit(lambda: (time.sleep(0.3), open(out + ".pool", "w").write("pool done")))
    atexit.register(lambda: open(out + ".atexit", "w").write("atexit done"))
    sys.stdout.write("x" * 100_000)                          # still in the buffer (a pipe)
    exit_now(int(sys.argv[2]))
""")


@pytest.mark.parametrize("code", [0, 3])
def test_threads_executors_atexit_and_buffered_output_all_finish_and_the_code_is_kept(tmp_path, code):
    out = tmp_path / "marker"
    proc = subprocess.run([sys.executable, "-c", PROGRAM, str(out), str(code)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == code, proc.stderr
    assert proc.stdout == "x" * 100_000
    assert (tmp_path / "marker.thread").read_text() == "thread done"
    assert (tmp_path / "marker.pool").read_text() == "pool done"
    assert (tmp_path / "marker.atexit").read_text() == "atexit done"


def test_the_mtrag_command_keeps_its_exit_codes_and_output(tmp_path):
    env = {**os.environ, "MTRAG_HOME": str(tmp_path / "home")}
    cli = [sys.executable, "-m", "mtrag_assets.app.cli"]
    refused = subprocess.run([*cli, "query", "--k", "0", "anything"], env=env, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and "k must be an integer from 1 to 100" in refused.stderr
    unpublished = subprocess.run([*cli, "status", "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert unpublished.returncode == 1 and "no published generation" in unpublished.stderr
    helped = subprocess.run([*cli, "query", "--help"], env=env, capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "--mode" in helped.stdout
