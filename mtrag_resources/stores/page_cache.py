"""Reading a store's files through once, so that a long-lived reader's first queries do not wait
on the disk page by page.

An Edge shard maps its segment files and touches them at random as searches walk its HNSW graph.
Right after a shard opens, every new page is a major fault; one sequential read of its files
removes them (the reads release the GIL, so queries on the loaded generation go on meanwhile), where
`posix_fadvise(WILLNEED)` alone left many (figures: docs/performance.md#qdrant).
A one-shot reader (`mtrag query`) does not call this: it runs one search per collection, and a
full read would cost it more than the faults it saves."""
from __future__ import annotations

import errno
import os
from pathlib import Path

_BLOCK = 1 << 20


# The most file identities a caller's `known` set holds before it starts over (~100 bytes each).
MAX_KNOWN_FILES = 20_000


def read_through(roots: list[Path], stop=None, known: set | None = None) -> int:
    """Read every regular file under `roots` once, sequentially; returns the bytes read. Best
    effort: a file that goes away (a closed generation's folder) is skipped. `stop()`, when given
    and true, ends the pass early (the reader is closing). `known`: the identities (device, inode,
    size, mtime) of the files this process read through before, skipped and updated: a published
    version hard-links the files a change left alone, so a serving reader's next generation shares
    their inodes, and their pages, which need not be read again on every switch."""
    buffer = bytearray(_BLOCK)
    view = memoryview(buffer)
    total = 0
    if known is not None and len(known) > MAX_KNOWN_FILES:
        known.clear()
    for root in roots:
        for folder, _dirs, files in os.walk(root):
            for name in files:
                if stop is not None and stop():
                    return total
                try:
                    with open(os.path.join(folder, name), "rb", buffering=0) as fh:
                        st = os.fstat(fh.fileno())
                        size = st.st_size
                        if known is not None:
                            identity = (st.st_dev, st.st_ino, size, st.st_mtime_ns)
                            if identity in known:
                                continue
                            known.add(identity)
                        # Edge preallocates sparse files (WAL, mmaps): their holes are not read
                        extents = data_extents(fh.fileno(), size)
                        for pos, end in [(0, size)] if extents is None else extents:
                            fh.seek(pos)
                            while pos < end and (n := fh.readinto(view[:min(_BLOCK, end - pos)])):
                                pos += n
                                total += n
                except OSError:
                    continue
    return total


def data_extents(fd: int, size: int) -> list[tuple[int, int]] | None:
    """[(start, end)] of the file's data (what is not a hole: SEEK_DATA / SEEK_HOLE), or None where
    the file system or platform cannot tell (then everything counts as data)."""
    extents, pos = [], 0
    try:
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # nothing but a hole up to the end
                    break
                raise
            pos = os.lseek(fd, start, os.SEEK_HOLE)
            extents.append((start, pos))
    except (OSError, AttributeError):
        return None
    return extents
