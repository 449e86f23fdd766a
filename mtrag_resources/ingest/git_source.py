"""Git sources: a local repository read at one commit through dulwich, from git objects only.

A git source's snapshot is the tree of the commit its `ref` (a branch, tag or commit sha) names
now, never the work tree: uncommitted edits, untracked and ignored files are not in it, and
nothing reaches the network. Reading follows the change: the ref's commit is compared with the
last snapshot's first (equal: not one object more is read), then the two trees are diffed
(identical subtrees are skipped unread) and only the blobs of added or modified paths are read;
a path whose blob the last snapshot already hashed (a renamed or copied file) is not read either.

`GitRepository` raises `GitError` with what is wrong (not a repository, no such ref); the
snapshot (`ingest/snapshot.py`) names the source entry in front of it."""
from __future__ import annotations

import hashlib
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from dulwich.diff_tree import CHANGE_ADD, CHANGE_COPY, CHANGE_DELETE, CHANGE_MODIFY, CHANGE_RENAME, \
    RenameDetector, tree_changes
from dulwich.errors import NotGitRepository
from dulwich.objects import Commit, Tag, Tree
from dulwich.repo import Repo

from mtrag_resources.core.versions import CODE_VERSIONS
from mtrag_resources.ingest import filetypes
from mtrag_resources.ingest.filetypes import classify
from mtrag_resources.ingest.globs import matches_any
from mtrag_resources.ingest.inventory import ALWAYS_EXCLUDED_DIRS, BINARY, BINARY_REASONS, SNIFF_BYTES, \
    TOO_LARGE, FileEntry, Inventory, _literal_prefix, _reachable, binary_rule
from mtrag_resources.ingest.pdf import NOT_IN_DOCS, PDF_LANGUAGE

HEX_RE = re.compile(r"^[0-9a-fA-F]{4,64}$")
BAD_REF_RE = re.compile(r"\.\.|//|@\{|[\x00-\x20\x7f~^:?*\[\\]")  # git check-ref-format's forbidden parts
SUBMODULE = "git submodule (gitlink) not followed"
SYMLINK = "symlink not followed (a git source indexes committed files)"
BAD_PATH = "path is not UTF-8"
# A tree written by hand (git itself never makes one) can name `..`, `.` or an empty part, or hold
# a `/` in a name: such a path is not under the source's root, and no hit may report it.
UNSAFE_PATH = "path leaves the source root (an absolute path, or an empty, '.' or '..' part); not indexed"
S_IFGITLINK = 0o160000


class GitError(Exception):
    """A repository or ref that cannot be read (the message says which and why)."""


@dataclass(frozen=True)
class TreeFile:
    """One non-tree entry of a commit's tree: its path (forward slashes), git mode and blob sha."""
    path: str
    mode: int
    blob: str


@dataclass(frozen=True)
class Change:
    """One path-level change between two commits' trees. `kind`: add | modify | delete | rename
    (the same blob at a new path, the old path gone) | copy (the same blob at a new path as well)."""
    kind: str
    old_path: str | None
    new_path: str | None
    old_blob: str | None = None
    new_blob: str | None = None
    new_mode: int | None = None


