"""The README and docs/*.md as a reader follows them: every relative link resolves to a file of the
repository (and to a heading of it, GitHub's anchors, when it names one), and every `mtrag`
command in a bash block parses with the CLI's own argparse parser, so a renamed flag or a moved
section breaks here rather than for the reader. The quick start's two commands stay first."""
from __future__ import annotations

import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pytest

from mtrag_assets.app.cli import build_parser

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
QUICK_START = ["bash scripts/demo", "bash scripts/test"]

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)[\s\S]*?(?<!`)\1(?!`)")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^()\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
_HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.I)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_ALTERNATIVES = re.compile(r"\w\|\w")  # `start|stop|status`: a usage line, not a command
_QUOTED = re.compile(r"'[^']*'|\"(?:\\.|[^\"\\])*\"")


@dataclass
class Block:
    language: str
    line: int           # 1-based line of its first content line
    lines: list[str]


def split_markdown(text: str) -> tuple[str, list[Block]]:
    """(the prose, with fenced blocks blanked so line numbers hold; the fenced blocks)."""
    prose, blocks = [], []
    fence: tuple[str, int] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        match = _FENCE.match(line)
        if fence is None and match:
            fence = (match.group(1)[0], len(match.group(1)))
            blocks.append(Block(match.group(2).lower(), number + 1, []))
            prose.append("")
        elif fence is not None:
            stripped = line.strip()
            if stripped and set(stripped) == {fence[0]} and len(stripped) >= fence[1]:
                fence = None
            else:
                blocks[-1].lines.append(line)
            prose.append("")
        else:
            prose.append(line)
    return "\n".join(prose), blocks


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text without markup, lowercased, punctuation dropped,
    spaces to hyphens (github-slugger)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose, _ = split_markdown(path.read_text(encoding="utf-8"))
    found: set[str] = set(_HTML_ANCHOR.findall(prose))
    seen: dict[str, int] = {}
    for line in prose.splitlines():
        match = _HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link, image and reference definition outside code."""
    prose, _ = split_markdown(text)
    prose = _CODE_SPAN.sub(lambda m: "\n" * m.group(0).count("\n"), prose)
    out = []
    for pattern in (_LINK, _REF_DEF):
        for match in pattern.finditer(prose):
            out.append((prose.count("\n", 0, match.start(1)) + 1, match.group(1)))
    return sorted(out)


def broken_links(page: Path, repo: Path = REPO) -> list[str]:
    problems = []
    for line, target in links(page.read_text(encoding="utf-8")):
        if _SCHEME.match(target):
            continue  # http:, https:, mailto: - not a file of the repository
        where = f"{page.relative_to(repo)}:{line}: ({target})"
        path_part, _, anchor = target.partition("#")
        path = (page.parent / unquote(path_part.split("?", 1)[0])).resolve() if path_part else page
        if not path.is_relative_to(repo):
            problems.append(f"{where}: leaves the repository")
        elif not path.exists():
            problems.append(f"{where}: no such file {path.relative_to(repo)}")
        elif anchor and path.suffix.lower() == ".md":
            if unquote(anchor) not in anchors(path):
                problems.append(f"{where}: no heading with anchor #{anchor} in {path.relative_to(repo)}")
        elif anchor and not re.fullmatch(r"L\d+(-L\d+)?", anchor):
            problems.append(f"{where}: anchor #{anchor} in a file that is not Markdown")
    return problems


def shell_lines(block: Block) -> list[tuple[int, str]]:
    """(line, logical command line) of a shell block: continuations joined, comments and blank
    lines left out, a console block's prompt taken off (its output lines left out)."""
    out, pending, start = [], "", 0
    for offset, raw in enumerate(block.lines):
        line = raw.strip()
        if block.language == "console":
            if not pending and not line.startswith("$ "):
                continue
            line = line[2:] if not pending else line
        if not pending:
            start = block.line + offset
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line and not line.startswith("#"):
            out.append((start, line))
    return out


