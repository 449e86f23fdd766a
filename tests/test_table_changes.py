"""The producers' change logs (stores/table_changes.py): where a log applies, the store stages read
exactly the difference the comparison of the two whole tables finds; where it does not, they
compare."""
from __future__ import annotations

import dataclasses
import os
from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa
import pytest
import pyarrow.compute  # noqa: F401 - pa.compute
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtrag_resources.stores.table_changes import (changes_path, forget_changes, identity, record_changes,
                                                  record_row_changes)
from mtrag_resources.stores.table_delta import ProjectedTables, compare_tables, diff_tables
from mtrag_resources.stores.bucketed import Bucketing
from mtrag_resources.stores.tables import held_table, read_schema, read_shared, read_table, truthy_count, value_counts, write_rows, write_rows_changed, write_table

pytestmark = pytest.mark.unit

SCHEMA = pa.schema([("id", pa.string()), ("path", pa.string()), ("v", pa.int64()),
                    ("tags", pa.list_(pa.string())), ("note", pa.string())])
_ROW = st.fixed_dictionaries({
    "id": st.sampled_from("abcdefgh"), "path": st.sampled_from(["p", "q"]), "v": st.integers(0, 2) | st.none(),
    "tags": st.lists(st.sampled_from(["x", ""]), max_size=2), "note": st.sampled_from(["", "é"]) | st.none()})
_ROWS = st.lists(_ROW, max_size=8, unique_by=lambda r: r["id"])
# (key, compared columns) as the store stages ask: the primary key alone or with another column,
# every column or a subset
_ASKS = [(("id",), None), (("id",), ("id", "v")), (("id", "path"), ("id", "path", "tags")), (("path", "id"), None)]


def _write_version(table, rows, log_rows: str) -> None:
    """Write `rows` over `table`, and its log."""
    base = identity(table)
    old = read_shared(table) if table.exists() else []
    write_table(table, pa.Table.from_pylist(rows, schema=SCHEMA))
    if log_rows == "all":  # a producer that passes every row
        record_changes(table, base, "id", old, rows, SCHEMA)
    else:  # one that passes the rows of one path only (cas_chunks: the files it parsed again)
        record_changes(table, base, "id", [r for r in old if r["path"] == "q"],
                       [r for r in rows if r["path"] == "q"], SCHEMA)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old_rows=_ROWS, new_rows=_ROWS, how=st.sampled_from(["all", "q"]))
def test_the_log_gives_what_comparing_the_tables_gives(tmp_path, old_rows, new_rows, how):
    if how == "q":  # rows outside path q are the producer's kept rows: the same in both versions
        kept = [r for r in old_rows if r["path"] == "p"]
        new_rows = kept + [r for r in new_rows if r["path"] == "q" and r["id"] not in {k["id"] for k in kept}]
    table = tmp_path / "chunks.parquet"
    write_table(table, pa.Table.from_pylist(old_rows, schema=SCHEMA))
    snapshot = ProjectedTables(tmp_path / "projected")
    snapshot.save("g1", {"t": table})
    _write_version(table, new_rows, how)
    old = snapshot.load().tables["t"]
    for key, columns in _ASKS:
        names = columns or tuple(SCHEMA.names)
        logged = diff_tables(table, old, key=key, columns=columns)
        compared = compare_tables(table, old, key, names)
        assert logged.via == "log"
        assert sorted(logged.changed.to_pylist(), key=repr) == sorted(compared.changed.to_pylist(), key=repr)
        assert logged.changed.schema.names == list(names)
        assert sorted(logged.removed) == sorted(compared.removed)


def test_a_log_of_other_versions_is_not_used(tmp_path):
    """A snapshot two writes behind, a table rewritten after its log, a copied snapshot, a log gone:
    the tables are compared."""
    table = tmp_path / "chunks.parquet"
    rows = [{"id": "a", "path": "p", "v": 1, "tags": [], "note": None}]
    write_table(table, pa.Table.from_pylist(rows, schema=SCHEMA))
    snapshot = ProjectedTables(tmp_path / "projected")
    snapshot.save("g1", {"t": table})
    _write_version(table, rows + [{"id": "b", "path": "q", "v": 2, "tags": [], "note": None}], "all")
    _write_version(table, rows + [{"id": "c", "path": "q", "v": 3, "tags": [], "note": None}], "all")
    old = snapshot.load().tables["t"]
    stale = diff_tables(table, old, key=("id",))  # the log is the second write's: g1 is two behind
    assert stale.via == "compare" and [r["id"] for r in stale.changed.to_pylist()] == ["c"]
    snapshot.save("g2", {"t": table})
    write_table(table, pa.Table.from_pylist(rows, schema=SCHEMA))  # a writer that stopped before its log
    assert diff_tables(table, snapshot.load().tables["t"], key=("id",)).via == "compare"
    assert diff_tables(table, snapshot.load().tables["t"], key=("id",)).removed == [("c",)]
    forget_changes(table)
    assert not changes_path(table).exists()
    assert diff_tables(table, old, key=("id",)).via == "compare"


