"""stores/page_cache.py: a long-lived reader reads its newly loaded collections through once."""
from __future__ import annotations

import os

import pytest

from mtrag_resources.stores.page_cache import data_extents, read_through

pytestmark = pytest.mark.unit


def _sparse(path, size: int, data: dict[int, bytes]) -> None:
    with open(path, "wb") as fh:
        fh.truncate(size)
        for pos, chunk in data.items():
            fh.seek(pos)
            fh.write(chunk)


def test_read_through_reads_each_file_once_and_skips_holes(tmp_path):
    (tmp_path / "a" / "seg").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "seg" / "matrix.dat").write_bytes(b"x" * 3_000_000)  # over one block
    (tmp_path / "b" / "ids.bin").write_bytes(b"y" * 10)
    size = 32 << 20
    _sparse(tmp_path / "a" / "wal", size, {0: b"z" * 4096, 16 << 20: b"w" * 4096})
    with open(tmp_path / "a" / "wal", "rb") as fh:
        extents = data_extents(fh.fileno(), size)
    data = sum(end - start for start, end in extents) if extents is not None else size
    assert data < size or extents is None  # a file system without holes reads it all
    assert read_through([tmp_path / "a", tmp_path / "b"]) == 3_000_000 + 10 + data
    assert read_through([tmp_path / "b"]) == 10


def test_read_through_skips_what_is_gone_and_stops_when_asked(tmp_path):
    (tmp_path / "a").mkdir()
    for n in range(3):
        (tmp_path / "a" / f"f{n}").write_bytes(b"q" * 100)
    assert read_through([tmp_path / "missing", tmp_path / "a"]) == 300
    calls = []
    assert read_through([tmp_path / "a"], stop=lambda: calls.append(1) or len(calls) > 1) == 100


def test_read_through_skips_the_files_it_read_before_hard_links_included(tmp_path):
    """A published version hard-links the files a change left alone: a reader's next generation
    reads only its new files through."""
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "segment.dat").write_bytes(b"s" * 5000)
    (tmp_path / "v1" / "appendable.dat").write_bytes(b"a" * 70)
    known: set = set()
    assert read_through([tmp_path / "v1"], known=known) == 5070
    (tmp_path / "v2").mkdir()
    os.link(tmp_path / "v1" / "segment.dat", tmp_path / "v2" / "segment.dat")
    (tmp_path / "v2" / "appendable.dat").write_bytes(b"b" * 90)  # a copy: a new file
    assert read_through([tmp_path / "v2"], known=known) == 90
    assert read_through([tmp_path / "v2"]) == 5090  # without `known`: everything
