"""A many-readers / one-writer lock: queries share the loaded generation, a reload owns it."""
from __future__ import annotations

import contextlib
import threading
import time


class SharedLock:
    """Many readers or one writer (a reload). Writers wait for readers in flight to finish."""

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False

    @contextlib.contextmanager
    def shared(self):
        with self._cond:
            while self._writing:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self):
        with self._cond:
            while self._writing or self._readers:
                self._cond.wait()
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no reader holds the lock, at most `timeout` seconds, without taking it
        (a reader may start right after). True: none did when this returned."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._readers:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True
