"""The publish gate's chunk rows (publish/checks.py checked_rows): the decoded rows the process
holds, else only the columns the checks read, and a table written before a column existed still
checks."""
from __future__ import annotations

import pytest

from mtrag_resources.publish.checks import CHECKED_COLUMNS, check_parents, checked_rows
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
def test_a_table_not_held_gives_the_checked_columns_only(tmp_path, with_new_columns):
    path = tmp_path / "chunks.parquet"
    tables.write_rows(path, _rows(with_new_columns))
    tables._DECODED.clear()  # as a process that did not write it
    rows = checked_rows(path)
    assert set(rows[0]) == set(CHECKED_COLUMNS) if with_new_columns else set(rows[0]) < set(CHECKED_COLUMNS)
    assert "text_extra" not in rows[0]
    outcome = check_parents("src", rows)
    assert not outcome.passed and outcome.metadata == {"dangling": 1}


def test_held_rows_are_the_checked_rows(tmp_path):
    path = tmp_path / "chunks.parquet"
    tables.write_rows(path, _rows(True))
    assert checked_rows(path) is tables.read_shared(path)


def test_the_checks_derive_each_rows_list_once_and_a_new_list_again():
    """check_parents and check_counts take what they derive from a rows list from a memo by the
    list (the stages' shared rows: one list until the table changes); another list, even one equal
    in length, is derived again."""
    from mtrag_resources.publish import checks
    rows = _rows(True)
    assert check_parents("src", rows).metadata == {"dangling": 1}
    assert checks._row_facts(rows) is checks._row_facts(rows)
    fixed = [dict(r, parent_id="p") if r["chunk_id"] == "c2" else r for r in rows]
    assert check_parents("src", fixed).passed
    assert checks._row_facts(fixed).children == 2 and checks._row_facts(fixed).vector_hashes == ["h2", "h3"]
    assert check_parents("src", rows).metadata == {"dangling": 1}
