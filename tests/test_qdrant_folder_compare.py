"""qdrant_folder.same_bytes, which decides whether a published version shares a file of a changed
Edge segment: sparse files (holes), zeros written as data, one byte apart anywhere."""
from __future__ import annotations

import filecmp

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtrag_resources.stores.qdrant_folder import same_bytes

pytestmark = pytest.mark.unit

MIB = 1 << 20
SIZE = 3 * MIB + 4097  # more than one compare block, not a multiple of a page


def _write(path, size: int, writes: list[tuple[int, bytes]]) -> None:
    """A sparse file of `size` bytes with `writes` (offset, bytes) as its only data."""
    with open(path, "wb") as f:
        f.truncate(size)
        for offset, data in writes:
            f.seek(offset)
            f.write(data)


chunks = st.lists(st.tuples(st.integers(0, SIZE - 1), st.binary(min_size=1, max_size=9000)), max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=chunks, b=chunks, explicit_zeros=st.booleans())
def test_same_bytes_agrees_with_a_full_compare(tmp_path, a, b, explicit_zeros):
    one, two = tmp_path / "one", tmp_path / "two"
    a = [(o, d[:SIZE - o]) for o, d in a]
    b = [(o, d[:SIZE - o]) for o, d in b]
    if explicit_zeros:  # zeros written as data where the other file has a hole: the same bytes
        b = [*b, (MIB, bytes(4096))]
    _write(one, SIZE, a)
    _write(two, SIZE, b)
    assert same_bytes(one, two) == filecmp.cmp(one, two, shallow=False)


def test_one_byte_apart_in_the_data_or_in_a_hole(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    data = bytes(range(256)) * 64
    _write(one, SIZE, [(MIB, data)])
    _write(two, SIZE, [(MIB, data)])
    assert same_bytes(one, two)
    _write(two, SIZE, [(MIB, data[:-1] + b"\x01")])
    assert not same_bytes(one, two)
    _write(two, SIZE, [(MIB, data), (2 * MIB + 5, b"\x01")])  # a byte where the other has a hole
    assert not same_bytes(one, two)
    _write(two, SIZE + 1, [(MIB, data)])
    assert not same_bytes(one, two)
