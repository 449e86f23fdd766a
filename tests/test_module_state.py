"""Module-level state of the product code: the mutable containers at module level that functions
fill. Caches and memos live in the build session (mtrag_resources/core/session.py), reached through
`session_cache` handles, which this scan does not count; what remains is listed in KNOWN with why.
A new one fails here, and one removed must leave the list too, so it always names what remains."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mtrag_resources", "mtrag_assets")
MUTATORS = frozenset({"append", "add", "update", "setdefault", "pop", "clear", "extend", "insert", "remove",
                      "discard", "popitem", "appendleft", "move_to_end"})
CONTAINER_TYPES = frozenset({"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter",
                             "WeakValueDictionary", "WeakKeyDictionary", "WeakSet"})

KNOWN = frozenset({
    # the process-wide holder of the current session: the handles it points at the next session
    "mtrag_resources.core.session:_handles",
    # facts of the process, not caches: the Qdrant folder locks it holds, the Neo4j servers it
    # launched and waits for, the signal pipe of a `signals_seen` block and what came through it
    "mtrag_resources.stores.qdrant_folder:_HELD_IN_THIS_PROCESS",
    "mtrag_resources.stores.neo4j_server:_BOOTING",
    "mtrag_assets.interrupts:_READ_FD",
    "mtrag_assets.interrupts:_SEEN",
})


def _module_containers(tree: ast.Module) -> set[str]:
    """Names bound at module level to a mutable container (a literal, a comprehension or a call
    of a container type)."""
    out = set()
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        call = value.func if isinstance(value, ast.Call) else None
        called = call.id if isinstance(call, ast.Name) else call.attr if isinstance(call, ast.Attribute) else None
        if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)) \
                or called in CONTAINER_TYPES:
            out.update(t.id for t in targets if isinstance(t, ast.Name))
    return out


def _mutated_in_functions(tree: ast.Module, names: set[str]) -> set[str]:
    """Those of `names` a function changes: item assignment or deletion, a mutating method, `global`."""
    hit = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Global):
                hit.update(n for n in node.names if n in names)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in MUTATORS and isinstance(node.func.value, ast.Name):
                hit.add(node.func.value.id)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = [node.target] if isinstance(node, ast.AugAssign) else node.targets
                hit.update(t.value.id for t in targets
                           if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name))
    return hit & names


def module_state(root: Path = ROOT) -> set[str]:
    found = set()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            module = path.relative_to(root).with_suffix("").as_posix().replace("/", ".")
            found.update(f"{module}:{name}" for name in _mutated_in_functions(tree, _module_containers(tree)))
    return found


def test_no_new_module_level_mutable_state():
    found = module_state()
    assert not found - KNOWN, f"new module-level mutable state (give it an owner instead): {sorted(found - KNOWN)}"
    assert not KNOWN - found, f"gone: remove from KNOWN: {sorted(KNOWN - found)}"


def test_the_scan_finds_a_cache_a_function_fills_and_ignores_a_constant(tmp_path):
    pkg = tmp_path / "mtrag_resources"
    pkg.mkdir()
    (tmp_path / "mtrag_assets").mkdir()
    (pkg / "m.py").write_text(
        "_MEMO = {}\nTABLE = {'a': 1}\n_SEEN: set[str] = set()\n"
        "def f(k):\n    _MEMO[k] = 1\n    _SEEN.add(k)\n    return TABLE[k]\n")
    assert module_state(tmp_path) == {"mtrag_resources.m:_MEMO", "mtrag_resources.m:_SEEN"}
