"""JavaScript, TypeScript/TSX, Java, Go and Rust definitions, imports and calls via tree-sitter.

The grammars come from the installed wheels (never downloaded). One walker serves all five
languages: their node types barely overlap, so a node type decides what a node is. Walks are
iterative so deeply nested code cannot exhaust the Python stack."""
from __future__ import annotations

import bisect
import functools
import posixpath
import re

from tree_sitter import Language, Node, Parser, Query, QueryCursor

from mtrag_resources.ingest.chunking.definitions import OUTLINE_MAX_CHARS, Definition, Extraction, first_sentence
from mtrag_resources.ingest.chunking.windows import split_lines


@functools.cache
def _language(name: str) -> Language:
    if name == "javascript":
        import tree_sitter_javascript as grammar
        return Language(grammar.language())
    if name in ("typescript", "tsx"):
        import tree_sitter_typescript as grammar
        return Language(grammar.language_tsx() if name == "tsx" else grammar.language_typescript())
    if name == "java":
        import tree_sitter_java as grammar
    elif name == "go":
        import tree_sitter_go as grammar
    elif name == "rust":
        import tree_sitter_rust as grammar
    else:
        raise ValueError(f"no tree-sitter grammar for {name!r}")
    return Language(grammar.language())


_FUNCTIONS = {"function_declaration", "generator_function_declaration", "function_item"}
_METHODS = {"method_definition", "method_declaration", "constructor_declaration"}
_CLASSES = {"class_declaration", "abstract_class_declaration", "interface_declaration",
            "enum_declaration", "record_declaration", "struct_item", "enum_item", "trait_item",
            "union_item", "type_spec"}
# Nodes whose children are still at the same scope as the node itself.
_CONTAINERS = {"program", "source_file", "export_statement", "type_declaration", "class_body",
               "interface_body", "enum_body", "enum_body_declarations", "ambient_declaration",
               "expression_statement"}
_FUNCTION_VALUES = {"arrow_function", "function_expression", "function", "generator_function"}
_COMMENTS = {"comment", "line_comment", "block_comment"}
_BLOCKS = {"statement_block", "block", "constructor_body"}
_IDENTIFIERS = {"identifier", "property_identifier", "field_identifier", "type_identifier",
                "private_property_identifier", "package_identifier", "shorthand_property_identifier"}
# (receiver field, name field) of member-access nodes, per grammar.
_MEMBER_FIELDS = {
    "member_expression": ("object", "property"),
    "selector_expression": ("operand", "field"),
    "field_expression": ("value", "field"),
    "field_access": ("object", "field"),
    "scoped_identifier": ("path", "name"),
    "method_invocation": ("object", "name"),
}
# Call-like node -> the field holding the callee (None: the node itself is the member chain).
_CALLS = {"call_expression": "function", "new_expression": "constructor",
          "object_creation_expression": "type", "method_invocation": None,
          "composite_literal": "type", "struct_expression": "name"}
_IMPORT_SCOPES = {"program", "source_file", "export_statement", "lexical_declaration",
                  "variable_declaration", "mod_item", "declaration_list"}
_NAME_CHAIN = re.compile(r"^[A-Za-z_$][\w$]*(\.[A-Za-z_$][\w$]*)*$")
_TITLE_MAX = 200


@functools.cache
def _call_query(name: str) -> Query:
    language = _language(name)
    kinds = [kind for kind in _CALLS if language.id_for_node_kind(kind, True)]
    return Query(language, "[" + " ".join(f"({kind})" for kind in kinds) + "] @call")


def extract_treesitter(file_path: str, text: str, language: str, module_qn: str,
                       max_definitions: int | None = None) -> Extraction:
    """The file's definitions, imports and calls; past `max_definitions` definitions the walk
    stops (`more_definitions`), and the calls after the last one are not read."""
    return _TreeSitterFile(file_path, text, language, module_qn).extract(max_definitions)


def _end_line(node: Node) -> int:
    """1-based last line; a node ending at column 0 (a comment with its newline) ends a line earlier."""
    row, column = node.end_point
    return max(node.start_point[0] + 1, row + (1 if column > 0 else 0))


