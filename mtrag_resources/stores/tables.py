"""Parquet tables of the replayable truth (chunks, graph, references, links).

Writes are atomic (temporary file + rename) so a concurrent reader or a crash never leaves a
half-written table; every table is a list of dataclass rows with a schema taken from the rows."""
from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import operator
import os
import tempfile
import threading
from pathlib import Path
from typing import Iterable, TypeVar

from mtrag_resources.core.arrow import pa, pc, pq, read_parquet_file
from mtrag_resources.core.real_paths import resolved_name
from mtrag_resources.core.session import session_cache
from mtrag_resources.stores import bucketed
from mtrag_resources.stores.bucketed import Bucketing

T = TypeVar("T")


def write_rows(path: Path, rows: Iterable, row_type: type | None = None, bucketing: Bucketing | None = None) -> int:
    """Lists of strings stay lists; a dict value goes as JSON, so the schema stays flat.
    `bucketing`: how a bucketed table (stores/bucketed.py) places its rows. Rows equal to those
    this process holds for the file's current version are not written again (a watch batch
    rewrote django's 6k import rows and the docs' 30k references on every change)."""
    return _write_rows(Path(path), list(rows), row_type, bucketing)[0]


def _write_rows(path: Path, rows: list, row_type: type | None, bucketing: Bucketing | None) -> tuple[int, pa.Table | None]:
    """write_rows; and the Arrow table written where it is built column-wise from `row_type`
    instances (the form write_rows_changed merges into), else None."""
    if bucketing is None and _holds_these(Path(path), rows, row_type):
        return len(rows), None
    columns, flat = _dataclass_columns(rows)
    if columns is not None:  # column-wise: a third of from_pylist's time on 30k graph rows
        table = pa.table(columns)
        if flat and row_type is not None and type(rows[0]) is row_type:
            # The writer's instances are the file's decoded entry of row_type; records, which few
            # readers of a graph table want, are decoded from the file when one asks.
            write_table(path, table, bucketing=bucketing)
            _remember(Path(path), rows, row_type)
            return len(rows), table
        names = list(columns)
        records = [dict(zip(names, values)) for values in zip(*columns.values())]
    else:
        # rows are flat (strings, numbers, lists of strings): a shallow view of each is enough, and
        # dataclasses.asdict's deep copy was most of a large table's write time
        records = as_records(rows)
        if records:
            table = pa.Table.from_pylist(records)
        elif row_type is not None and dataclasses.is_dataclass(row_type):
            table = pa.Table.from_pylist([], schema=_schema_for(row_type))
        else:
            table = pa.table({})
    write_table(path, table, bucketing=bucketing)
    if records and table.num_rows == len(records):
        _remember(Path(path), records)  # the next reader of this file in this process decodes nothing
    return len(records), None


def _holds_these(path: Path, rows: list, row_type: type | None) -> bool:
    """Are `rows` the rows the file holds, by the decoded rows this process keeps for its version?
    A held row that is the same object is the same row (the stages' memos; rows are not changed
    after they are written), any other is compared by value."""
    if row_type is not None and rows and type(rows[0]) is row_type:
        held = cached_rows(path, row_type)
        return held is not None and len(held) == len(rows) and all(a is b or a == b for a, b in zip(held, rows))
    held = cached_rows(path)
    return held is not None and len(held) == len(rows) and held == as_records(rows)


def as_records(rows: Iterable) -> list[dict]:
    """Dataclass rows (or dicts) as the table's records: flat values, a dict value as JSON."""
    return [{k: _flat(v) for k, v in (vars(r) if dataclasses.is_dataclass(r) else r).items()} for r in rows]


def _flat(value):
    return json.dumps(value, sort_keys=True) if type(value) is dict else value


