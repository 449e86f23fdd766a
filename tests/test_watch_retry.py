"""The watch loop after a failed convergence run: it tries again at the next change or after
RETRY_S, not on every turn of the loop (a failing Dagster run every 200 ms until the fault
clears). The loop's decision alone, with the run replaced by one that fails."""
from __future__ import annotations

import time

import pytest

from mtrag_assets.app import watch

pytestmark = pytest.mark.unit


def _loop(log: list[str]) -> watch.WatchLoop:
    loop = object.__new__(watch.WatchLoop)  # the decision only: no sources, no signals, no recorder
    loop.watched, loop.roots, loop.git_dirs = [], {}, {}
    loop.converge_pending, loop.retry_at, loop.last_scan = True, 0.0, time.monotonic()
    loop.log = log.append
    runs: list[str] = []

    def failing_run(paths, why, known):
        runs.append(why)
        raise RuntimeError("Neo4j unreachable")

    loop._apply = failing_run
    loop.runs = runs
    return loop


def test_a_failed_retry_waits_before_the_next_one():
    log: list[str] = []
    loop = _loop(log)
    for _ in range(5):
        loop._take(set())
    assert loop.runs == ["retry"] and loop.converge_pending
    assert log == ["build failed (RuntimeError: Neo4j unreachable); still watching"]
    loop.retry_at = time.monotonic() - 1  # RETRY_S later
    loop._take(set())
    assert loop.runs == ["retry", "retry"]