def test_a_snapshot_that_is_a_copy_is_compared(tmp_path, monkeypatch):
    """Where links are refused, ProjectedTables copies the table: the copy is another file than the
    one the producer replaced, so its log does not apply."""
    table = tmp_path / "chunks.parquet"
    rows = [{"id": "a", "path": "p", "v": 1, "tags": [], "note": None}]
    write_table(table, pa.Table.from_pylist(rows, schema=SCHEMA))

    def refuse(src, dst):
        raise OSError("links refused")
    monkeypatch.setattr(os, "link", refuse)
    snapshot = ProjectedTables(tmp_path / "projected")
    snapshot.save("g1", {"t": table})
    _write_version(table, [], "all")
    assert changes_path(table).exists()
    delta = diff_tables(table, snapshot.load().tables["t"], key=("id",))
    assert delta.via == "compare" and delta.removed == [("a",)]


@dataclass
class Row:
    id: str
    v: int
    tags: list = field(default_factory=list)


def test_instance_rows_log_only_what_differs(tmp_path):
    table = tmp_path / "nodes.parquet"
    same, old_b = Row("a", 1, ["x"]), Row("b", 2)
    write_rows(table, [same, old_b, Row("c", 3)], Row)
    snapshot = ProjectedTables(tmp_path / "projected")
    snapshot.save("g1", {"t": table})
    base = identity(table)
    new = [same, Row("b", 2), Row("d", 4, ["y"])]  # a: the same object; b: equal values; c gone; d new
    changes = write_rows_changed(table, new, Row, "id")
    assert [r.id for r in changes.fresh] == ["d"] and [r.id for r in changes.replaced] == ["c"]
    assert record_row_changes(table, base, "id", changes) == {"changed": 1, "removed": 1}
    delta = diff_tables(table, snapshot.load().tables["t"], key=("id",))
    assert delta.via == "log"
    assert delta.changed.to_pylist() == [{"id": "d", "v": 4, "tags": ["y"]}] and delta.removed == [("c",)]
    dup = [Row("a", 1), Row("a", 2)]  # a key that is not unique: the whole table, and no log
    assert write_rows_changed(table, dup, Row, "id") is None
    assert record_row_changes(table, identity(table), "id", None) == {}
    assert not changes_path(table).exists()


def test_a_table_another_writer_left_out_of_key_order_is_merged_in_order(tmp_path):
    """Rows held from a write_rows in another order are no keyed base: the change's table is in
    key order, as a whole write of the same rows."""
    table = tmp_path / "t.parquet"
    a, b = Row("a", 1), Row("b", 2)
    write_rows(table, [b, a], Row)
    write_rows_changed(table, [a, b, Row("c", 3)], Row, "id")
    assert [r["id"] for r in read_table(table).to_pylist()] == ["a", "b", "c"]


@dataclass
class Node:
    id: str
    v: int | None = None
    tags: list = field(default_factory=list)
    note: str | None = None


_NODE = st.builds(Node, id=st.sampled_from(["a", "b", "c", "é", "中", "Z", "a_b"]), v=st.integers(0, 2) | st.none(),
                  tags=st.lists(st.sampled_from(["x", ""]), max_size=2), note=st.sampled_from(["", "é"]) | st.none())
