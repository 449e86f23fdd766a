"""Bucketed tables (stores/bucketed.py): a one-file change writes that file's part only, a reader
gets the single-file table's rows in its order, two versions compare by their differing parts, a
crashed write leaves the last version readable."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtrag_resources.stores import bucketed
from mtrag_resources.stores.bucketed import Bucketing
from mtrag_resources.stores.table_changes import identity
from mtrag_resources.stores.table_delta import ProjectedTables, compare_tables, diff_tables
from mtrag_resources.stores.tables import (_forget, cached_rows, column_values, read_rows, read_shared, read_table,
                                           row_count, rows_where, write_rows, write_table)

pytestmark = pytest.mark.unit

BY_FILE = Bucketing(key="file_path", order=("file_path",), buckets=8)


def _chunks(files: dict[str, int], suffix: str = "") -> pa.Table:
    """Rows in the chunk table's order: by file, each file's rows in their own order (descending
    ids, so that a sort by id would show)."""
    rows = [{"chunk_id": f"{path}#{i}", "file_path": path, "text": f"{path} part {i}{suffix}"}
            for path in sorted(files) for i in reversed(range(files[path]))]
    return pa.Table.from_pylist(rows)


FILES = {f"pkg/mod{i:02d}.py": 3 + i % 4 for i in range(40)}


def test_read_gives_the_written_table_in_its_order(tmp_path):
    table = _chunks(FILES)
    counts = write_table(tmp_path / "chunks", table, bucketing=BY_FILE)
    assert counts["parts"] == 8 and counts["written"] == 8
    assert read_table(tmp_path / "chunks").to_pylist() == table.to_pylist()
    assert row_count(tmp_path / "chunks") == table.num_rows
    assert read_table(tmp_path / "chunks", columns=["chunk_id"]).column_names == ["chunk_id"]


def test_a_read_of_some_files_reads_their_buckets_only(tmp_path, monkeypatch):
    """read_table(keys=("file_path", files)): those files' rows as the whole table has them, in its
    order, from their buckets' parts alone; keys of another column read the whole table."""
    table = _chunks(FILES)
    write_table(tmp_path / "chunks", table, bucketing=BY_FILE)
    opened: list = []
    real_read = bucketed.pq.read_table
    monkeypatch.setattr(bucketed.pq, "read_table", lambda files, **kw: opened.append(files) or real_read(files, **kw))
    for files in (["pkg/mod03.py"], ["pkg/mod01.py", "pkg/mod17.py", "gone.py"], ["gone.py"], []):
        opened.clear()
        got = read_table(tmp_path / "chunks", columns=["chunk_id", "file_path"], keys=("file_path", files))
        assert [r for r in got.to_pylist() if r["file_path"] in files] == \
            [{"chunk_id": r["chunk_id"], "file_path": r["file_path"]} for r in table.to_pylist() if r["file_path"] in files]
        assert got.column_names == ["chunk_id", "file_path"]
        parts = [p for found in opened for p in (found if isinstance(found, list) else [found])]
        assert len(parts) <= len({bucketed.bucket_of(f, 8) for f in files})
    assert read_table(tmp_path / "chunks", keys=("chunk_id", ["x"])).num_rows == table.num_rows


def test_a_one_file_change_writes_one_part(tmp_path):
    path = tmp_path / "chunks"
    write_table(path, _chunks(FILES), bucketing=BY_FILE)
    before = {p.name: p.stat().st_ino for p in bucketed.part_files(path)}
    changed = dict(FILES, **{"pkg/mod07.py": 9})
    counts = write_table(path, _chunks(changed), bucketing=BY_FILE)
    assert counts["written"] == 1 and counts["parts"] == 8
    after = {p.name: p.stat().st_ino for p in bucketed.part_files(path)}
    kept = set(before) & set(after)
    assert len(kept) == 7 and all(before[n] == after[n] for n in kept)  # the same files, untouched
    assert sorted(p.name for p in path.glob("part-*.parquet")) == sorted(after)  # the old part is gone
    assert read_rows(path) == _chunks(changed).to_pylist()
    # the same content again writes nothing
    assert write_table(path, _chunks(changed), bucketing=BY_FILE)["written"] == 0


