"""resolved_name gives what Path.resolve gives, also after the directories' links change."""
from __future__ import annotations

from pathlib import Path

import pytest

from mtrag_resources.core.real_paths import resolved, resolved_name

pytestmark = pytest.mark.unit


def _tree(root: Path) -> list[Path]:
    """Directories, a directory link, a file link, a dangling link; the names to resolve in it."""
    (root / "a" / "b").mkdir(parents=True)
    (root / "c").mkdir()
    (root / "a" / "b" / "t.parquet").write_text("x")
    (root / "c" / "u.parquet").write_text("y")
    (root / "link_b").symlink_to(root / "a" / "b")
    (root / "a" / "b" / "file_link").symlink_to(root / "c" / "u.parquet")
    (root / "dangling").symlink_to(root / "nowhere")
    return [root / "a" / "b" / "t.parquet", root / "link_b" / "t.parquet", root / "link_b" / "file_link",
            root / "link_b" / "missing.parquet", root / "missing_dir" / "t.parquet", root / "dangling",
            root / "a" / "b" / ".." / "b" / "t.parquet", root / "link_b" / ".." / "c" / "u.parquet",
            root / "a" / "." / "b" / "t.parquet", root / "a" / "b", root / "link_b"]


def test_names_resolve_as_pathlib_does(tmp_path):
    for name in _tree(tmp_path):
        for _ in range(2):  # the first call fills the directory entry, the second reads it
            assert resolved_name(name) == str(name.resolve()), name
            assert resolved(str(name)) == name.resolve()


def test_a_relative_name_resolves_from_the_working_directory(tmp_path, monkeypatch):
    _tree(tmp_path)
    monkeypatch.chdir(tmp_path / "link_b")
    assert resolved_name("t.parquet") == str((tmp_path / "a" / "b" / "t.parquet").resolve())
    monkeypatch.chdir(tmp_path / "c")
    assert resolved_name("t.parquet") == str(tmp_path.resolve() / "c" / "t.parquet")


def test_a_link_pointed_elsewhere_is_not_read_from_the_last_resolution(tmp_path):
    _tree(tmp_path)
    name = tmp_path / "link_b" / "u.parquet"
    assert resolved_name(name) == str(tmp_path.resolve() / "a" / "b" / "u.parquet")
    # the link now names another directory: the same spelling resolves there
    (tmp_path / "link_b").unlink()
    (tmp_path / "link_b").symlink_to(tmp_path / "c")
    assert resolved_name(name) == str(name.resolve()) == str(tmp_path.resolve() / "c" / "u.parquet")
    # a directory replaced by a link under the same name
    (tmp_path / "a" / "b" / "t.parquet").unlink()
    (tmp_path / "a" / "b" / "file_link").unlink()
    (tmp_path / "a" / "b").rmdir()
    (tmp_path / "a" / "b").symlink_to(tmp_path / "c")
    assert resolved_name(tmp_path / "a" / "b" / "u.parquet") == str(tmp_path.resolve() / "c" / "u.parquet")


def test_a_leaf_that_becomes_a_link_is_followed(tmp_path):
    _tree(tmp_path)
    leaf = tmp_path / "a" / "b" / "t.parquet"
    assert resolved_name(leaf) == str(leaf)
    leaf.unlink()
    leaf.symlink_to(tmp_path / "c" / "u.parquet")
    assert resolved_name(leaf) == str(tmp_path / "c" / "u.parquet")


def test_the_root_and_a_name_without_parent(tmp_path):
    assert resolved_name("/") == str(Path("/").resolve())
    assert resolved_name(str(tmp_path) + "/") == str(tmp_path.resolve())