_VERSIONS = st.lists(st.lists(_NODE, max_size=6, unique_by=lambda n: n.id), min_size=1, max_size=4)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(versions=_VERSIONS, ordered=st.booleans())
def test_changed_rows_write_the_table_a_whole_write_does(tmp_path, versions, ordered):
    """Version after version, the merged table is byte for byte the file write_rows writes for the
    same rows (so the data version does not depend on the path taken), whatever changed: rows new,
    gone or changed, or a column going all null or getting its first value; whether the caller
    says the rows are in key order (`ordered`, as the graph stage does) or they are checked."""
    merged, whole = tmp_path / "merged.parquet", tmp_path / "whole.parquet"
    for p in (merged, whole):
        p.unlink(missing_ok=True)
    held: dict[str, Node] = {}
    for version in versions:
        rows = sorted((held.get(n.id) if held.get(n.id) == n else n for n in version), key=lambda n: n.id)
        write_rows_changed(merged, rows, Node, "id", ordered=ordered)
        write_rows(whole, rows, Node)
        assert merged.read_bytes() == whole.read_bytes()
        if rows:  # the held Arrow table (merged) and the file's column (whole) count as Counter does
            expected = dict(Counter(n.note for n in rows))
            assert value_counts(merged, "note") == value_counts(whole, "note") == expected
            assert list(value_counts(merged, "note")) == list(expected)  # first occurrences' order
            # neo4j_graph's totals: the held table and the file's column, an all-null column too
            assert truthy_count(held_table(merged, ["note"]), "note") == \
                truthy_count(held_table(whole, ["note"]), "note") == sum(bool(n.note) for n in rows)
            # the store stages' row reads (neo4j_graph's changed edges, fts_db's endpoints)
            for filters in ([("id", "in", ["a", "中", "Z"])], [("id", "=", "b")]):
                assert held_table(merged, filters=filters).to_pylist() == \
                    read_table(whole, filters=filters).to_pylist() == \
                    [dataclasses.asdict(n) for n in rows if n.id in filters[0][2]]
        held = {n.id: n for n in rows}
    if rows:  # a row changed by value (a new object with the same key) is found and merged
        changed = Node(rows[0].id, 7 if rows[0].v != 7 else 8, rows[0].tags, rows[0].note)
        changes = write_rows_changed(merged, [changed, *rows[1:]], Node, "id")
        write_rows(whole, [changed, *rows[1:]], Node)
        assert merged.read_bytes() == whole.read_bytes()
        # None: the whole table (a column whose type the change alters, e.g. v's first value)
        assert changes is None or (changes.fresh == [changed] and changes.replaced == [rows[0]])


@dataclass
class Edge:
    id: str
    file: str
    v: int


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.sets(st.integers(0, 399), max_size=4), st.sets(st.integers(0, 399), max_size=4),
                                st.integers(0, 300)), min_size=1, max_size=90))
def test_many_small_changes_to_a_bucketed_table_keep_its_rows(tmp_path, steps):
    """Small changes merge into the held table as slices around the fresh rows (and a change of
    more rows than that, by a filter and a sort): after every one the table read back, the held
    one and a whole write of the same rows agree, and the held table's chunks stay bounded."""
    from mtrag_resources.stores import tables
    merged, whole = tmp_path / "merged", tmp_path / "whole"
    bucketing = Bucketing(key="file", order=("id",), buckets=8)
    for p in (merged, whole):
        write_table(p, pa.table({"id": ["x"], "file": ["f"], "v": [0]}), bucketing=bucketing)
    rows = {f"{i:04d}": Edge(f"{i:04d}", f"f{i % 37}", 0) for i in range(0, 400, 2)}
    for step, (added, removed, bulk) in enumerate(steps):
        for i in added:
            rows[f"{i:04d}"] = Edge(f"{i:04d}", f"f{i % 37}", step)
        for i in removed:
            rows.pop(f"{i:04d}", None)
        if bulk > 280:  # more rows than a sliced merge takes: every row a new object
            rows = {k: Edge(r.id, r.file, r.v + 1) for k, r in rows.items()}
        ordered = [rows[k] for k in sorted(rows)]
        changes = write_rows_changed(merged, ordered, Edge, "id", bucketing)
        assert changes is not None or step == 0  # merged, not written whole (the first: nothing held)
        write_rows(whole, ordered, Edge, bucketing)
        expected = [dataclasses.asdict(r) for r in ordered]
        assert read_table(merged).to_pylist() == read_table(whole).to_pylist() == expected
        assert held_table(merged).to_pylist() == expected
        assert held_table(merged).column(0).num_chunks <= tables._MAX_CHUNKS


_PATHS = st.sampled_from(["a.py", "b/c.py", "é.md", "Z.md", "a_b.py", "中文.md", "b.py"])


@settings(max_examples=60, deadline=None)
@given(old=st.lists(st.tuples(_PATHS, st.integers(0, 3)), max_size=12),
       reparsed=st.sets(_PATHS), new=st.lists(st.tuples(_PATHS, st.integers(0, 3)), max_size=6))
def test_cas_chunks_records_from_the_previous_table_equal_decoding_the_new_one(old, reparsed, new):
    """cas_chunks' records of a rebuilt chunk table, reusing the previous records of the files it
    kept (stages/cas_chunks._records), are table.to_pylist() of the new table, in its order."""
    from mtrag_resources.stages import cas_chunks

    def table_of(rows):
        return pa.Table.from_pylist([{"chunk_id": f"{p}#{i}#{n}", "file_path": p, "n": v, "repository": "r", "ref": ""}
                                     for i, (p, v, n) in enumerate(rows)],
                                    schema=pa.schema([("chunk_id", pa.string()), ("file_path", pa.string()),
                                                      ("n", pa.int64()), ("repository", pa.string()), ("ref", pa.string())]))

    previous = table_of([(p, v, "old") for p, v in old]).sort_by([("file_path", "ascending")])
    kept = {p for p, _ in old} - reparsed
    kept_part = previous.filter(pa.compute.is_in(previous["file_path"], value_set=pa.array(sorted(kept) or [""])))
    fresh = table_of([(p, v, "new") for p, v in new if p not in kept])
    table = pa.concat_tables([kept_part, fresh]).sort_by([("file_path", "ascending")])
    records = cas_chunks._records(table, previous.to_pylist(), previous, kept)
    assert records == table.to_pylist()


