"""A table's change log: what the stage that wrote a table changed in it, beside the table, so that
the store stages read the difference instead of comparing the whole old and new tables.

The producer knows what it changed, so it writes `<table>.changes.parquet` after the table, with the
identities of the table it replaced and of the one it wrote; where those match what a store stage
last projected, the log is exactly the difference, and anything else leaves the whole-table
comparison to the caller (docs/incremental.md#nothing-decoded-twice-nothing-compared-twice)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from mtrag_resources.core.arrow import pa, pc, pq, read_parquet_file
from mtrag_resources.stores.tables import RowChanges, as_records, commit_file, read_schema, write_table

CHANGE_COLUMN = "_change"
_META_KEY = b"mtrag.changes"


def changes_path(table: Path) -> Path:
    table = Path(table)
    return table.with_name(table.name.removesuffix(".parquet") + ".changes.parquet")


def identity(path: Path) -> list | None:
    """The table's (inode, size, mtime in ns) of its file (a bucketed table: its manifest's): a hard
    link of it has the same; a rewrite (every table write replaces the file) does not, and the old
    inode is not reused while a link keeps it."""
    try:
        st = os.stat(commit_file(path))
    except FileNotFoundError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def forget_changes(table: Path) -> None:
    """No log for this write (the caller could not tell what changed): the next reader compares."""
    changes_path(table).unlink(missing_ok=True)


def record_changes(table: Path, base: list | None, pk: str, old_rows: list[dict], new_rows: list[dict],
                   schema: pa.Schema) -> dict:
    """Write the log of the write that just replaced the table whose identity was `base` with
    `table`'s current file. `old_rows` / `new_rows`: records (flat values, as the table holds them)
    of every row that may have changed, before and after: at least every row whose key is gone,
    new or changed (rows that did not change may be included: they are left out here). Returns
    counts for the stage's metadata."""
    if base is None:
        forget_changes(table)
        return {}
    before = {r[pk]: r for r in old_rows}
    after = {r[pk]: r for r in new_rows}
    if len(before) != len(old_rows) or len(after) != len(new_rows):
        forget_changes(table)  # the key is not unique here: only a comparison of the tables is right
        return {}
    changed = [r for k, r in after.items() if before.get(k) != r]
    previous = [before[r[pk]] for r in changed if r[pk] in before]
    removed = [r for k, r in before.items() if k not in after]
    rows = ([{**r, CHANGE_COLUMN: "new"} for r in changed] + [{**r, CHANGE_COLUMN: "before"} for r in previous]
            + [{**r, CHANGE_COLUMN: "removed"} for r in removed])
    log_schema = schema.remove_metadata().append(pa.field(CHANGE_COLUMN, pa.string()))
    log = pa.Table.from_pylist(rows, schema=log_schema).replace_schema_metadata({_META_KEY: json.dumps(
        {"base": base, "head": identity(table), "pk": pk}).encode()})
    write_table(changes_path(table), log)
    return {"changed": len(changed), "removed": len(removed)}


def record_row_changes(table: Path, base: list | None, pk: str, changes: RowChanges | None) -> dict:
    """record_changes for a table written by tables.write_rows_changed, from the change it found
    (None: it wrote the whole table without comparing; no log, the readers compare)."""
    if base is None or changes is None:
        forget_changes(table)
        return {}
    return record_changes(table, base, pk, as_records(changes.replaced), as_records(changes.fresh),
                          read_schema(table))


def describe_changes(counts: dict) -> str:
    """record_changes' counts as the stage's metadata line."""
    if not counts:
        return "none: the store stages compare the tables"
    return f"{counts['changed']} rows new or changed, {counts['removed']} removed"


def logged_delta(new: Path, old: Path, key: tuple[str, ...],
                 names: tuple[str, ...]) -> tuple[pa.Table, list[tuple]] | None:
    """(rows of `new` that `old` does not have as they are, compared on `names`; the `key` tuples of
    `old` that `new` has no row for) from `new`'s change log, as table_delta.diff_tables would
    compute them; None when the log is not the difference between these two files."""
    try:
        log = read_parquet_file(changes_path(new))
    except (FileNotFoundError, OSError, pa.ArrowInvalid):
        return None
    try:
        meta = json.loads((log.schema.metadata or {})[_META_KEY])
    except (KeyError, ValueError):
        return None
    pk = meta.get("pk")
    if (pk not in key or meta.get("base") is None or meta.get("base") != identity(old)
            or meta.get("head") != identity(new)):
        return None
    kinds = log.column(CHANGE_COLUMN).to_pylist()
    fields = sorted({pk, *key, *names})
    records = log.select(fields).to_pylist()
    after = {r[pk]: r for r, kind in zip(records, kinds) if kind == "new"}
    before = {r[pk]: r for r, kind in zip(records, kinds) if kind == "before"}

    def project(row: dict, columns) -> tuple:
        return tuple(row[c] for c in columns)

    keep = [kind == "new" and (r[pk] not in before or project(r, names) != project(before[r[pk]], names))
            for r, kind in zip(records, kinds)]
    changed = log.filter(pa.array(keep, type=pa.bool_())).select(list(names))
    removed = {project(r, key) for r, kind in zip(records, kinds) if kind == "removed"}
    removed |= {project(b, key) for k, b in before.items() if project(b, key) != project(after[k], key)}
    return changed, sorted(removed, key=repr)


def rows_outside(table: pa.Table, column: str, values: set[str]) -> list[dict]:
    """The records of `table` whose `column` is not in `values` (the rows a producer replaced)."""
    if not values:
        return table.to_pylist()
    mask = pc.invert(pc.is_in(table[column], value_set=pa.array(sorted(values), type=table.schema.field(column).type)))
    return table.filter(mask).to_pylist()
