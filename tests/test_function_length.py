"""Function length in the product code: issue #55 asks for no function over ~80 lines without a
reason written beside it. KNOWN lists the ones longer than that, each with its length; the
test fails on a new one, and on one that grew by more than a few lines or shrank below the bound
(then it leaves the list), so the list always names what remains to split."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mtrag_resources", "mtrag_assets")
MAX_LINES = 80
SLACK = 10  # a fix inside a listed function may add a few lines

KNOWN: dict[str, int] = {}  # none left: a function over MAX_LINES is split, or says why beside it


def long_functions(root: Path = ROOT) -> dict[str, int]:
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_LINES:
                        found[f"{path.relative_to(root).as_posix()}:{node.name}"] = lines
    return found


def test_no_new_or_growing_long_function():
    found = long_functions()
    new = sorted(set(found) - set(KNOWN))
    assert not new, f"functions over {MAX_LINES} lines (split them, or say why beside them): {new}"
    grown = {f: (KNOWN[f], n) for f, n in found.items() if f in KNOWN and n > KNOWN[f] + SLACK}
    assert not grown, f"listed functions that grew (was, now): {grown}"
    gone = sorted(set(KNOWN) - set(found))
    assert not gone, f"no longer over {MAX_LINES} lines: remove from KNOWN: {gone}"


def test_the_scan_measures_a_function_from_def_to_its_last_line(tmp_path):
    (tmp_path / "mtrag_resources").mkdir()
    (tmp_path / "mtrag_assets").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "mtrag_resources" / "m.py").write_text(f"def long():\n{body}\n\n\ndef short():\n    return 1\n")
    assert long_functions(tmp_path) == {"mtrag_resources/m.py:long": MAX_LINES + 1}