def _dataclass_columns(rows: list) -> tuple[dict[str, list] | None, bool]:
    """({field: values}, whether every value went as it is (no dict turned into JSON)) of rows that
    are instances of one dataclass with nothing but its fields ((None, False) otherwise: the
    row-wise path)."""
    if not rows or not dataclasses.is_dataclass(rows[0]):
        return None, False
    kind = type(rows[0])
    names = [f.name for f in dataclasses.fields(kind)]
    if list(vars(rows[0])) != names or set(map(type, rows)) != {kind}:
        return None, False
    # One attrgetter call per row and zip's transpose, both in C: about half the time of a getattr
    # per value in Python (objects scattered over the memos' heap)
    if len(names) == 1:
        transposed = [list(map(operator.attrgetter(names[0]), rows))]
    else:
        transposed = [list(values) for values in zip(*map(operator.attrgetter(*names), rows))]
    columns, flat = {}, True
    for name, values in zip(names, transposed):
        if dict in set(map(type, values)):
            values, flat = [_flat(v) for v in values], False
        columns[name] = values
    return columns, flat


def write_table(path: Path, table: pa.Table, records: list[dict] | None = None,
                bucketing: Bucketing | None = None, changed_keys: Iterable[str] | None = None) -> dict | None:
    """`records`: the table's rows as to_pylist gives them, when the caller has them anyway; they
    become the file's decoded entry (read_shared) and so are the caller's no more to change.
    A bucketed table's folder (a path without `.parquet`) gets only its changed parts written
    (`bucketing`, else the one its manifest records; `changed_keys`: bucketed.write's); returns
    bucketed.write's counts then."""
    path = Path(path)
    counts = None
    if bucketed.is_bucketed(path):
        counts = bucketed.write(path, table, bucketing or _recorded_bucketing(path), changed_keys)
    else:
        _write_file(path, table)
    _forget(path)
    _remember_names(path, table.column_names)
    if records is not None and len(records) == table.num_rows:
        _remember(path, records)
    return counts


def _recorded_bucketing(path: Path) -> Bucketing:
    recorded = bucketed.load_manifest(path)
    if recorded is None:
        raise ValueError(f"{path}: a new bucketed table needs its bucketing")
    return Bucketing(recorded["key"], tuple(recorded["order"]), recorded["buckets"])


def _write_file(path: Path, table: pa.Table) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".parquet")
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_table(path: Path, columns: list[str] | None = None, filters=None,
               keys: tuple[str, Iterable[str]] | None = None) -> pa.Table:
    """The table at `path`, a Parquet file or a bucketed table's folder, in its order. `keys`
    (column, values): a table bucketed by that column may give those values' buckets alone (the
    result can hold other rows too: the caller filters)."""
    path = Path(path)
    if bucketed.is_bucketed(path):
        return bucketed.read(path, columns=columns, filters=filters, keys=keys)
    if not filters:
        return read_parquet_file(path, columns)
    return pq.read_table(path, columns=columns, filters=filters)


# Schemas by file identity: the store stages compare the columns of each table they diff with its
# projected snapshot's (table_delta.same_columns), each a file footer read. A new version of a table is a new identity.
_SCHEMAS_MAX = 512
_SCHEMAS = session_cache("tables.schemas", max_entries=_SCHEMAS_MAX)


# Column names by file identity, from the write or a schema read: the delta's check that a table
# has its snapshot's columns (ProjectedTables.base_for) needs no footer of a version just written.
_NAMES = session_cache("tables.column_names", max_entries=_SCHEMAS_MAX)


def _remember_names(path: Path, names: list[str]) -> None:
    key = _identity(path)
    if key is not None:
        _NAMES[key] = list(names)


def column_names(path: Path) -> list[str]:
    """The table's column names (read_schema's names)."""
    path = Path(path)
    found = _NAMES.get(_identity(path) or ())
    return list(found) if found is not None else read_schema(path).names


def read_schema(path: Path) -> pa.Schema:
    path = Path(path)
    key = _identity(path)
    found = _SCHEMAS.get(key) if key is not None else None
    if found is not None:
        return found
    schema = bucketed.read_schema(path) if bucketed.is_bucketed(path) else pq.read_schema(path)
    if key is not None and _identity(path) == key:  # not replaced meanwhile
        _SCHEMAS[key] = schema
    return schema


def table_exists(path: Path) -> bool:
    path = Path(path)
    return bucketed.exists(path) if bucketed.is_bucketed(path) else path.is_file()


