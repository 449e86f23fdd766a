"""The embedded Qdrant folder, apart from the points in it: which engine built it, the lock that
keeps it to one process, the read-only versions published for readers, and the free-disk check.

Embedded mode allows one process per folder and both engines fail at once when the folder is
taken, so the store guards the client's lifetime with its own lock (`<folder>.mtrag.lock`) and
waits for it; readers open a published version (`publish_version`, then `link_for_reader` into
a private folder) instead of the live folder. A version shares every file that did not change
with the version before it (hard links), so publishing and opening cost what changed, not what
the store holds. The SQLite tuning of local mode's files lives here too (`tune_wal`,
`checkpoint_wal`)."""
from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import fnmatch
import json
import os
import shutil
import sqlite3
import stat
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from mtrag_resources.core.config import env
from mtrag_resources.core.errors import BusyError, StoreError
from mtrag_resources.core.faults import fault_point
from mtrag_resources.stores.page_cache import data_extents


class QdrantStoreError(StoreError):
    pass


class QdrantStoreLocked(QdrantStoreError, BusyError, TimeoutError):
    """Another process holds the embedded Qdrant folder."""


class QdrantEngineMismatch(QdrantStoreError, ValueError):
    """The folder was built by the other embedded engine."""


ENGINES = ("local", "edge")
ENGINE_ENV = "MTRAG_QDRANT_ENGINE"
ENGINE_FILE = "engine.json"


DEFAULT_ENGINE = "edge"


def engine_from_env() -> str | None:
    """The engine MTRAG_QDRANT_ENGINE names, or None when unset: then an existing folder keeps the
    engine that built it and a new one gets DEFAULT_ENGINE."""
    engine = env(ENGINE_ENV).strip().lower()
    if not engine:
        return None
    if engine not in ENGINES:
        raise ValueError(f"{ENGINE_ENV}={engine!r}: expected one of {', '.join(ENGINES)}")
    return engine


def folder_engine(folder: Path | str) -> str | None:
    """The embedded engine that built `folder`, or None for a folder no engine has used yet."""
    folder = Path(folder)
    with contextlib.suppress(FileNotFoundError):
        return str(json.loads((folder / ENGINE_FILE).read_text())["engine"])
    return "local" if (folder / "meta.json").is_file() else None  # made before engine.json


def claim_engine(folder: Path, engine: str) -> None:
    found = folder_engine(folder)
    if found is None:
        (folder / ENGINE_FILE).write_text(json.dumps({"engine": engine}) + "\n")
    elif found != engine:
        raise QdrantEngineMismatch(
            f"the embedded Qdrant folder {folder} was built with the {found!r} engine, not "
            f"{engine!r}: set {ENGINE_ENV}={found}, or rebuild into another folder")


def lock_path_for(folder: Path | str) -> Path:
    folder = Path(folder)
    return folder.parent / f"{folder.name}.mtrag.lock"


def wanted_path_for(folder: Path | str) -> Path:
    """Beside the lock file: touched by a process while it waits for the lock (FolderLock.acquire),
    so that a holder keeping the folder open between uses (`mtrag watch`) closes it now."""
    folder = Path(folder)
    return folder.parent / f"{folder.name}.mtrag.wanted"


# A waiter touches its request at least every 0.25 s (acquire's longest sleep); an older one is a
# waiter that gave up or died.
WANTED_FRESH_S = 2.0


def wanted_by_another(folder: Path | str) -> bool:
    """Is a process waiting for this folder's lock now?"""
    try:
        return time.time() - wanted_path_for(folder).stat().st_mtime < WANTED_FRESH_S
    except OSError:
        return False


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


# Not in the session: the folder locks this process holds are a fact of the process, not a cache.
_HELD_IN_THIS_PROCESS: set[str] = set()


