"""The embedded Qdrant a `mtrag watch` keeps open from one batch to the next
(stores/connect.py: shared_qdrant(keep_open=True), close_parked_qdrant): the next block and every
open_qdrant of the process reuse it, other processes wait for its lock until it is closed, and a
block that fails closes it. Real embedded Qdrant, real processes."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.stores.connect import close_parked_qdrant, open_qdrant, shared_qdrant
from tests.test_qdrant_store import make_points

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[1]


def _other_process_count(path: Path, timeout: float) -> str:
    """What another process sees: the holder's point count, or 'locked'."""
    code = textwrap.dedent(f"""
        from mtrag_resources.stores.qdrant_store import QdrantStore
        from mtrag_resources.stores.qdrant_folder import QdrantStoreLocked
        try:
            with QdrantStore(path={str(path)!r}, lock_timeout={timeout}) as s:
                print(s.count("code", "src-a"))
        except QdrantStoreLocked:
            print("locked")
    """)
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
