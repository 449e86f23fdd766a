"""The fast lane's task graph (core/task_graph.py): order, overlap and failure."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from mtrag_resources.core.task_graph import Task, run_graph as run_on

pytestmark = pytest.mark.unit


def run_graph(tasks, workers):
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return run_on(tasks, pool)


def test_a_task_starts_only_after_its_dependencies_and_independent_ones_overlap():
    log: list[tuple[str, str]] = []
    lock = threading.Lock()
    both_running = threading.Barrier(2, timeout=5)

    def step(name: str, meet: bool = False):
        def run():
            with lock:
                log.append(("start", name))
            if meet:  # both store tasks must be running at once, or the barrier times out
                both_running.wait()
            with lock:
                log.append(("end", name))
            return name.upper()
        return run

    tasks = {"raw": Task(step("raw")), "chunks": Task(step("chunks"), ["raw"]),
             "fts": Task(step("fts", meet=True), ["chunks"]), "neo4j": Task(step("neo4j", meet=True), ["chunks"]),
             "manifest": Task(step("manifest"), ["fts", "neo4j"])}
    results = run_graph(tasks, workers=3)
    assert results == {n: n.upper() for n in tasks}
    at = {event: i for i, event in enumerate(log)}
    for name, task in tasks.items():
        for dep in task.after:
            assert at[("end", dep)] < at[("start", name)], (dep, name, log)


def test_after_a_failure_nothing_new_starts_and_the_first_failure_in_graph_order_is_raised():
    started: list[str] = []
    release = threading.Event()

    def slow_fail():
        started.append("neo4j")
        release.wait(5)
        raise RuntimeError("neo4j down")

    def fast_fail():
        started.append("fts")
        release.set()
        time.sleep(0.05)
        raise ValueError("fts broken")

    tasks = {"chunks": Task(lambda: started.append("chunks")),
             "neo4j": Task(slow_fail, ["chunks"]), "fts": Task(fast_fail, ["chunks"]),
             "links": Task(lambda: started.append("links"), ["neo4j"]),
             "manifest": Task(lambda: started.append("manifest"), ["fts", "neo4j"])}
    with pytest.raises(RuntimeError, match="neo4j down"):  # neo4j comes first in the graph
        run_graph(tasks, workers=2)
    assert "links" not in started and "manifest" not in started
    assert sorted(started) == ["chunks", "fts", "neo4j"]


def test_one_worker_runs_the_graph_in_order():
    seen: list[str] = []
    tasks = {n: Task(lambda n=n: seen.append(n), after) for n, after in
             (("a", []), ("b", ["a"]), ("c", ["a"]), ("d", ["b", "c"]))}
    run_graph(tasks, workers=1)
    assert seen == ["a", "b", "c", "d"]


@pytest.mark.parametrize("tasks", [
    {"a": Task(lambda: 1, ["b"]), "b": Task(lambda: 2)},       # a dependency listed after its dependent
    {"a": Task(lambda: 1, ["missing"])},                       # an unknown dependency
])
def test_a_graph_out_of_order_is_refused_before_anything_runs(tasks):
    with pytest.raises(ValueError, match="not an earlier task"):
        run_graph(tasks, workers=2)
