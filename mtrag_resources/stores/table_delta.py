"""What changed between the table a store last projected and the table it is asked to project now.

A store stage that committed a projection keeps the input tables it projected (hard links: every
table write replaces its file, so the link keeps the old version at no copy cost) with the
generation it committed. The next write of the same store compares the new tables with those
(DuckDB, column-wise: tens of milliseconds at 30k rows) and writes only the difference, provided
the store still says it holds that generation; anything else (no snapshot, another code version,
a store that lost or never finished the generation) is the full write, which diffs against the
store itself."""
from __future__ import annotations

import json
import re
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

from mtrag_resources.core.arrow import pa
from mtrag_resources.core.atomic import write_text_atomic
from mtrag_resources.stores.contract import COMMITTED
from mtrag_resources.stores import bucketed
from mtrag_resources.stores.table_changes import logged_delta
from mtrag_resources.stores.tables import column_names, read_schema, table_exists

_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")
STATE_FILE = "state.json"


@dataclass(frozen=True)
class Projected:
    """A store's last committed projection of a source: its generation, what the stage recorded
    with it, and the input tables as they were then."""
    generation: str
    extra: dict
    tables: dict[str, Path]
    columns: dict[str, list[str]] | None = None  # each table's column names, as saved (older: None)


class ProjectedTables:
    """The snapshot of one store's inputs for one source, in `folder`."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def load(self) -> Projected | None:
        try:
            state = json.loads((self.folder / STATE_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return None
        # a bucketed table's snapshot is a folder of links (stores/bucketed.py), a file's a link
        tables = {name: self.folder / name if bucketed.exists(self.folder / name) else self.folder / f"{name}.parquet"
                  for name in state.get("tables", [])}
        if not all(table_exists(p) for p in tables.values()):
            return None
        return Projected(generation=state["generation"], extra=state.get("extra", {}), tables=tables,
                         columns=state.get("columns"))

    def save(self, generation: str, tables: dict[str, Path], extra: dict | None = None) -> None:
        """Called after the store committed `generation` from `tables`. The state file goes first
        and comes back last, so a crash in between leaves no snapshot (the next write is full)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / STATE_FILE).unlink(missing_ok=True)
        for name, src in tables.items():
            if bucketed.is_bucketed(src):
                (self.folder / f"{name}.parquet").unlink(missing_ok=True)
                bucketed.link_version(src, self.folder / name)
                continue
            if (self.folder / name).is_dir():
                shutil.rmtree(self.folder / name)
            bucketed.link_replace(src, self.folder / f"{name}.parquet")
        # the column names too: base_for compares them with the new tables' without reading every
        # snapshot's footers again (a new snapshot each watch batch)
        columns = {name: column_names(src) for name, src in tables.items()}
        write_text_atomic(self.folder / STATE_FILE, json.dumps(
            {"generation": generation, "tables": sorted(tables), "extra": extra or {}, "columns": columns},
            sort_keys=True))

    def base_for(self, generation: str, version: dict, tables: dict[str, Path]) -> Projected | None:
        """The snapshot a write of `generation` from `tables` may diff against: one whose recorded
        `version` entries (code versions, embedders, ...) are these, of another generation (a
        rebuild of the same one takes the full write, which doubles as a repair), whose tables have
        the new ones' columns. None: only the full write is right. The caller still asks the store
        whether it holds the snapshot's generation."""
        last = self.load()
        if (last is None or last.generation == generation
                or any(last.extra.get(k) != v for k, v in version.items())
                or set(tables) != set(last.tables)
                or not all(column_names(new) == last.columns[name] if last.columns and name in last.columns
                           else same_columns(new, last.tables[name]) for name, new in tables.items())):
            return None
        return last

    def save_if_committed(self, marker, generation: str, tables: dict[str, Path], extra: dict) -> None:
        """`save`, when the store's `marker` (after the write) says it committed `generation`."""
        if marker is not None and marker.state == COMMITTED and marker.generation == generation:
            self.save(generation, tables, extra)


@dataclass
class TableDelta:
    """`changed`: the rows of the new table that the old one does not have as they are (new or
    different); `removed`: the key tuples of the old table that the new one has no row for."""
    changed: pa.Table
    removed: list[tuple]
    via: str = "compare"  # "log": read from the producer's change log (stores/table_changes.py)


