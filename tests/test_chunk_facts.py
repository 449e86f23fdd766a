"""The publish gate's chunk facts (publish/checks.py chunk_facts): from the decoded rows the
process holds, else computed in Arrow on the checked columns alone, the same facts either way, and
a table written before a column existed still checks."""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from mtrag_resources.publish import checks
from mtrag_resources.publish.checks import check_parents, chunk_facts, row_facts, table_facts
from mtrag_resources.stores import tables

pytestmark = pytest.mark.unit


def _rows(with_new_columns: bool) -> list[dict]:
    rows = [{"chunk_id": "p", "parent_id": None, "role": "parent", "content_hash": "h1", "text_extra": "x"},
            {"chunk_id": "c1", "parent_id": "p", "role": "child", "content_hash": "h2", "text_extra": "y"},
            {"chunk_id": "c2", "parent_id": "gone", "role": "child", "content_hash": "h3", "text_extra": "z"}]
    if with_new_columns:
        for r in rows:
            r.update(script="latin", embed_hash="")
    return rows


@pytest.mark.parametrize("with_new_columns", [True, False])
def test_a_table_not_held_is_checked_in_arrow_with_the_facts_of_its_rows(tmp_path, with_new_columns):
    path = tmp_path / "chunks.parquet"
    rows = _rows(with_new_columns)
    tables.write_rows(path, rows)
    tables._DECODED.clear()  # as a process that did not write it
    facts = chunk_facts(path)
    assert tables.cached_rows(path) is None  # nothing decoded into row dicts
    assert facts == row_facts(rows)
    assert facts.rows == 3 and facts.children == 2 and facts.dangling == ["c2"]
    outcome = check_parents("src", facts)
    assert not outcome.passed and outcome.metadata == {"dangling": 1}


def test_held_rows_give_their_memoised_facts(tmp_path):
    path = tmp_path / "chunks.parquet"
    tables.write_rows(path, _rows(True))
    assert chunk_facts(path) is row_facts(tables.read_shared(path))


def test_the_checks_derive_each_rows_list_once_and_a_new_list_again():
    """row_facts is memoised by the list (the stages' shared rows: one list until the table
    changes); another list, even one equal in length, is derived again."""
    rows = _rows(True)
    assert check_parents("src", row_facts(rows)).metadata == {"dangling": 1}
    assert row_facts(rows) is row_facts(rows)
    fixed = [dict(r, parent_id="p") if r["chunk_id"] == "c2" else r for r in rows]
    assert check_parents("src", row_facts(fixed)).passed
    assert row_facts(fixed).children == 2 and row_facts(fixed).vector_hashes == ["h2", "h3"]
    assert row_facts(rows).dangling == ["c2"]
    assert len(checks._ROW_FACTS) <= checks._ROW_FACTS.max_entries


_ids = st.sampled_from(["a", "b", "c", "d", "e", "f"])
_maybe = st.one_of(st.none(), st.just(""), _ids)
_COLUMNS = ("chunk_id", "parent_id", "role", "script", "embed_hash", "content_hash")
_row = st.fixed_dictionaries({
    "chunk_id": _ids, "parent_id": _maybe, "role": st.one_of(st.none(), st.sampled_from(["child", "parent"])),
    "script": st.one_of(st.none(), st.sampled_from(["cjk", "latin", ""])),
    "embed_hash": st.one_of(st.none(), st.just(""), st.sampled_from(["e1", "e2", "h1"])),
    "content_hash": st.sampled_from(["h1", "h2", "h3"])})


@hsettings(max_examples=300, deadline=None)
@given(st.lists(_row, max_size=12), st.sets(st.sampled_from(["script", "embed_hash"])))
def test_arrow_facts_equal_the_row_facts_for_any_rows(rows, dropped):
    """Nulls, empty strings, duplicate ids, missing columns: the Arrow facts are the rows' facts."""
    rows = [{k: v for k, v in r.items() if k not in dropped} for r in rows]
    schema = pa.schema([(k, pa.string()) for k in _COLUMNS if k not in dropped])
    table = pa.Table.from_pylist(rows, schema=schema)
    assert table_facts(table) == row_facts(rows)
