"""The embedded Qdrant folder, apart from the points in it: which engine built it, the lock that
keeps it to one process, and the read-only copies published for readers.

Embedded mode allows one process per folder and both engines fail at once when the folder is
taken, so the store guards the client's lifetime with its own lock (`<folder>.mtrag.lock`) and
waits for it; readers open a published copy (`copy_local_snapshot`, then `copy_for_reader` into
a private folder) instead of the live folder. The SQLite tuning of local mode's files lives here
too (`tune_wal`, `checkpoint_wal`)."""
from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import json
import os
import shutil
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Iterable

from mtrag_resources.core.config import env
from mtrag_resources.core.errors import BusyError, StoreError


class QdrantStoreError(StoreError):
    pass


class QdrantStoreLocked(QdrantStoreError, BusyError, TimeoutError):
    """Another process holds the embedded Qdrant folder."""


class QdrantEngineMismatch(QdrantStoreError, ValueError):
    """The folder was built by the other embedded engine."""


ENGINES = ("local", "edge")
ENGINE_ENV = "MTRAG_QDRANT_ENGINE"
ENGINE_FILE = "engine.json"


def engine_from_env() -> str:
    engine = env(ENGINE_ENV).strip().lower() or "local"
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


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


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
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    fh.close()
                    raise
                if time.monotonic() >= deadline:
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


def _copy_sparse(src: str, dst: str) -> str:
    """shutil.copy2 that keeps holes: Edge preallocates sparse 32 MiB files (WAL, mmaps) and a
    plain copy writes their zeros out (~3x the disk). Holes are skipped with SEEK_DATA/SEEK_HOLE
    and all-zero blocks inside data are left as holes too."""
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        fd, size, pos = fin.fileno(), os.fstat(fin.fileno()).st_size, 0
        while pos < size:
            try:
                pos = os.lseek(fd, pos, os.SEEK_DATA)
                end = os.lseek(fd, pos, os.SEEK_HOLE)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # nothing but a hole up to the end
                    break
                end = size  # no hole support here: scan it all
            except AttributeError:  # no SEEK_DATA on this platform
                end = size
            fin.seek(pos)
            while pos < end:
                block = fin.read(min(_COPY_BLOCK, end - pos))
                if not block:
                    break
                if block.count(0) != len(block):
                    fout.seek(pos)
                    fout.write(block)
                pos += len(block)
        fout.truncate(size)
    shutil.copystat(src, dst)
    return dst


def copy_for_reader(src: Path | str, dst: Path | str) -> None:
    """Copy a published snapshot into a reader's private folder (either engine), keeping holes."""
    shutil.copytree(src, dst, dirs_exist_ok=True, ignore=_NOT_COPIED, copy_function=_copy_sparse)


def copy_local_snapshot(src_path: Path | str, dst_path: Path | str, *, lock: bool = True,
                        lock_timeout: float = 300, keep: int = 2, protect: Iterable[Path | str] = ()) -> Path:
    """Publish a read-only copy of an embedded Qdrant folder that readers open while builds keep
    writing to `src_path`.

    The copy goes to a hidden temporary sibling and is renamed to a versioned folder
    `<dst>.v-<time>-<id>`; `dst` itself is a symlink swapped to the new version with one atomic
    rename, so a reader opening `dst` sees the old copy or the new one, never a missing or
    half-copied folder (a plain rename cannot replace a non-empty folder). The newest `keep`
    versions stay; older ones are removed. Lock files are not copied. With `lock` (the default)
    the source's `<src>.mtrag.lock` is held while copying; pass lock=False when the caller already
    holds it (`QdrantStore.publish_snapshot`).
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
            shutil.copytree(src, tmp, ignore=_NOT_COPIED, copy_function=_copy_sparse)
        os.rename(tmp, version)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)

    link_tmp = dst.parent / f".{dst.name}.link-{uuid.uuid4().hex[:8]}"
    os.symlink(version.name, link_tmp)
    if dst.exists() and not dst.is_symlink():
        # a real folder from elsewhere: move it aside as the oldest version
        os.rename(dst, dst.parent / f"{dst.name}.v-{0:020d}-{uuid.uuid4().hex[:8]}")
    os.replace(link_tmp, dst)

    versions = sorted(p for p in dst.parent.glob(f"{dst.name}.v-*") if p.is_dir())
    keep_also = {os.path.realpath(p) for p in protect}
    for old in versions[:-max(1, keep)]:
        if old != version and os.path.realpath(old) not in keep_also:
            shutil.rmtree(old, ignore_errors=True)
            with contextlib.suppress(OSError):
                lock_path_for(old).unlink()
    return dst
