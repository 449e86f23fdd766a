"""Which signal interrupted a build. Dagster's in-process runs turn SIGINT and SIGTERM alike into
DagsterExecutionInterruptedError (and, after a run, leave SIGTERM raising KeyboardInterrupt), so
the exception does not say which came; Python's wakeup fd does: it is written the number of every
signal a Python handler takes, whoever installed that handler."""
from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def signals_seen() -> Iterator[Callable[[], int | None]]:
    """Yields a function that answers the number of the last signal received inside the block
    (None: none, or not on the main thread, where no wakeup fd can be set). An exception raised
    after one is its consequence, whatever its type: the handler may have raised inside a
    driver's buffer handling, which then fails with an error of its own."""
    try:
        read_fd, write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        yield lambda: None
        return
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:  # not the main thread
        os.close(read_fd)
        os.close(write_fd)
        yield lambda: None
        return
    _READ_FD[:] = [read_fd]
    # SIGTERM raises as Ctrl-C does (a Dagster run maps it so too), rather than ending the
    # process unannounced before the first run starts
    term = signal.getsignal(signal.SIGTERM)
    if term == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield last_signal
    finally:
        _READ_FD.clear()
        if term == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, term)
        signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)
        _SEEN.clear()


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Not in the build session: a signal pipe and what came through it belong to the process, and the
# handler reaches them without a session.
_READ_FD: list[int] = []  # the read end of the pipe while a `signals_seen` block runs
_SEEN: list[int] = []     # the signal numbers read from it


def last_signal() -> int | None:
    """The last SIGINT or SIGTERM received inside the running `signals_seen` block (None: none, or
    no block)."""
    if _READ_FD:
        try:
            _SEEN.extend(n for n in os.read(_READ_FD[0], 4096) if n in STOP_SIGNALS)
        except OSError:  # nothing written
            pass
    return _SEEN[-1] if _SEEN else None


def is_interrupt(exc: BaseException) -> bool:
    """Ctrl-C or SIGTERM, as Python raises it or as a Dagster run re-raises it."""
    dagster = sys.modules.get("dagster")
    interrupted = getattr(dagster, "DagsterExecutionInterruptedError", None) if dagster else None
    return isinstance(exc, KeyboardInterrupt) or (interrupted is not None and isinstance(exc, interrupted))


def exit_code(signum: int | None) -> int:
    """A shell's code for a process its signal ended: 128 + the number (130 for Ctrl-C, 143 for SIGTERM)."""
    return 128 + (signum or signal.SIGINT)
