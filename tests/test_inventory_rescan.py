"""inventory.rescan (the watch's raw stage: only the paths its events named are read again) gives
the inventory a whole scan gives, for any files, folders and symlinks changed, added or removed."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtrag_resources.ingest.inventory import rescan, scan

pytestmark = pytest.mark.unit

INCLUDE = ["src/**/*.py", "docs/**/*.md", "*.md"]
EXCLUDE = ["src/gen/**"]
_DIRS = ["src", "src/a", "src/a/b", "src/gen", "src/__pycache__", "docs", "docs/x", "data", ""]
_NAMES = ["m.py", "n.py", "z.py", "README.md", "page.md", "big.py", "blob.bin", "a"]

_OP = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(_DIRS), st.sampled_from(_NAMES), st.integers(0, 3)),
    st.tuples(st.just("rmfile"), st.sampled_from(_DIRS), st.sampled_from(_NAMES), st.just(0)),
    st.tuples(st.just("rmdir"), st.sampled_from(_DIRS[:-1]), st.just(""), st.just(0)),
    st.tuples(st.just("link"), st.sampled_from(_DIRS), st.sampled_from(["ln", "lnf"]), st.just(0)),
)


def apply(root: Path, op: tuple) -> set[str]:
    """Do `op` under root; the paths (relative) a watcher reports for it."""
    kind, folder, name, v = op
    rel = f"{folder}/{name}" if folder and name else folder or name
    path = root / rel
    folders = [p for p in path.parents if root in p.parents]
    if any(p.is_symlink() or (p.exists() and not p.is_dir()) for p in folders):
        return set()  # a file or a link where this op needs a folder
    if kind == "write":
        if path.is_dir() and not path.is_symlink():
            return set()
        made = [p for p in folders if not p.exists()]
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            path.unlink()
        body = b"\0binary" if name.endswith(".bin") else (b"x" * 5000 if name == "big.py" else f"v{v}\n".encode())
        path.write_bytes(body)
        return {rel, *(p.relative_to(root).as_posix() for p in made)}
    if kind == "rmfile":
        if path.is_symlink() or path.is_file():
            path.unlink()
            return {rel}
        return set()
    if kind == "rmdir":
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
            return {rel}
        return set()
    if path.exists() or path.is_symlink() or not path.parent.is_dir():
        return set()
    os.symlink(root / "src" if name == "ln" else root / "README.md", path)  # a folder or a file
    return {rel}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(before=st.lists(_OP, max_size=12), steps=st.lists(st.lists(_OP, min_size=1, max_size=4), min_size=1, max_size=4))
def test_a_rescan_of_the_changed_paths_is_the_whole_scan(tmp_path_factory, before, steps):
    root = tmp_path_factory.mktemp("src")
    for op in before:
        apply(root, op)
    previous = scan("s", root, INCLUDE, EXCLUDE, 4096)
    for step in steps:
        changed: set[str] = set()
        for op in step:
            changed |= apply(root, op)
        whole = scan("s", root, INCLUDE, EXCLUDE, 4096, previous=previous)
        partial = rescan(previous, root, INCLUDE, EXCLUDE, 4096, changed)
        assert partial is not None
        assert partial.files == whole.files
        assert partial.digest == whole.digest and partial.links == whole.links
        previous = whole


def test_an_inventory_without_its_links_asks_for_the_whole_scan(tmp_path):
    """An inventory written before the links were recorded (or a git source's) cannot tell which
    entries a target's change moves: the rescan walks."""
    (tmp_path / "src").mkdir()
    previous = scan("s", tmp_path, INCLUDE, EXCLUDE, 4096)
    previous.links = None
    assert rescan(previous, tmp_path, INCLUDE, EXCLUDE, 4096, {"src/m.py"}) is None


def test_a_path_outside_the_root_or_another_root_asks_for_the_whole_scan(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("x = 1\n")
    previous = scan("s", tmp_path, INCLUDE, EXCLUDE, 4096)
    for odd in ("../etc/passwd", ".", "src/./m.py", "/src/m.py", "src//m.py"):
        assert rescan(previous, tmp_path, INCLUDE, EXCLUDE, 4096, {odd}) is None
    assert rescan(previous, tmp_path / "src", INCLUDE, EXCLUDE, 4096, {"m.py"}) is None
    assert rescan(previous, tmp_path, INCLUDE, EXCLUDE, 4096, set()).files == previous.files
