"""Leaving an mtrag command's process without tearing the interpreter down.

CPython's exit, once the program is done, (1) waits for the non-daemon threads, (2) runs the
atexit callbacks, then (3) tears the interpreter down: a full collection, every module's globals
cleared, every object freed one by one. A `mtrag build` holds a few million objects (Dagster's
definitions, the stores' clients, the decoded tables and facts), and step 3 took 1.1-1.3 s of a
one-function build's ~4.8 s on the bench corpus, after the generation was already published
(strace: CPU with no system calls, then the munmaps of the freed arenas). `exit_now` does steps 1
and 2 exactly as CPython does and flushes the standard streams, then ends the process with
os._exit, which the kernel finishes by unmapping the memory in one go.

What step 3 would have done and no longer does: `__del__` methods and extension-type destructors
of objects still alive at exit. mtrag closes what it writes (stores, files, the Dagster instance's
transactions are committed when their block ends), SQLite keeps committed transactions in its
journal for the next opener, and the kernel releases file locks and descriptors; files left open
for writing by code that relied on a destructor to flush them would lose their buffered tail, which
is why only the command's entry point (`mtrag_assets.cli.run`) calls this, never a library
function."""
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
