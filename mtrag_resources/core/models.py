"""The records that flow between stages. Plain dataclasses: every stage reads and writes these,
and the Parquet schemas in `tables.py` mirror them field for field."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from mtrag_resources.core.scripts import script_of

SOURCE_KINDS = ("code", "docs", "issues")


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def cjk_children(rows: list[dict]) -> list[dict]:
    """The child chunk rows the multilingual embedder embeds as well (script "cjk"): the embedding
    stage, the Qdrant stage and the publish gate count the same ones."""
    return [r for r in rows if r["role"] == "child" and r.get("script") == "cjk"]


def vector_hash(row: dict) -> str:
    """The CAS hash of the text a chunk row's vector embeds: `embed_hash`, else `content_hash`."""
    return row.get("embed_hash") or row["content_hash"]


def stable_id(*parts: object) -> str:
    """An id from a structural place (source, path, symbol or heading path, occurrence), never from
    line numbers, so inserting code elsewhere shifts no id. 32 hex chars = 128 bits."""
    joined = "\x1f".join(str(p) for p in parts)
    return hashlib.sha256(joined.encode("utf-8")).hexdigest()[:32]


@dataclass
class Chunk:
    """One retrievable unit. `role` is 'parent' (file, class, doc section) or 'child' (function,
    method, class body, doc passage). The text itself lives in the CAS, keyed by content_hash."""

    chunk_id: str
    parent_id: str | None
    role: str                # parent | child
    chunk_type: str          # file | class | function | method | module | section | passage | window
    file_path: str           # relative to the source root, forward slashes
    start_line: int          # 1-based, inclusive
    end_line: int
    title: str
    summary: str             # first sentence of the docstring / section, <= 300 chars
    symbol: str              # qualified symbol for code ("pkg.mod.Class.meth"); heading path for docs
    language: str            # python, javascript, markdown, rst, ...
    text: str
    locator: str = ""        # human-readable: "path:12-40 (symbol or heading path)"
    content_hash: str = ""   # sha256 of text; filled by `finalize`
    source_id: str = ""
    source_kind: str = ""
    cas_uri: str = ""
    repository: str = ""     # the spec's `repository`, else a git source's repository path, the pin, the root
    # The commit this row was parsed at (a git source's snapshot commit; a folder's work-tree HEAD).
    # A row kept from an earlier snapshot (its file's blob unchanged) keeps its commit: that commit
    # has the same text, and a new commit rewrites only the rows of the files it changed.
    commit_sha: str = ""
    ref: str = ""            # a git source's ref as the spec names it (branch, tag or sha); "" otherwise
    graph_ids: list[str] = field(default_factory=list)
    script: str = ""         # "cjk": embedded by the multilingual embedder too (core/scripts.py)
    # Code children: what the embedder reads instead of `text` (ingest/embed_text.py; an issue's
    # passage: its issue's title and state, then the text, ingest/issues.py), in the CAS like `text`
    # and never in a row; `embed_hash` is its sha256 ("": the vector is text's).
    embed_text: str = ""
    embed_hash: str = ""
    declaration: bool = False  # code without an implementation (`@overload`, abstract, Protocol stub)
    # PDF documents: the 1-based page the chunk's text is on (a child's whole text is on that page;
    # a parent's is its section's first page); 0 for every other file. start_line/end_line of a PDF
    # chunk count lines of the extracted text (ingest/chunking/pdf.py).
    page: int = 0
    # Issue-tracker exports (ingest/issues.py): the issue's key (`owner/repo#12`, `#12`, `PROJ-12`)
    # and its state (GitHub `open` / `closed`, a Jira status name) on each of its chunks; "" otherwise.
    # start_line/end_line of an issue's chunk count lines of its body or of its comment.
    issue_key: str = ""
    state: str = ""

    def finalize(self) -> "Chunk":
        self.content_hash = sha256_hex(self.text)
        self.embed_hash = sha256_hex(self.embed_text) if self.embed_text else ""
        self.script = script_of(self.text)
        if not self.locator:
            where = f"{self.file_path}:{self.start_line}-{self.end_line}"
            self.locator = f"{where} ({self.symbol})" if self.symbol else where
        return self


@dataclass
class GraphNode:
    """A canonical entity. label is one of Source, File, Module, Class, Function, Method, Page, Section,
    Endpoint (a web route: name and qualified_name `METHOD /path`, chunk_id its handler's chunk),
    Issue (an issue or pull request of a tracker export: name `#12` / `PROJ-12`, qualified_name its
    key, chunk_id its parent chunk, `properties` its fields)."""

    node_id: str
    label: str
    name: str
    qualified_name: str
    source_id: str = ""
    file_path: str = ""
    start_line: int = 0
    end_line: int = 0
    chunk_id: str = ""       # the chunk that holds this entity's text, if any
    content_hash: str = ""
    # A JSON object of the label's own properties, projected into Neo4j beside the ones above (Issue:
    # key, number, title, state, labels, author, created_at, updated_at, closed_at, url, ...); "" none.
    properties: str = ""


@dataclass
class GraphRelation:
    """A typed, directed relation with evidence. confidence is VERIFIED only when resolved
    unambiguously; otherwise INFERRED with `candidates` (qualified names)."""

    rel_id: str
    rel_type: str            # CONTAINS, DEFINES, IMPORTS, INHERITS, CALLS, ROUTES_TO, MENTIONS, IMPLEMENTS, REFERENCES
    src_id: str
    dst_id: str
    confidence: str = "VERIFIED"
    candidates: list[str] = field(default_factory=list)
    evidence_file: str = ""
    evidence_start: int = 0
    evidence_end: int = 0
    evidence_hash: str = ""
    evidence_text: str = ""
    source_id: str = ""


@dataclass
class DocReference:
    """A reference a doc makes to code, kept for cross-source resolution.
    ref_kind: role (:func:`x`), directive (.. autofunction:: x), backtick (`x` / ``x``), code_span, file (a file path an issue names: ingest/issues.py)."""

    chunk_id: str
    file_path: str
    line: int
    ref_kind: str
    role: str                # func, class, meth, autofunction, ... or "" for plain backticks
    target: str              # the identifier as written, e.g. "click.Group.command" or "~click.echo"
    matched_text: str        # the raw span, e.g. ":func:`click.echo`"
    module_context: str = "" # from `.. currentmodule:: click` / `{currentmodule} click`, else ""
    source_id: str = ""


@dataclass
class ParsedFile:
    """What a chunker returns for one file."""

    chunks: list[Chunk] = field(default_factory=list)
    nodes: list[GraphNode] = field(default_factory=list)
    relations: list[GraphRelation] = field(default_factory=list)
    references: list[DocReference] = field(default_factory=list)
    # Unresolved facts for the source-level resolver (code): imports and calls by name.
    imports: list[dict] = field(default_factory=list)   # {module_qn, file_path, line, imported, alias}
    calls: list[dict] = field(default_factory=list)     # {caller_id, caller_qn, callee_expr, file_path, line}
    bases: list[dict] = field(default_factory=list)     # {class_id, class_qn, base_expr, file_path, line}
    routes: list[dict] = field(default_factory=list)    # web route facts (ingest/routes.py): router, route, mount
    warnings: list[str] = field(default_factory=list)
    language: str = ""  # the file's language (set by the stage; the graph resolver groups by it)
