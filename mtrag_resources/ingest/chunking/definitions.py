"""The neutral records a language parser hands back (`Definition`, `Extraction`) and the text
limits they obey: shared by `code` (which turns them into chunks and nodes) and the parsers
(`code_python`, `code_treesitter`), so neither side imports the other."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

# Child chunks that are summaries of something bigger (class outline), and the size of a window
# (module-level code, what an outline leaves out, fallback windows: chunking/windows.py).
OUTLINE_MAX_CHARS = 4_000
SUMMARY_MAX_CHARS = 300


@dataclass
class Definition:
    """One function, method or class as a parser found it, before any id exists."""

    kind: str                      # class | function | method
    name: str
    qualname: str                  # dotted, relative to the module: "Cart.total"
    start_line: int                # 1-based, inclusive, decorators/attributes/annotations included
    end_line: int
    text: str                      # the full source of the definition
    title: str                     # signature line: "def total(self)", "class Cart(Base)"
    summary: str = ""
    outline: str = ""              # classes only: own source (header, docstring, fields) + member signatures
    owner: int | None = None       # index (in Extraction.definitions) of the enclosing class
    calls: list[tuple[str, int, str]] = field(default_factory=list)  # (callee_expr, line, text)
    bases: list[tuple[str, int]] = field(default_factory=list)       # (base_expr, line)
    class_name: str = ""           # methods whose type lives elsewhere (Go receivers, Rust impls)
    declaration: bool = False      # no implementation: `@overload`, a body of only `...`/`pass`/
                                   # a docstring/`raise NotImplementedError`, no body at all
    embed_source: str = ""         # the source the embedder reads when not the chunk's text: an
                                   # implementation's own, its folded declarations left out


@dataclass
class Extraction:
    """What a language parser hands back for one file."""

    definitions: list[Definition] = field(default_factory=list)
    module_summary: str = ""
    module_calls: list[tuple[str, int, str]] = field(default_factory=list)
    # {imported, alias, from_module, name, kind, line, text}; see _import_fact for the meaning
    imports: list[dict] = field(default_factory=list)
    routes: list[dict] = field(default_factory=list)  # web route facts (ingest/routes.py), Python only
    warnings: list[str] = field(default_factory=list)
    fallback: str = ""             # non-empty: the file did not parse; cut line windows instead
    more_definitions: bool = False  # the walk stopped at the caller's limit: more definitions follow


def first_sentence(text: str) -> str:
    """First sentence of a docstring or comment, whitespace collapsed, <= 300 chars."""
    paragraph = re.split(r"\n\s*\n", text.strip(), maxsplit=1)[0]
    flat = " ".join(paragraph.split())
    match = re.search(r"[.!?](\s|$)", flat)
    sentence = flat[: match.start() + 1] if match else flat
    return sentence[:SUMMARY_MAX_CHARS]
