"""The embedded Qdrant a `mtrag watch` keeps open from one batch to the next
(stores/connect.py: shared_qdrant(keep_open=True), close_parked_qdrant): the next block and every
open_qdrant of the process reuse it, other processes wait for its lock until it is closed (at once
when they ask for it: the request file a waiting FolderLock touches), and a block that fails closes
it. Real embedded Qdrant, real processes."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.stores.connect import close_parked_qdrant, open_qdrant, shared_qdrant
from mtrag_resources.stores.qdrant_folder import WANTED_FRESH_S, wanted_path_for
from tests.test_qdrant_store import make_points

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[1]


def _other_process_code(path: Path, timeout: float) -> str:
    return textwrap.dedent(f"""
        from mtrag_resources.stores.qdrant_store import QdrantStore
        from mtrag_resources.stores.qdrant_folder import QdrantStoreLocked
        try:
            with QdrantStore(path={str(path)!r}, lock_timeout={timeout}) as s:
                print(s.count("code", "src-a"))
        except QdrantStoreLocked:
            print("locked")
    """)


def _other_process_count(path: Path, timeout: float) -> str:
    """What another process sees: the holder's point count, or 'locked'."""
    code = _other_process_code(path, timeout)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_a_kept_store_serves_the_next_block_and_holds_the_lock_until_closed(tmp_path):
    settings = Settings(home=tmp_path / "home")
    try:
        with shared_qdrant(settings, keep_open=True):
            with open_qdrant(settings) as store:
                first = store
                store.write_source("src-a", "code", "g1", make_points("src-a", 3))
        with open_qdrant(settings) as borrowed:  # outside any block: the parked store, not a second open
            assert borrowed is first and borrowed.count("code", "src-a") == 3
        assert _other_process_count(settings.qdrant_path, 0.5) == "locked"
        assert close_parked_qdrant(idle_s=60) == 0  # not idle long enough: kept
        with shared_qdrant(settings, keep_open=True):
            with open_qdrant(settings) as store:
                assert store is first
                store.write_source("src-a", "code", "g2", make_points("src-a", 5))
        assert close_parked_qdrant() == 1
        assert _other_process_count(settings.qdrant_path, 30) == "5"  # closed: written and released
    finally:
        close_parked_qdrant()


def test_a_block_that_fails_closes_its_store(tmp_path):
    settings = Settings(home=tmp_path / "home")
    with pytest.raises(RuntimeError):
        with shared_qdrant(settings, keep_open=True):
            with open_qdrant(settings) as store:
                store.write_source("src-a", "code", "g1", make_points("src-a", 2))
            raise RuntimeError("a stage failed")
    assert close_parked_qdrant() == 0
    assert _other_process_count(settings.qdrant_path, 30) == "2"


def _park(settings: Settings, points: int) -> None:
    with shared_qdrant(settings, keep_open=True):
        with open_qdrant(settings) as store:
            store.write_source("src-a", "code", "g1", make_points("src-a", points))


def test_a_parked_store_is_closed_when_another_process_waits_for_its_lock(tmp_path):
    settings = Settings(home=tmp_path / "home")
    try:
        _park(settings, 4)
        assert close_parked_qdrant(idle_s=600) == 0  # nobody asks: kept
        waiter = subprocess.Popen([sys.executable, "-c", _other_process_code(settings.qdrant_path, 60)],
                                  cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        closed, deadline = 0, time.monotonic() + 30
        while not closed and time.monotonic() < deadline:  # the watch loop's call, every tick
            closed = close_parked_qdrant(idle_s=600)
            time.sleep(0.05)
        assert closed == 1
        out, err = waiter.communicate(timeout=60)
        assert out.strip() == "4", err[-2000:]  # it took the lock and read what was written
        assert not wanted_path_for(settings.qdrant_path).exists()  # and took its request back
    finally:
        close_parked_qdrant()


def test_a_waiter_that_gives_up_takes_its_request_back_and_a_stale_one_is_ignored(tmp_path):
    settings = Settings(home=tmp_path / "home")
    wanted = wanted_path_for(settings.qdrant_path)
    try:
        _park(settings, 2)
        assert _other_process_count(settings.qdrant_path, 0.5) == "locked"
        assert not wanted.exists()
        wanted.write_text("pid 1\n")  # a waiter that died without taking it back
        os.utime(wanted, (time.time() - WANTED_FRESH_S - 1,) * 2)
        assert close_parked_qdrant(idle_s=600) == 0
        wanted.write_text("pid 1\n")  # a fresh request
        assert close_parked_qdrant(idle_s=600) == 1
    finally:
        close_parked_qdrant()