def test_a_schema_is_read_again_when_the_table_is_replaced(tmp_path):
    """read_schema's memo (by file identity) gives a replaced table's new columns, a single Parquet
    file or a bucketed table alike."""
    single, folder = tmp_path / "t.parquet", tmp_path / "bucketed"
    for path, bucketing in ((single, None), (folder, Bucketing(key="p", order=("p",), buckets=4))):
        write_table(path, pa.table({"p": ["x", "y"]}), bucketing=bucketing)
        assert read_schema(path).names == read_schema(path).names == ["p"]
        write_table(path, pa.table({"p": ["x", "y"], "v": [1, 2]}), bucketing=bucketing)
        assert read_schema(path).names == ["p", "v"]


def test_a_snapshot_of_other_columns_is_no_base(tmp_path):
    """ProjectedTables.base_for: a snapshot whose tables had other columns than the new ones is no
    base for a delta (the column names recorded at save, or the snapshot's files where a state
    written before they were recorded has none); the same columns are."""
    table, snapshot = tmp_path / "chunks", ProjectedTables(tmp_path / "projected")
    bucketing = Bucketing(key="p", order=("p",), buckets=4)
    write_table(table, pa.table({"p": ["x", "y"]}), bucketing=bucketing)
    snapshot.save("g1", {"chunks": table}, {"v": 1})
    assert snapshot.load().columns == {"chunks": ["p"]}
    write_table(table, pa.table({"p": ["x", "z"]}), bucketing=bucketing)
    assert snapshot.base_for("g2", {"v": 1}, {"chunks": table}).generation == "g1"
    write_table(table, pa.table({"p": ["x", "z"], "v": [1, 2]}), bucketing=bucketing)
    assert snapshot.base_for("g2", {"v": 1}, {"chunks": table}) is None
    state = snapshot.folder / "state.json"  # a state without the names: the snapshot's files say
    state.write_text(state.read_text().replace('"columns"', '"ignored"'))
    assert snapshot.load().columns is None
    assert snapshot.base_for("g2", {"v": 1}, {"chunks": table}) is None


@dataclass
class Labelled:
    id: str
    label: str
    v: int = 0


_VERSION_OPS = st.lists(st.tuples(st.sampled_from(["keep", "renew", "change", "drop"]), st.integers(0, 30),
                                  st.sampled_from(["Function", "Class", "Chunk"])), max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(_VERSION_OPS, min_size=1, max_size=6))
def test_rows_where_brought_up_to_date_is_the_filter_of_the_rows_held(tmp_path, steps):
    """rows_where's answer after write_rows_changed's merges, taken from its last answer and the
    change, holds the very instances (not only equal ones) a filter of the rows held gives, in
    their order: rows new, gone, changed, or new instances equal to the old ones."""
    from mtrag_resources.stores.tables import rows_where
    table = tmp_path / f"labelled-{len(steps)}.parquet"
    table.unlink(missing_ok=True)
    rows = {f"{i:02d}": Labelled(f"{i:02d}", ("Function", "Class", "Chunk")[i % 3]) for i in range(0, 30, 2)}
    write_rows(table, sorted(rows.values(), key=lambda r: r.id), Labelled)
    for step in steps:
        asked = rows_where(table, Labelled, "label", ["Function", "Class"])  # the answer to bring up to date
        for op, i, label in step:
            k = f"{i:02d}"
            if op == "renew" and k in rows:
                rows[k] = Labelled(rows[k].id, rows[k].label, rows[k].v)
            elif op == "change":
                rows[k] = Labelled(k, label, (rows[k].v + 1) if k in rows else 0)
            elif op == "drop":
                rows.pop(k, None)
        held = sorted(rows.values(), key=lambda r: r.id)
        write_rows_changed(table, held, Labelled, "id")
        got = rows_where(table, Labelled, "label", ["Function", "Class"])
        want = [r for r in held if r.label in ("Function", "Class")]
        assert len(got) == len(want) and all(a is b for a, b in zip(got, want)), (asked, got, want)
