"""The text the embedder sees for a code chunk, and identifier splitting. Pure functions.

A definition's child chunk is displayed (and FTS-indexed) as its source; the dense channel embeds
instead its name's words, then its source: `code_embed_text`. The source already holds what a reader
looks at first (decorators, the signature, the docstring); the name's words (`Context.invoke` ->
"context invoke", `getTerminalSize` -> "get terminal size") give a natural-language query the
words the identifiers hide, at the head of the embedder's window (it reads the first
max_seq_length tokens: 256 for all-MiniLM-L6-v2).

The template was chosen on the dev evaluation (bench/eval/run.py, click 8.5.1, docstring
sentence -> function, dense MRR@10): the source alone 0.54; name words + source 0.61; adding
what many chunks share (the file path, the enclosing class's signature, the module-qualified
name, the chunk kind) made the vectors of one file or class alike: 0.51-0.60; moving the
docstring ahead of the code did not help (0.58). Issue #13.

Identifier splitting (`split_identifier`) turns `get_terminal_size`, `getTerminalSize`,
`HTTPServerError` and `click.termui.get_terminal_size` into lower-case words; the FTS store also
indexes the words of camelCase identifiers of code rows (`fts_query.case_words_for_index`)."""
from __future__ import annotations

import re

# The parts of a word run: cut before an upper-case letter that follows a lower-case one or a
# digit (`getTerminal`, `base64Encode`), and before the last capital of an acronym that starts a
# word (`HTTPServer` -> HTTP Server); digits stay with the letters before them (`utf8`). Case is
# ASCII's; other letters stay in their part. `_`, `.`, `$`, `-` and the rest separate runs.
_LOWER = r"[^\W\d_A-Z]"  # a letter that is not an ASCII capital
_PART_RE = re.compile(rf"[A-Z]+\d*(?=[A-Z]{_LOWER})|[A-Z]?{_LOWER}+\d*|[A-Z]+\d*|\d+")
_RUN_RE = re.compile(r"[^\W_]+")


def split_identifier(name: str) -> list[str]:
    """Lower-case words of an identifier or dotted path: snake_case, camelCase, PascalCase,
    acronyms (`HTTPServer` -> http, server), digits kept with the letters before them (`utf8`,
    `base64Encode` -> base64, encode), dotted paths and `$`/`-` cut into their parts."""
    return [part.lower() for run in _RUN_RE.findall(name or "") for part in _PART_RE.findall(run) or [run]]


def identifier_words(name: str) -> str:
    """`split_identifier` as one space-separated string."""
    return " ".join(split_identifier(name))


def has_case_parts(word: str) -> bool:
    """Does this word run split into more than one part by case (camelCase, HTTPServer)?"""
    return len(_PART_RE.findall(word)) > 1 and not word.islower() and not word.isupper()


def local_name(symbol: str, module: str) -> str:
    """The symbol relative to its module: `click.core.Context.invoke` -> `Context.invoke`."""
    if module and symbol.startswith(module + "."):
        return symbol[len(module) + 1:]
    return symbol


def code_embed_text(symbol: str, module: str, source: str) -> str:
    """The embedding text of a definition's child chunk (function, method, class outline): the
    words of the symbol relative to its module, then the source:
    `code_embed_text("click.core.Context.invoke", "click.core", src)` is
    `"context invoke\n" + src`. (Module-level code is embedded as it is: its module's words would
    draw the queries that name one of the module's definitions.)"""
    words = identifier_words(local_name(symbol, module))
    source = source.strip("\n")
    return f"{words}\n{source}\n" if words else f"{source}\n"