def commit_file(path: Path) -> Path:
    """The file whose replacement commits a new version of the table: the Parquet file itself, or a
    bucketed table's manifest."""
    path = Path(path)
    return bucketed.manifest_path(path) if bucketed.is_bucketed(path) else path


# Decoded tables by file identity (path, inode, mtime, size) and form (None: records; a dataclass:
# its instances, read_shared): every write replaces the file (a new inode; this process also
# forgets the path when it writes it), so an entry is not stale. The stages and checks of one build
# (and every batch of `mtrag watch`) read the same chunk table up to eight times, and decoding it
# is not cheap. Bounded by rows, so that a build's memory does not grow with every
# table it touched (the entry bound is never the one reached first).
DECODED_MAX_ROWS = 500_000  # django: ~145k records and ~115k instances per build
_DECODED = session_cache("tables.decoded", max_entries=4096)
_DECODED_LOCK = threading.Lock()


def _identity(path: Path) -> tuple | None:
    try:
        st = commit_file(path).stat()
    except FileNotFoundError:
        return None
    return (resolved_name(path), st.st_ino, st.st_mtime_ns, st.st_size)


def _decoded(path: Path, form: type | None = None) -> list | None:
    key = _identity(path)
    if key is None:
        return None
    key += (form,)
    with _DECODED_LOCK:
        found = _DECODED.get(key)  # a hit is the most recently used
        if found is not None:
            return found
    if form is None:
        found = held_table(path).to_pylist()  # the Arrow table this process holds, if any: one read
    else:
        records = _decoded(path)
        if records is None:  # removed since the stat above
            return None
        found = as_rows(records, form)
    _keep(key, found)
    return found


def _remember(path: Path, rows: list, form: type | None = None) -> None:
    """The rows just written to `path`, as its decoded entry of `form` (records: what reading it
    back would give, flat values, nested ones already JSON; or the writer's own instances)."""
    key = _identity(path)
    if key is not None:
        _keep(key + (form,), rows)


def _keep(key: tuple, rows: list) -> None:
    with _DECODED_LOCK:
        _DECODED[key] = rows
        while len(_DECODED) > 1 and sum(len(v) for v in _DECODED.values()) > DECODED_MAX_ROWS:
            _DECODED.popitem(last=False)


def _forget(path: Path) -> None:
    """This process replaced `path`: its decoded entries go (a freed inode may be reused)."""
    name = resolved_name(path)
    with _DECODED_LOCK:
        for key in [k for k in _DECODED if k[0] == name]:
            del _DECODED[key]


def read_rows(path: Path, row_type: type[T] | None = None) -> list:
    """The table's rows: dicts (each the caller's own copy) or `row_type` instances."""
    records = _decoded(Path(path))
    if records is None:
        return []
    if row_type is None:
        return [dict(r) for r in records]
    return as_rows(records, row_type)


def row_count(path: Path) -> int:
    """The table's number of rows, from its footer (0 where there is no table): nothing decoded."""
    path = Path(path)
    if bucketed.is_bucketed(path):
        return bucketed.num_rows(path)
    try:
        return pq.read_metadata(path).num_rows
    except FileNotFoundError:
        return 0


def value_counts(path: Path, column: str) -> dict:
    """{value: rows} of one column of the table, in the order values first occur: from the Arrow
    table this process merged into the file last (write_rows_changed) where it holds it, else the
    file's column alone. What Counter over the rows gives, without a Python object per row."""
    return column_counts(held_table(path, [column]), column)


