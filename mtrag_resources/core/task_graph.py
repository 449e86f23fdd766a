"""Run a small graph of dependent tasks on a few threads: each task starts once every task it
depends on has finished. The fast lane uses it for one source's stages, whose store writes (Qdrant,
SQLite FTS, Neo4j) depend on nothing but their inputs and spend much of their time outside the
GIL (a C library, the Neo4j server's socket).

After a failure no further task starts; those already running finish, then the first failure is
raised (in the graph's order), as a sequential run would have stopped there."""
from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Task:
    run: Callable[[], Any]
    after: list[str] = field(default_factory=list)


def run_graph(tasks: dict[str, Task], pool: Executor) -> dict[str, Any]:
    """{name: what its `run` returned} of every task, run on `pool` (a caller that runs graphs again
    and again keeps one pool, and with it its threads' thread-local connections). `tasks` in an
    order where every dependency comes before its dependents (a task naming an unknown or later one
    is refused)."""
    position = {name: i for i, name in enumerate(tasks)}
    for name, task in tasks.items():
        for dep in task.after:
            if position.get(dep, len(tasks)) >= position[name]:
                raise ValueError(f"task {name!r} depends on {dep!r}, which is not an earlier task")
    results: dict[str, Any] = {}
    failures: dict[str, BaseException] = {}
    pending = dict(tasks)
    running: dict[Future, str] = {}
    while pending or running:
        if not failures:
            for name in [n for n, t in pending.items() if all(d in results for d in t.after)]:
                running[pool.submit(pending.pop(name).run)] = name
        if not running:
            break
        finished, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in finished:
            name = running.pop(future)
            try:
                results[name] = future.result()
            except BaseException as exc:  # noqa: BLE001 - raised below, after the others finish
                failures[name] = exc
    if failures:
        raise failures[min(failures, key=position.__getitem__)]
    return results
