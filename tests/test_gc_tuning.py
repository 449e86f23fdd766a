"""The watch pauses the cyclic collector for a fast-lane batch and puts it back as it was."""
from __future__ import annotations

import gc

import pytest

from mtrag_assets.watch import collections_after

pytestmark = pytest.mark.unit


def test_a_batch_runs_without_collections_and_the_collector_comes_back():
    assert gc.isenabled()
    with collections_after():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_failed_batch_puts_the_collector_back_and_a_disabled_one_stays_off():
    with pytest.raises(RuntimeError):
        with collections_after():
            raise RuntimeError("the batch failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with collections_after():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a caller that turned it off keeps it off
    finally:
        gc.enable()
