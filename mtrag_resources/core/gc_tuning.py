"""The cyclic garbage collector in mtrag's processes: its thresholds, what it skips, when it waits.

A build or a watch batch allocates millions of short-lived rows while the process keeps a few
hundred thousand long-lived ones (the decoded-table and facts memos, the loaded embedders); with
CPython's default thresholds each full collection walks all of those, a large share of a batch
(docs/performance.md#processes). The rows hold no reference cycles, so rarer young collections
delay nothing but the rare cyclic garbage."""
from __future__ import annotations

import contextlib
import gc

YOUNG_THRESHOLD = 50_000   # allocations minus deallocations between young collections
MIDDLE_THRESHOLD = 20      # young collections between middle ones
OLD_THRESHOLD = 100        # middle collections between full ones (CPython also waits for 25% growth)


def tune_gc() -> None:
    """Raise the thresholds (never lower ones a caller raised further)."""
    current = gc.get_threshold()
    wanted = (YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)
    gc.set_threshold(*(max(c, w) for c, w in zip(current, wanted)))


def freeze_startup() -> None:
    """Move every object alive now to the permanent generation: called once the code location is
    loaded (the modules of Dagster, its dependencies and mtrag, the definitions), which then live
    as long as the process. The middle and full collections of a build no longer walk them again:
    frozen, they cost the middle collections of an own-process `mtrag build` almost nothing."""
    gc.freeze()


@contextlib.contextmanager
def collections_after():
    """The cyclic collector paused for a stretch of work, and back on as it was after it: its
    collections run once the work is done (`mtrag watch` around a fast-lane batch, whose rows
    hold no cycles; the little cyclic garbage the work makes waits until then)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
