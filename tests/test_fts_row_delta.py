"""fts_db's delta rewrites only the chunk rows that changed (and the parents whose having children
changed, and the changed files' own aliases), not every row of a changed file; what it leaves is
what a full write of the new rows leaves: the same rows, aliases and FTS matches. Real SQLite."""
from __future__ import annotations

import hashlib
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtrag_resources.stages.fts_db import SOURCE_WIDE_KINDS, plan_delta
from mtrag_resources.stores.fts_query import entry_alias, file_anchors, source_alias
from mtrag_resources.stores.fts_store import FtsStore

pytestmark = pytest.mark.unit

SID = "pkg"
TEXTS = ["def alpha():\n    return 1\n", "def alpha():\n    return 2  # fixes ABC-7\n", "退货需要在三十天内完成\n",
         "class Thing:\n    \"\"\"beta gamma\"\"\"\n"]
TITLES = ["", "alpha helper", "fix ABC-12 rounding", "beta"]
COLS = ("chunk_id, source_kind, role, chunk_type, parent_id, file_path, start_line, end_line, symbol, title, "
        "summary, text, language, content_hash, locator, graph_ids, extra")


def _row(file: str, cid: str, role: str, chunk_type: str, parent: str | None, line: int, text: str,
         title: str) -> dict:
    return {"chunk_id": cid, "source_id": SID, "source_kind": "code", "role": role, "chunk_type": chunk_type,
            "parent_id": parent, "file_path": file, "start_line": line, "end_line": line + 3,
            "symbol": cid.replace("/", ".").replace("#", "."), "title": title, "summary": "", "language": "python",
            "content_hash": hashlib.sha256(text.encode()).hexdigest(), "locator": f"{file}:{line}",
            "graph_ids": [f"g:{cid}"], "text": text}


@st.composite
def versions(draw) -> list[dict]:
    """One version of up to three files drawn from a small universe of chunk ids, so that two
    draws overlap: rows kept, changed, added and removed, children moving between parents."""
    rows = []
    for f in range(3):
        if not draw(st.booleans()):
            continue
        file = f"pkg/m{f}.py"
        module = f"{file}#module"
        if draw(st.booleans()):  # a file without a module chunk is anchored elsewhere
            rows.append(_row(file, module, "parent", "module", None, 1, draw(st.sampled_from(TEXTS)), ""))
        classes = [c for c in range(2) if draw(st.booleans())]
        for c in classes:
            rows.append(_row(file, f"{file}#C{c}", "parent", "class", module, 10 * (c + 1),
                             draw(st.sampled_from(TEXTS)), draw(st.sampled_from(TITLES))))
        for k in range(4):
            if draw(st.booleans()):
                owner = draw(st.sampled_from([None, *classes]))
                rows.append(_row(file, f"{file}#fn{k}", "child", "function",
                                 module if owner is None else f"{file}#C{owner}", 40 + k,
                                 draw(st.sampled_from(TEXTS)), draw(st.sampled_from(TITLES))))
    return rows


def _content(path) -> tuple[set, set, dict]:
    conn = sqlite3.connect(path)
    try:
        rows = set(conn.execute(f"SELECT {COLS} FROM chunks WHERE source_id = ?", (SID,)))
        aliases = set(conn.execute("SELECT alias_norm, alias, alias_kind, chunk_id FROM exact_aliases "
                                   "WHERE source_id = ?", (SID,)))
        matches = {(table, q): {r[0] for r in conn.execute(
            f"SELECT c.chunk_id FROM {table} f JOIN chunks c ON c.rid = f.rowid WHERE {table} MATCH ?", (q,))}
            for table, q in (("fts_trigram", '"alpha"'), ("fts_trigram", '"ABC"'), ("fts_cjk", "退货"),
                             ("fts_trigram", '"gamma"'))}
        return rows, aliases, matches
    finally:
        conn.close()


def _write(path, generation: str, rows: list[dict]) -> FtsStore:
    store = FtsStore(path)
    store.write_source(SID, generation, generation, [dict(r) for r in rows])
    return store


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old=versions(), new=versions())
def test_a_row_delta_leaves_what_a_full_write_leaves(tmp_path_factory, old, new):
    _delta_equals_full(tmp_path_factory.mktemp("fts"), old, new)


def test_a_file_anchor_that_moves_to_a_new_row_moves_the_files_aliases(tmp_path):
    """No module chunk: the file's aliases sit at its first row by line; a row added above it takes
    them, while the old anchor itself is unchanged (nothing else would drop its file_path alias)."""
    file = "pkg/m0.py"
    module = f"{file}#module"
    old = [_row(file, f"{file}#fn{k}", "child", "function", module, 40 + k, TEXTS[0], "") for k in (1, 2)]
    new = [_row(file, f"{file}#fn0", "child", "function", module, 40, TEXTS[1], ""), *old]
    _delta_equals_full(tmp_path, old, new)


