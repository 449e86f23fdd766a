"""The cyclic collector in mtrag's processes: paused for a fast-lane batch and put back as it was;
the loaded code location frozen out of later collections."""
from __future__ import annotations

import gc

import pytest

from mtrag_resources.core.gc_tuning import collections_after

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


def test_loading_the_code_location_freezes_what_it_loaded():
    """The objects of the loaded code location go to the permanent generation (core/gc_tuning.py):
    a build's middle and full collections do not walk them again."""
    import mtrag_assets.definitions  # noqa: F401 - loading it is what is tested
    assert gc.get_freeze_count() > 100_000