def test_a_snapshot_links_the_version_s_parts_and_drops_the_others(tmp_path):
    """link_version: the snapshot folder holds exactly the current manifest's parts, as hard links
    of the table's own files (the unchanged ones kept, the new one linked, the replaced one gone),
    and reads as the table; a crashed write's temporary part goes once it is old, not before."""
    path, snap = tmp_path / "chunks", tmp_path / "projected" / "chunks"
    write_table(path, _chunks(FILES), bucketing=BY_FILE)
    bucketed.link_version(path, snap)
    first = {p.name: p.stat().st_ino for p in bucketed.part_files(snap)}
    changed = dict(FILES, **{"pkg/mod07.py": 9})
    write_table(path, _chunks(changed), bucketing=BY_FILE)
    old_tmp, new_tmp = snap / ".tmp-old.part", snap / ".tmp-new.part"
    old_tmp.write_bytes(b"x")
    new_tmp.write_bytes(b"x")
    os.utime(old_tmp, (time.time() - 120,) * 2)
    bucketed.link_version(path, snap)
    names = sorted(p.name for p in snap.glob("part-*.parquet"))
    assert names == sorted(p.name for p in bucketed.part_files(path))
    assert all((snap / n).stat().st_ino == (path / n).stat().st_ino for n in names)  # links, not copies
    kept = set(first) & set(names)
    assert len(kept) == 7 and all(first[n] == (snap / n).stat().st_ino for n in kept)
    assert read_rows(snap) == _chunks(changed).to_pylist()
    assert not old_tmp.exists() and new_tmp.exists()


def test_an_empty_table_keeps_its_schema(tmp_path):
    schema = _chunks({"a.py": 1}).schema
    write_table(tmp_path / "t", schema.empty_table(), bucketing=BY_FILE)
    assert read_table(tmp_path / "t").schema.names == schema.names and row_count(tmp_path / "t") == 0


def test_compare_reads_the_differing_parts_and_finds_the_difference(tmp_path):
    path, snap = tmp_path / "chunks", ProjectedTables(tmp_path / "snap")
    write_table(path, _chunks(FILES), bucketing=BY_FILE)
    snap.save("g1", {"chunks": path})
    old = snap.load().tables["chunks"]
    assert old.is_dir() and identity(old) == identity(path)  # a hard-linked version
    changed = {k: v for k, v in FILES.items() if k != "pkg/mod03.py"}
    changed["pkg/new.py"] = 2
    write_table(path, _chunks(changed, suffix="").set_column(
        2, "text", pa.array([t + ("!" if t.startswith("pkg/mod05.py") else "") for t in _chunks(changed)["text"].to_pylist()])),
        bucketing=BY_FILE)
    new_parts, old_parts = bucketed.changed_parts(path, old)
    assert 0 < len(new_parts) <= 3 and len(old_parts) == len(new_parts)
    delta = compare_tables(path, old, key=("chunk_id",), names=("chunk_id", "file_path", "text"))
    assert sorted(delta.changed["chunk_id"].to_pylist()) == sorted(
        [f"pkg/new.py#{i}" for i in range(2)] + [f"pkg/mod05.py#{i}" for i in range(FILES["pkg/mod05.py"])])
    assert sorted(delta.removed) == sorted((f"pkg/mod03.py#{i}",) for i in range(FILES["pkg/mod03.py"]))
    # the snapshot still reads as the version it linked
    assert read_table(old).num_rows == sum(FILES.values())
    assert diff_tables(path, old, key=("chunk_id",)).via == "compare"


def test_a_crash_before_the_manifest_leaves_the_last_version(tmp_path, monkeypatch):
    path = tmp_path / "chunks"
    write_table(path, _chunks(FILES), bucketing=BY_FILE)

    def crash(*_a, **_k):
        raise OSError("disk gone")

    monkeypatch.setattr(bucketed, "write_bytes_atomic", crash)
    with pytest.raises(OSError):
        write_table(path, _chunks(dict(FILES, **{"pkg/mod01.py": 7})), bucketing=BY_FILE)
    monkeypatch.undo()
    assert read_rows(path) == _chunks(FILES).to_pylist()
    assert len(list(path.glob("part-*.parquet"))) == 9  # the unnamed part waits for the next write
    write_table(path, _chunks(FILES), bucketing=BY_FILE)
    assert len(list(path.glob("part-*.parquet"))) == 8


def test_a_reader_retries_when_a_writer_removed_its_parts(tmp_path, monkeypatch):
    path = tmp_path / "chunks"
    write_table(path, _chunks(FILES), bucketing=BY_FILE)
    stale = bucketed.load_manifest(path)
    write_table(path, _chunks(dict(FILES, **{"pkg/mod02.py": 1})), bucketing=BY_FILE)
    loads = iter([stale])
    real = bucketed.load_manifest
    monkeypatch.setattr(bucketed, "load_manifest", lambda p: next(loads, None) or real(p))
    assert read_table(path).num_rows == row_count(path)


def test_the_bucket_of_a_value_is_stable():
    # crc32: the same bucket in every process and version (hash() of a str differs per process), so
    # an unchanged file's rows stay in the part they were written to
    assert [bucketed.bucket_of(v, 32) for v in ("a.py", "django/utils/text.py", "", None)] == [30, 15, 0, 0]


@dataclass
class Edge:
    rel_id: str
    rel_type: str
    evidence_file: str


