"""Comments say why in a line or two; figures, dates and A/B results live in docs/performance.md or
bench/README.md (issue #55, item 5).

The rule, as `scripts/comment_figures.py --benchmarks` applies it to every comment and docstring
line of the modules below: a line fails when it carries a date ("Dec 2026", 2026-12-06), a "vs"
comparison, a machine ("on 2 cores"), or a figure with a unit (ms, s, MB, %, x, CPU-s...) that reads
as a measurement: approximate ("~40 ms", "about 6 s"), a range ("20-80 ms"), a share ("0.23 s of
every build"), a before/after ("62 -> 37 ms", "to 3.1 s"), a decimal aside ("(0.05 s)"), or beside
"django", "bench corpus", "measured", "took", "p95", "faster". A setting's unit stated as the why
("Edge preallocates sparse 32 MiB files", "touches it every 0.25 s", "default 8 MiB") passes, and so
does quoted example text ("3ms"). A module docstring says what the module is for: under 15 lines.
Where a comment points to a docs page (`docs/<page>.md#<anchor>`), the page and heading exist.
"""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from tests.test_readme_links import anchors

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("comment_figures", REPO / "scripts" / "comment_figures.py")
comment_figures = importlib.util.module_from_spec(_spec)
sys.modules.setdefault(_spec.name, comment_figures)  # its dataclass looks its module up
_spec.loader.exec_module(comment_figures)

# The modules whose comments were cleaned (the rest of the tree follows in later passes).
SCOPE = [
    "mtrag_resources/stores", "mtrag_resources/embedding", "mtrag_resources/stages",
    "mtrag_resources/publish", "mtrag_assets",
    *(str(p.relative_to(REPO)) for p in sorted((REPO / "mtrag_resources/core").glob("*.py"))
      if p.name != "versions.py"),
    *(f"mtrag_resources/serving/{name}.py" for name in (
        "bundles", "fusion", "query_text", "ranker", "translation", "results", "golden", "shared_lock",
        "generations", "graph_connection", "graph_queries", "query_embedding", "query_flow", "recall",
        "reader_gate", "compare", "query_log")),
]
FILES = comment_figures.python_files(SCOPE)
_DOC_REFERENCE = re.compile(r"docs/([\w-]+\.md)(?:#([\w-]+))?")


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_comments_carry_no_benchmark_figures(path):
    findings = comment_figures.findings_in(path, benchmarks_only=True)
    assert not findings, ("move these figures to docs/performance.md (or bench/README.md) and leave "
                          "the why:\n" + "\n".join(map(str, findings)))


@pytest.mark.parametrize("line, reasons", [
    ("# on 2 cores, Dec 2026: a full build 69.6 s vs 72.7 s", ("date", "versus", "machine")),
    ("# (a read per part cost ~1 ms each in fixed overhead)", ("measured-figure",)),
    ("# batch was a 20-80 ms round trip on the critical path", ("measured-figure",)),
    ("pandas: 0.23 s of every `mtrag build` process", ("measured-figure",)),
    ("# each row's line digested once (0.05 s)", ("measured-figure",)),
    ("sort it was ~40% of the query (62 -> 37 ms)", ("measured-figure",)),
    ("measured on 2026-12-01", ("date",)),
])
def test_the_rule_finds_a_measurement(line, reasons):
    assert comment_figures.benchmark_reasons(line) == reasons


@pytest.mark.parametrize("line", [
    "shutil.copy2 that keeps holes: Edge preallocates sparse 32 MiB files (WAL, mmaps)",
    "# A waiter touches its request at least every 0.25 s (acquire's longest sleep)",
    "`needed` bytes free beyond the reserve (MTRAG_QDRANT_DISK_RESERVE_MB, default 8 MiB",
    '# "40k", "3ms": a number with a unit',
    "# the server applies one transaction on one core",
])
def test_the_rule_lets_a_settings_unit_pass(line):
    assert comment_figures.benchmark_reasons(line) == ()


def test_a_long_module_docstring_is_found(tmp_path):
    module = tmp_path / "long.py"
    module.write_text('"""' + "\n".join(f"line {i}" for i in range(16)) + '"""\nX = 1  # took ~3 s\n')
    kinds = [f.kind for f in comment_figures.findings_in(module, benchmarks_only=True)]
    assert kinds == ["long-docstring", "comment"]


def test_docs_references_in_comments_resolve():
    broken = []
    for path in FILES:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for page, anchor in _DOC_REFERENCE.findall(line):
                target = REPO / "docs" / page
                if not target.exists() or (anchor and anchor not in anchors(target)):
                    broken.append(f"{path.relative_to(REPO)}:{number}: docs/{page}#{anchor}")
    assert not broken, "\n".join(broken)
