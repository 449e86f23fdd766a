"""Code files -> parent/child chunks, per-file graph nodes and relations, and the unresolved facts
(imports, calls, bases, web routes) that `mtrag_resources.ingest.code_graph` turns into source-level edges.

The language parsers (`code_python`, `code_treesitter`) only *extract* definitions into the small
neutral records below; everything about ids, chunks and nodes is decided here, once, so every
language gets the same identity rules: ids from (source, path, type, role, symbol, occurrence),
never from line numbers or content."""
from __future__ import annotations

import bisect
import dataclasses
from pathlib import PurePosixPath

from mtrag_resources.ingest.chunking.definitions import Definition, Extraction
from mtrag_resources.ingest.chunking.limits import DEFAULT_MAX_FILE_CHUNKS, cap_chunks, cut_warning
from mtrag_resources.ingest.embed_text import code_embed_text
from mtrag_resources.ingest.chunking.windows import WINDOW_MAX_CHARS, line_windows, split_lines, windows
from mtrag_resources.core.models import (
    Chunk, GraphNode, GraphRelation, ParsedFile, sha256_hex, stable_id,
)

LANGUAGE_BY_SUFFIX: dict[str, str] = {
    ".py": "python",
    ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript", ".jsx": "javascript",
    ".ts": "typescript",
    ".tsx": "tsx",
    ".java": "java",
    ".go": "go",
    ".rs": "rust",
}

# Parent chunks go back to a reader as context; past this they are cut (at a line boundary) and
# end with a marker carrying the full text's sha256, so the parent's hash still tracks every edit.
PARENT_MAX_CHARS = 12_000
MODULE_SPAN_MAX_LINES = 80  # one module-level chunk spans at most this many lines of its file
MODULE_GAP_LINES = 3  # module-level lines this close (blank lines squeezed) are one block


def module_name_for(file_path: str) -> str:
    """Dotted module name of a file: `src/shopcart/tax.py` -> `shopcart.tax`,
    `pkg/__init__.py` -> `pkg`, `web/src/cart.ts` -> `web.src.cart`."""
    path = PurePosixPath(file_path.replace("\\", "/").lstrip("/"))
    parts = list(path.parts)
    if path.suffix == ".py":
        if len(parts) > 1 and parts[0] in ("src", "lib"):
            parts = parts[1:]
        parts[-1] = parts[-1][: -len(".py")]
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
    elif path.suffix:
        parts[-1] = parts[-1][: -len(path.suffix)]
    return ".".join(parts)


def cap_parent_text(text: str) -> str:
    if len(text) <= PARENT_MAX_CHARS:
        return text
    cut = text.rfind("\n", 0, PARENT_MAX_CHARS) + 1 or PARENT_MAX_CHARS
    rest = text[cut:].count("\n") + 1
    return f"{text[:cut]}... [truncated: {rest} more lines; full text sha256 {sha256_hex(text)}]\n"


def chunk_code(source_id: str, file_path: str, text: str, language: str,
               max_chunks: int = DEFAULT_MAX_FILE_CHUNKS) -> ParsedFile:
    """Chunk one code file and extract its per-file graph. Unknown languages get line windows.
    At most `max_chunks` chunks (chunking/limits.py): past it, the file from its start to a cut."""
    if not text.strip():
        return ParsedFile()
    text = text.removeprefix("\ufeff")  # ast rejects a BOM; it is no part of the code
    module_qn = module_name_for(file_path)
    if language == "python":
        from mtrag_resources.ingest.chunking.code_python import extract_python
        extraction = extract_python(file_path, text, module_qn)
    elif language in ("javascript", "typescript", "tsx", "java", "go", "rust"):
        from mtrag_resources.ingest.chunking.code_treesitter import extract_treesitter
        extraction = extract_treesitter(file_path, text, language, module_qn, max_definitions=max_chunks)
    else:
        extraction = Extraction(fallback="no parser for this language")
    if extraction.fallback:
        parsed = _windows_file(source_id, file_path, text, language, module_qn, extraction, max_chunks)
    else:
        parsed = _FileAssembler(source_id, file_path, text, language, module_qn).build(extraction, max_chunks)
    return cap_chunks(parsed, max_chunks, file_path)