def _comment_text(raw: str) -> str:
    out = []
    for line in raw.splitlines():
        line = line.strip()
        line = re.sub(r"^(/\*\*|/\*|///|//!|//)", "", line)
        line = re.sub(r"\*/$", "", line).strip()
        out.append(line[1:].strip() if line.startswith("*") else line)
    return "\n".join(out)


# A byte that bytes.strip() keeps, searched in place: slicing the rest of a line to strip it, once
# per definition, is quadratic on a minified line of thousands of definitions.
_NON_BLANK = re.compile(rb"[^ \t\n\r\x0b\x0c]")
_NON_BLANK_OR_NEWLINE = re.compile(rb"[^ \t\r\x0b\x0c]")


class _TreeSitterFile:
    def __init__(self, file_path: str, text: str, language: str, module_qn: str):
        self.file_path, self.language, self.module_qn = file_path, language, module_qn
        self.src = text.encode("utf-8")
        self.lines = split_lines(text)
        self.tree = Parser(_language(language)).parse(self.src)
        self.defs: list[Definition] = []
        self.nodes: list[Node] = []          # the definition node behind each Definition
        self.spans: list[Node] = []          # the outermost node (export wrapper) of each

    def text_of(self, node: Node) -> str:
        return self.src[node.start_byte:node.end_byte].decode("utf-8", "replace")

    # -- the walk ------------------------------------------------------------------------
    def extract(self, max_definitions: int | None = None) -> Extraction:
        root = self.tree.root_node
        stack: list[tuple[Node, str, int | None, str, Node | None]] = [
            (child, "", None, "", None) for child in reversed(root.named_children)]
        stop = None  # the byte the walk stopped at (a minified bundle past the caller's limit)
        while stack:
            if max_definitions is not None and len(self.defs) > max_definitions:
                stop = max(span.end_byte for span in self.spans)
                break
            node, prefix, owner, class_name, span = stack.pop()
            pushed = self.visit(node, prefix, owner, class_name, span or node)
            stack.extend(reversed(pushed))
        ex = Extraction()
        errors = self.error_lines(root) if root.has_error else []
        if errors and not self.defs:
            reason = f"{self.file_path}: tree-sitter syntax errors from line {errors[0]}"
            return Extraction(fallback=reason, warnings=[f"{reason}; fell back to line windows"])
        if errors:
            ex.warnings.append(f"{self.file_path}: tree-sitter syntax errors at {len(errors)} "
                               f"place(s), first line {errors[0]}; kept the definitions that parsed")
        calls = self.assign_calls(root, stop)
        ex.more_definitions = stop is not None
        for index, d in enumerate(self.defs):
            d.calls = self.call_facts(calls.get(index, []), self.receiver_name(self.nodes[index]))
            if d.kind == "class":
                d.outline = self.outline(index)
        ex.definitions = self.defs
        ex.module_calls = self.call_facts(calls.get(None, []), "")
        ex.imports = self.imports(root)
        return ex

    # Each visitor records `node` if it defines something and returns the children to walk
    # next as (node, qualname prefix, owner index, implementing type name, wrapper span).
    def visit(self, node, prefix, owner, class_name, span) -> list[tuple]:
        t = node.type
        if t in _CLASSES:
            return self.visit_class(node, prefix, owner, span)
        if t == "method_declaration" and self.language == "go":
            return self.visit_go_method(node, prefix, span)
        if t in _FUNCTIONS or t in _METHODS:
            in_class = bool(class_name) or owner is not None and self.defs[owner].kind == "class"
            name = self.name_of(node)
            if name:
                kind = "method" if in_class or t in _METHODS else "function"
                index = self.add(kind, name, prefix + name, owner, node, span)
                self.defs[index].class_name = class_name
            return []
        if t == "impl_item":
            return self.visit_rust_impl(node, prefix)
        if t in ("mod_item", "internal_module", "module"):  # Rust `mod m {}`, TS `namespace N {}`
            name, body = self.name_of(node).strip("'\""), node.child_by_field_name("body")
            return [(c, f"{prefix}{name}.", None, "", None)
                    for c in (body.named_children if body else [])]
        if t in ("lexical_declaration", "variable_declaration") and not class_name:
            self.visit_js_variables(node, prefix, owner, span)
            return []
        if t in _CONTAINERS:
            # The wrapper (`export ...`, a one-spec Go `type X struct`) is part of the definition.
            wrapper = span if t == "export_statement" else None
            if t == "type_declaration" and len(node.named_children) == 1:
                wrapper = node
            return [(c, prefix, owner, class_name, None if c.type in _COMMENTS else wrapper)
                    for c in node.named_children if c.type != "decorator"]
        return []

    def visit_class(self, node, prefix, owner, span) -> list[tuple]:
        name = self.name_of(node)
        if not name:
            return []
        index = self.add("class", name, prefix + name, owner, node, span)
        self.defs[index].bases = self.bases(node)
        body = node.child_by_field_name("body")
        return [(c, f"{prefix}{name}.", index, "", None)
                for c in (body.named_children if body else [])]

    def visit_go_method(self, node, prefix, span) -> list[tuple]:
        """`func (c *Cart) Total()` is `Cart.Total`, under the Cart class when it is in this file."""
        receiver = self.type_name(node.child_by_field_name("receiver"))
        name = self.name_of(node)
        if receiver and name:
            owner = self.find_class(prefix + receiver)
            index = self.add("method", name, f"{prefix}{receiver}.{name}", owner, node, span)
            self.defs[index].class_name = receiver
        return []

    def visit_rust_impl(self, node, prefix) -> list[tuple]:
        """`impl [Trait for] Type { fn ... }`: the functions are methods of Type; a trait impl
        is recorded as a base of Type when Type is declared in this file."""
        type_name = self.type_name(node.child_by_field_name("type"))
        body = node.child_by_field_name("body")
        if not type_name or body is None:
            return []
        owner = self.find_class(prefix + type_name)
        trait = self.type_name(node.child_by_field_name("trait"))
        if trait and owner is not None:
            self.defs[owner].bases.append((trait, node.start_point[0] + 1))
        return [(c, f"{prefix}{type_name}.", owner, type_name, None) for c in body.named_children]

    def visit_js_variables(self, node, prefix, owner, span) -> None:
        """`const total = (x) => ...` / `let f = function () {}` define functions too."""
        for declarator in node.named_children:
            value = declarator.child_by_field_name("value")
            name = declarator.child_by_field_name("name")
            if value is None or value.type not in _FUNCTION_VALUES or name is None \
                    or name.type != "identifier":
                continue
            outer = span if len(node.named_children) == 1 else declarator
            self.add("function", self.text_of(name), prefix + self.text_of(name), owner,
                     declarator, outer)

    def add(self, kind, name, qualname, owner, node, span) -> int:
        start_node, doc = self.leading(span)
        start, end = start_node.start_point[0] + 1, _end_line(span)
        self.defs.append(Definition(
            kind=kind, name=name, qualname=qualname, start_line=start, end_line=end,
            text=self.source(self.line_begin(start_node), span.end_byte),
            title=self.title(node),
            summary=first_sentence(doc), owner=owner,
            declaration=kind != "class" and self.bodiless(node),
        ))
        self.nodes.append(node)
        self.spans.append(span)
        return len(self.defs) - 1

    @staticmethod
    def bodiless(node: Node) -> bool:
        """A declaration only: no body (an interface or abstract method, a trait signature) or an
        empty block."""
        if node.type == "variable_declarator":
            value = node.child_by_field_name("value")
            node = value if value is not None else node
        body = node.child_by_field_name("body")
        if body is None:
            return True
        return body.type in _BLOCKS and all(c.type in _COMMENTS for c in body.named_children)

    def line_begin(self, node: Node) -> int:
        """`node`'s first byte, or the start of its line when only indentation precedes it."""
        start = node.start_byte
        line_start = start - node.start_point[1]  # the column, in bytes
        return start if _NON_BLANK.search(self.src, line_start, start) else line_start

    def source(self, start: int, end: int) -> str:
        """Source from `start` to `end`, plus the rest of the last line when that is blank.
        Whole lines for ordinary code; exact spans for minified code, where one line may hold
        hundreds of definitions."""
        after = _NON_BLANK_OR_NEWLINE.search(self.src, end)
        if after is None:
            end = len(self.src)
        elif after.group() == b"\n":
            end = after.end()
        return self.src[start:end].decode("utf-8", "replace")

    def extent(self, span: Node) -> tuple[int, int]:
        """The bytes of a definition's text (`add`): from its doc comment to its end."""
        start = self.line_begin(self.leading(span)[0])
        return start, start + len(self.source(start, span.end_byte).encode("utf-8"))

    def find_class(self, qualname: str) -> int | None:
        for index, d in enumerate(self.defs):
            if d.kind == "class" and d.qualname == qualname:
                return index
        return None

    # -- names, titles, docs -------------------------------------------------------------
    def name_of(self, node: Node) -> str:
        name = node.child_by_field_name("name")
        return self.text_of(name) if name is not None else ""

    def type_name(self, node: Node | None) -> str:
        """`*Cart`, `Cart<T>`, `(c *Cart)`, `java.util.List<String>`, `fmt::Display` -> dotted name."""
        if node is None:
            return ""
        raw = self.text_of(node)
        if node.type == "parameter_list":  # Go receiver `(c *Cart[T])`
            raw = raw.strip("()").split()[-1] if raw.strip("()").split() else ""
        raw = re.sub(r"<.*>|\[.*\]", "", raw, flags=re.S)
        raw = re.sub(r"^(&|\*|mut\s+|dyn\s+)+", "", raw.strip()).replace("::", ".")
        raw = "".join(raw.split())
        return raw if _NAME_CHAIN.match(raw) else ""

    def title(self, node: Node) -> str:
        body = node.child_by_field_name("body")
        if node.type == "variable_declarator":
            value = node.child_by_field_name("value")
            body = value.child_by_field_name("body") if value is not None else None
        start = node.start_byte
        if node.type == "variable_declarator" and node.parent is not None:
            start = node.parent.start_byte          # keep `const` / `let`
        if node.type == "type_spec":                # Go: `type Cart struct`, `type ID int`
            raw = "type " + self.text_of(node).split("{", 1)[0]
        else:
            end = body.start_byte if body is not None else node.end_byte
            raw = self.src[start:end].decode("utf-8", "replace")
        return " ".join(raw.split()).rstrip("{;").rstrip()[:_TITLE_MAX]

    def leading(self, span: Node) -> tuple[Node, str]:
        """The first node of the definition including the comment block and attributes
        (`#[derive]`) right above it, and that comment block's text."""
        first, docs = span, []
        sibling = span.prev_named_sibling
        while sibling is not None and sibling.type in _COMMENTS | {"attribute_item", "decorator"} \
                and _end_line(sibling) >= first.start_point[0]:
            column = sibling.start_point[1]
            if _NON_BLANK.search(self.src, sibling.start_byte - column, sibling.start_byte):  # trails the previous statement
                break
            if sibling.type in _COMMENTS:
                docs.insert(0, _comment_text(self.text_of(sibling)))
            first, sibling = sibling, sibling.prev_named_sibling
        return first, "\n".join(docs)

    def receiver_name(self, node: Node) -> str:
        """Go: the receiver variable (`c` in `func (c *Cart)`), which plays `self`."""
        if self.language != "go" or node.type != "method_declaration":
            return ""
        receiver = node.child_by_field_name("receiver")
        for param in receiver.named_children if receiver is not None else []:
            name = param.child_by_field_name("name")
            if name is not None:
                return self.text_of(name)
        return ""

    def outline(self, index: int) -> str:
        """The class's own source, its members elided: doc comment, header, fields and free
        comments as they are; a member becomes its signature and `{ ... }` (Go/Rust methods, which
        live outside the type, are listed before its closing line). Blank lines go; capped, and
        `code.class_rest` windows what the cap leaves out."""
        span, d = self.spans[index], self.defs[index]
        members = [i for i, m in enumerate(self.defs) if m.owner == index]
        if not members:
            return d.text
        lo, hi = self.extent(self.spans[index])
        inside, outside = [], []
        for i in members:
            a, b = self.extent(self.spans[i])
            (inside if lo <= a and b <= hi else outside).append((a, b, i))
        parts, pos = [], lo
        for a, b, i in sorted(inside):
            if a < pos:  # cannot happen for direct members; never emit a byte twice
                continue
            member = self.src[a:b].decode("utf-8", "replace")
            indent = member[: len(member) - len(member.lstrip(" \t"))]
            parts += [self.src[pos:a].decode("utf-8", "replace"),
                      f"{indent}{self.defs[i].title} {{ ... }}" + ("\n" if member.endswith("\n") else "")]
            pos = b
        parts.append(self.src[pos:hi].decode("utf-8", "replace"))
        lines = [line for line in "".join(parts).splitlines(keepends=True) if line.strip()]
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        extra = [f"    {self.defs[i].title} {{ ... }}\n" for _, _, i in sorted(outside)]
        at = len(lines) - 1 if lines and lines[-1].strip() in ("}", "};") else len(lines)
        text = "".join(lines[:at] + extra + lines[at:])
        if len(text) > OUTLINE_MAX_CHARS:
            text = text[: text.rfind("\n", 0, OUTLINE_MAX_CHARS) + 1 or OUTLINE_MAX_CHARS]
        return text

    # -- facts ---------------------------------------------------------------------------
    def error_lines(self, root: Node) -> list[int]:
        lines, stack = [], [root]
        while stack:
            node = stack.pop()
            if node.is_error or node.is_missing:
                lines.append(node.start_point[0] + 1)
            elif node.has_error:
                stack.extend(node.children)
        return sorted(lines)

    def bases(self, node: Node) -> list[tuple[str, int]]:
        found: list[Node] = []
        for child in node.named_children:
            if child.type == "class_heritage":  # JS: the expression; TS: extends/implements
                for part in child.named_children:
                    found += part.named_children if part.type.endswith("_clause") else [part]
            elif child.type in ("superclass", "super_interfaces", "extends_interfaces"):
                for part in child.named_children:
                    found += part.named_children if part.type == "type_list" else [part]
        if node.type == "type_spec":  # Go struct embedding: a field with a type and no name
            struct = node.child_by_field_name("type")
            fields = struct.named_children[0].named_children if struct is not None and \
                struct.type == "struct_type" and struct.named_children else []
            found += [f.child_by_field_name("type") for f in fields
                      if f.type == "field_declaration" and f.child_by_field_name("name") is None]
        out = []
        for base in found:
            if base is not None and base.type != "type_arguments" and self.type_name(base):
                out.append((self.type_name(base), base.start_point[0] + 1))
        return out

    def chain(self, node: Node | None, receiver: str) -> str:
        """`this.sub` -> `self.sub`, `tax::rate` -> `tax.rate`, `c.sub` (Go receiver c) ->
        `self.sub`; "" when the callee is not a plain name chain."""
        parts: list[str] = []
        for _ in range(64):
            if node is None:
                return ""
            t = node.type
            if t in ("this", "self") or (t == "type_identifier" and self.text_of(node) == "Self"):
                parts.append("self")
                break
            if t in ("super", "crate"):
                parts.append(t)
                break
            if t in _IDENTIFIERS:
                name = self.text_of(node)
                parts.append("self" if receiver and name == receiver else name)
                break
            if t in ("generic_type", "scoped_type_identifier", "qualified_type"):
                name = self.type_name(node)
                if not name:
                    return ""
                parts.append(name)
                break
            if t in _MEMBER_FIELDS:
                object_field, name_field = _MEMBER_FIELDS[t]
                name = node.child_by_field_name(name_field)
                if name is None:
                    return ""
                parts.append(self.text_of(name))
                node = node.child_by_field_name(object_field)
                if node is None:       # Java `helper()`, Rust `::f`
                    break
                continue
            return ""
        expr = ".".join(reversed(parts))
        return expr if _NAME_CHAIN.match(expr) else ""

    def assign_calls(self, root: Node, stop: int | None = None) -> dict[int | None, list[Node]]:
        """Every call-like node (found by a tree-sitter query, in C) before byte `stop` -> the
        innermost extracted definition whose span holds it; None for module-level calls."""
        order = sorted(range(len(self.spans)),
                       key=lambda i: (self.spans[i].start_byte, -self.spans[i].end_byte))
        parent: dict[int, int | None] = {}
        open_spans: list[int] = []
        for i in order:  # spans nest (or are disjoint); a stack gives each its container
            while open_spans and self.spans[open_spans[-1]].end_byte < self.spans[i].end_byte:
                open_spans.pop()
            parent[i] = open_spans[-1] if open_spans else None
            open_spans.append(i)
        starts = [self.spans[i].start_byte for i in order]
        found: dict[int | None, list[Node]] = {}
        cursor = QueryCursor(_call_query(self.language))
        if stop is not None:
            cursor.set_byte_range(0, stop)
        captures = cursor.captures(root).get("call", [])
        for node in captures:
            k = bisect.bisect_right(starts, node.start_byte) - 1
            owner = order[k] if k >= 0 else None
            while owner is not None and self.spans[owner].end_byte < node.end_byte:
                owner = parent[owner]
            found.setdefault(owner, []).append(node)
        return found

    def call_facts(self, nodes: list[Node], receiver: str) -> list[tuple[str, int, str]]:
        """(callee expression, line, call text), first occurrence of each callee."""
        found: dict[str, tuple[str, int, str]] = {}
        for node in sorted(nodes, key=lambda n: n.start_byte):
            field = _CALLS[node.type]
            expr = self.chain(node if field is None else node.child_by_field_name(field), receiver)
            if expr and expr not in ("super", "self") and expr not in found:
                snippet = self.text_of(node).split("\n", 1)[0].strip()[:120]
                found[expr] = (expr, node.start_point[0] + 1, snippet)
        return sorted(found.values(), key=lambda call: (call[1], call[0]))

    def imports(self, root: Node) -> list[dict]:
        """Imports at declaration level (top level, `export`, Rust `mod` bodies, `const x =
        require(...)`); imports inside function bodies are rare and not worth a full walk."""
        handlers = {
            "import_statement": self.js_import, "import_declaration": self.java_or_go_import,
            "use_declaration": self.rust_use, "variable_declarator": self.js_require,
        }
        facts: list[dict] = []
        stack = [root]
        while stack:
            node = stack.pop()
            handler = handlers.get(node.type)
            if handler is not None:
                line, text = node.start_point[0] + 1, self.text_of(node).split("\n", 1)[0][:120]
                facts += [{"line": line, "text": text, **fact} for fact in handler(node)]
            elif node.type in _IMPORT_SCOPES:
                stack.extend(node.named_children)
        return sorted(facts, key=lambda f: f["line"])

    @staticmethod
    def _fact(kind, imported, alias, bound, from_module="", name=""):
        return dict(kind=kind, imported=imported, from_module=from_module, name=name,
                    alias=alias, bound=bound)

    def js_module(self, specifier: str) -> str:
        """`./tax` from `web/src/cart.ts` -> `web.src.tax`; packages stay as written."""
        if not specifier.startswith("."):
            return specifier
        path = posixpath.normpath(posixpath.join(posixpath.dirname(self.file_path), specifier))
        path = re.sub(r"\.(m?[jt]sx?|cjs)$", "", path)
        return path.strip("/").replace("/", ".")

    def js_import(self, node: Node) -> list[dict]:
        source = node.child_by_field_name("source")
        if source is None:
            return []
        module = self.js_module(self.text_of(source).strip("'\"`"))
        facts = []
        for clause in (c for c in node.named_children if c.type == "import_clause"):
            for part in clause.named_children:
                if part.type == "identifier":       # default import
                    alias = self.text_of(part)
                    facts.append(self._fact("default", module, alias, f"{module}.{alias}", module, "default"))
                elif part.type == "namespace_import" and part.named_children:
                    facts.append(self._fact("import", module, self.text_of(part.named_children[-1]), module))
                elif part.type == "named_imports":
                    for spec in part.named_children:
                        name = spec.child_by_field_name("name")
                        alias = spec.child_by_field_name("alias") or name
                        if name is not None:
                            target = f"{module}.{self.text_of(name)}"
                            facts.append(self._fact("from", target, self.text_of(alias), target,
                                                    module, self.text_of(name)))
        return facts or [self._fact("import", module, "", module)]

    def js_require(self, node: Node) -> list[dict]:
        value, name = node.child_by_field_name("value"), node.child_by_field_name("name")
        if self.language not in ("javascript", "typescript", "tsx") or value is None \
                or value.type != "call_expression" or name is None or name.type != "identifier":
            return []
        function, arguments = value.child_by_field_name("function"), value.child_by_field_name("arguments")
        if function is None or self.text_of(function) != "require" or arguments is None \
                or not arguments.named_children or arguments.named_children[0].type != "string":
            return []
        module = self.js_module(self.text_of(arguments.named_children[0]).strip("'\"`"))
        return [self._fact("import", module, self.text_of(name), module)]

    def java_or_go_import(self, node: Node) -> list[dict]:
        if self.language == "go":
            facts = []
            specs = [n for n in _descendants(node) if n.type == "import_spec"]
            for spec in specs:
                path = self.text_of(spec.child_by_field_name("path")).strip('"`')
                alias_node = spec.child_by_field_name("name")
                alias = self.text_of(alias_node) if alias_node is not None else path.rsplit("/", 1)[-1]
                kind = "star" if alias == "." else "import"
                fact = self._fact(kind, path, "" if alias in (".", "_") else alias, path)
                fact.update(line=spec.start_point[0] + 1, text=self.text_of(spec)[:120])
                facts.append(fact)
            return facts
        names = [c for c in node.named_children if c.type in ("scoped_identifier", "identifier")]
        if not names:
            return []
        dotted = self.text_of(names[0])
        if any(c.type == "asterisk" for c in node.named_children):
            return [self._fact("star", dotted, "", dotted, dotted, "*")]
        head, _, last = dotted.rpartition(".")
        return [self._fact("from", dotted, last, dotted, head, last)]

    def rust_use(self, node: Node) -> list[dict]:
        """Flatten a `use` tree into (path, alias) facts: `use crate::a::{b, c as d, e::*}`."""
        facts = []
        stack = [(node.child_by_field_name("argument"), "")]
        while stack:
            tree, prefix = stack.pop()
            if tree is None:
                continue
            t = tree.type
            join = lambda tail: ".".join(p for p in (prefix, tail) if p)  # noqa: E731
            if t in ("identifier", "scoped_identifier", "crate", "self", "super"):
                path = join(self.text_of(tree).replace("::", "."))
                head, _, last = path.rpartition(".")
                if last == "self":  # `use a::b::{self}` binds b
                    path, (head, _, last) = head, head.rpartition(".")
                facts.append(self._fact("from", path, last, path, head, last))
            elif t == "use_as_clause":
                path = join(self.text_of(tree.child_by_field_name("path")).replace("::", "."))
                alias = self.text_of(tree.child_by_field_name("alias"))
                head, _, last = path.rpartition(".")
                facts.append(self._fact("from", path, alias, path, head, last))
            elif t == "use_wildcard":
                inner = tree.named_children[0] if tree.named_children else None
                path = join(self.text_of(inner).replace("::", ".")) if inner is not None else prefix
                facts.append(self._fact("star", path, "", path, path, "*"))
            elif t == "scoped_use_list":
                path = tree.child_by_field_name("path")
                base = join(self.text_of(path).replace("::", ".")) if path is not None else prefix
                stack.append((tree.child_by_field_name("list"), base))
            elif t == "use_list":
                stack.extend((child, prefix) for child in tree.named_children)
        return facts


def _descendants(node: Node):
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(current.named_children)
