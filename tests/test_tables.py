"""Parquet tables of dataclass rows (mtrag_resources/stores/tables.py): the column-wise write path
stores exactly the rows' values (a dict as sorted JSON, lists as lists, None as null), whatever
mix of them a table holds, and a table of one field or of mixed row types takes the other paths."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtrag_resources.stores.tables import (_forget, adopt_rows, cached_rows, read_rows, read_shared, row_count,
                                           write_rows)

pytestmark = pytest.mark.unit


@dataclass
class Row:
    name: str
    line: int | None = None
    tags: list = field(default_factory=list)
    extra: dict | None = None


@dataclass
class OneField:
    value: str


texts = st.text(max_size=12)
rows_strategy = st.lists(st.builds(
    Row, name=texts, line=st.one_of(st.none(), st.integers(-2**40, 2**40)),
    tags=st.lists(texts, max_size=3),
    extra=st.one_of(st.none(), st.dictionaries(texts, st.one_of(texts, st.integers()), max_size=3))),
    min_size=1, max_size=40)


def _expected(rows: list[Row]) -> list[dict]:
    return [{"name": r.name, "line": r.line, "tags": r.tags,
             "extra": json.dumps(r.extra, sort_keys=True) if isinstance(r.extra, dict) else None} for r in rows]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=rows_strategy)
def test_the_file_holds_every_value_of_the_rows(tmp_path, rows):
    path = tmp_path / "rows.parquet"
    assert write_rows(path, rows, Row) == len(rows)
    _forget(path)  # what the file holds, not this process's memo of it
    assert pq.read_table(path).to_pylist() == _expected(rows)
    assert read_rows(path) == _expected(rows)


def test_one_field_rows_and_mixed_rows_are_written_too(tmp_path):
    one = [OneField("a"), OneField("b")]
    write_rows(tmp_path / "one.parquet", one, OneField)
    _forget(tmp_path / "one.parquet")
    assert read_rows(tmp_path / "one.parquet") == [{"value": "a"}, {"value": "b"}]

    @dataclass
    class Other(Row):
        pass

    mixed = [Row("x", 1, ["t"], {"k": 1}), Other("y")]  # not one dataclass: the row-wise path
    write_rows(tmp_path / "mixed.parquet", mixed)
    _forget(tmp_path / "mixed.parquet")
    assert read_rows(tmp_path / "mixed.parquet") == _expected(mixed)


def test_row_count_reads_the_footer_only(tmp_path):
    table = tmp_path / "links.parquet"
    assert row_count(table) == 0  # no table yet
    write_rows(table, [{"id": str(i)} for i in range(5)])
    assert row_count(table) == 5 == len(read_rows(table))
    write_rows(table, [])
    assert row_count(table) == 0


@settings(max_examples=80, deadline=None)
@given(texts=st.lists(st.one_of(st.none(), st.sampled_from(["", "a", "é", "中"])), max_size=12),
       flags=st.lists(st.one_of(st.none(), st.booleans()), max_size=12))
def test_arrow_counts_are_what_python_counts(texts, flags):
    """column_counts is Counter (values and first-occurrence order); truthy_count is
    sum(bool(v)), for strings (empty and null count as false), booleans and all-null columns."""
    import pyarrow as pa
    from collections import Counter

    from mtrag_resources.stores.tables import column_counts, truthy_count

    table = pa.table({"t": pa.array(texts, type=pa.string()), "n": pa.array([None] * len(texts))})
    assert column_counts(table, "t") == dict(Counter(texts))
    assert list(column_counts(table, "t")) == list(dict(Counter(texts)))
    assert truthy_count(table, "t") == sum(bool(v) for v in texts)
    assert truthy_count(table, "n") == 0
    flagged = pa.table({"f": pa.array(flags, type=pa.bool_())})
    assert truthy_count(flagged, "f") == sum(bool(v) for v in flags)


def test_rows_the_file_already_holds_are_not_written_again(tmp_path):
    """write_rows skips a file whose current version holds these rows (by this process's decoded
    rows of it), and writes when a row differs, when the rows are records, and when the file was
    replaced by someone else."""
    path = tmp_path / "refs.parquet"
    rows = [Row(name="a", line=1), Row(name="b", tags=["x"])]

    def version():
        st_ = path.stat()
        return st_.st_ino, st_.st_mtime_ns

    write_rows(path, rows, Row)
    first = version()
    assert write_rows(path, list(rows), Row) == 2 and version() == first  # the same objects
    assert write_rows(path, [Row(name="a", line=1), Row(name="b", tags=["x"])], Row) == 2
    assert version() == first  # equal values
    write_rows(path, [Row(name="a", line=2), rows[1]], Row)
    assert version() != first and read_rows(path, Row)[0].line == 2
    records = [{"module_qn": "m", "imported": "x"}]
    write_rows(tmp_path / "imports.parquet", records)
    held = (tmp_path / "imports.parquet").stat().st_ino
    write_rows(tmp_path / "imports.parquet", [dict(r) for r in records])
    assert (tmp_path / "imports.parquet").stat().st_ino == held
    pq.write_table(pq.read_table(path).slice(0, 1), path)  # another writer: the version changed
    write_rows(path, [Row(name="a", line=2), rows[1]], Row)
    assert [r.name for r in read_rows(path, Row)] == ["a", "b"]


def test_rows_equal_to_the_file_s_are_adopted_as_its_shared_rows_and_others_are_not(tmp_path):
    """adopt_rows: equal rows (the same rows built again) become what read_shared and cached_rows
    give for the file's version, so a writer finds them by identity; rows that differ from the file
    in any value, or in number, leave the file's own decoded rows in place."""
    path = tmp_path / "nodes.parquet"
    write_rows(path, [Row(name="a", line=1), Row(name="b", tags=["x"])], Row)
    _forget(path)  # as a process that starts after the write: it decodes the file
    decoded = read_shared(path, Row)
    assert not adopt_rows(path, [Row(name="a", line=1), Row(name="b", tags=["y"])], Row)
    assert not adopt_rows(path, [Row(name="a", line=1)], Row)
    assert cached_rows(path, Row) is decoded
    again = [Row(name="a", line=1), Row(name="b", tags=["x"])]
    assert adopt_rows(path, again, Row)
    assert read_shared(path, Row) is again and cached_rows(path, Row) is again
    assert not adopt_rows(tmp_path / "missing.parquet", again, Row)


def test_one_file_reads_as_pq_read_table_reads_it(tmp_path):
    """read_parquet_file (no dataset) gives pq.read_table's table, schema metadata included, and
    its errors: a missing column or file, a file that is not Parquet."""
    import pyarrow as pa

    from mtrag_resources.core.arrow import read_parquet_file
    path = tmp_path / "t.parquet"
    table = pa.table({"a": [1, 2], "b": ["x", None], "n": [{"k": 1}, {"k": 2}]}).replace_schema_metadata({"m": "1"})
    pq.write_table(table, path)
    for columns in (None, ["b"], ["b", "a"], ["n"], []):
        got, want = read_parquet_file(path, columns), pq.read_table(path, columns=columns)
        assert got.equals(want) and got.schema.metadata == want.schema.metadata, columns
    with pytest.raises(pa.ArrowInvalid):
        read_parquet_file(path, ["a", "missing"])
    with pytest.raises(FileNotFoundError):
        read_parquet_file(tmp_path / "none.parquet")
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(pa.ArrowInvalid):
        read_parquet_file(tmp_path / "bad.parquet")