def held_table(path: Path, columns: list[str] | None = None, filters: list[tuple] | None = None) -> pa.Table:
    """read_table(path, columns, filters) from the Arrow table this process holds for the file's
    current version (write_rows_changed's merge, hold_table, hold_arrow) where it holds one, else
    from the file. `filters`: (column, "=" or "in", value) conjunctions, as read_table takes them.
    The store stages read a few columns or rows of a table the graph or chunk stage just wrote
    (neo4j_graph's totals and changed edges, fts_db's endpoints, qdrant_collection's counts), and
    reading them again from disk was a real share of a watch batch."""
    path = Path(path)
    key = _identity(path)  # its first field is the table's resolved name, the key of what is held
    held = _ARROW.get(key[0]) if key is not None else None
    if held is None or held[0] != key:
        return read_table(path, columns=columns, filters=filters)
    table = held[1]
    if columns is None and not table.schema.equals(read_schema(path)):
        # the whole table as the file gives it: a type the file stores otherwise (a list's item
        # name) would make what the caller builds from it differ from a fresh process's
        return read_table(path, columns=columns, filters=filters)
    try:
        for column, op, value in filters or ():
            values = table[column]
            if op == "=":
                table = table.filter(pc.equal(values, pa.scalar(value, type=values.type)))
            elif op == "in":
                table = table.filter(pc.is_in(values, value_set=pa.array(list(value), type=values.type)))
            else:
                return read_table(path, columns=columns, filters=filters)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):  # a value of another type
        return read_table(path, columns=columns, filters=filters)
    return table if columns is None else table.select(columns)


def hold_table(path: Path, table: pa.Table) -> None:
    """Hold `table`, just written to `path` (write_table), for held_table's reads of this version."""
    key = _identity(Path(path))
    if key is not None:
        _ARROW[key[0]] = (key, table)


def column_counts(table: pa.Table, column: str) -> dict:
    """{value: rows} of one column of an Arrow table, in the order values first occur (Counter's)."""
    return {c["values"]: c["counts"] for c in pc.value_counts(table[column]).to_pylist()}


def truthy_count(table: pa.Table, column: str) -> int:
    """How many rows hold a value Python takes as true in `column` (a string or bool column; an
    all-null one counts none): sum(bool(v) for v in values) without a Python object per row."""
    values = table[column]
    if pa.types.is_boolean(values.type):
        return int(pc.sum(values).as_py() or 0)
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        return int(pc.sum(pc.greater(pc.utf8_length(values), 0)).as_py() or 0)
    if pa.types.is_null(values.type):
        return 0
    return sum(bool(v) for v in values.to_pylist())


def read_shared(path: Path, row_type: type[T] | None = None) -> list:
    """The table's rows as read_rows gives them, but shared with this process's other readers
    (and with the writer that wrote them, for write_rows' own instances): read them, never change
    them. For the stages and checks that only look, so no reader copies or builds the rows again."""
    return _decoded(Path(path), row_type) or []


def adopt_rows(path: Path, rows: list, row_type: type[T]) -> bool:
    """Make `rows`, equal row for row to what the table holds (its rows built again from their
    inputs), the table's shared decoded rows (read_shared, cached_rows), so that a later
    write_rows_changed of mostly the same objects finds the unchanged ones by identity, as after
    its own write. Nothing where they differ from the file's rows; returns whether adopted."""
    held = read_shared(path, row_type)
    if not held or len(held) != len(rows) or held != rows:
        return False
    _remember(Path(path), rows, row_type)
    return True


def cached_rows(path: Path, row_type: type[T] | None = None) -> list | None:
    """read_shared's rows when this process holds them decoded already (it wrote or read the file),
    else None: nothing is read."""
    key = _identity(Path(path))
    if key is None:
        return None
    with _DECODED_LOCK:
        return _DECODED.get(key + (row_type,))


def rows_where(path: Path, row_type: type[T], column: str, values: Iterable[str]) -> list[T]:
    """read_shared's `row_type` rows whose `column` is one of `values`, in the table's order:
    filtered from the rows this process holds decoded, else only the matching rows read (a filter
    in the Parquet read) and decoded. A stage that wants a few kinds of rows of another source's
    table (the links stage: code entities, INHERITS edges) would otherwise decode all its rows."""
    path, wanted = Path(path), set(values)
    held = cached_rows(path, row_type)
    if held is not None:
        return _held_where(path, held, row_type, column, wanted)
    records = cached_rows(path)
    if records is not None:
        return as_rows([r for r in records if r[column] in wanted], row_type)
    if not table_exists(path):
        return []
    return as_rows(read_table(path, filters=[(column, "in", sorted(wanted))]).to_pylist(), row_type)


# rows_where's last answer from held rows per (file, row type, column, values): (those rows, it).
_WHERE = session_cache("tables.rows_where", max_entries=1024)


