"""A source's snapshot: its file inventory, read fresh or as the last build recorded it. Cheap
(stat + hash of changed files; for a git source the ref's commit first, then a tree diff and the
changed blobs), so change detection runs it before Dagster or a model loads."""
from __future__ import annotations

import hashlib
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import SourceLayout, spec_root
from mtrag_resources.ingest.inventory import TOO_LARGE, FileEntry, Inventory, git_commit, rescan, scan
from mtrag_resources.ingest.sources import SourceConfigError, SourceSpec, folder_problem

if TYPE_CHECKING:  # dulwich is imported where a git source is read (folder-only builds never load it)
    from mtrag_resources.ingest.git_source import GitRepository, ScanStats


def load_inventory(layout: SourceLayout) -> Inventory | None:
    try:
        return Inventory.from_json(layout.inventory.read_text())
    except FileNotFoundError:
        return None


def scan_source(settings: Settings, spec: SourceSpec, keep: Callable[[bytes, str], object] | None = None,
                stats: "ScanStats | None" = None, changed: set[str] | None = None) -> Inventory:
    """A fresh inventory, reusing the previous snapshot's hashes for files whose stat is unchanged.
    An sdist has no commit: the git HEAD found above its unpacked folder (MTRAG_HOME inside a
    repository) is the enclosing repository's, not the package's; its pin names it instead.
    A git source is the tree at its ref's commit (`scan_git`; `keep` gets each blob it reads,
    `stats` how it was taken); an unusable one raises SourceConfigError naming the entry.
    `changed`: a folder source's paths (relative to its root) that alone changed since the last
    snapshot, as a watcher saw them: only those are read again (inventory.rescan; `stats.mode`
    "rescan" then, else the folder is walked)."""
    layout = SourceLayout(settings, spec.id)
    if spec.git is not None or spec.error:
        from mtrag_resources.ingest.git_source import GitError, scan_git
        with open_git(settings, spec) as repo:
            try:
                inventory, taken = scan_git(spec.id, repo, spec.ref, spec.include, spec.exclude,
                                            spec.max_file_bytes, spec.repository or str(repo.path.resolve()),
                                            previous=load_inventory(layout), keep=keep, kind=spec.kind)
            except GitError as exc:
                raise SourceConfigError(f"{_where(settings, spec)}: {exc}") from None
        if stats is not None:
            stats.__dict__.update(taken.__dict__)
        return inventory
    if spec.kind == "issues":  # one export file (ingest/issues.py)
        return scan_export(settings, spec, load_inventory(layout))
    missing = folder_problem(spec, settings.sources_file) or (home_problem(settings, spec) if spec.path else None)
    if missing:  # a walk of no folder is an empty source, not a source whose files all went
        raise SourceConfigError(missing)
    previous = load_inventory(layout)
    inventory = None
    root = spec_root(settings, spec)
    # MTRAG_HOME inside the folder (the default home, data/, inside the repository indexed): its
    # files are mtrag's own output, changed by every build, and never walked
    home = home_in_folder(settings, root)
    pruned, exclude = ((home,), (*spec.exclude, home, f"{home}/**")) if home else ((), spec.exclude)
    if changed is not None and previous is not None:
        inventory = rescan(previous, root, spec.include, exclude, spec.max_file_bytes, changed, kind=spec.kind,
                           pruned=pruned)
    if inventory is None:
        inventory = scan(spec.id, root, spec.include, exclude, spec.max_file_bytes, previous=previous,
                         kind=spec.kind, pruned=pruned)
    elif stats is not None:  # how the folder was read: the named paths only
        stats.mode, stats.changed_paths = "rescan", len(changed)
    if spec.pip_sdist:
        inventory.commit = ""
    return inventory


def _where(settings: Settings, spec: SourceSpec) -> str:
    return f"{settings.sources_file}: source id={spec.id!r}: git {spec.git!r}"


@contextmanager
def open_git(settings: Settings, spec: SourceSpec) -> Iterator["GitRepository"]:
    """A git source's repository (resolved like a `path`, against the sources file's folder); an
    entry whose origin cannot work, or a path that is no repository, is a SourceConfigError
    naming the entry."""
    from mtrag_resources.ingest.git_source import GitError, GitRepository
    if spec.error:
        raise SourceConfigError(spec.error)
    try:
        repo = GitRepository(spec_root(settings, spec))
    except GitError as exc:
        raise SourceConfigError(f"{_where(settings, spec)}: {exc}") from None
    try:
        yield repo
    finally:
        repo.close()


def home_in_folder(settings: Settings, root: Path) -> str | None:
    """MTRAG_HOME's path relative to a folder source's `root` when the home lies inside it
    ("." when it is the root itself), else None."""
    try:
        return Path(settings.home).resolve().relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return None


