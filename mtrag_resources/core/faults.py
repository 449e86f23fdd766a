"""Fault injection for crash tests: `fault_point(name)` is a no-op unless the environment variable
MTRAG_FAULT names that point (comma-separated names allowed); then the process signals itself, by
default SIGKILL (a crash that runs no cleanup: no `finally`, no atexit, no flush).
MTRAG_FAULT_SIGNAL=STOP instead freezes the process there (SIGSTOP) until something sends
SIGCONT, so a test can change the world (stop a server, fill a disk) at exactly that moment.

Points: `qdrant:after_begin`, `fts:after_begin`, `neo4j:after_begin` (a store's `begin` marker is
written, nothing else of the source yet), `neo4j:after_batch` (a Neo4j write's first transaction
of nodes or relationships committed, the rest and the `committed` marker not yet),
`manifest:before_current` (manifest-N.json written, CURRENT not yet moved),
`table:before_manifest` (a bucketed table's new parts written, its manifest not yet replaced)."""
from __future__ import annotations

import os
import signal

from mtrag_resources.core.config import env


def fault_point(name: str) -> None:
    wanted = env("MTRAG_FAULT")
    if not wanted or name not in {w.strip() for w in wanted.split(",")}:
        return
    sig = signal.SIGSTOP if env("MTRAG_FAULT_SIGNAL").upper() == "STOP" else signal.SIGKILL
    os.kill(os.getpid(), sig)
