"""List comment and docstring lines that carry measurements or dates, and long module docstrings.

Comments say why; figures, dates and A/B results belong in bench/README.md or docs/performance.md.
The default listing is broad (any number with a unit, "vs", a date); `--benchmarks` keeps only the
lines that read as a measurement (see `benchmark_reasons`), the rule tests/test_comment_figures.py
holds.

    .venv/bin/python scripts/comment_figures.py [PATH ...]       # default: mtrag_resources mtrag_assets
    .venv/bin/python scripts/comment_figures.py --count PATH ...  # totals only
    .venv/bin/python scripts/comment_figures.py --benchmarks PATH ...
"""
from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ROOTS = ("mtrag_resources", "mtrag_assets")
LONG_MODULE_DOCSTRING = 15

_NUMBER = r"(?<![\w.])\d+(?:[.,]\d+)?"
_UNIT = r"(?:ms|µs|us|ns|s|sec|min|h|MB|MiB|GB|GiB|KB|KiB|kB|TB|%|x|×|CPU-s|CPU\s*s|rows/s|chunks/s|docs/s|qps|req/s)"
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.?"
PATTERNS = {
    # a decimal figure with a unit is a measurement ("69.6 s", "14.5 CPU-s", "1.8x")
    "measured": re.compile(_NUMBER.replace(r"(?:[.,]\d+)?", r"[.,]\d+") + r"\s?" + _UNIT + r"(?![\w])"),
    "figure": re.compile(_NUMBER + r"\s?" + _UNIT + r"(?![\w/])"),
    "versus": re.compile(r"\bvs\.?(?=\s)|\bversus\b"),
    "date": re.compile(r"\b" + _MONTH + r"\s+20\d\d\b|\b20\d\d-\d\d(?:-\d\d)?\b"),
    "machine": re.compile(r"\bon (?:\d+|two|four)[- ](?:cores?|CPUs?)\b"),
}

# What makes a figure a measurement rather than a setting's unit ("32 MiB files", "every 0.25 s"):
# it is approximate, a before/after, or names the corpus, the bench or the act of measuring.
_QUOTED = re.compile(r'"[^"]*"|`[^`]*`')
_MEASURED_CONTEXT = re.compile(
    r"~\s?\d|\babout \d|\d\s?->\s?\d|\bdjango\b|\bbench corpus\b|\bmeasured\b|\btook\b|\bp(?:50|95|99)\b"
    r"|\b(?:was|were|cost|costs) \d|\b(?:faster|slower)\b",
    re.IGNORECASE)
_FIG = r"\d+(?:[.,]\d+)?\s?" + _UNIT + r"(?![\w/])"
_MEASURED_FIGURE = re.compile(
    r"\d(?:\.\d+)?\s?-\s?" + _FIG                                   # a range: "20-80 ms"
    + r"|" + _FIG + r" of (?:a|an|the|every|each|it|its|one)\b"          # a share: "0.23 s of every build"
    + r"|\(\s*\d+\.\d+\s?" + _UNIT + r"(?![\w/])"                   # a decimal aside: "(0.05 s)"
    + r"|\b(?:against|this|to|from) " + _FIG,                          # a before/after: "to 3.1 s"
    re.IGNORECASE)


def benchmark_reasons(text: str) -> tuple[str, ...]:
    """The reasons a comment or docstring line reads as a benchmark result: a date, a "vs"
    comparison, a machine ("on 2 cores"), or a figure with a unit in a measuring context
    (`_MEASURED_CONTEXT`). Quoted text ("3ms", `40k`) is an example, not a figure."""
    text = _QUOTED.sub("", text)
    reasons = [name for name in ("date", "versus", "machine") if PATTERNS[name].search(text)]
    if PATTERNS["figure"].search(text) and _MEASURED_CONTEXT.search(text) or _MEASURED_FIGURE.search(text):
        reasons.append("measured-figure")
    return tuple(reasons)


@dataclass(frozen=True)
class Finding:
    path: Path
    line: int
    kind: str  # "comment", "docstring" or "long-docstring"
    reasons: tuple[str, ...]
    text: str

    def __str__(self) -> str:
        where = f"{self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path}:{self.line}"
        return f"{where}: [{self.kind}: {','.join(self.reasons)}] {self.text.strip()[:110]}"


def reasons_in(text: str) -> tuple[str, ...]:
    """The kinds of figure a comment or docstring line carries; empty when it carries none."""
    return tuple(name for name, pattern in PATTERNS.items() if pattern.search(text))


def _docstring_nodes(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                yield node, body[0].value


def findings_in(path: Path, benchmarks_only: bool = False) -> list[Finding]:
    """Comment and docstring lines of `path` that carry figures (`benchmark_reasons` where
    `benchmarks_only`), and its module docstring when it runs LONG_MODULE_DOCSTRING lines or more."""
    reasons_in_line = benchmark_reasons if benchmarks_only else reasons_in
    source = path.read_text(encoding="utf-8")
    found: list[Finding] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            reasons = reasons_in_line(token.string)
            if reasons:
                found.append(Finding(path, token.start[0], "comment", reasons, token.string))
    tree = ast.parse(source, filename=str(path))
    for node, doc in _docstring_nodes(tree):
        lines = doc.value.splitlines()
        if isinstance(node, ast.Module) and len(lines) >= LONG_MODULE_DOCSTRING:
            found.append(Finding(path, doc.lineno, "long-docstring", (f"{len(lines)} lines",), lines[0]))
        for offset, line in enumerate(lines):
            reasons = reasons_in_line(line)
            if reasons:
                found.append(Finding(path, doc.lineno + offset, "docstring", reasons, line))
    return sorted(found, key=lambda f: f.line)


def python_files(roots) -> list[Path]:
    files: list[Path] = []
    for root in roots:
        root = Path(root) if Path(root).is_absolute() else REPO / root
        files.extend([root] if root.is_file() else sorted(root.rglob("*.py")))
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=list(DEFAULT_ROOTS))
    parser.add_argument("--count", action="store_true", help="print the totals only")
    parser.add_argument("--benchmarks", action="store_true", help="only lines that read as a measurement")
    args = parser.parse_args(argv)
    findings = [f for path in python_files(args.paths) for f in findings_in(path, args.benchmarks)]
    if not args.count:
        for finding in findings:
            print(finding)
    figure_lines = sum(1 for f in findings if f.kind != "long-docstring")
    long_docs = sum(1 for f in findings if f.kind == "long-docstring")
    print(f"{figure_lines} comment/docstring lines with figures or dates, "
          f"{long_docs} module docstrings of {LONG_MODULE_DOCSTRING}+ lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