def _windows_file(source_id, file_path, text, language, module_qn, extraction, max_chunks) -> ParsedFile:
    asm = _FileAssembler(source_id, file_path, text, language, module_qn)
    parsed = ParsedFile(warnings=list(extraction.warnings))
    file_chunk = asm.file_parent(extraction.module_summary)
    windows = line_windows(file_path, text, language, source_id=source_id,
                           parent_id=file_chunk.chunk_id, symbol=module_qn, max_windows=max_chunks)
    for window in windows:
        window.graph_ids = [asm.module_id]
    parsed.chunks = [file_chunk, *windows]
    parsed.nodes, parsed.relations = asm.file_and_module(file_chunk)
    return parsed


class _FileAssembler:
    """Turns an Extraction into chunks, nodes, relations and facts for one file."""

    def __init__(self, source_id: str, file_path: str, text: str, language: str, module_qn: str):
        self.source_id, self.file_path, self.text = source_id, file_path, text
        self.language, self.module_qn = language, module_qn
        self.lines = split_lines(text)
        self.offsets = [0]  # each line's first character in `text`
        for line in self.lines:
            self.offsets.append(self.offsets[-1] + len(line))
        self.spans: dict[tuple[int, str], tuple[int, int]] = {}  # span_of, once per definition
        self.last_span_start = 0
        self.limit = len(text)  # module-level code is read up to here (a cut file: its first definition left out)
        self.file_id = f"{source_id}:file:{file_path}"
        self.module_id = f"{source_id}:module:{module_qn}"

    # -- pieces -----------------------------------------------------------------------------
    def chunk(self, chunk_type, role, symbol, occurrence, parent_id, start, end, title, summary,
              text, graph_ids, embed_text: str = "", declaration: bool = False, part: int = 1) -> Chunk:
        # `part` > 1: a further window of the same thing (module-level code, a class body); part 1
        # keeps the id of the unwindowed chunk, so code that grows past one window keeps it too.
        key = (occurrence,) if part == 1 else (occurrence, part)
        return Chunk(
            chunk_id=stable_id(self.source_id, self.file_path, chunk_type, role, symbol, *key),
            parent_id=parent_id, role=role, chunk_type=chunk_type, file_path=self.file_path,
            start_line=start, end_line=end, title=title, summary=summary, symbol=symbol,
            language=self.language, text=text, source_id=self.source_id, graph_ids=list(graph_ids),
            embed_text=embed_text, declaration=declaration,
        ).finalize()

    def relation(self, rel_type, src_id, dst_id, chunk: Chunk, evidence_text: str) -> GraphRelation:
        return GraphRelation(
            rel_id=stable_id(rel_type, src_id, dst_id), rel_type=rel_type, src_id=src_id,
            dst_id=dst_id, evidence_file=self.file_path, evidence_start=chunk.start_line,
            evidence_end=chunk.end_line, evidence_hash=chunk.content_hash,
            evidence_text=evidence_text[:200], source_id=self.source_id,
        )

    def node(self, node_id, label, name, qualified_name, chunk: Chunk, start, end) -> GraphNode:
        return GraphNode(
            node_id=node_id, label=label, name=name, qualified_name=qualified_name,
            source_id=self.source_id, file_path=self.file_path, start_line=start, end_line=end,
            chunk_id=chunk.chunk_id, content_hash=chunk.content_hash,
        )

    def file_parent(self, summary: str) -> Chunk:
        return self.chunk("file", "parent", self.module_qn, 1, None, 1, max(1, len(self.lines)),
                          self.file_path, summary, cap_parent_text(self.text),
                          [self.file_id, self.module_id])

    def file_and_module(self, file_chunk: Chunk) -> tuple[list[GraphNode], list[GraphRelation]]:
        end = max(1, len(self.lines))
        nodes = [
            self.node(self.file_id, "File", PurePosixPath(self.file_path).name, self.file_path,
                      file_chunk, 1, end),
            self.node(self.module_id, "Module", self.module_qn.rsplit(".", 1)[-1], self.module_qn,
                      file_chunk, 1, end),
        ]
        return nodes, [self.relation("CONTAINS", self.file_id, self.module_id, file_chunk,
                                     self.file_path)]

    # -- the whole file ---------------------------------------------------------------------
    def build(self, ex: Extraction, max_chunks: int = DEFAULT_MAX_FILE_CHUNKS) -> ParsedFile:
        parsed = ParsedFile(warnings=list(ex.warnings))
        ex = self.within(ex, max_chunks, parsed.warnings)
        file_chunk = self.file_parent(ex.module_summary)
        parsed.chunks.append(file_chunk)
        parsed.nodes, parsed.relations = self.file_and_module(file_chunk)
        module_chunks = self.module_chunks(ex, parsed.warnings)
        parsed.chunks += module_chunks
        ex = dataclasses.replace(ex, definitions=self.fold_declarations(ex.definitions))
        placed = self.place_definitions(ex.definitions, file_chunk, parsed)

        def module_evidence(line: int) -> Chunk:  # the module window holding the line
            return next((c for c in module_chunks if c.start_line <= line <= c.end_line),
                        module_chunks[0] if module_chunks else file_chunk)

        self.add_facts(ex, placed, module_evidence, parsed)
        return parsed

    def within(self, ex: Extraction, max_chunks: int, warnings: list[str]) -> Extraction:
        """More definitions than chunks allowed (a minified bundle): the first half of the budget
        in definitions, module-level code up to the first one left out, the facts of the lines
        before it; cap_chunks trims what still overflows. Building every chunk first would cost
        what the cap is there to bound."""
        defs = ex.definitions
        if len(defs) < max_chunks and not ex.more_definitions:
            return ex
        keep = max(1, max_chunks // 2)
        for d in defs[:keep + 1]:
            self.span_of(d)  # in source order: span_of searches on from the previous one
        self.limit = self.span_of(defs[keep])[0]
        line = defs[keep].start_line
        column = self.limit - self.offsets[line - 1] + 1
        found = f"more than {max_chunks}" if ex.more_definitions else str(len(defs))  # the walk stopped early
        warnings.append(cut_warning(self.file_path, f"{found} definitions, over max_file_chunks={max_chunks}; "
                                                    f"indexed the first {keep}, to line {line} column {column}"))
        return dataclasses.replace(
            ex, definitions=defs[:keep], imports=[f for f in ex.imports if f["line"] <= line],
            module_calls=[c for c in ex.module_calls if c[1] <= line],
            routes=[f for f in ex.routes if f["line"] <= line])

    def fold_declarations(self, defs: list[Definition]) -> list[Definition]:
        """Declarations of a name directly followed by its implementation (`@overload` stubs; any
        language: same name, kind and owner, only blank or comment lines between) fold into the
        implementation's definition: one chunk and one node whose span starts at the first
        declaration; the embedding text keeps the implementation's own source. Declarations
        without an implementation right after them stay as they are (`declaration` chunks)."""
        out: list[Definition] = []
        new_index: dict[int, int] = {}
        i = 0
        while i < len(defs):
            j = i
            while (j + 1 < len(defs) and defs[j].declaration and defs[j + 1].qualname == defs[i].qualname
                   and defs[j + 1].kind == defs[i].kind and defs[j + 1].owner == defs[i].owner
                   and self.only_gap(defs[j].end_line, defs[j + 1].start_line)):
                j += 1
            impl = defs[j]
            if j > i and not impl.declaration:
                run = defs[i:j + 1]
                calls = {}
                for d in run:
                    for call in d.calls:
                        calls.setdefault(call[0], call)
                impl = dataclasses.replace(
                    impl, start_line=defs[i].start_line,
                    text="".join(self.lines[defs[i].start_line - 1:impl.end_line]),
                    summary=impl.summary or next((d.summary for d in run if d.summary), ""),
                    embed_source=impl.text, calls=list(calls.values()))
            else:
                j = i
            for k in range(i, j + 1):
                new_index[k] = len(out)
            out.append(impl)
            i = j + 1
        if len(out) == len(defs):
            return defs
        return [dataclasses.replace(d, owner=new_index[d.owner]) if d.owner is not None else d for d in out]

    def only_gap(self, end_line: int, start_line: int) -> bool:
        """Only blank and comment lines between two definitions."""
        return all(not line.strip() or line.lstrip().startswith(("#", "//", "/*", "*"))
                   for line in self.lines[end_line:start_line - 1])

    def place_definitions(self, defs: list[Definition], file_chunk: Chunk,
                          parsed: ParsedFile) -> list[tuple[str, Chunk, Chunk]]:
        """Chunks, nodes and DEFINES for each definition; returns (node id, child chunk,
        evidence chunk) per definition. Owners always precede their members in `defs`."""
        seen: dict[tuple[str, str], int] = {}
        placed: list[tuple[str, Chunk, Chunk]] = []
        class_parents: dict[int, Chunk] = {}
        for index, d in enumerate(defs):
            symbol = f"{self.module_qn}.{d.qualname}" if self.module_qn else d.qualname
            occurrence = seen[(d.kind, symbol)] = seen.get((d.kind, symbol), 0) + 1
            node_id = f"{self.source_id}:{d.kind}:{symbol}"
            node_id += f"#{occurrence}" if occurrence > 1 else ""
            parent = class_parents.get(d.owner, file_chunk) if d.owner is not None else file_chunk
            child_text = d.text
            if d.kind == "class":
                class_parents[index] = self.chunk(
                    "class", "parent", symbol, occurrence, parent.chunk_id, d.start_line,
                    d.end_line, d.title, d.summary, cap_parent_text(d.text), [node_id])
                parsed.chunks.append(class_parents[index])
                child_text = d.outline or d.text
            child = self.chunk(d.kind, "child", symbol, occurrence, parent.chunk_id, d.start_line,
                               d.end_line, d.title, d.summary, child_text, [node_id],
                               embed_text=code_embed_text(symbol, self.module_qn, d.embed_source or child_text),
                               declaration=d.declaration)
            parsed.chunks.append(child)
            if d.kind == "class":
                parsed.chunks += self.class_rest(defs, index, child_text, symbol, occurrence,
                                                 parent.chunk_id, node_id)  # beside the outline
            parsed.nodes.append(self.node(node_id, d.kind.capitalize(), d.name, symbol, child,
                                          d.start_line, d.end_line))
            definer = placed[d.owner][0] if d.owner is not None else self.module_id
            parsed.relations.append(self.relation("DEFINES", definer, node_id, child, d.title))
            # a class's own facts (bases, class-body calls) are evidenced by its full source
            placed.append((node_id, child, class_parents.get(index, child)))
        return placed

    def add_facts(self, ex: Extraction, placed: list[tuple[str, Chunk, Chunk]],
                  module_evidence, parsed: ParsedFile) -> None:
        """The unresolved imports, calls and bases, each with its evidence chunk's hash."""
        defs = ex.definitions
        common = {"file_path": self.file_path, "module_qn": self.module_qn,
                  "language": self.language}

        def enclosing_class(index: int | None) -> tuple[str, str]:
            while index is not None and defs[index].kind != "class":
                index = defs[index].owner
            return (placed[index][0], placed[index][1].symbol) if index is not None else ("", "")

        for fact in ex.imports:
            holders = [i for i, d in enumerate(defs) if d.start_line <= fact["line"] <= d.end_line]
            evidence = placed[max(holders, key=lambda i: defs[i].start_line)][2] if holders \
                else module_evidence(fact["line"])
            parsed.imports.append({**fact, **common, "module_id": self.module_id,
                                   "evidence_hash": evidence.content_hash,
                                   "chunk_id": evidence.chunk_id})
        sites = [(None, call) for call in ex.module_calls]
        sites += [(i, call) for i, d in enumerate(defs) for call in d.calls]
        for index, (expr, line, call_text) in sites:
            caller_id, caller_qn, evidence = (self.module_id, self.module_qn, module_evidence(line)) \
                if index is None else (placed[index][0], placed[index][1].symbol, placed[index][2])
            class_id, class_qn = enclosing_class(index)
            parsed.calls.append({
                **common, "caller_id": caller_id, "caller_qn": caller_qn, "callee_expr": expr,
                "line": line, "text": call_text[:200], "class_id": class_id, "class_qn": class_qn,
                "class_name": defs[index].class_name if index is not None else "",
                "evidence_hash": evidence.content_hash,
            })
        for index, d in enumerate(defs):
            for base_expr, line in d.bases:
                parsed.bases.append({
                    **common, "class_id": placed[index][0], "class_qn": placed[index][1].symbol,
                    "base_expr": base_expr, "text": base_expr, "line": line,
                    "evidence_hash": placed[index][2].content_hash,
                })
        for fact in ex.routes:  # web routes (ingest/routes.py), evidenced like the imports
            holders = [i for i, d in enumerate(defs) if d.start_line <= fact["line"] <= d.end_line]
            evidence = placed[max(holders, key=lambda i: defs[i].start_line)][2] if holders \
                else module_evidence(fact["line"])
            parsed.routes.append({**fact, **common, "evidence_hash": evidence.content_hash,
                                  "chunk_id": evidence.chunk_id})

    def span_of(self, d: Definition) -> tuple[int, int]:
        """A definition's character range in `text`: whole lines for ordinary code, part of a line
        for minified code (tree-sitter definitions are exact spans there)."""
        key = (d.start_line, d.text)
        if key not in self.spans:
            # Definitions come in source order (module_chunks asks for all of them first), so on a
            # minified line the search starts at the one before, not at the line's start again.
            at = max(self.offsets[d.start_line - 1], self.last_span_start)
            if not self.text.startswith(d.text, at):
                found = self.text.find(d.text, at)
                if found < 0:
                    found = self.text.find(d.text, self.offsets[d.start_line - 1])
                at = found if found >= 0 else self.offsets[d.start_line - 1]
            self.spans[key] = (at, at + len(d.text))
            self.last_span_start = at
        return self.spans[key]

    def outside(self, lo: int, hi: int, holes: list[tuple[int, int]]) -> list[tuple[int, str]]:
        """(line number, text) of what lies in text[lo:hi] outside every hole: a line no hole
        touches as it is (blank ones too); of a line that a hole cuts (minified code,
        `const a = 1, f = () => {}`), the parts outside it joined by a space, if not blank."""
        parts: dict[int, list[str]] = {}
        pos = lo
        for a, b in sorted(holes) + [(hi, hi)]:
            a, b = min(max(a, lo), hi), min(b, hi)  # Go/Rust methods may lie past a class
            n = bisect.bisect_right(self.offsets, pos) - 1
            while pos < a:  # the gap [pos, a), line by line
                cut = min(a, self.offsets[n + 1])
                parts.setdefault(n + 1, []).append(self.text[pos:cut])
                pos, n = cut, n + 1
            pos = max(pos, b)
        out = []
        for n, pieces in parts.items():
            line = self.lines[n - 1]
            if pieces == [line]:
                out.append((n, line))
            elif "".join(pieces).strip():
                out.append((n, " ".join(pieces)))
        return out

    def module_chunks(self, ex: Extraction, warnings: list[str]) -> list[Chunk]:
        """Module-level code: everything outside the definitions (docstring, imports, constants,
        `if __name__ == ...`), blank runs squeezed. Past one window it is cut into overlapping
        windows (by size only), so a data module is searchable to its last line."""
        kept: list[tuple[int, str]] = []
        for number, line in self.outside(0, self.limit, [self.span_of(d) for d in ex.definitions]):
            if line.strip() or (kept and kept[-1][1].strip()):
                kept.append((number, line))
        while kept and not kept[-1][1].strip():
            kept.pop()
        if not kept:
            return []
        body = "".join(line for _, line in kept)
        parts = module_parts(kept)
        if len(body) > PARENT_MAX_CHARS:  # a data or generated module: many chunks for one file
            warnings.append(f"{self.file_path}: module-level code ({len(body)} chars, lines {kept[0][0]}-"
                            f"{kept[-1][0]}) is over {PARENT_MAX_CHARS} chars; cut into {len(parts)} windows")
        return [self.chunk("module", "child", self.module_qn, 1, self.file_parent_id, first, last,
                           f"module {self.module_qn}", ex.module_summary if part == 1 else "", text,
                           [self.module_id], part=part)  # embedded as it is: the module's words would
                for part, first, last, text in parts]     # draw queries that name one of its definitions

    def class_rest(self, defs: list[Definition], index: int, outline: str, symbol: str,
                   occurrence: int, parent_id: str, node_id: str) -> list[Chunk]:
        """The lines of a class's own body (not its members') that its outline left out (past the
        outline's size cap; a field or comment it shortened), as windows after the outline, so
        all of a class is in some child."""
        lo, hi = self.span_of(defs[index])
        holes = [self.span_of(m) for m in defs if m.owner == index]
        flat = " ".join(outline.split())
        missing = [(n, line) for n, line in self.outside(lo, hi, holes)
                   if line.strip() and " ".join(line.split()) not in flat]
        d = defs[index]
        return [self.chunk("class", "child", symbol, occurrence, parent_id, first, last, d.title, "",
                           text, [node_id], embed_text=code_embed_text(symbol, self.module_qn, text),
                           part=part + 1)
                for part, first, last, text in windows(missing)]

    @property
    def file_parent_id(self) -> str:
        return stable_id(self.source_id, self.file_path, "file", "parent", self.module_qn, 1)


def module_parts(kept: list[tuple[int, str]]) -> list[tuple[int, int, int, str]]:
    """(part, first line, last line, text) of a module's own lines, so that a chunk's lines are
    the lines it holds (a header and the comments between far-apart functions are not one
    300-line hit): blocks of consecutive lines, neighbours merged while the part spans fewer
    than MODULE_SPAN_MAX_LINES lines and fits one window; a longer block is cut into overlapping
    windows of at most that many lines."""
    blocks: list[list[tuple[int, str]]] = []
    for number, line in kept:
        if blocks and number - blocks[-1][-1][0] <= MODULE_GAP_LINES:
            blocks[-1].append((number, line))
        else:
            blocks.append([(number, line)])
    merged: list[list[tuple[int, str]]] = []
    for block in blocks:
        prev = merged[-1] if merged else None
        if prev and block[-1][0] - prev[0][0] < MODULE_SPAN_MAX_LINES \
                and sum(len(x) for _, x in prev + block) <= WINDOW_MAX_CHARS:
            prev.extend(block)
        else:
            merged.append(list(block))
    parts: list[tuple[int, int, int, str]] = []
    for run in merged:
        while len(run) > 1 and not run[-1][1].strip():
            run.pop()
        if run[-1][0] - run[0][0] < MODULE_SPAN_MAX_LINES and sum(len(x) for _, x in run) <= WINDOW_MAX_CHARS:
            pieces = [(1, run[0][0], run[-1][0], "".join(x for _, x in run))]
        else:
            pieces = windows(run, max_lines=MODULE_SPAN_MAX_LINES)
        parts.extend((len(parts) + 1, first, last, text) for _, first, last, text in pieces if text.strip())
    return parts