def same_columns(new: Path, old: Path) -> bool:
    return column_names(new) == column_names(old)


def diff_tables(new: Path, old: Path, key: tuple[str, ...], columns: tuple[str, ...] | None = None) -> TableDelta:
    """Rows of `new` not in `old` (every column compared, or `columns`), and the keys of `old`
    not in `new`. Both files must have the same columns (`same_columns`). Read from `new`'s change
    log where it is the difference between these two files; the two tables compared otherwise."""
    names = columns or tuple(read_schema(new).names)
    _check_names(*names, *key)
    logged = logged_delta(new, old, key, names)
    if logged is not None:
        return TableDelta(changed=logged[0], removed=logged[1], via="log")
    return compare_tables(new, old, key, names)


def compare_tables(new: Path, old: Path, key: tuple[str, ...], names: tuple[str, ...]) -> TableDelta:
    """diff_tables by comparing the two whole tables, whatever change log there is."""
    _check_names(*names, *key)
    schema = read_schema(new)
    cols = ", ".join(f'"{c}"' for c in names)
    keys = ", ".join(f'"{c}"' for c in key)
    con = _connection()
    new_files, old_files = _files_to_compare(new, old)
    nothing = pa.schema([schema.field(c) for c in names]).empty_table()
    if not new_files or not old_files:  # the same parts, or buckets only one version has rows in
        changed = con.sql(f"SELECT {cols} FROM read_parquet($new)", params={"new": new_files}).to_arrow_table() \
            if new_files else nothing
        removed = con.execute(f"SELECT DISTINCT {keys} FROM read_parquet($old)", {"old": old_files}).fetchall() \
            if old_files else []
        return TableDelta(changed=changed, removed=[tuple(r) for r in removed])
    params = {"new": new_files, "old": old_files}
    # Rows compare by a hash of all their columns, paired with a hash of their key (a third of the
    # time of EXCEPT ALL over the values at 30k rows): a changed row is missed only when its new
    # values hash as the old row of the same key did (one in 2^64). Only the changed rows are read
    # whole, and usually there are none or a few.
    hashed = f"SELECT hash({keys}) AS _k, hash({cols}) AS _h FROM read_parquet"
    pairs = con.sql(f"{hashed}($new) EXCEPT ALL {hashed}($old)", params=params).to_arrow_table()
    if pairs.num_rows:
        con.register("_changed_pairs", pairs)
        try:
            changed = con.sql(f"SELECT {cols} FROM read_parquet($new) SEMI JOIN _changed_pairs p "
                              f"ON hash({keys}) = p._k AND hash({cols}) = p._h", params={"new": new_files}).to_arrow_table()
        finally:
            con.unregister("_changed_pairs")
    else:
        changed = pa.schema([schema.field(c) for c in names]).empty_table()
    removed = con.execute(f"SELECT {keys} FROM read_parquet($old) EXCEPT SELECT {keys} FROM read_parquet($new)",
                          params).fetchall()
    return TableDelta(changed=changed, removed=[tuple(r) for r in removed])


def _files_to_compare(new: Path, old: Path) -> tuple[list[str], list[str]]:
    """The Parquet files holding the rows that may differ: of two versions of one bucketed table,
    the parts whose names (content digests) differ, as a row's key stays in its bucket; else every
    file of both."""
    pair = bucketed.changed_parts(new, old)
    if pair is None:
        pair = tuple(bucketed.part_files(p) if bucketed.is_bucketed(p) else [Path(p)] for p in (new, old))
    return [str(f) for f in pair[0]], [str(f) for f in pair[1]]


def _check_names(*names: str) -> None:
    """Column names go into DuckDB's SQL text: only plain identifiers."""
    for name in names:
        if not _IDENT.match(name):
            raise ValueError(f"not a column name: {name!r}")


_LOCAL = threading.local()


def _connection():
    """This thread's in-memory DuckDB (a connection is not shared across threads; opening one per
    diff cost more than a small diff). It holds no tables: every query reads the Parquet files."""
    con = getattr(_LOCAL, "con", None)
    if con is None:
        import duckdb  # imported here: only the stages that diff pay for it
        con = _LOCAL.con = duckdb.connect()
    return con
