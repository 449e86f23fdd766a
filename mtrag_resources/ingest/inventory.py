"""`raw_source`: the file inventory of one source.

Hashing every file on every run is what makes "nothing changed" expensive, so a stat cache
(size + mtime_ns -> sha256) from the previous snapshot lets an unchanged file skip its read."""
from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from mtrag_resources.ingest import pdf
from mtrag_resources.ingest.filetypes import classify
from mtrag_resources.ingest.globs import matches_any

ALWAYS_EXCLUDED_DIRS = {".git", "__pycache__", ".venv", "venv", "node_modules", ".mypy_cache",
                        ".pytest_cache", ".tox", ".hg", ".svn"}
SNIFF_BYTES = 8192
TOO_LARGE = "larger than max_file_bytes"  # the skip reason's start; raw_source lists these
BINARY = "binary file (NUL byte in the first 8 KiB)"
NOT_TEXT = "binary file (under 70% of the first 8 KiB is text)"
BINARY_REASONS = (BINARY, NOT_TEXT)
# Perl's -B rule: more than this share of control characters and bytes that are not UTF-8 in the
# head is no text, NUL or not (a compressed or image file whose head happens to hold no NUL).
MAX_NOT_TEXT_SHARE = 0.3
_NOT_TEXT_RE = re.compile("[\x00-\x08\x0e-\x1a\x1c-\x1f\x7f-\x9f\ufffd]")
SYMLINKED_DIR = "symlinked directory not followed"
# A rescan of more changed paths than this walks the whole folder instead.
MAX_RESCAN_PATHS = 256


@dataclass
class FileEntry:
    path: str            # relative to the source root, forward slashes
    size: int
    mtime_ns: int
    sha256: str
    category: str        # code | doc | ""
    language: str        # python, markdown, ... or ""
    status: str          # ok | skipped
    reason: str = ""     # why skipped, or a warning for an ok file (e.g. invalid UTF-8 replaced)
    blob: str = ""       # git sources: the file's blob sha at the snapshot's commit (ingest/git_source.py)


@dataclass
class Inventory:
    source_id: str
    root: str
    commit: str
    files: list[FileEntry]
    # Git sources (`git:` + `ref:`): the ref as the spec names it, the repository label the chunks
    # carry, and the key of what else the snapshot depends on (globs, size limit; git_source.origin_key).
    ref: str = ""
    repository: str = ""
    origin: str = ""
    # A folder's scan: every symlink the walk met (taken or not), whose target may change with no
    # event on the link itself: a rescan reads them all again. None: not recorded (an inventory
    # written before them, or a git source's); a rescan then walks.
    links: list[str] | None = None

    @property
    def included(self) -> list[FileEntry]:
        return [f for f in self.files if f.status == "ok"]

    @property
    def skipped(self) -> list[FileEntry]:
        return [f for f in self.files if f.status == "skipped"]

    @property
    def digest(self) -> str:
        """Identity of the snapshot: paths, contents and skip reasons; not mtimes."""
        h = hashlib.sha256()
        if self.ref:  # a git snapshot is the tree of one commit: a moved ref is a new snapshot
            h.update(f"git\0{self.commit}\0{self.ref}\0{self.repository}\n".encode())
        for f in sorted(self.files, key=lambda f: f.path):
            h.update(f"{f.path}\0{f.sha256}\0{f.status}\0{f.reason}\n".encode())
        return h.hexdigest()

    def to_json(self) -> str:
        git = {"ref": self.ref, "repository": self.repository, "origin": self.origin} if self.ref else {}
        links = {"links": self.links} if self.links is not None else {}
        return json.dumps({"source_id": self.source_id, "root": self.root, "commit": self.commit, **git, **links,
                           # vars(): the entries are flat, and asdict's deep copy of each was
                           # most of the 12 ms this took for django's 1,540 files
                           "digest": self.digest, "files": [dict(vars(f)) for f in self.files]}, indent=0)

    @classmethod
    def from_json(cls, text: str) -> "Inventory":
        doc = json.loads(text)
        return cls(doc["source_id"], doc["root"], doc["commit"], [FileEntry(**f) for f in doc["files"]],
                   doc.get("ref", ""), doc.get("repository", ""), doc.get("origin", ""), doc.get("links"))