def commands(line: str) -> list[list[str]]:
    """The simple commands of one shell line: split at pipes, lists, subshells and `$(`, their
    redirections and leading variable assignments taken off."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    out, current, skip_target = [], [], False
    for token in lexer:
        if token and set(token) <= set("();<>|&"):
            if "<" in token or ">" in token:
                if current and current[-1].isdigit():
                    current.pop()  # `2>&1`: the descriptor
                skip_target = True  # the file or descriptor it names
                continue
            out.append(current)
            current = []
        elif skip_target:
            skip_target = False
        else:
            current.append(token)
    out.append(current)
    cleaned = []
    for command in out:
        while command and _ENV_ASSIGNMENT.match(command[0]):
            command = command[1:]
        if command:
            cleaned.append(command)
    return cleaned


def mtrag_commands(text: str) -> list[tuple[int, str, list[str] | None]]:
    """(line, the shell line, the arguments after `mtrag`) of every `mtrag` command in the shell
    blocks; arguments None where the line cannot be read as shell (unbalanced quotes)."""
    _, blocks = split_markdown(text)
    found = []
    for block in blocks:
        if block.language not in SHELL_LANGUAGES:
            continue
        for line, shell_line in shell_lines(block):
            try:
                parsed = commands(shell_line)
            except ValueError:
                found.append((line, shell_line, None))
                continue
            for command in parsed:
                if Path(command[0]).name == "mtrag":
                    found.append((line, shell_line, command[1:]))
    return found


def refused_commands(page: Path, repo: Path = REPO) -> list[str]:
    problems = []
    for line, shell_line, args in mtrag_commands(page.read_text(encoding="utf-8")):
        where = f"{page.relative_to(repo)}:{line}: {shell_line}"
        if args is None:
            problems.append(f"{where}: not a shell line (unbalanced quotes?)")
            continue
        unquoted = _QUOTED.sub("", shell_line)
        placeholders = [w for w in unquoted.split() if _ALTERNATIVES.search(w)] + [a for a in args if a.startswith("[")]
        if placeholders:
            problems.append(f"{where}: placeholders {placeholders}: write a real example")
            continue
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                build_parser().parse_args(args)
        except SystemExit as exc:
            if exc.code not in (0, None):
                problems.append(f"{where}: {' '.join(err.getvalue().split())}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_mtrag_commands_parse(page):
    assert refused_commands(page) == []


def test_the_readme_has_commands_to_check():
    """The extraction finds the README's commands (an extractor that finds none passes anything)."""
    found = mtrag_commands((REPO / "README.md").read_text(encoding="utf-8"))
    assert len(found) >= 5
    assert ["query", "how do I prompt for a password"] in [args for _, _, args in found]


def test_quick_start_commands_come_first():
    _, blocks = split_markdown((REPO / "README.md").read_text(encoding="utf-8"))
    first = [line.split("#", 1)[0].strip() for line in blocks[0].lines]
    assert blocks[0].language == "bash" and first == QUICK_START


def test_the_sources_file_names_a_readme_section_that_exists():
    header = (REPO / "data" / "sources.yaml").read_text(encoding="utf-8")
    named = re.findall(r'README "([^"]+)"', header)
    assert named, "data/sources.yaml no longer points at the README's entry schema"
    readme = anchors(REPO / "README.md")
    assert [n for n in named if slug(n) not in readme] == []


# The checkers themselves: a broken link, a missing anchor, an unknown flag, a placeholder.

def test_slug_follows_github():
    assert slug("Jobs, and `mtrag build` in the UI") == "jobs-and-mtrag-build-in-the-ui"
    assert slug("3. Shared storage: what every pod must see") == "3-shared-storage-what-every-pod-must-see"
    assert slug("The local Neo4j's class-data archive") == "the-local-neo4js-class-data-archive"
    assert slug("Storage (`bench/instance_storage.py`)") == "storage-benchinstance_storagepy"


def test_the_checkers_report_what_is_wrong(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## A section\n\n## A section\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "# Page\n\n"
        "[fine](other.md#a-section) [second](other.md#a-section-1) [here](#page) [web](https://x.org/y)\n"
        "[gone](missing.md) [no anchor](other.md#nowhere)\n"
        "`[in code](missing.md)`\n\n"
        "```bash\n"
        ".venv/bin/mtrag query \"x\" --k 5 --source a   # fine\n"
        "MTRAG_HOME=/tmp/h mtrag status --json | head -1\n"
        "mtrag query \"x\" --top 5\n"
        "mtrag neo4j start|stop|status\n"
        "```\n\n"
        "```text\nmtrag query --nonsense\n```\n")
    assert broken_links(page, tmp_path) == [
        "docs/page.md:4: (missing.md): no such file docs/missing.md",
        "docs/page.md:4: (other.md#nowhere): no heading with anchor #nowhere in docs/other.md"]
    problems = refused_commands(page, tmp_path)
    assert len(problems) == 2
    assert problems[0].startswith("docs/page.md:10: mtrag query \"x\" --top 5: ") and "--top" in problems[0]
    assert problems[1].startswith("docs/page.md:11: mtrag neo4j start|stop|status: placeholders")


def test_every_source_of_the_demo_file_can_be_built_in_the_demo_home():
    """`bash scripts/demo` builds every source of data/sources.yaml in data/: none is refused
    before it starts (its samples and issue export live in the home, beside mtrag's folders)."""
    from mtrag_resources.core.config import Settings
    from mtrag_resources.ingest.snapshot import source_problem
    from mtrag_resources.ingest.sources import load_sources
    settings = Settings(home=REPO / "data", sources=REPO / "data" / "sources.yaml")
    specs = load_sources(settings.sources_file)
    assert len(specs) == 5
    assert {s.id: source_problem(settings, s) for s in specs if not s.pip_sdist} == \
        {s.id: None for s in specs if not s.pip_sdist}