class FolderLock:
    """An exclusive fcntl.flock on `<folder>.mtrag.lock`, waited for up to `timeout` seconds.
    Taking it twice in one process is a bug (it would wait on itself), so that fails at once."""

    def __init__(self, folder: Path, timeout: float) -> None:
        self.folder = Path(folder)
        self.path = lock_path_for(self.folder)
        self.timeout = timeout
        self._fh = None

    def acquire(self) -> None:
        key = str(self.path.resolve())
        if key in _HELD_IN_THIS_PROCESS:
            raise QdrantStoreLocked(
                f"the embedded Qdrant folder {self.folder} is already open in this process; "
                "reuse that QdrantStore (or close it first)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")
        deadline = time.monotonic() + max(0.0, self.timeout)
        delay = 0.02
        wanted = wanted_path_for(self.folder)
        asked = False
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    fh.close()
                    raise
                with contextlib.suppress(OSError):  # ask a holder that keeps it open to let go
                    wanted.write_text(f"pid {os.getpid()} since {now_iso()}\n")
                    asked = True
                if time.monotonic() >= deadline:
                    if asked:
                        with contextlib.suppress(OSError):
                            wanted.unlink(missing_ok=True)
                    holder = ""
                    with contextlib.suppress(OSError):
                        fh.seek(0)
                        holder = fh.read().strip()
                    fh.close()
                    raise QdrantStoreLocked(
                        f"the embedded Qdrant folder {self.folder} is in use by another process"
                        f"{f' ({holder})' if holder else ''}; waited {self.timeout:g} s for "
                        f"{self.path}. Embedded Qdrant allows one process per folder: wait for "
                        "the running build, open a published copy, or use a Qdrant server "
                        "(QDRANT_URL).") from None
                time.sleep(delay)
                delay = min(delay * 1.5, 0.25)
        if asked:  # another waiter asks again within its next sleep
            with contextlib.suppress(OSError):
                wanted.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            fh.seek(0)
            fh.truncate()
            fh.write(f"pid {os.getpid()} since {now_iso()}\n")
            fh.flush()
        self._fh = fh
        self._key = key
        _HELD_IN_THIS_PROCESS.add(key)

    def release(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.seek(0)
                self._fh.truncate()
            with contextlib.suppress(OSError):
                fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
            _HELD_IN_THIS_PROCESS.discard(self._key)

    def __enter__(self) -> "FolderLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def tune_wal(conn: sqlite3.Connection) -> None:
    """Local mode commits every point in its own transaction: WAL with synchronous=NORMAL turns
    ~180 fsynced commits/s into ~20k/s; `checkpoint_wal` makes them durable before a commit marker."""
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")


def checkpoint_wal(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


_COPY_BLOCK = 1 << 16
# lock files are per process and never copied; a SQLite WAL file holds committed points and is
# copied, its -shm index is rebuilt on open
_NOT_COPIED = shutil.ignore_patterns(".lock", "*.tmp", "*-shm")
FILES_INDEX = ".mtrag-files.json"
# A file whose mtime lies this close to the scan that recorded it may have changed again within
# the filesystem's timestamp granularity after that scan ("racy git"): its bytes are compared.
_RACY_NS = 2_000_000_000
# The files of an immutable Edge segment that an opening shard only reads (checked by hashing
# them and counting their blocks around a reader's open, on ext4 and on tmpfs): the vectors, the
# HNSW graph, the payload pages and the keyword indexes' maps, nearly all of a segment's bytes. A
# reader links these; everything else (id trackers, payload trackers, null flags, configs, which
# Edge maps writable and touches when it opens) it copies.
_READ_ONLY_ON_OPEN = ("vector_storage/matrix.dat", "vector_index/*", "payload_storage/page_*.dat",
                      "payload_index/*-map/point_to_values.bin", "payload_index/*-map/values_to_points.bin")


def _copy_sparse(src: str, dst: str) -> int:
    """shutil.copy2 that keeps holes: Edge preallocates sparse 32 MiB files (WAL, mmaps) and a
    plain copy writes their zeros out (several times the disk). Holes are skipped (data_extents) and
    all-zero blocks inside data are left as holes too. Returns the bytes written. On bare file
    descriptors, with the mode and times copied (copy2's xattrs: Edge's files have none): a
    reader's switch and a publish copy ~60 small files each, and the buffered files and copystat
    were two thirds of their syscalls."""
    written = 0
    fin = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        st = os.fstat(fin)
        fout = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            extents = data_extents(fin, st.st_size)
            for pos, end in [(0, st.st_size)] if extents is None else extents:
                while pos < end:
                    block = os.pread(fin, min(_COPY_BLOCK, end - pos), pos)
                    if not block:
                        break
                    if block.count(0) != len(block):
                        os.pwrite(fout, block, pos)
                        written += len(block)
                    pos += len(block)
            os.ftruncate(fout, st.st_size)
            os.fchmod(fout, stat.S_IMODE(st.st_mode))
            os.utime(fout, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(fout)
    finally:
        os.close(fin)
    return written


_COMPARE_BLOCK = 1 << 20


def same_bytes(a: Path | str, b: Path | str) -> bool:
    """Do two files hold the same bytes? Edge's files are sparse (32 MiB preallocated, a few MiB
    written): where both have the same holes only their data is read, in 1 MiB blocks (filecmp
    read both whole, 8 KiB at a time). Holes read as zeros, so different hole maps compare all."""
    with open(a, "rb") as fa, open(b, "rb") as fb:
        size = os.fstat(fa.fileno()).st_size
        if size != os.fstat(fb.fileno()).st_size:
            return False
        extents = data_extents(fa.fileno(), size)
        if extents is None or extents != data_extents(fb.fileno(), size):
            extents = [(0, size)]
        for start, end in extents:
            fa.seek(start)
            fb.seek(start)
            while start < end:
                n = min(_COMPARE_BLOCK, end - start)
                if fa.read(n) != fb.read(n):
                    return False
                start += n
    return True


def _allocated(path: Path) -> int:
    with contextlib.suppress(OSError):
        return os.stat(path).st_blocks * 512
    return 0


class QdrantDiskFull(QdrantStoreError, OSError):
    """Too little free disk for a write: Edge maps its files into memory, and a write to a mapped
    page the disk has no room for kills the process with SIGBUS, so the store refuses first."""


DISK_RESERVE_ENV = "MTRAG_QDRANT_DISK_RESERVE_MB"


def ensure_free_disk(folder: Path | str, needed: int, what: str) -> None:
    """Refuse (QdrantDiskFull, before anything is written) unless the filesystem of `folder` has
    `needed` bytes free beyond the reserve (MTRAG_QDRANT_DISK_RESERVE_MB, default 8 MiB: Edge's
    32 MiB WAL and storage files are sparse, so the reserve covers what fills their pages: the
    markers, segment metadata, small appends)."""
    folder = Path(folder)
    probe = folder if folder.exists() else folder.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    reserve = int(float(env(DISK_RESERVE_ENV) or 8) * (1 << 20))
    free = shutil.disk_usage(probe).free
    if free < needed + reserve:
        raise QdrantDiskFull(
            errno.ENOSPC,
            f"the disk is full for {what} in {folder}: {free / 2**20:,.1f} MiB free, "
            f"{(needed + reserve) / 2**20:,.1f} MiB needed ({needed / 2**20:,.1f} MiB of data + "
            f"{reserve / 2**20:,.0f} MiB reserve, {DISK_RESERVE_ENV}); nothing was written. Free "
            "some space and build again: the published generation is still served")


def _walk(root: Path, skip: set[str] | frozenset = frozenset()) -> Iterable[tuple[str, list[str], list[str]]]:
    """os.walk of what a published version holds: no Edge WAL (a flushed shard holds every point
    in its segments; a reader's open creates an empty WAL of its own); `skip`: top-level folders
    not entered."""
    top = True
    for dirpath, dirnames, filenames in os.walk(root):
        if top:
            dirnames[:] = [d for d in dirnames if d not in skip]
            top = False
        if "wal" in dirnames and os.path.isfile(os.path.join(dirpath, "edge_config.json")):
            dirnames.remove("wal")
        yield dirpath, dirnames, filenames


# The helpers below take and give paths as strings: a version has many files in many folders, and
# pathlib's parsing and hashing was a third of a reader's folder.

def _make_parent(target: str, made: set[str]) -> None:
    """`target`'s folder, unless `made` (the folders known to exist, updated) has it: a mkdir costs
    a syscall, slow on a slow disk, and a version has many files in many folders."""
    parent = os.path.dirname(target)
    if parent not in made:
        os.makedirs(parent, exist_ok=True)
        while parent not in made:  # it and every folder above it exist now
            made.add(parent)
            parent = os.path.dirname(parent)


def _make_folders(src: Path | str, dst: Path | str, made: set[str] = frozenset(),
                  skip: set[str] | frozenset = frozenset()) -> None:
    """`src`'s folders under `dst`, empty ones too (an Edge shard's temp_segments is part of its
    layout); `made`: those known to exist already; `skip`: top-level folders left out."""
    src, dst = str(src), str(dst)
    for dirpath, dirnames, _ in _walk(src, skip):
        here = dst + dirpath[len(src):]
        for d in dirnames:
            folder = os.path.join(here, d)
            if folder not in made:
                os.makedirs(folder, exist_ok=True)


def _walk_files(root: Path | str, skip: set[str] | frozenset = frozenset()) -> Iterable[tuple[str, str]]:
    """(relative path, path) of the files a published version holds: no lock, temp or -shm files,
    no Edge WAL; none under the top-level folders `skip`."""
    root = str(root)
    for dirpath, _, filenames in _walk(root, skip):
        ignored = _NOT_COPIED(dirpath, filenames)
        folder = dirpath[len(root) + 1:]
        for name in sorted(filenames):
            if name not in ignored and name != FILES_INDEX:
                yield (f"{folder}/{name}" if folder else name), os.path.join(dirpath, name)


@dataclass
class PublishStats:
    """What one publish cost: files hard-linked from the previous version, files copied, and the
    bytes written (data blocks of the copied files)."""
    version: Path
    files_linked: int = 0
    files_copied: int = 0
    bytes_written: int = 0
    bytes_linked: int = 0
    seconds: float = 0.0

    def as_metadata(self) -> dict:
        return {"qdrant_publish_files_linked": self.files_linked,
                "qdrant_publish_files_copied": self.files_copied,
                "qdrant_publish_bytes_written": self.bytes_written,
                "qdrant_publish_bytes_shared": self.bytes_linked,
                "qdrant_publish_seconds": round(self.seconds, 4)}


def _reusable(src: Path, st: os.stat_result, rec: list | None, prev_file: Path, scanned_ns: int) -> bool:
    """Local mode: is the previous version's file still exactly the live one? Stat first (size,
    mtime, inode as recorded when it was copied); a file modified close to that scan is compared
    byte by byte."""
    if rec is None or not prev_file.is_file():
        return False
    size, mtime_ns, ino = rec
    if (st.st_size, st.st_mtime_ns, st.st_ino) != (size, mtime_ns, ino):
        return False
    if mtime_ns < scanned_ns - _RACY_NS:
        return True
    return same_bytes(src, prev_file)


def _read_only_on_open(inside: str) -> bool:
    """Is `inside` (a path within an immutable segment) one of the files an open only reads?"""
    return any(fnmatch.fnmatchcase(inside, pat) for pat in _READ_ONLY_ON_OPEN)


def _segment_of(rel: str) -> str | None:
    """`<collection>/segments/<id>` for a file inside an Edge segment, else None."""
    parts = rel.split("/")
    return "/".join(parts[:3]) if len(parts) > 3 and parts[1] == "segments" else None


def _edge_reusable(src: Path, rel: str, prev_file: Path, unchanged_segments: set[str]) -> bool:
    """Edge: a segment whose persisted state (segment.json: its version, bumped by every write to
    it and stored by each flush) equals the previous version's is shared whole, with no read; in a
    segment that changed, the large files a write rarely touches (vectors, HNSW graph, payload
    pages, index maps) are compared byte by byte and shared when equal; the rest is copied. Mapped
    writes need not move a file's mtime, so Edge folders never trust it."""
    if not prev_file.is_file():
        return False
    segment = _segment_of(rel)
    if segment is None:
        return False
    if segment in unchanged_segments:
        return True
    return (_read_only_on_open(rel[len(segment) + 1:])
            and same_bytes(src, prev_file))


def _unchanged_segments(src: Path, previous: Path) -> set[str]:
    out = set()
    for meta in src.glob("*/segments/*/segment.json"):
        rel = meta.parent.relative_to(src).as_posix()
        with contextlib.suppress(OSError):
            if (previous / rel / "segment.json").read_bytes() == meta.read_bytes():
                out.add(rel)
    return out


def _write_version(src: Path, tmp: Path, previous: Path | None) -> PublishStats:
    """Fill `tmp` with the files of `src`: a hard link to `previous`'s file where the live file is
    unchanged since `previous` was made, else a sparse copy. Published files are never written
    again (readers link them too and copy only what their engine rewrites), which is what makes
    sharing them safe."""
    t0 = time.perf_counter()
    stats = PublishStats(version=tmp)
    index: dict = {}
    if previous is not None:
        with contextlib.suppress(OSError, ValueError, KeyError):
            index = json.loads((previous / FILES_INDEX).read_text())
    records, scanned_ns = index.get("files", {}), int(index.get("scanned_ns", 0))
    files = list(_walk_files(src))
    fresh = [(rel, full, os.stat(full)) for rel, full in files]
    if previous is None:
        to_copy = fresh
    elif folder_engine(src) == "edge":
        unchanged = _unchanged_segments(src, previous)
        to_copy = [(rel, full, st) for rel, full, st in fresh
                   if not _edge_reusable(full, rel, previous / rel, unchanged)]
    else:
        to_copy = [(rel, full, st) for rel, full, st in fresh
                   if not _reusable(full, st, records.get(rel), previous / rel, scanned_ns)]
    ensure_free_disk(tmp.parent, sum(_allocated(full) for _, full, _ in to_copy), "a published copy")
    copied = {rel for rel, _, _ in to_copy}
    now_ns = time.time_ns()
    tmp.mkdir(parents=True)
    made: set[str] = {str(tmp)}
    for rel, full, st in fresh:
        target = os.path.join(tmp, rel)
        _make_parent(target, made)
        if rel in copied:
            stats.bytes_written += _copy_sparse(full, target)
            stats.files_copied += 1
        else:
            os.link(previous / rel, target)
            stats.files_linked += 1
            stats.bytes_linked += _allocated(target)
    _make_folders(src, tmp, made)
    (tmp / FILES_INDEX).write_text(json.dumps({
        "scanned_ns": now_ns,
        "files": {rel: [st.st_size, st.st_mtime_ns, st.st_ino] for rel, _, st in fresh}}))
    stats.seconds = time.perf_counter() - t0
    return stats


def _immutable_segments(root: Path, skip: set[str] | frozenset = frozenset()) -> set[Path]:
    """Edge segments that no write touches again: the optimizer's (HNSW-indexed, plain mmap
    storage). The appendable segment (chunked mmap, no index) takes every new point, and its files
    are mapped writable and allocated when a shard opens, so a reader never shares them. `skip`:
    collections (top-level folders) not looked at."""
    out = set()
    for meta in root.glob("*/segments/*/segment.json"):
        if meta.relative_to(root).parts[0] in skip:
            continue
        with contextlib.suppress(OSError, ValueError):
            vectors = json.loads(meta.read_text())["config"]["vector_data"].values()
            if vectors and all(v.get("storage_type") == "Mmap" and v.get("index", {}).get("type") == "hnsw"
                               for v in vectors):
                out.add(meta.parent)
    return out


def link_for_reader(src: Path | str, dst: Path | str, skip: set[str] | frozenset = frozenset()) -> None:
    """A reader's private folder of a published version. The files of an Edge shard's immutable
    (indexed) segments, nearly all of its bytes, are hard links, so a reader's open costs the
    file count plus the appendable segment (bounded by Edge's indexing threshold), not what the
    collection holds; what Edge rewrites when it opens (id trackers, configs) is copied. A
    local-mode folder (one SQLite file per collection, written on open) is copied whole.
    `skip`: Edge collections (top-level folders) the reader does not load from this folder."""
    src, dst = Path(src), Path(dst)
    if folder_engine(src) != "edge":
        shutil.copytree(src, dst, dirs_exist_ok=True, ignore=_NOT_COPIED, copy_function=_copy_sparse)
        return
    # by relative path: `segment in full.parents` compared Path objects, slow for every CLI query
    shared = {seg.relative_to(src).as_posix() for seg in _immutable_segments(src, skip)}

    def linkable(rel: str) -> bool:
        segment = _segment_of(rel)
        return segment in shared and _read_only_on_open(rel[len(segment) + 1:])

    plan = [(rel, full, linkable(rel)) for rel, full in _walk_files(src, skip)]
    # Edge may allocate the copied files in full when it maps them: room for their whole size,
    # or the reader would die of SIGBUS instead of failing its switch
    ensure_free_disk(dst, sum(os.stat(full).st_size for _, full, link in plan if not link),
                     "a reader's private folder")
    made: set[str] = set()
    for rel, full, link in plan:
        target = os.path.join(dst, rel)
        _make_parent(target, made)
        if link:
            os.link(full, target)
        else:
            _copy_sparse(full, target)
    _make_folders(src, dst, made, skip)


def unchanged_collections(old: Path | str, new: Path | str, names) -> list[str]:
    """The Edge collections among `names` that two published versions hold alike: the same
    segments, each at the same version and config (its segment.json; Edge counts every update
    operation in a segment's version, and a publish flushes first). Where either side cannot be
    read, the collection counts as changed."""
    return [name for name in names
            if (sig := _segments_signature(Path(old) / name)) is not None and sig == _segments_signature(Path(new) / name)]


def _segments_signature(collection: Path) -> dict | None:
    try:
        return {segment.name: json.loads((segment / "segment.json").read_text())
                for segment in sorted((collection / "segments").iterdir()) if segment.is_dir()} or None
    except (OSError, ValueError):
        return None


def published_version(dst: Path | str) -> Path | None:
    """The version folder the `dst` link names now, or None."""
    dst = Path(dst)
    if dst.is_symlink() and dst.exists():
        return dst.resolve()
    return None


def publish_version(src_path: Path | str, dst_path: Path | str, *, lock: bool = True,
                    lock_timeout: float = 300, keep: int = 2,
                    protect: Iterable[Path | str] = (), prune: bool = True) -> PublishStats:
    """Publish a read-only version of an embedded Qdrant folder that readers open while builds
    keep writing to `src_path`, at the cost of what changed since the last version.

    The version is made in a hidden temporary sibling (`_write_version`: unchanged files are hard
    links to the previous version's) and renamed to `<dst>.v-<time>-<id>`; `dst` itself is a
    symlink swapped to it with one atomic rename, so a reader opening `dst` sees the old version
    or the new one, never a missing or half-made folder. The newest `keep` versions stay (and any
    named in `protect`); older ones are removed (removing a version unlinks only its own names).
    With `lock` (the default) the source's `<src>.mtrag.lock` is held while the version is made;
    pass lock=False when the caller already holds it (`QdrantStore.publish_snapshot`). prune=False
    leaves the older versions to the caller's prune_versions (a build prunes once its manifest names
    the new version: removing one is ~200 unlinks, none of them a reader's wait).
    """
    src = Path(src_path).resolve()
    dst = Path(dst_path).absolute()
    if folder_engine(src) is None:
        raise FileNotFoundError(f"{src} is not an embedded Qdrant folder (no {ENGINE_FILE} or "
                                "meta.json)")
    dst.parent.mkdir(parents=True, exist_ok=True)
    version = dst.parent / f"{dst.name}.v-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
    tmp = dst.parent / f".{version.name}.tmp"
    guard = FolderLock(src, lock_timeout) if lock else contextlib.nullcontext()
    try:
        with guard:
            stats = _write_version(src, tmp, published_version(dst))
        fault_point("qdrant:publish_before_rename")
        os.rename(tmp, version)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    stats.version = version

    link_tmp = dst.parent / f".{dst.name}.link-{uuid.uuid4().hex[:8]}"
    os.symlink(version.name, link_tmp)
    if dst.exists() and not dst.is_symlink():
        # a real folder from elsewhere: move it aside as the oldest version
        os.rename(dst, dst.parent / f"{dst.name}.v-{0:020d}-{uuid.uuid4().hex[:8]}")
    os.replace(link_tmp, dst)

    if prune:
        prune_versions(dst, keep, [*protect, version])
    # a publish killed before its rename leaves a hidden temporary folder: nothing names it
    for stale in dst.parent.glob(f".{dst.name}.v-*.tmp"):
        if stale != tmp:
            shutil.rmtree(stale, ignore_errors=True)
    return stats


def prune_versions(dst_path: Path | str, keep: int, protect: Iterable[Path | str] = ()) -> int:
    """Remove the published versions behind `dst_path` but the newest `keep` and those named in
    `protect`; returns how many went (removing a version unlinks only its own names)."""
    dst = Path(dst_path).absolute()
    versions = sorted(p for p in dst.parent.glob(f"{dst.name}.v-*") if p.is_dir())
    keep_also = {os.path.realpath(p) for p in protect}
    removed = 0
    for old in versions[:-max(1, keep)]:
        if os.path.realpath(old) not in keep_also:
            shutil.rmtree(old, ignore_errors=True)
            with contextlib.suppress(OSError):
                lock_path_for(old).unlink()
            removed += 1
    return removed