def git_commit(root: Path) -> str:
    try:
        proc = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip() if proc.returncode == 0 else ""


def _walk(root: Path, include, start: str = "",
          pruned: tuple[str, ...] = ()) -> "Iterator[tuple[str, str, str | None, os.DirEntry]]":
    """Yield (rel_path, abs_path, skip_reason|None, its directory entry), directories and files in
    name order. Symlinked directories are not followed, which also makes symlink loops harmless.
    Directories no include glob can reach are not entered: a source rooted at a repository must not
    pay for walking its data folders. os.scandir's entries tell a directory and a symlink from
    the directory listing, so a plain file costs no syscall here (django's 2,455 folders and 8.5k
    files: pathlib and os.walk's per-entry lstat were most of a 0.12 s scan). `start`: a folder
    under the root (relative) whose entries alone are walked, as the whole walk gives them;
    `pruned`: folders (relative) never entered (MTRAG_HOME inside the source: snapshot.scan_source)."""
    prefixes = [_literal_prefix(p) for p in include]
    stack = [(start, os.path.join(str(root), start) if start else str(root))]
    while stack:
        rel_dir, dirpath = stack.pop()
        try:
            with os.scandir(dirpath) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError:
            continue  # unreadable or gone since its parent was listed, as os.walk skips it
        subdirs = []
        files = []
        for entry in entries:
            try:
                is_dir = entry.is_dir()  # a symlink to a directory too, as os.walk lists it
            except OSError:
                is_dir = False
            (subdirs if is_dir else files).append(entry)
        descend = []
        for entry in subdirs:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if entry.name in ALWAYS_EXCLUDED_DIRS or rel in pruned or not _reachable(rel, prefixes):
                continue
            if entry.is_symlink():
                yield rel, entry.path, SYMLINKED_DIR, entry
            else:
                descend.append((rel, entry.path))
        for entry in files:
            yield (f"{rel_dir}/{entry.name}" if rel_dir else entry.name), entry.path, None, entry
        stack.extend(reversed(descend))  # depth first, in name order: the order os.walk gave


def _literal_prefix(pattern: str) -> tuple[str, ...]:
    """The leading path segments of a glob that contain no wildcard."""
    parts = []
    for seg in pattern.split("/")[:-1]:
        if any(c in seg for c in "*?["):
            break
        parts.append(seg)
    return tuple(parts)


def _reachable(rel_dir: str, prefixes: list[tuple[str, ...]]) -> bool:
    parts = tuple(rel_dir.split("/"))
    return any(parts[: len(p)] == p[: len(parts)] for p in prefixes)


def scan(source_id: str, root: Path, include, exclude, max_file_bytes: int,
         previous: Inventory | None = None, kind: str = "code", pruned: tuple[str, ...] = ()) -> Inventory:
    """The inventory of a folder. `kind` is the source's: a docs source takes PDFs (binary files
    whose text pypdf extracts; `binary_rule`), any other skips them as binary."""
    root = Path(root).resolve()
    cache = {f.path: f for f in previous.files} if previous else {}
    files: list[FileEntry] = []
    links: list[str] = []
    for rel, full, walk_reason, dirent in _walk(root, include, pruned=pruned):
        if dirent.is_symlink():
            links.append(rel)
        if not _taken(rel, walk_reason, include, exclude):
            continue
        files.append(_entry(root, rel, Path(full), walk_reason, max_file_bytes, cache.get(rel), kind, dirent))
    return Inventory(source_id=source_id, root=str(root), commit=git_commit(root), files=files, links=sorted(links))


def _taken(rel: str, walk_reason: str | None, include, exclude) -> bool:
    """Does the inventory list this walked entry? A symlinked directory is reported whatever the
    include globs say (it may hide files the maintainer expected to be indexed); no excluded one."""
    return (bool(walk_reason) or matches_any(rel, include)) and not matches_any(rel, exclude)


