"""A large table as buckets: its rows placed by a stable hash of one column (the file a row comes
from), each bucket one Parquet part named by its content's digest, and a small manifest that names
the parts.

Why: a one-file change rewrote the whole chunk and graph tables (django: 24k chunk rows, 40k
nodes, 31k relations, every build). Here a write digests every bucket's rows and writes only the
parts whose content is new; the manifest, replaced atomically last, is the write's commit point:
a reader sees the old table or the new one, and a crash before it leaves unnamed parts that the
next write removes. A part's name is its content's digest, so two versions of a table differ
exactly in the parts whose names differ (a comparison reads those only), and a hard link of the
manifest and its parts is a snapshot of one version.

A reader gets the table the single-file form would hold: the parts' rows, stably sorted by the
table's `order` columns (a file's rows share one part, in their order there)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mtrag_resources.core.arrow import pa, pc, pq
from mtrag_resources.core.atomic import write_bytes_atomic
from mtrag_resources.core.faults import fault_point

MANIFEST = "_table.json"
PART_PREFIX = "part-"
_READ_RETRIES = 5


@dataclass(frozen=True)
class Bucketing:
    """`key`: the string column whose value picks a row's bucket; `order`: the columns the table is
    sorted by (stably: rows equal on them keep their order within a bucket); `buckets`: how many."""
    key: str
    order: tuple[str, ...]
    buckets: int = 32


def is_bucketed(path: Path) -> bool:
    """A table path without the `.parquet` suffix is a bucketed table's folder."""
    return Path(path).suffix != ".parquet"


def manifest_path(path: Path) -> Path:
    return Path(path) / MANIFEST


def load_manifest(path: Path) -> dict | None:
    try:
        return json.loads(manifest_path(path).read_text())
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None


def exists(path: Path) -> bool:
    return manifest_path(path).is_file()


def part_files(path: Path, manifest: dict | None = None) -> list[Path]:
    """The parts of the table's current version, in bucket order ([] where there is none)."""
    manifest = manifest if manifest is not None else load_manifest(path)
    if manifest is None:
        return []
    return [Path(path) / name for _bucket, name in sorted((int(b), n) for b, n in manifest["parts"].items())]


def num_rows(path: Path) -> int:
    manifest = load_manifest(path)
    return int(manifest["rows"]) if manifest else 0


def read_schema(path: Path) -> pa.Schema:
    files = part_files(path)
    if not files:
        raise FileNotFoundError(f"{path}: no bucketed table here")
    return pq.read_schema(files[0]).remove_metadata()


def read(path: Path, columns: list[str] | None = None, filters=None,
         keys: tuple[str, Iterable[str]] | None = None) -> pa.Table:
    """The table (or `columns` of it, rows matching `filters` as pq.read_table takes them), in its
    order. `keys` (column, values): where the table is bucketed by that column, only the parts of
    those values' buckets (their rows and the other rows those buckets hold: the caller filters).
    Retries where a writer replaced the version between the manifest and the parts."""
    last_error: Exception | None = None
    for attempt in range(_READ_RETRIES):
        manifest = load_manifest(path)
        if manifest is None:
            raise FileNotFoundError(f"{path}: no bucketed table here")
        order = list(manifest["order"])
        wanted = None if columns is None else list(dict.fromkeys([*columns, *order]))
        if keys is not None and keys[0] == manifest.get("key"):
            buckets = {str(bucket_of(k, int(manifest["buckets"]))) for k in keys[1]}
            manifest = {**manifest, "parts": {b: n for b, n in manifest["parts"].items() if b in buckets}}
            if not manifest["parts"]:  # no rows of those values: the table's columns, no rows
                table = read_schema(path).empty_table()
                return table if columns is None else table.select(columns)
        files = [str(f) for f in part_files(path, manifest)]
        try:
            # one dataset read of the listed parts: a read per part pays a fixed overhead each
            table = pq.read_table(files if len(files) > 1 else files[0], columns=wanted, filters=filters)
        except OSError as exc:  # a concurrent write removed a part of the version read
            last_error = exc
            time.sleep(0.05 * (attempt + 1))
            continue
        if len(files) > 1 and order:
            table = table.sort_by([(c, "ascending") for c in order])  # stable: a file's rows keep theirs
        table = table.replace_schema_metadata(None)
        return table if columns is None else table.select(columns)
    raise last_error  # type: ignore[misc]


def bucket_of(value: str | None, buckets: int) -> int:
    return zlib.crc32((value or "").encode("utf-8")) % buckets


