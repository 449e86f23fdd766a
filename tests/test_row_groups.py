"""write_row_groups: a table written as one list of rows per file, where the lists this process
wrote last time are taken from the held Arrow table; the file must hold what write_rows writes for
the same rows, whichever groups are kept, replaced, added or dropped."""
from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtrag_resources.core.models import DocReference
from mtrag_resources.stores import tables
from mtrag_resources.stores.tables import read_shared, write_row_groups, write_rows

pytestmark = pytest.mark.unit


def _ref(file: int, n: int, target: str, context: str | None) -> DocReference:
    return DocReference(chunk_id=f"docs/f{file}.md#{n}", file_path=f"docs/f{file}.md", line=n, ref_kind="role",
                        role="func", target=target, matched_text=f":func:`{target}`",
                        module_context=context, source_id="docs")


group = st.builds(lambda file, items: [_ref(file, i, t, c) for i, (t, c) in enumerate(items)],
                  st.integers(0, 3), st.lists(st.tuples(st.sampled_from(["a.b", "c", "日本.x"]),
                                                        st.sampled_from(["", "pkg"])), max_size=3))
# each step: per group slot, keep the list written before, replace it (maybe None-valued), or drop it
steps = st.lists(st.lists(st.tuples(st.sampled_from(["keep", "new", "none"]), group), min_size=0, max_size=4),
                 min_size=1, max_size=5)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=steps)
def test_grouped_writes_hold_what_write_rows_holds(tmp_path_factory, steps):
    tmp = tmp_path_factory.mktemp("groups")
    path, plain = tmp / "references.parquet", tmp / "plain.parquet"
    groups: list[list] = []
    for step in steps:
        new_groups = []
        for i, (how, fresh) in enumerate(step):
            if how == "keep" and i < len(groups):
                new_groups.append(groups[i])  # the very list written before
            elif how == "none":  # a column whose values turn None: its type changes
                new_groups.append([DocReference(**{**vars(r), "module_context": None}) for r in fresh])
            else:
                new_groups.append(fresh)
        groups = new_groups
        rows = [r for g in groups for r in g]
        if not rows:
            continue
        write_row_groups(path, groups, DocReference)
        write_rows(plain, rows, DocReference)
        got, want = pq.read_table(path), pq.read_table(plain)
        assert got.schema.remove_metadata() == want.schema.remove_metadata()
        assert got.to_pylist() == want.to_pylist()
        assert read_shared(path, DocReference) == rows


def _written(tmp_path, files: int, per_file: int) -> tuple:
    """A references table written from `files` groups of `per_file` rows: (its path, the groups)."""
    path = tmp_path / "references.parquet"
    groups = [[_ref(f, n, "a.b", "") for n in range(per_file)] for f in range(files)]
    write_row_groups(path, groups, DocReference)
    return path, groups


def _sizes_passed_to(monkeypatch, name: str) -> list[int]:
    """The length of what each call of tables.`name` gets from now on."""
    sizes: list[int] = []
    real = getattr(tables, name)
    monkeypatch.setattr(tables, name, lambda arg: sizes.append(len(arg)) or real(arg))
    return sizes


def test_an_unchanged_group_is_not_converted_again(tmp_path, monkeypatch):
    path, groups = _written(tmp_path, files=4, per_file=50)
    converted = _sizes_passed_to(monkeypatch, "_dataclass_columns")
    changed = [groups[0], [_ref(1, 0, "c", "")], groups[2], groups[3]]
    write_row_groups(path, changed, DocReference)
    assert converted == [1]  # the one changed file's rows
    assert pq.read_table(path).num_rows == 151
    stat = path.stat()
    write_row_groups(path, list(changed), DocReference)  # the same lists again: the file stays
    assert path.stat().st_mtime_ns == stat.st_mtime_ns and converted == [1]


def test_kept_neighbours_are_one_slice_of_the_held_table(tmp_path, monkeypatch):
    """A file removed from the middle of 40: the table is made of the two runs of kept files around
    it, not a slice per file (django's docs: ~650 slices cast and joined, ~0.1 s a change)."""
    path, groups = _written(tmp_path, files=40, per_file=5)
    joined = _sizes_passed_to(monkeypatch, "_as_inferred")
    changed = groups[:17] + groups[18:]
    write_row_groups(path, changed, DocReference)
    assert joined == [2]
    assert read_shared(path, DocReference) == [r for g in changed for r in g]
    changed = [*changed[:5], [_ref(99, 0, "c", "")], *changed[5:]]  # a file added among them
    write_row_groups(path, changed, DocReference)
    assert joined == [2, 3]
    assert read_shared(path, DocReference) == [r for g in changed for r in g]


def test_rows_the_process_holds_for_the_file_are_not_written_again(tmp_path):
    """A process that read the table (the watch's warm-up) and has no groups of it yet: the same
    rows write nothing, as write_rows."""
    path = tmp_path / "references.parquet"
    groups = [[_ref(f, n, "a.b", "") for n in range(3)] for f in range(2)]
    write_rows(path, [r for g in groups for r in g], DocReference)
    tables._GROUPS.clear()
    held = read_shared(path, DocReference)
    stat = path.stat()
    write_row_groups(path, [held[:3], held[3:]], DocReference)
    assert path.stat().st_mtime_ns == stat.st_mtime_ns
    changed = [held[:3], [_ref(1, 0, "c", "")]]
    write_row_groups(path, changed, DocReference)
    assert read_shared(path, DocReference) == [r for g in changed for r in g]