def _held_where(path: Path, held: list, row_type: type, column: str, wanted: set) -> list:
    """rows_where of the rows this process holds: the answer for the same rows again, or the last
    answer brought up to date with write_rows_changed's change since (its rows gone out, its fresh
    ones in at their key's place, value-equal new instances in place of the old), else a filter
    of every row. The links stage asks for the code entities and INHERITS edges on every watch
    batch, and two passes over every node and relation added up. Read-only to the caller."""
    name = resolved_name(path)
    key = (name, row_type, column, frozenset(wanted))
    last = _WHERE.get(key)
    if last is not None and last[0] is held:
        return last[1]
    change = _CHANGES.get(name)
    if last is not None and change is not None and change[0] is last[0] and change[1] is held:
        _old, _new, rows, pk = change
        renewed = {id(a): b for a, b in rows.renewed or ()}
        gone = {id(r) for r in rows.replaced}
        answer = [renewed.get(id(r), r) for r in last[1] if id(r) not in gone]
        key_of = operator.attrgetter(pk)
        for row in rows.fresh:
            if getattr(row, column) in wanted:
                bisect.insort(answer, row, key=key_of)
    else:
        answer = [r for r in held if getattr(r, column) in wanted]
    _WHERE[key] = (held, answer)
    return answer


def column_values(path: Path, columns: list[str]) -> dict[str, list]:
    """{column: values in the table's order} of a few columns: from the rows this process holds
    decoded, else those columns alone read ({column: []} where there is no table)."""
    path = Path(path)
    records = cached_rows(path)
    if records is not None:
        return {c: [r[c] for r in records] for c in columns}
    if not table_exists(path):
        return {c: [] for c in columns}
    table = read_table(path, columns=columns)
    return {c: table.column(c).to_pylist() for c in columns}


def as_rows(records: Iterable[dict], row_type: type[T]) -> list[T]:
    """`row_type` instances of table records (columns the type does not have are left out)."""
    names = {f.name for f in dataclasses.fields(row_type)}
    records = records if isinstance(records, list) else list(records)
    if records and all(r.keys() == names for r in (records[0], records[-1])):
        try:  # a table's rows share its columns: the type's fields exactly, nothing to leave out
            return [row_type(**r) for r in records]
        except TypeError:
            pass
    return [row_type(**{k: v for k, v in r.items() if k in names}) for r in records]


_PA_TYPES = {int: pa.int64(), str: pa.string(), float: pa.float64(), bool: pa.bool_()}


def _schema_for(row_type) -> pa.Schema:
    fields = []
    for f in dataclasses.fields(row_type):
        ann = str(f.type)
        if ann.startswith("list"):
            typ = pa.list_(pa.string())
        elif "int" in ann:
            typ = pa.int64()
        elif "float" in ann:
            typ = pa.float64()
        elif "bool" in ann:
            typ = pa.bool_()
        else:
            typ = pa.string()
        fields.append(pa.field(f.name, typ))
    return pa.schema(fields)


def column_schema(row_type) -> list[tuple[str, str]]:
    """(name, type) pairs for Dagster's TableSchema metadata."""
    return [(f.name, str(t)) for f, t in zip(dataclasses.fields(row_type), _schema_for(row_type).types)]


@dataclasses.dataclass
class RowChanges:
    """What write_rows_changed found: the rows new or changed (`fresh`, the new instances) and the
    previous instances they replace or that went (`replaced`)."""
    fresh: list
    replaced: list
    fresh_at: list[int] | None = None     # their positions in the new rows, in order
    replaced_at: list[int] | None = None  # theirs in the previous rows, in order
    renewed: list[tuple] | None = None    # (previous, new) instances of one row, equal by value
    positions: dict[int, int] | None = None  # id of each new row -> its position (the next call's old)