def write(path: Path, table: pa.Table, bucketing: Bucketing, changed_keys: Iterable[str] | None = None) -> dict:
    """Replace the table with `table` (in its order already), writing only the parts whose content
    is not there yet. `changed_keys`: the caller knows that only the rows of these key values
    differ from the current version (added, changed or removed); a part of another bucket, with as
    many rows as before, is then the current version's and is not digested again (taking and
    digesting every part cost as much as writing the whole table). Returns {"parts": n, "written":
    parts written, "bytes_written": their size}."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    table = table.replace_schema_metadata(None)
    rows_by_bucket = _rows_by_bucket(table.column(bucketing.key), bucketing.buckets)
    if not rows_by_bucket:
        rows_by_bucket = {0: np.empty(0, dtype=np.int64)}  # an empty table keeps its schema in one empty part
    current = _same_bucketing(load_manifest(path), bucketing) if changed_keys is not None else None
    dirty = {bucket_of(k, bucketing.buckets) for k in changed_keys} if current is not None else set()
    parts, counts, written, bytes_written = {}, {}, 0, 0
    for bucket, rows in sorted(rows_by_bucket.items()):
        counts[str(bucket)] = len(rows)
        kept = current["parts"].get(str(bucket)) if current is not None and bucket not in dirty else None
        if kept is not None and current["counts"].get(str(bucket)) == len(rows) and (path / kept).exists():
            parts[str(bucket)] = kept
            continue
        part = table.take(rows)
        name = f"{PART_PREFIX}{bucket:03d}-{_digest(part)}.parquet"
        target = path / name
        if not target.exists():
            bytes_written += _write_part(target, part)
            written += 1
        parts[str(bucket)] = name
    manifest = {"key": bucketing.key, "order": list(bucketing.order), "buckets": bucketing.buckets,
                "rows": table.num_rows, "parts": parts, "counts": counts}
    fault_point("table:before_manifest")
    write_bytes_atomic(manifest_path(path), json.dumps(manifest, sort_keys=True).encode())
    _remove_unlisted(path, set(parts.values()))
    return {"parts": len(parts), "written": written, "bytes_written": bytes_written}


def _rows_by_bucket(column: pa.ChunkedArray, buckets: int) -> dict[int, np.ndarray]:
    """The row numbers of each bucket, in row order. The bucket of each distinct value, not of each
    row: a graph has many rows per file (see docs/performance.md#tables)."""
    if not pa.types.is_string(column.type):
        by_bucket: dict[int, list[int]] = {}
        for i, value in enumerate(column.to_pylist()):
            by_bucket.setdefault(bucket_of(value, buckets), []).append(i)
        return {b: np.asarray(rows, dtype=np.int64) for b, rows in by_bucket.items()}
    values = pc.fill_null(column, "")
    distinct = pc.unique(values)
    of_distinct = np.fromiter((bucket_of(v, buckets) for v in distinct.to_pylist()), dtype=np.int64,
                              count=len(distinct))
    row_buckets = of_distinct[pc.index_in(values, value_set=distinct).to_numpy()]
    order = np.argsort(row_buckets, kind="stable")
    counts = np.bincount(row_buckets, minlength=buckets)
    ends = np.cumsum(counts)
    return {int(b): order[ends[b] - counts[b]:ends[b]] for b in np.flatnonzero(counts)}


def _same_bucketing(manifest: dict | None, bucketing: Bucketing) -> dict | None:
    """`manifest` where it records its parts' row counts for `bucketing` (versions before the counts
    have every part digested again)."""
    if manifest is None or "counts" not in manifest or manifest.get("key") != bucketing.key or \
            manifest.get("buckets") != bucketing.buckets or manifest.get("order") != list(bucketing.order):
        return None
    return manifest


def changed_parts(new: Path, old: Path) -> tuple[list[Path], list[Path]] | None:
    """The parts of `new` and of `old` that differ (by name: a name is the content's digest), where
    both are versions of one bucketing; None where they cannot be compared part by part."""
    a, b = load_manifest(new), load_manifest(old)
    if a is None or b is None or a["key"] != b["key"] or a["buckets"] != b["buckets"]:
        return None
    buckets = sorted(set(a["parts"]) | set(b["parts"]), key=int)
    differ = [k for k in buckets if a["parts"].get(k) != b["parts"].get(k)]
    return ([Path(new) / a["parts"][k] for k in differ if k in a["parts"]],
            [Path(old) / b["parts"][k] for k in differ if k in b["parts"]])


def link_version(src: Path, dst: Path) -> None:
    """A snapshot of `src`'s current version in folder `dst` (replaced): hard links of its parts and
    of its manifest (a copy where links are refused), the manifest last."""
    src, dst = Path(src), Path(dst)
    manifest = load_manifest(src)
    if manifest is None:
        raise FileNotFoundError(f"{src}: no bucketed table here")
    dst.mkdir(parents=True, exist_ok=True)
    manifest_path(dst).unlink(missing_ok=True)
    names = set(manifest["parts"].values())
    # one listing, not a stat per part: a store stage saves its snapshot beside other stages' threads,
    # and each syscall waits for the GIL again
    present = set(os.listdir(dst))
    for name in names - present:
        _link_or_copy(src / name, dst / name)
    link_replace(manifest_path(src), manifest_path(dst))
    _remove_unlisted(dst, names, present)


def link_replace(src: Path, dst: Path) -> None:
    """`dst` becomes a hard link of `src` (a copy where links are refused), replaced atomically."""
    tmp = Path(dst).with_name(f".{Path(dst).name}.tmp")
    tmp.unlink(missing_ok=True)
    _link_or_copy(src, tmp)
    os.replace(tmp, dst)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links refused: a copy is slower, not wrong
        shutil.copyfile(src, dst)


def _digest(part: pa.Table) -> str:
    """The digest of a part's schema and values (Arrow's stream form of freshly taken arrays)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, part.schema) as writer:
        writer.write_table(part)
    return hashlib.sha256(sink.getvalue()).hexdigest()[:24]


def _write_part(target: Path, part: pa.Table) -> int:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=".part")
    os.close(fd)
    try:
        pq.write_table(part, tmp)
        size = os.path.getsize(tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return size


def _remove_unlisted(path: Path, keep: set[str], listing: set[str] | None = None) -> None:
    """Parts of earlier versions (and a crashed write's) go once the manifest no longer names them.
    `listing`: the folder's names, listed by the caller (a part it added since is in `keep`)."""
    for name in os.listdir(path) if listing is None else listing:
        if name.startswith(PART_PREFIX) and name.endswith(".parquet"):
            if name not in keep:
                (path / name).unlink(missing_ok=True)
        elif name.startswith(".tmp-") and name.endswith(".part"):
            with contextlib.suppress(FileNotFoundError):  # not a write in flight (each source has one writer)
                if time.time() - (path / name).stat().st_mtime > 60:
                    (path / name).unlink(missing_ok=True)
