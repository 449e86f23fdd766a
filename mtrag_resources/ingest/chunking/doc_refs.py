"""References a doc makes to code: Sphinx/MyST roles, autodoc directives, rST interpreted text
under an object default role (conf.py's `default_role = "py:obj"`) and, where the markup has no
roles (an issue tracker, an HTML page), identifier-like code spans; each with the module context
(`currentmodule`) in force where it occurs. Anywhere else a code span is a literal (a parameter
name, `True`, a shell command), not a reference.

Only the finding happens here; resolving a target to a code symbol is the cross-source linker's
job, which is why targets keep their relative form (`Context.invoke`) next to the module context.
"""
from __future__ import annotations

import bisect
import itertools
import keyword
import re
from typing import Callable, Iterable

from mtrag_resources.core.models import DocReference

PY_ROLES = ("func", "class", "meth", "attr", "mod", "exc", "data", "obj", "const", "deco", "type", "any")
AUTODOC = (
    "autofunction", "autoclass", "automethod", "automodule", "autoexception", "autodata",
    "autoattribute", "autodecorator", "autoproperty",
)
_ROLE_ALT = "|".join(PY_ROLES)
_AUTO_ALT = "|".join(AUTODOC)

# :func:`x` / :py:func:`x` (rST) and {func}`x` / {py:func}`x` (MyST). Any other role ({ref},
# {doc}, :kbd:) is matched too, only so its content is not mistaken for a code span.
_ANY_ROLE_RE = re.compile(r"(?::(?P<r1>[\w.+-]+(?::[\w.+-]+)*):|\{(?P<r2>[\w.+-]+(?::[\w.+-]+)*)\})`(?P<body>[^`]+)`")
# `.. autofunction:: x` (also inside {eval-rst} fences) and MyST fences ```{autofunction} x.
_DIRECTIVE_RE = re.compile(
    rf"^[ \t]*(?:\.\.[ \t]+(?:py:)?(?P<d1>{_AUTO_ALT})::|(?:`{{3,}}|~{{3,}}|:{{3,}})\{{(?:py:)?(?P<d2>{_AUTO_ALT})\}})"
    r"[ \t]+(?P<target>[^\s(]+)",
    re.M,
)
_MODULE_RE = re.compile(
    r"^[ \t]*(?:\.\.[ \t]+(?:py:)?(?:currentmodule|module)::|(?:`{3,}|~{3,}|:{3,})\{(?:py:)?(?:currentmodule|module)\})"
    r"[ \t]*(?P<mod>[^\s`]*)",
    re.M,
)
# A backtick run, its content, and the same-length closing run (CommonMark; also rST ``x``/`x`).
# A trailing `_` makes it an rST hyperlink reference, not code.
_CODE_SPAN_RE = re.compile(
    r"(?<!`)(?P<ticks>`+)(?!`)(?P<body>(?:(?!\n[ \t]*\n).)+?)(?<!`)(?P=ticks)(?![`_])", re.S
)
# Fence delimiter lines are blanked before looking for code spans so a fence never pairs up.
_FENCE_LINE_RE = re.compile(r"^[ \t]*(?:`{3,}|~{3,}).*$", re.M)
_IDENT_RE = re.compile(r"@?[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*(?:\(\))?")
_NOT_IDENTS = set(keyword.kwlist) | {"True", "False", "None", "self", "cls"}

# Literal blocks whose text is code, not prose: a paragraph ending in `::` or a code directive,
# each followed by a more-indented body. Backticks in there are Python strings, not markup.
_CODE_DIRECTIVE_RE = re.compile(
    r"^(?P<indent>[ \t]*)\.\.[ \t]+(?:code-block|code|sourcecode|highlight|doctest|testcode|"
    r"testoutput|ipython|click:example|click:run|literalinclude|parsed-literal)::"
)
_EXPLICIT_RE = re.compile(r"^[ \t]*\.\.[ \t]+\S+::")

Locate = Callable[[int], tuple[str, int]]


def clean_target(raw: str) -> str:
    """`~click.echo` -> `click.echo`; `title <target>` -> target; `echo()` -> `echo`."""
    target = raw.strip()
    m = re.match(r"^(?:.*?)\s*<([^<>]+)>$", target, re.S)
    if m:
        target = m.group(1).strip()
    target = target.lstrip("~!@")
    return target[:-2] if target.endswith("()") else target


# `pyproject.toml`, `__main__.py`: dotted like a name, but a file.
_FILE_SUFFIXES = {
    "py", "pyi", "toml", "cfg", "ini", "txt", "md", "rst", "json", "yaml", "yml", "html", "js",
    "ts", "sh", "bat", "exe", "lock", "zip", "gz", "whl", "csv", "log", "xml",
}