# The Arrow table of the last write_rows_changed per file, by file identity: the next write merges
# into it instead of reading the file back. Bounded by tables, past the tables of a large project.
_ARROW = session_cache("tables.arrow", max_entries=1024)
# Per file, write_rows_changed's last merge: (the rows before, the rows after, the change, the key
# column), for rows_where to bring its answer for the rows before up to date; and the next write's
# previous rows are usually those rows after, known unique and in key order. Evicted, the next
# write checks its rows again.
_CHANGES = session_cache("tables.row_changes", max_entries=1024)
# A merged table is slices of the ones before it: combined into one chunk per column past this many.
_MAX_CHUNKS = 64
# A change of more rows than this is merged by a filter and a sort (copies) rather than by slices.
_MAX_SLICED_ROWS = 256


def write_rows_changed(path: Path, rows: list, row_type: type, pk: str,
                       bucketing: Bucketing | None = None, ordered: bool = False) -> RowChanges | None:
    """write_rows for a table of `row_type` instances sorted by their unique `pk`, that this process
    wrote last (its instances are held, cached_rows): only the rows that differ from those become
    Arrow columns, merged into the previous table (the others are the previous file's rows as they
    are), so a one-file change does not convert every row of the source again. The file is the one write_rows
    writes for the same rows. Returns the change, or None where it wrote the whole table (nothing
    held, keys not unique or not sorted, a column whose type the change alters). `ordered`: the
    caller made `rows` unique and sorted by `pk` (not checked again)."""
    path = Path(path)
    name = resolved_name(path)
    old = cached_rows(path, row_type)
    last = _CHANGES.get(name)
    # rows the last merge found unique and in key order are not checked again
    follows = last is not None and old is last[1]  # the previous rows are the last merge's rows after
    changes = _row_changes(old, rows, pk, checked=follows, ordered=ordered,
                           old_at=last[2].positions if follows else None) if old is not None else None
    merged = _merged(path, _ARROW.get(name), changes, rows, pk) if changes is not None else None
    if merged is None:
        _CHANGES.pop(name, None)
        # a fresh process (`mtrag build`) holds what it wrote too: the store stages read it
        written = _write_rows(path, list(rows), row_type, bucketing)[1]
        if written is not None:
            hold_table(path, written)
        else:
            _ARROW.pop(name, None)
        return None
    keys = None if bucketing is None else \
        {getattr(r, bucketing.key) for r in (*changes.fresh, *changes.replaced)}
    write_table(path, merged, bucketing=bucketing, changed_keys=keys)
    _remember(path, rows, row_type)
    hold_table(path, merged)
    _CHANGES[name] = (old, rows, changes, pk)
    return changes


# Per table write_row_groups wrote: (its identity, the group lists it wrote, their Arrow table).
_GROUPS = session_cache("tables.row_groups", max_entries=1024)


def write_row_groups(path: Path, groups: list[list], row_type: type) -> int:
    """write_rows of the groups' rows one after another (a stage's rows, one list per file, in file
    order; a single Parquet file). A group that is the very list this process wrote last time
    takes its rows from that table as they are, so only the changed groups become Arrow columns.
    The table is the one write_rows writes for the same rows; unchanged groups write nothing."""
    path = Path(path)
    name = resolved_name(path)
    rows = [r for group in groups for r in group]
    held = _GROUPS.get(name)
    table = None
    if held is not None and held[0] == _identity(path) and rows and type(rows[0]) is row_type:
        table = _regrouped(held[1], held[2], groups)
        if table is True:  # every group is the one written: the file holds these rows
            return len(rows)
    if table is None:
        if _holds_these(path, rows, row_type):  # as write_rows: the rows this process holds for the file
            return len(rows)
        columns, flat = _dataclass_columns(rows) if rows and type(rows[0]) is row_type else (None, False)
        if columns is None or not flat:
            _GROUPS.pop(name, None)
            return write_rows(path, rows, row_type)
        table = pa.table(columns)
    write_table(path, table)
    _remember(path, rows, row_type)
    _GROUPS[name] = (_identity(path), list(groups), table)
    return len(rows)


