"""A path's resolved name, as `str(Path(path).resolve())` gives it, for the hot paths that key
in-process caches by it (tables' decoded rows, the embedding cache's shard hashes, the settings).

`Path.resolve` walks every component of the path in Python with an lstat each, hundreds of times a
`mtrag watch` batch (docs/performance.md#processes). Here a directory's resolved name is kept by the directory's identity (the name as given,
its device and inode from one stat), so the next call costs that stat and an lstat of the last
component. A symlink re-pointed anywhere above gives the name another directory (another inode):
the entry is not reused. A name with `..` or a missing directory takes the full resolution."""
from __future__ import annotations

import os
import threading
from pathlib import Path

from mtrag_resources.core.session import session_cache
_DIRS = session_cache("real_paths.dirs", max_entries=4096)  # a build touches a few hundred directories
_LOCK = threading.Lock()


def resolved_name(path: str | os.PathLike) -> str:
    """`str(Path(path).resolve())` (non-strict), with the parent directory's resolution reused."""
    name = os.path.abspath(path)
    if ".." in os.fspath(path).split(os.sep):
        return str(Path(path).resolve())  # `..` after a symlink is not lexical: walk it
    parent, leaf = os.path.split(name)
    if not leaf:
        return str(Path(name).resolve())
    try:
        st = os.stat(parent)
    except OSError:
        return str(Path(name).resolve())
    key = (parent, st.st_dev, st.st_ino)
    real_parent = _DIRS.get(key)
    if real_parent is None:
        real_parent = os.path.realpath(parent)
        with _LOCK:
            _DIRS[key] = real_parent
    full = os.path.join(real_parent, leaf)
    return os.path.realpath(full) if os.path.islink(full) else full


def resolved(path: str | os.PathLike) -> Path:
    """`Path(path).resolve()`, as resolved_name."""
    return Path(resolved_name(path))