def test_rows_where_and_column_values_agree_with_the_whole_table_in_every_form(tmp_path):
    """Held instances, held records, or nothing held (a filtered Parquet read): the same rows, in
    the table's order, as filtering read_shared's."""
    path = tmp_path / "relations"
    rows = [Edge(f"r{i:03d}", ("INHERITS", "CALLS", "IMPORTS")[i % 3], f"m{i % 7}.py") for i in range(60)]
    bucketing = Bucketing(key="evidence_file", order=("rel_id",), buckets=4)
    write_rows(path, rows, Edge, bucketing)
    expected = [r for r in rows if r.rel_type in ("INHERITS", "IMPORTS")]
    held = rows_where(path, Edge, "rel_type", ["INHERITS", "IMPORTS"])
    assert held == expected and held[0] is rows[0]  # the writer's own instances
    _forget(path)
    read_shared(path)  # records held only
    assert rows_where(path, Edge, "rel_type", ["INHERITS", "IMPORTS"]) == expected
    assert column_values(path, ["rel_id"]) == {"rel_id": [r.rel_id for r in rows]}
    _forget(path)  # nothing held: only the matching rows are read
    assert rows_where(path, Edge, "rel_type", ["INHERITS", "IMPORTS"]) == expected
    assert cached_rows(path) is None  # the filtered read did not decode the table
    assert column_values(path, ["rel_id", "rel_type"])["rel_type"] == [r.rel_type for r in rows]
    assert rows_where(tmp_path / "none", Edge, "rel_type", ["CALLS"]) == []
    assert column_values(tmp_path / "none", ["rel_id"]) == {"rel_id": []}


# A file's rows as (chunk id suffix, text); a version of the table is {file: rows}.
_versions = st.lists(st.dictionaries(
    st.sampled_from([f"pkg/m{i}.py" for i in range(12)]),
    st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["a", "b", "c"])), min_size=1, max_size=4,
             unique_by=lambda r: r[0]),
    max_size=8), min_size=2, max_size=4)


def _version_table(files: dict[str, list]) -> pa.Table:
    rows = [{"chunk_id": f"{path}#{n}", "file_path": path, "text": text}
            for path in sorted(files) for n, text in files[path]]
    return pa.Table.from_pylist(rows, schema=pa.schema(
        [("chunk_id", pa.string()), ("file_path", pa.string()), ("text", pa.string())]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(versions=_versions)
def test_any_sequence_of_versions_reads_and_compares_as_single_files(tmp_path_factory, versions):
    """Whatever files come, change or go between versions, the bucketed table reads as the single
    file of the same rows, and comparing two versions by their differing parts finds what comparing
    the two whole files finds."""
    root = tmp_path_factory.mktemp("versions")
    path, snapshot, hinted = root / "chunks", ProjectedTables(root / "snap"), root / "hinted"
    for i, files in enumerate(versions):
        table = _version_table(files)
        single = root / f"v{i}.parquet"
        write_table(single, table)
        write_table(path, table, bucketing=BY_FILE)
        assert read_table(path).to_pylist() == table.to_pylist()
        # told which files changed, the write digests only their buckets and makes the same version
        before = versions[i - 1] if i else {}
        changed = {f for f in set(files) | set(before) if files.get(f) != before.get(f)}
        write_table(hinted, table, bucketing=BY_FILE, changed_keys=changed if i else None)
        assert bucketed.load_manifest(hinted)["parts"] == bucketed.load_manifest(path)["parts"]
        if i:
            names = ("chunk_id", "file_path", "text")
            by_parts = compare_tables(path, snapshot.load().tables["chunks"], ("chunk_id",), names)
            by_files = compare_tables(single, root / f"v{i - 1}.parquet", ("chunk_id",), names)
            assert sorted(by_parts.changed.to_pylist(), key=str) == sorted(by_files.changed.to_pylist(), key=str)
            assert sorted(by_parts.removed) == sorted(by_files.removed)
        snapshot.save(f"g{i}", {"chunks": path})


def test_told_the_changed_files_a_write_digests_only_their_buckets(tmp_path, monkeypatch):
    path = tmp_path / "chunks"
    write_table(path, _chunks(FILES), bucketing=BY_FILE)
    digested = []
    real = bucketed._digest
    monkeypatch.setattr(bucketed, "_digest", lambda part: digested.append(part.num_rows) or real(part))
    changed = dict(FILES, **{"pkg/mod03.py": FILES["pkg/mod03.py"] + 1})
    counts = write_table(path, _chunks(changed), bucketing=BY_FILE, changed_keys={"pkg/mod03.py"})
    assert len(digested) == 1 and counts["written"] == 1
    assert read_table(path).to_pylist() == _chunks(changed).to_pylist()