def _regrouped(old_groups: list[list], old: pa.Table, groups: list[list]) -> pa.Table | bool | None:
    """The table of `groups` from the held one's slices and new columns for the changed groups;
    True where nothing changed; None where the parts do not make one table (a column whose type
    a changed group alters, rows that are not plain instances)."""
    at, pos = {}, 0
    for group in old_groups:
        at[id(group)] = (pos, len(group))
        pos += len(group)
    if len(groups) == len(old_groups) and all(a is b for a, b in zip(groups, old_groups)):
        return True
    # Kept groups that stood next to each other stay one slice: a part per file was a cast and a
    # concatenation per file.
    parts: list = []  # [start, length] of a run of the old table, or a new group's table
    for group in groups:
        slot = at.get(id(group))
        if slot is not None and slot[1] == len(group):
            if parts and type(parts[-1]) is list and parts[-1][0] + parts[-1][1] == slot[0]:
                parts[-1][1] += slot[1]
            else:
                parts.append(list(slot))
        elif group:
            columns, flat = _dataclass_columns(group)
            if columns is None or not flat:
                return None
            parts.append(pa.table(columns))
    parts = [old.slice(*part) if type(part) is list else part for part in parts]
    return _as_inferred(parts) if parts else None


def _as_inferred(parts: list[pa.Table]) -> pa.Table | None:
    """The parts as one table with the types pa.table infers from all their values at once: a
    column is null-typed exactly where every value is None, else of its one non-null type (a
    kept slice of a held table keeps the type the other rows gave it). None where the parts
    disagree otherwise, or a list column has no item to type it by."""
    names = parts[0].schema.names
    fields = []
    for name in names:
        types = {p.schema.field(name).type for p in parts} - {pa.null()}
        if len(types) > 1:
            return None
        fields.append(pa.field(name, types.pop() if types else pa.null()))
    table = pa.concat_tables([p.cast(pa.schema(fields)) for p in parts])
    for i, field in enumerate(fields):
        column = table.column(i)
        if pa.types.is_list(field.type) and len(pc.list_flatten(column)) == 0:
            return None
        if not pa.types.is_null(field.type) and column.null_count == table.num_rows:
            table = table.set_column(i, pa.field(field.name, pa.null()), pa.nulls(table.num_rows))
    return table


def hold_arrow(path: Path) -> None:
    """Read the table once into the Arrow form write_rows_changed merges into (a long-lived writer's
    warm-up: its first merge then reads no file); nothing where there is no table."""
    path = Path(path)
    key = _identity(path)
    if key is not None and _ARROW.get(key[0], (None,))[0] != key:
        _ARROW[key[0]] = (key, _read_as_built(path))


def _row_changes(old: list, new: list, pk: str, checked: bool = False, ordered: bool = False,
                 old_at: dict[int, int] | None = None) -> RowChanges | None:
    """The rows of `new` that are not in `old` as they are, and those of `old` they replace or that
    went; None where either list is not unique and in key order (`checked`: `old` is known to be;
    `ordered`: `new` is). `old_at`: {id: position} of `old`'s rows, where a call made it already."""
    key_of = operator.attrgetter(pk)
    if not ordered and not _strictly_increasing(list(map(key_of, new))):
        return None  # not unique, or not in key order: the table is not a keyed merge of rows
    if not checked and not _strictly_increasing(list(map(key_of, old))):
        return None  # rows read from a file another writer wrote: not in key order
    # An unchanged row is usually the same object (the stages' memos): the rows of both lists are
    # matched by identity in C, and only those new or gone by identity are looked at (building a
    # key dict of the previous rows touched every one of them).
    new_at = dict(zip(map(id, new), range(len(new))))
    if old_at is None:
        old_at = dict(zip(map(id, old), range(len(old))))
    gone = {key_of(old[i]): i for i in sorted(old_at[k] for k in old_at.keys() - new_at.keys())}
    fresh_at, renewed = [], []
    for position in sorted(new_at[k] for k in new_at.keys() - old_at.keys()):
        row = new[position]
        key = key_of(row)
        was = gone.get(key)
        # an equal row of another object: vars() compared, dicts compare in C where a
        # dataclass's __eq__ builds two tuples in Python
        if was is not None and vars(old[was]) == vars(row):
            del gone[key]
            renewed.append((old[was], row))
        else:
            fresh_at.append(position)
    replaced_at = sorted(gone.values())
    return RowChanges([new[i] for i in fresh_at], [old[i] for i in replaced_at], fresh_at, replaced_at, renewed,
                      new_at)


