"""Leaving an mtrag command's process without tearing the interpreter down.

CPython's exit waits for the non-daemon threads, runs the atexit callbacks, then tears the
interpreter down, freeing a build's few million objects one by one after the generation was
published (docs/performance.md#processes). `exit_now` does the first two exactly as CPython does,
flushes the standard streams and ends with os._exit. It skips `__del__` and extension destructors,
so only the command's entry point (`mtrag_assets.app.cli.run`) calls it, never a library function."""
from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn

BROKEN_PIPE_EXIT = 120  # what CPython's own exit returns when flushing stdout fails


def exit_now(code: int | None) -> NoReturn:
    """End the process with `code` (None: 0) after what CPython's exit does before its teardown."""
    # 1. What Py_FinalizeEx does first: join the non-daemon threads and run the hooks registered
    # with threading._register_atexit (concurrent.futures' executors finish their queued work).
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None and threading.current_thread() is threading.main_thread():
        shutdown()
    # 2. The atexit callbacks (logging.shutdown, weakref.finalize(atexit=True), temporary folders,
    # multiprocessing's cleanup), in their usual last-registered-first order.
    atexit._run_exitfuncs()
    status = 0 if code is None else int(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # the reader left (`mtrag status | head`), or closed
            status = status or BROKEN_PIPE_EXIT
        except OSError:
            status = status or 1
    os._exit(status)
