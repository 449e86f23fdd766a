"""A serving reader's switch loads a changed collection's Edge shard where no query is in flight
(qdrant-edge-py holds the GIL for a whole load): the shared lock tells when no reader holds it,
and the Edge client calls the thread's pacing before each shard it loads."""
from __future__ import annotations

import threading
import time

import pytest

from mtrag_resources.serving.shared_lock import SharedLock
from mtrag_resources.stores.qdrant_edge_client import EdgeClient, edge_config, paced_loads

pytestmark = pytest.mark.unit


def test_wait_idle_returns_when_the_last_reader_leaves_and_gives_up_after_its_timeout():
    lock = SharedLock()
    assert lock.wait_idle(0.0)  # nobody reads
    entered, leave = threading.Event(), threading.Event()

    def reader():
        with lock.shared():
            entered.set()
            leave.wait(10)

    thread = threading.Thread(target=reader)
    thread.start()
    entered.wait(10)
    t0 = time.monotonic()
    assert not lock.wait_idle(0.2)  # a reader in flight: gives up after the timeout
    assert time.monotonic() - t0 >= 0.2
    threading.Timer(0.2, leave.set).start()
    t0 = time.monotonic()
    assert lock.wait_idle(10)  # ... and returns as that reader leaves, not at the timeout
    assert 0.1 < time.monotonic() - t0 < 5
    thread.join(10)
    with lock.shared():  # not taken by wait_idle
        pass


def test_each_shard_load_of_a_paced_thread_waits_first_and_other_threads_do_not(tmp_path):
    import qdrant_edge
    for name in ("mtrag_code", "mtrag_docs"):
        qdrant_edge.EdgeShard.create(str(tmp_path / name), edge_config(4)).close()
    waits: list[str] = []
    with paced_loads(lambda: waits.append(threading.current_thread().name)):
        EdgeClient(tmp_path).close()
        assert waits == [threading.current_thread().name] * 2  # one wait per shard loaded
        other = threading.Thread(target=lambda: EdgeClient(tmp_path).close(), name="unpaced")
        other.start()
        other.join(30)
        assert "unpaced" not in waits  # pacing is the calling thread's
    EdgeClient(tmp_path).close()  # outside the block: no wait
    assert len(waits) == 2