def rescan(previous: Inventory, root: Path, include, exclude, max_file_bytes: int, changed: set[str],
           kind: str = "code", pruned: tuple[str, ...] = ()) -> Inventory | None:
    """The inventory `scan` gives now, from `previous` (the scan before, of the same root) and the
    paths (relative to the root) that changed since: each changed path is read again as the whole
    walk reads it (a folder: walked), every other entry is kept as it was. The caller vouches that
    nothing else changed (`mtrag watch`: the watcher's events; its rescan every few seconds
    catches what an event missed). None where a full scan is the answer (too many paths, a path
    outside the root, another root)."""
    root = Path(root).resolve()
    if previous.root != str(root) or previous.links is None or \
            len(changed) + len(previous.links) > MAX_RESCAN_PATHS:
        return None
    if any(part in ("", ".", "..") for rel in changed for part in rel.split("/")):
        return None  # the root itself, or not a plain relative path: walk
    cache = {f.path: f for f in previous.files}
    files = dict(cache)
    prefixes = [_literal_prefix(p) for p in include]
    links = {link for link in previous.links if not any(link == rel or link.startswith(rel + "/") for rel in changed)}
    # every symlink is read again: its target may have appeared, gone or changed with no event on it
    for rel in sorted(changed | links):
        if rel in changed:
            under = rel + "/"
            for path in [p for p in files if p == rel or p.startswith(under)]:
                del files[path]
        else:
            files.pop(rel, None)
            links.discard(rel)
        if not _walked_into(root, rel, prefixes):
            continue  # a folder the walk does not enter holds it, or it is gone with its folder
        full = os.path.join(str(root), rel)
        name = rel.rsplit("/", 1)[-1]
        is_dir, is_link = os.path.isdir(full), os.path.islink(full)
        if is_dir and (name in ALWAYS_EXCLUDED_DIRS or not _reachable(rel, prefixes)):
            continue
        if is_dir and not is_link:
            walked = list(_walk(root, include, start=rel, pruned=pruned))
            links.update(sub for sub, _path, _reason, dirent in walked if dirent.is_symlink())
            found = [(sub, Path(path), reason) for sub, path, reason, _ in walked]
        elif is_dir or os.path.lexists(full):
            if is_link:
                links.add(rel)
            found = [(rel, Path(full), SYMLINKED_DIR if is_dir else None)]
        else:
            continue  # removed
        for sub, path, reason in found:
            if not _taken(sub, reason, include, exclude):
                continue
            files[sub] = _entry(root, sub, path, reason, max_file_bytes, cache.get(sub), kind)
    ordered = sorted(files.values(), key=_walk_key)
    return Inventory(source_id=previous.source_id, root=str(root), commit=git_commit(root), files=ordered,
                     links=sorted(links))


def _walked_into(root: Path, rel: str, prefixes: list[tuple[str, ...]]) -> bool:
    """Does the whole walk enter every folder above `rel`? (Each one a folder, not a symlink, not
    always excluded, reachable by an include glob.)"""
    parts = rel.split("/")[:-1]
    for depth in range(len(parts)):
        folder = "/".join(parts[: depth + 1])
        if parts[depth] in ALWAYS_EXCLUDED_DIRS or not _reachable(folder, prefixes):
            return False
        try:
            st = os.lstat(os.path.join(str(root), folder))
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode):
            return False
    return True


def _walk_key(entry: "FileEntry") -> tuple:
    """An entry's place in _walk's order: in each folder its symlinked folders, then its files, by
    name, then its folders' entries, folder by folder in name order."""
    parts = entry.path.split("/")
    last = (0 if entry.reason == SYMLINKED_DIR else 1, parts[-1])
    return (*((2, p) for p in parts[:-1]), last)


def binary_rule(language: str, kind: str, head: bytes, read: Callable[[], bytes]) -> tuple[str, str] | None:
    """The binary rule of folder and git sources alike: ("skipped", reason) for a file mtrag does
    not read as text, ("ok", "") for a PDF of a docs source that has text, None for any other file
    (then read as text). A NUL byte in the first 8 KiB (`head`) is a binary file, skipped, except
    that a PDF is binary by nature: a docs source reads its text layer (`read()` gives its bytes;
    a scanned, encrypted or unreadable one is skipped with ingest.pdf's reason), any other source
    skips it unread. A head with no NUL that is mostly not text (`not_text`) is binary too."""
    if language == pdf.PDF_LANGUAGE:
        if kind != "docs":
            return "skipped", pdf.NOT_IN_DOCS
        reason = pdf.skip_reason(read())
        return ("skipped", reason) if reason else ("ok", "")
    if b"\0" in head[:SNIFF_BYTES]:
        return "skipped", BINARY
    if not_text(head[:SNIFF_BYTES]):
        return "skipped", NOT_TEXT
    return None