def looks_like_identifier(text: str) -> bool:
    """A dotted Python name, optionally `@`-prefixed or `()`-suffixed; not a keyword or a file."""
    text = text.strip()
    if not _IDENT_RE.fullmatch(text):
        return False
    name = text.lstrip("@").removesuffix("()")
    return name not in _NOT_IDENTS and not ("." in name and name.rsplit(".", 1)[1] in _FILE_SUFFIXES)


def literal_block_spans(text: str) -> list[tuple[int, int]]:
    """Offsets of rST literal blocks (after `::` or a code directive), in rST and in the
    `{eval-rst}` blocks of MyST alike."""
    spans: list[tuple[int, int]] = []
    lines = text.split("\n")
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    i = 0
    while i < len(lines):
        line = lines[i]
        code_dir = _CODE_DIRECTIVE_RE.match(line)
        is_literal = line.rstrip().endswith("::") and not _EXPLICIT_RE.match(line)
        if not (code_dir or is_literal):
            i += 1
            continue
        indent = len(line) - len(line.lstrip())
        j = i + 1
        while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent):
            j += 1
        if j > i + 1:
            spans.append((offsets[i + 1], offsets[j] - 1))
        i = max(j, i + 1)
    return spans


def extract_references(
    text: str,
    file_path: str,
    locate: Locate,
    *,
    source_id: str = "",
    skip: Iterable[tuple[int, int]] = (),
    interpreted_role: str | None = None,
    code_spans: bool = False,
) -> list[DocReference]:
    """Every reference in `text`, in document order. `locate(offset)` gives (chunk_id, line);
    `skip` are offset ranges of code blocks, whose content is code, not references.
    `interpreted_role`: the role rST interpreted text (`name`, single backticks) takes, where the
    project's default role is an object role (sphinx_conf.interpreted_role); None: it is a literal,
    as ``name`` always is. `code_spans`: identifier-like code spans are references (markup with no
    roles: an issue tracker's Markdown, an HTML page)."""
    masked = sorted(list(skip) + literal_block_spans(text))
    mask_starts = [s for s, _ in masked]
    mask_ends = list(itertools.accumulate((e for _, e in masked), max))  # spans may nest

    def in_code(pos: int) -> bool:
        i = bisect.bisect_right(mask_starts, pos) - 1
        return i >= 0 and pos < mask_ends[i]

    # (offset, kind, role, target, matched) events, plus module-context changes as kind "module".
    events: list[tuple[int, str, str, str, str]] = []
    for m in _MODULE_RE.finditer(text):
        if in_code(m.start()):
            continue
        mod = m.group("mod")
        events.append((m.start(), "module", "", "" if mod in ("", "None") else mod, ""))
    for m in _DIRECTIVE_RE.finditer(text):
        if not in_code(m.start()):
            start = m.start() + len(m.group(0)) - len(m.group(0).lstrip())
            role = m.group("d1") or m.group("d2")
            events.append((start, "directive", role, clean_target(m.group("target")), text[start:m.end()]))
    role_spans = []
    for m in _ANY_ROLE_RE.finditer(text):
        role_spans.append((m.start(), m.end()))
        role = (m.group("r1") or m.group("r2")).removeprefix("py:")
        if role in PY_ROLES and not in_code(m.start()):
            events.append((m.start(), "role", role, clean_target(m.group("body")), m.group(0)))
    scan = _FENCE_LINE_RE.sub(lambda f: " " * len(f.group(0)), text)
    for m in _CODE_SPAN_RE.finditer(scan):
        if in_code(m.start()) or any(s <= m.start() < e for s, e in role_spans):
            continue
        body = m.group("body")
        if code_spans and looks_like_identifier(body):
            events.append((m.start(), "code_span", "", clean_target(body), m.group(0)))
        elif interpreted_role and len(m.group("ticks")) == 1 and looks_like_identifier(clean_target(body).lstrip(".")):
            events.append((m.start(), "role", interpreted_role, clean_target(body), m.group(0)))

    refs: list[DocReference] = []
    module = ""
    for offset, kind, role, target, matched in sorted(events, key=lambda e: (e[0], e[1] != "module")):
        if kind == "module":
            module = target
            continue
        chunk_id, line = locate(offset)
        refs.append(DocReference(
            chunk_id=chunk_id, file_path=file_path, line=line, ref_kind=kind, role=role,
            target=target, matched_text=matched, module_context=module, source_id=source_id,
        ))
    return refs