def home_problem(settings: Settings, spec: SourceSpec) -> str | None:
    """A folder source that is MTRAG_HOME or lies in a folder mtrag writes there (its stages,
    stores, servers' data) holds mtrag's own output, which every build changes: refused, naming
    the entry. A user's folder kept in the home (the demo's `data/samples`) is a source like any
    other; a home inside the source's folder is not walked instead (scan_source)."""
    root = spec_root(settings, spec).resolve()
    home = Path(settings.home).resolve()
    if root == home:
        return (f"{settings.sources_file}: source id={spec.id!r}: path {spec.path!r}: is MTRAG_HOME ({home}): "
                "mtrag's own output, not a source")
    output = next((d for d in settings.output_dirs() if d.resolve() == root or d.resolve() in root.parents), None)
    if output is None:
        return None
    return (f"{settings.sources_file}: source id={spec.id!r}: path {spec.path!r}: lies in {output.resolve()}, "
            "a folder of MTRAG_HOME that mtrag writes: mtrag's own output, not a source")


def source_problem(settings: Settings, spec: SourceSpec) -> str | None:
    """Why this source cannot be built now, or None: a `path` folder that does not exist, a git
    entry with both `path` and `git` or no `ref`, a `git:` that is no repository, a ref that names
    no commit. Reads no file (the ref only), so a build checks every source before it starts and
    builds the others. An issues source's export file is read and parsed (`export_problem`):
    missing, unreadable, too large, not JSON, not the shape of a GitHub or Jira export."""
    if spec.kind == "issues" and spec.git is None and not spec.error:
        return export_problem(settings, spec)
    if spec.git is None and not spec.error:
        missing = folder_problem(spec, settings.sources_file)
        return missing or (home_problem(settings, spec) if spec.path is not None else None)
    from mtrag_resources.ingest.git_source import GitError
    try:
        with open_git(settings, spec) as repo:
            repo.resolve(spec.ref)
    except SourceConfigError as exc:
        return str(exc)
    except GitError as exc:
        return f"{_where(settings, spec)}: {exc}"
    return None


@contextmanager
def snapshot_files(settings: Settings, spec: SourceSpec, inventory: Inventory) -> Iterator[Callable[[FileEntry], bytes]]:
    """`read(entry)`: the bytes of one file of `inventory` as the snapshot has it (a git source's
    blob at the snapshot's commit; otherwise the file under the source's root)."""
    if inventory.ref:
        with open_git(settings, spec) as repo:
            yield lambda entry: repo.read(entry.blob)
        return
    root = Path(inventory.root)
    yield lambda entry: (root / entry.path).read_bytes()


# ------------------------------------------------------------------ issue-tracker exports

def _where_export(settings: Settings, spec: SourceSpec) -> str:
    return f"{settings.sources_file}: source id={spec.id!r}: path {spec.path!r}"


def _export_file_problem(path: Path, max_file_bytes: int) -> str | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return f"no such file ({path})"
    except OSError as exc:
        return f"unreadable ({path}): {exc.strerror or exc}"
    if stat.S_ISDIR(st.st_mode):
        return f"is a folder ({path}); an issues source's path names one export file"
    if not stat.S_ISREG(st.st_mode):
        return f"not a regular file ({path})"
    if st.st_size > max_file_bytes:
        return f"{TOO_LARGE} ({st.st_size} > {max_file_bytes}); raise this source's max_file_bytes"
    return None


def scan_export(settings: Settings, spec: SourceSpec, previous: Inventory | None = None) -> Inventory:
    """An issues source's snapshot: its one export file (category `issues`, path its file name,
    the inventory's root its folder), hashed unless its stat is the previous snapshot's. A file
    that cannot be read raises SourceConfigError naming the entry (its content is checked by
    `export_problem`, before a build, and parsed by cas_chunks)."""
    path = spec_root(settings, spec)
    why = _export_file_problem(path, spec.max_file_bytes)
    if why:
        raise SourceConfigError(f"{_where_export(settings, spec)}: {why}")
    st = path.stat()
    cached = next((f for f in previous.files if f.path == path.name), None) \
        if previous and previous.root == str(path.parent) else None
    if cached and cached.status == "ok" and cached.size == st.st_size and cached.mtime_ns == st.st_mtime_ns:
        digest = cached.sha256
    else:
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError as exc:
            raise SourceConfigError(f"{_where_export(settings, spec)}: unreadable ({path}): "
                                    f"{exc.strerror or exc}") from None
    entry = FileEntry(path.name, st.st_size, st.st_mtime_ns, digest, "issues", "json", "ok")
    return Inventory(source_id=spec.id, root=str(path.parent), commit=git_commit(path.parent), files=[entry])


def export_problem(settings: Settings, spec: SourceSpec) -> str | None:
    """Why an issues source's export file cannot be built now (one line naming the entry and the
    file), or None: missing, a folder, too large, unreadable, not UTF-8 JSON, not a GitHub or Jira
    export (ingest/issues.py)."""
    from mtrag_resources.ingest.issues import check_export
    try:
        path = spec_root(settings, spec)
    except SourceConfigError as exc:
        return str(exc)
    why = _export_file_problem(path, spec.max_file_bytes)
    if why is None:
        try:
            why = check_export(path.read_bytes())
        except OSError as exc:
            why = f"unreadable ({path}): {exc.strerror or exc}"
    return f"{_where_export(settings, spec)}: {why}" if why else None