def _delta_equals_full(tmp, old: list[dict], new: list[dict]) -> None:
    store = _write(tmp / "delta.sqlite", "g1", old)
    before = {r["chunk_id"]: r for r in old}
    changed = [r["chunk_id"] for r in new if before.get(r["chunk_id"]) != r]
    removed = sorted(set(before) - {r["chunk_id"] for r in new})
    files = {r["file_path"] for r in new if r["chunk_id"] in set(changed)} | {before[c]["file_path"] for c in removed}
    old_file_rows = [{k: r[k] for k in ("chunk_id", "file_path", "role", "parent_id")}
                     for r in old if r["file_path"] in files]
    texts = {r["content_hash"]: r["text"] for r in new}
    read: list[str] = []

    def text_of(row: dict) -> str:
        read.append(row["chunk_id"])
        return texts[row["content_hash"]]

    stored = [{k: v for k, v in r.items() if k != "text"} for r in new]  # the chunk table has no text
    plan = plan_delta(SID, stored, old_file_rows, changed, removed, text_of)
    try:
        stats = store.write_source_delta(SID, "g2", "g2", ("g1", "g1"), plan.drop, plan.rows, plan.aliases,
                                         SOURCE_WIDE_KINDS, refiled_chunk_ids=plan.refiled)
    finally:
        store.close()
    assert stats is not None
    _write(tmp / "full.sqlite", "g2", new).close()
    got, want = _content(tmp / "delta.sqlite"), _content(tmp / "full.sqlite")
    assert got[0] == want[0], "chunk rows differ from a full write"
    assert got[1] == want[1], (sorted(got[1] - want[1])[:5], sorted(want[1] - got[1])[:5])
    assert got[2] == want[2]
    # only what changed was rewritten: a row identical before and after, whose parent kept its
    # children, is neither read nor written again
    assert set(read) == {r["chunk_id"] for r in plan.rows} and set(read) <= set(plan.drop)
    untouched = {c for c in before if c not in set(changed) | set(removed)}
    assert not {c for c in untouched if before[c]["role"] == "child"} & set(plan.drop)


def test_an_appended_function_rewrites_its_row_and_the_module_only(tmp_path):
    """The case the watch meets most: one function appended to a long module."""
    file = "pkg/m0.py"
    module = f"{file}#module"
    old = [_row(file, module, "parent", "module", None, 1, TEXTS[0], "")] + [
        _row(file, f"{file}#fn{k}", "child", "function", module, 40 + k, TEXTS[k % 2], TITLES[k % 4]) for k in range(4)]
    new = [dict(old[0], content_hash="changed", end_line=99)] + old[1:] + [
        _row(file, f"{file}#fn9", "child", "function", module, 90, TEXTS[1], "")]
    store = _write(tmp_path / "a.sqlite", "g1", old)
    plan = plan_delta(SID, [{k: v for k, v in r.items() if k != "text"} for r in new],
                      [{k: r[k] for k in ("chunk_id", "file_path", "role", "parent_id")} for r in old],
                      [module, f"{file}#fn9"], [], lambda r: "module text" if r["chunk_id"] == module else TEXTS[1])
    assert sorted(plan.drop) == sorted([module, f"{file}#fn9"])
    stats = store.write_source_delta(SID, "g2", "g2", ("g1", "g1"), plan.drop, plan.rows, plan.aliases,
                                     SOURCE_WIDE_KINDS, refiled_chunk_ids=plan.refiled)
    store.close()
    assert (stats["inserted_rows"], stats["deleted_rows"], stats["child_rows"]) == (2, 2, 5)


_ANCHOR_ROW = st.fixed_dictionaries({
    "chunk_id": st.text("abcdef0123", min_size=1, max_size=6),
    "file_path": st.sampled_from(["", "README.md", "pkg/__init__.py", "pkg/a.py", "docs/index.rst", "b.py", "x/y/z.py"]),
    "chunk_type": st.sampled_from(["file", "module", "function", "section", "page"]),
    "parent_id": st.sampled_from(["", None, "p1"]),
    "start_line": st.integers(0, 40),
})


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(_ANCHOR_ROW, max_size=12))
def test_the_source_alias_of_a_delta_is_the_one_of_every_files_anchor(rows):
    """entry_alias ranks only the entry file's rows: the alias every file's anchors give."""
    anchors = file_anchors(rows)
    assert entry_alias(rows, "src") == (source_alias(anchors, "src") if anchors else None)