def _path(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


class GitRepository:
    """A local repository (a work tree's root, its `.git` folder, or a bare repository) read through
    its object store. Use as a context manager, or call `close()`."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        if not self.path.is_dir():
            raise GitError(f"{self.path} does not exist or is not a directory")
        try:
            self._repo = Repo(str(self.path))
        except NotGitRepository:
            raise GitError(f"{self.path} is not a git repository (no .git folder, nor a bare repository's "
                           "objects/ and refs/)") from None
        except (OSError, ValueError, KeyError) as exc:
            raise GitError(f"{self.path} is not a readable git repository: {exc}") from None
        self._store = self._repo.object_store

    @property
    def control_dir(self) -> Path:
        """The folder holding refs, HEAD and objects (`.git`, or a bare repository itself): where
        a new commit on a ref shows (`mtrag watch` watches it)."""
        return Path(self._repo.controldir())

    def close(self) -> None:
        self._repo.close()

    def __enter__(self) -> "GitRepository":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ refs and commits

    def resolve(self, ref: str) -> str:
        """The commit sha (hex) `ref` names, in git's order: a full sha; then the ref as written,
        `refs/<ref>`, `refs/tags/<ref>`, `refs/heads/<ref>`, `refs/remotes/<ref>`,
        `refs/remotes/<ref>/HEAD`; then an abbreviated sha (at least 4 hex digits) naming exactly
        one commit. Annotated tags are peeled to their commit."""
        if not isinstance(ref, str) or not ref.strip():
            raise GitError(f"ref {ref!r} is empty")
        if BAD_REF_RE.search(ref) or ref.startswith(("/", "-")) or ref.endswith(("/", ".", ".lock")):
            raise GitError(f"ref {ref!r} is not a valid ref name (a branch, tag or commit sha; "
                           "revision expressions like HEAD~1 or a..b are not refs)")
        if HEX_RE.match(ref) and len(ref) in (40, 64):
            sha = ref.lower().encode()
            if sha in self._store:
                return self._peel(sha, ref)
        for name in (ref, f"refs/{ref}", f"refs/tags/{ref}", f"refs/heads/{ref}", f"refs/remotes/{ref}",
                     f"refs/remotes/{ref}/HEAD"):
            try:
                sha = self._repo.refs[name.encode()]
            except (KeyError, ValueError):
                continue
            return self._peel(sha, ref)
        if HEX_RE.match(ref):
            found = {self._peel_or_none(s) for s in self._store.iter_prefix(ref.lower().encode())}
            found.discard(None)
            if len(found) == 1:
                return found.pop()
            if len(found) > 1:
                raise GitError(f"ref {ref!r} is an ambiguous short sha ({len(found)} commits start with it)")
        raise GitError(f"ref {ref!r} not found in {self.path} (no branch, tag or commit of that name)")

    def _peel(self, sha: bytes, ref: str) -> str:
        obj = self._store[sha]
        while isinstance(obj, Tag):
            obj = self._store[obj.object[1]]
        if not isinstance(obj, Commit):
            raise GitError(f"ref {ref!r} names a {obj.type_name.decode()}, not a commit")
        return obj.id.decode()

    def _peel_or_none(self, sha: bytes) -> str | None:
        try:
            return self._peel(sha, "")
        except (GitError, KeyError):
            return None

    def has_commit(self, sha: str) -> bool:
        try:
            return isinstance(self._store[sha.encode()], Commit)
        except (KeyError, ValueError):
            return False

    def _tree_id(self, commit: str) -> bytes:
        return self._store[commit.encode()].tree

    # ------------------------------------------------------------------ trees and blobs

    def files(self, commit: str, include=("**/*",), exclude=()) -> Iterator[TreeFile]:
        """The commit's files (regular files, symlinks, submodules; not trees) that the globs
        select, in path order. Subtrees no include glob can reach, and the folders every source
        leaves out (`.venv`, `node_modules`, ...), are not read."""
        prefixes = [_literal_prefix(p) for p in include]
        yield from self._walk(self._tree_id(commit), "", prefixes, include, exclude)

    def _walk(self, tree_id: bytes, prefix: str, prefixes, include, exclude) -> Iterator[TreeFile]:
        tree = self._store[tree_id]
        assert isinstance(tree, Tree)
        for entry in tree.iteritems(name_order=True):
            name = _path(entry.path)
            rel = f"{prefix}{name}"
            if stat.S_ISDIR(entry.mode):
                if name in ALWAYS_EXCLUDED_DIRS or not _reachable(rel, prefixes):
                    continue
                yield from self._walk(entry.sha, rel + "/", prefixes, include, exclude)
            elif selected(rel, include, exclude):
                yield TreeFile(rel, entry.mode, entry.sha.decode())

    def diff(self, old_commit: str, new_commit: str) -> list[Change]:
        """The path-level changes from `old_commit`'s tree to `new_commit`'s. Identical subtrees are
        skipped without reading them; a blob that moved unchanged is one `rename` (or `copy`), found
        by its sha alone (no blob is read to score similar contents)."""
        detector = RenameDetector(self._store, max_files=0)  # 0: exact renames only, no blob reads
        out = []
        for ch in tree_changes(self._store, self._tree_id(old_commit), self._tree_id(new_commit),
                               rename_detector=detector):
            old = _path(ch.old.path) if ch.old is not None and ch.old.path is not None else None
            new = _path(ch.new.path) if ch.new is not None and ch.new.path is not None else None
            kind = {CHANGE_ADD: "add", CHANGE_MODIFY: "modify", CHANGE_DELETE: "delete", CHANGE_RENAME: "rename",
                    CHANGE_COPY: "copy"}.get(ch.type)
            if kind is None:  # unchanged
                continue
            out.append(Change(kind, old, new, ch.old.sha.decode() if ch.old is not None else None,
                              ch.new.sha.decode() if ch.new is not None else None,
                              ch.new.mode if ch.new is not None else None))
        return out

    def read(self, blob: str) -> bytes:
        """A blob's bytes (git verifies nothing here; the CAS hashes what it stores)."""
        _type, data = self._store.get_raw(blob.encode())
        return data


def is_plain_relative(path: str) -> bool:
    """Whether `path` names a file under the root: relative, with no empty, `.` or `..` part."""
    return all(part not in ("", ".", "..") for part in path.split("/"))


def selected(rel: str, include, exclude) -> bool:
    """Whether a path is in the source: under no always-excluded folder, some include glob
    matches it and no exclude glob does (the same rule as a folder source's)."""
    if any(part in ALWAYS_EXCLUDED_DIRS for part in rel.split("/")[:-1]):
        return False
    return matches_any(rel, include) and not matches_any(rel, exclude)


# ---------------------------------------------------------------------- the snapshot


@dataclass
class ScanStats:
    """How a git snapshot was taken: `mode` (unchanged | diff | full), blobs read, changed paths."""
    mode: str = "full"
    blobs_read: int = 0
    changed_paths: int = 0
    changes: dict = field(default_factory=dict)


def origin_key(repo_path: Path, ref: str, include, exclude, max_file_bytes: int, repository: str,
               kind: str = "code") -> str:
    """What, beside the commit, a git snapshot depends on (the file types mtrag reads too, and the
    source's kind, which decides whether a PDF is read: a diff keeps the entries of unchanged paths
    as they were classified): a snapshot taken with another key is listed afresh (its blobs'
    hashes are still reused)."""
    types = sorted({**filetypes.CODE_LANGUAGES, **{k: f"doc:{v}" for k, v in filetypes.DOC_FORMATS.items()}}.items())
    doc = f"{CODE_VERSIONS['raw_source']}\0{Path(repo_path).resolve()}\0{ref}\0{list(include)}\0{list(exclude)}" \
          f"\0{max_file_bytes}\0{repository}\0{types}\0{kind}"
    return hashlib.sha256(doc.encode()).hexdigest()[:24]


def scan_git(source_id: str, repo: GitRepository, ref: str, include, exclude, max_file_bytes: int,
             repository: str, previous: Inventory | None = None,
             keep: Callable[[bytes, str], object] | None = None, kind: str = "code") -> tuple[Inventory, ScanStats]:
    """The snapshot of `ref`'s commit: an inventory whose entries carry their blob sha. With the
    previous snapshot of the same origin: the same commit returns it as it is; a moved ref diffs
    the two trees and reads only the changed paths' blobs. `keep(bytes, sha256)` is called with each blob
    read for an included file (raw_source puts them into the CAS). `kind` is the source's (a docs
    source reads PDFs: inventory.binary_rule)."""
    commit = repo.resolve(ref)
    key = origin_key(repo.path, ref, include, exclude, max_file_bytes, repository, kind)
    stats = ScanStats()
    same_origin = previous is not None and previous.origin == key and bool(previous.commit)
    if same_origin and previous.commit == commit:
        stats.mode = "unchanged"
        return previous, stats
    known = {f.blob: f for f in previous.files if f.blob} if previous is not None else {}

    def entry(path: str, mode: int, blob: str) -> FileEntry:
        return _entry(repo, path, mode, blob, max_file_bytes, known, stats, keep, kind)

    if same_origin and repo.has_commit(previous.commit):
        stats.mode = "diff"
        files = {f.path: f for f in previous.files}
        changes = repo.diff(previous.commit, commit)
        for ch in changes:
            if ch.kind in ("delete", "rename") and ch.old_path is not None:
                files.pop(ch.old_path, None)
            if ch.new_path is None:
                continue
            if selected(ch.new_path, include, exclude):
                files[ch.new_path] = entry(ch.new_path, ch.new_mode, ch.new_blob)
                stats.changed_paths += 1
            else:
                files.pop(ch.new_path, None)
        for ch in changes:
            stats.changes[ch.kind] = stats.changes.get(ch.kind, 0) + 1
        entries = [files[p] for p in sorted(files)]
    else:
        entries = [entry(f.path, f.mode, f.blob) for f in repo.files(commit, include, exclude)]
        stats.changed_paths = len(entries)
    inventory = Inventory(source_id=source_id, root=str(repo.path.resolve()), commit=commit, files=entries,
                          ref=ref, repository=repository, origin=key)
    return inventory, stats


def _entry(repo: GitRepository, path: str, mode: int, blob: str, max_file_bytes: int, known: dict,
           stats: ScanStats, keep, source_kind: str = "code") -> FileEntry:
    kind = classify(path)
    category, language = kind if kind else ("", "")

    def skipped(reason: str, size: int = 0) -> FileEntry:
        return FileEntry(path, size, 0, "", category, language, "skipped", reason, blob=blob)

    if not is_plain_relative(path):
        return skipped(UNSAFE_PATH)
    if "\ufffd" in path:  # a name that is not UTF-8 (decoded with replacement characters)
        return skipped(BAD_PATH)
    if stat.S_IFMT(mode) == S_IFGITLINK:
        return skipped(SUBMODULE)
    if stat.S_ISLNK(mode):
        return skipped(SYMLINK)
    if not kind:
        return skipped("unsupported file type")
    is_pdf = language == PDF_LANGUAGE
    if is_pdf and source_kind != "docs":
        return skipped(NOT_IN_DOCS)  # unread, like a folder source's
    prev = known.get(blob)
    # The same blob seen before (a rename, a copy, an unchanged path): its verdict holds, the text
    # rule's and the PDF rule's alike (a PDF's verdict only for a PDF path).
    if prev is not None and (prev.sha256 or prev.reason in BINARY_REASONS) and (prev.language == PDF_LANGUAGE) == is_pdf:
        size, sha, status, reason = prev.size, prev.sha256, prev.status, prev.reason
        data = None
    else:
        data = repo.read(blob)
        stats.blobs_read += 1
        size = len(data)
        if size > max_file_bytes:
            return skipped(f"{TOO_LARGE} ({size} > {max_file_bytes})", size)
        status, reason = binary_rule(language, source_kind, data[:SNIFF_BYTES], lambda: data) or ("ok", "")
        sha = "" if reason in BINARY_REASONS else hashlib.sha256(data).hexdigest()
        if status == "ok" and not is_pdf:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as exc:
                reason = f"invalid UTF-8 at byte {exc.start}; decoded with replacement characters"
    if size > max_file_bytes:
        return skipped(f"{TOO_LARGE} ({size} > {max_file_bytes})", size)
    if reason in BINARY_REASONS:
        return skipped(reason, size)
    if status == "skipped":  # a PDF without text: its hash keeps the verdict for this blob
        return FileEntry(path, size, 0, sha, category, language, "skipped", reason, blob=blob)
    if data is not None and keep is not None:
        keep(data, sha)
    return FileEntry(path, size, 0, sha, category, language, "ok", reason, blob=blob)
