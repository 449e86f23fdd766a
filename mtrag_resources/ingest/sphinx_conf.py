"""What a Sphinx project's conf.py says about its references: the default role, the role rST
interpreted text (single backticks) takes. A project whose default role is an object role
(`py:obj`, `obj`, `any`, `func`...) writes `click.echo` for a reference; anywhere else backticks
are literals, never references. conf.py is read as Python source, never run."""
from __future__ import annotations

import ast
import posixpath
from pathlib import Path
from typing import Callable, Iterable

CONF_NAME = "conf.py"
# The roles whose targets are Python objects (doc_refs.PY_ROLES, `any` included); a default role
# that is none of them (`code`, `literal`, `math`) leaves backticks literals.
OBJECT_ROLES = ("func", "class", "meth", "attr", "mod", "exc", "data", "obj", "const", "deco", "type", "any")


def default_role(conf_source: str) -> str:
    """The `default_role = "..."` a conf.py assigns at module level ("" where none, or where the
    file does not parse)."""
    try:
        tree = ast.parse(conf_source)
    except (SyntaxError, ValueError):
        return ""
    role = ""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "default_role"
                                                for t in node.targets):
            value = node.value
            role = value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else ""
    return role.strip()


def interpreted_role(role: str) -> str | None:
    """The Python role rST interpreted text takes under the default role `role`, or None where
    backticks stay literals."""
    name = role.strip().removeprefix("py:")
    return name if name in OBJECT_ROLES else None


def default_roles(doc_paths: Iterable[str], read_conf: Callable[[str], str | None]) -> dict[str, str]:
    """{doc path: the default role of the Sphinx project it belongs to} for the docs `doc_paths`
    (relative to the source root) under some conf.py: the nearest one in a folder above the file.
    `read_conf(path)`: a conf.py's text, None where there is none. Files under no conf.py or under
    one without a default role are left out."""
    confs: dict[str, str | None] = {}  # folder -> the default role of its conf.py (None: no conf.py)

    def role_of(folder: str) -> str | None:
        if folder not in confs:
            text = read_conf(posixpath.join(folder, CONF_NAME) if folder else CONF_NAME)
            confs[folder] = None if text is None else default_role(text)
        return confs[folder]

    out = {}
    for path in doc_paths:
        folder = posixpath.dirname(path)
        while True:
            role = role_of(folder)
            if role is not None:
                if role:
                    out[path] = role
                break
            if not folder:
                break
            folder = posixpath.dirname(folder)
    return out


def conf_reader(root: Path | None, included: dict[str, Callable[[], str]]) -> Callable[[str], str | None]:
    """read_conf for default_roles: a conf.py the snapshot holds (`included`: path -> its text),
    else one on disk under the source's `root` (a docs source often includes only its pages)."""
    def read(path: str) -> str | None:
        if path in included:
            return included[path]()
        if root is None:
            return None
        try:
            return (root / path).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    return read