def _strictly_increasing(keys: list) -> bool:
    return all(map(operator.lt, keys, itertools.islice(keys, 1, None)))


def _merged(path: Path, held: tuple | None, changes: RowChanges, rows: list, pk: str) -> pa.Table | None:
    """The previous table (`held`: its Arrow table by file identity, if this process kept it) without
    the replaced rows, plus the fresh ones, in key order; None where that is not the table
    write_rows would write. Built of zero-copy slices of the previous table around the fresh
    rows, not copied (filtering and sorting the relations copied them twice a batch);
    the chunks are combined once there are many."""
    previous = held[1] if held is not None and held[0] == _identity(path) else _read_as_built(path)
    if previous.num_rows != len(rows) - len(changes.fresh) + len(changes.replaced):
        return None
    fresh = None
    if changes.fresh:
        columns, flat = _dataclass_columns(changes.fresh)
        if columns is None or not flat:
            return None
        try:
            fresh = pa.table(columns).cast(previous.schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return None  # a type the old rows did not have (e.g. values in a column that was all null)
    if len(changes.fresh_at) + len(changes.replaced_at) > _MAX_SLICED_ROWS:
        table = previous
        if changes.replaced:
            gone = pa.array(sorted({getattr(r, pk) for r in changes.replaced}), type=pa.string())
            table = table.filter(pc.invert(pc.is_in(table[pk], value_set=gone)))
        if fresh is not None:
            table = pa.concat_tables([table, fresh]).sort_by(pk)
    else:
        table = _spliced(previous, fresh, changes.fresh_at, changes.replaced_at, len(rows))
    if table.num_rows != len(rows) or any(map(_all_null, table.columns)):
        return None  # write_rows would infer the null type for that column (or its lists' items)
    return table.combine_chunks() if table.column(0).num_chunks > _MAX_CHUNKS else table


def _spliced(previous: pa.Table, fresh: pa.Table | None, fresh_at: list[int], replaced_at: list[int],
             total: int) -> pa.Table:
    """`previous` without the rows at `replaced_at`, with `fresh`'s rows at positions `fresh_at` of
    the result (both sorted): zero-copy slices of both. The kept rows are the previous table's but
    the replaced ones, in its order, and the result's but the fresh ones, in theirs."""
    kept_runs, start = [], 0
    for gone in (*replaced_at, previous.num_rows):
        if gone > start:
            kept_runs.append([start, gone])
        start = gone + 1
    pieces, runs, emitted = [], iter(kept_runs), 0
    run: list[int] | None = None

    def emit_kept(count: int) -> None:
        nonlocal run
        while count > 0:
            run = run or next(runs)
            step = min(count, run[1] - run[0])
            pieces.append(previous.slice(run[0], step))
            run[0] += step
            count -= step
            if run[0] == run[1]:
                run = None

    j = 0
    while j < len(fresh_at):  # a run of adjacent fresh rows is one slice
        end = j + 1
        while end < len(fresh_at) and fresh_at[end] == fresh_at[end - 1] + 1:
            end += 1
        emit_kept(fresh_at[j] - j - emitted)
        emitted = fresh_at[j] - j
        pieces.append(fresh.slice(j, end - j))
        j = end
    emit_kept(total - len(fresh_at) - emitted)
    return pa.concat_tables(pieces) if pieces else previous.slice(0, 0)


def _all_null(column: pa.ChunkedArray) -> bool:
    """Is every value of this column (of a list column: every item) null, in a column of another
    type than null?"""
    if pa.types.is_list(column.type):
        items = pc.list_flatten(column)
        return items.null_count == len(items) and not pa.types.is_null(column.type.value_type)
    return column.null_count == len(column) and not pa.types.is_null(column.type)


def _read_as_built(path: Path) -> pa.Table:
    """The file's table with the schema pa.table gives the same values: a list column read back from
    Parquet names its item `element`, where a table built from Python lists names it `item`."""
    table = read_table(path).replace_schema_metadata(None)
    return table.cast(pa.schema([pa.field(f.name, pa.list_(f.type.value_type)) if pa.types.is_list(f.type) else f
                                 for f in table.schema]))
