"""A source's snapshot: its file inventory, read fresh or as the last build recorded it. Cheap
(stat + hash of changed files; for a git source the ref's commit first, then a tree diff and the
changed blobs), so change detection runs it before Dagster or a model loads."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from mtrag_resources.core.config import Settings
from mtrag_resources.core.layout import SourceLayout, spec_root
from mtrag_resources.ingest.inventory import FileEntry, Inventory, scan
from mtrag_resources.ingest.sources import SourceConfigError, SourceSpec

if TYPE_CHECKING:  # dulwich is imported where a git source is read (folder-only builds never load it)
    from mtrag_resources.ingest.git_source import GitRepository, ScanStats


def load_inventory(layout: SourceLayout) -> Inventory | None:
    try:
        return Inventory.from_json(layout.inventory.read_text())
    except FileNotFoundError:
        return None


def scan_source(settings: Settings, spec: SourceSpec, keep: Callable[[bytes, str], object] | None = None,
                stats: "ScanStats | None" = None) -> Inventory:
    """A fresh inventory, reusing the previous snapshot's hashes for files whose stat is unchanged.
    An sdist has no commit: the git HEAD found above its unpacked folder (MTRAG_HOME inside a
    repository) is the enclosing repository's, not the package's; its pin names it instead.
    A git source is the tree at its ref's commit (`scan_git`; `keep` gets each blob it reads,
    `stats` how it was taken); an unusable one raises SourceConfigError naming the entry."""
    layout = SourceLayout(settings, spec.id)
    if spec.git is not None or spec.error:
        from mtrag_resources.ingest.git_source import GitError, scan_git
        with open_git(settings, spec) as repo:
            try:
                inventory, taken = scan_git(spec.id, repo, spec.ref, spec.include, spec.exclude,
                                            spec.max_file_bytes, spec.repository or str(repo.path.resolve()),
                                            previous=load_inventory(layout), keep=keep)
            except GitError as exc:
                raise SourceConfigError(f"{_where(settings, spec)}: {exc}") from None
        if stats is not None:
            stats.__dict__.update(taken.__dict__)
        return inventory
    inventory = scan(spec.id, spec_root(settings, spec), spec.include, spec.exclude, spec.max_file_bytes,
                     previous=load_inventory(layout))
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


def source_problem(settings: Settings, spec: SourceSpec) -> str | None:
    """Why this source cannot be built now, or None: a git entry with both `path` and `git` or no
    `ref`, a `git:` that is no repository, a ref that names no commit. Reads no file (the ref only),
    so a build checks every source before it starts and builds the others."""
    if spec.git is None and not spec.error:
        return None
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