def not_text(head: bytes) -> bool:
    """Whether more than MAX_NOT_TEXT_SHARE of `head`'s characters (read as UTF-8) are control
    characters other than whitespace and ESC, or bytes that are not UTF-8."""
    if not head or head.isascii() and not _NOT_TEXT_RE.search(head.decode("ascii")):
        return False
    text = head.decode("utf-8", errors="replace")
    if len(head) == SNIFF_BYTES:  # a character cut at the sniff's end is no sign of binary
        text = text[:-3]
    return len(_NOT_TEXT_RE.findall(text)) > MAX_NOT_TEXT_SHARE * max(len(text), 1)


def _entry(root: Path, rel: str, full: Path, walk_reason, max_file_bytes: int, cached,
           source_kind: str = "code", dirent: os.DirEntry | None = None) -> FileEntry:
    kind = classify(rel)
    category, language = kind if kind else ("", "")

    def skipped(reason: str, size: int = 0, mtime_ns: int = 0) -> FileEntry:
        return FileEntry(rel, size, mtime_ns, "", category, language, "skipped", reason)

    if walk_reason:
        return skipped(walk_reason)
    symlink = dirent.is_symlink() if dirent is not None else full.is_symlink()
    if symlink:
        try:
            target = full.resolve(strict=True)
        except (OSError, RuntimeError):
            return skipped("broken or looping symlink")
        if not target.is_relative_to(root):
            return skipped(f"symlink leaves the source root (-> {target})")
    try:
        # not a symlink: the entry's lstat is the file's stat (one syscall, cached by the entry)
        st = dirent.stat(follow_symlinks=False) if dirent is not None and not symlink else full.stat()
    except OSError as exc:
        return skipped(f"unreadable: {exc.strerror}")
    if not stat.S_ISREG(st.st_mode):
        # Opening a FIFO blocks until a writer comes; a device may never end.
        return skipped("not a regular file (named pipe, socket or device)")
    if not kind:
        return skipped("unsupported file type", st.st_size, st.st_mtime_ns)
    if st.st_size > max_file_bytes:
        return skipped(f"{TOO_LARGE} ({st.st_size} > {max_file_bytes})", st.st_size, st.st_mtime_ns)
    if language == pdf.PDF_LANGUAGE and source_kind != "docs":
        return skipped(pdf.NOT_IN_DOCS, st.st_size, st.st_mtime_ns)  # unread: no text taken from it
    if cached and cached.size == st.st_size and cached.mtime_ns == st.st_mtime_ns and cached.sha256:
        return FileEntry(rel, st.st_size, st.st_mtime_ns, cached.sha256, category, language,
                         cached.status, cached.reason)
    with open(full, "rb") as fh:
        head = fh.read(SNIFF_BYTES)
    data: bytes | None = None

    def read() -> bytes:
        nonlocal data
        data = full.read_bytes() if data is None else data
        return data

    verdict = binary_rule(language, source_kind, head, read)
    if verdict is not None and verdict[1] in BINARY_REASONS:
        return skipped(verdict[1], st.st_size, st.st_mtime_ns)
    if verdict is not None:  # a PDF of a docs source: its bytes' hash keeps the verdict while unchanged
        status, reason = verdict
        return FileEntry(rel, st.st_size, st.st_mtime_ns, hashlib.sha256(read()).hexdigest(), category,
                         language, status, reason)
    data = read()
    reason = ""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        reason = f"invalid UTF-8 at byte {exc.start}; decoded with replacement characters"
    return FileEntry(rel, st.st_size, st.st_mtime_ns, hashlib.sha256(data).hexdigest(), category,
                     language, "ok", reason)


def read_text(root: Path, entry: FileEntry) -> str:
    return (Path(root) / entry.path).read_bytes().decode("utf-8", errors="replace")
