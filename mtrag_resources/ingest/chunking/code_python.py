"""Python definitions, imports and calls from the stdlib `ast` (exact spans, no grammar needed).

Every walk here is iterative: a generated file with hundreds of nested blocks must not blow
the interpreter stack in our code (the parser itself may still refuse it; that is a fallback)."""
from __future__ import annotations

import ast
import bisect
import warnings

from mtrag_resources.ingest.chunking.definitions import OUTLINE_MAX_CHARS, Definition, Extraction, first_sentence
from mtrag_resources.ingest.chunking.windows import split_lines
from mtrag_resources.ingest.routes import extract_routes

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
# Statements whose bodies still belong to the enclosing scope (conditional definitions).
_BLOCK_FIELDS = ("body", "orelse", "handlers", "finalbody", "cases")
_TITLE_MAX = 200


def extract_python(file_path: str, text: str, module_qn: str) -> Extraction:
    try:
        with warnings.catch_warnings():  # `"\d"`-style escapes warn; the code is not ours to lint
            warnings.simplefilter("ignore")
            tree = ast.parse(text, filename=file_path)
    except SyntaxError as exc:
        return _fallback(f"{file_path}: SyntaxError line {exc.lineno}: {exc.msg}")
    except (RecursionError, MemoryError, ValueError) as exc:
        return _fallback(f"{file_path}: {type(exc).__name__} while parsing: {exc}")
    try:
        return _PythonFile(file_path, text, module_qn, tree).extract()
    except RecursionError as exc:  # ast.unparse & co. on pathological expressions
        return _fallback(f"{file_path}: RecursionError while extracting: {exc}")


def _fallback(reason: str) -> Extraction:
    return Extraction(fallback=reason, warnings=[f"{reason}; fell back to line windows"])


def _start_line(node: ast.AST) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decorators])


def _dotted(node: ast.AST) -> str | None:
    """`self.helper` / `tax.lookup_rate` / `super().save` for a callee; None when not a name chain."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super":
        parts.append("super()")
    else:
        return None
    return ".".join(reversed(parts))


def _is_declaration(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """No implementation: `@overload`-decorated, or a body of only a docstring, `...`, `pass` and
    `raise NotImplementedError` (Protocol members, abstract methods, stubs)."""
    for deco in node.decorator_list:
        name = _dotted(deco)
        if name and name.rsplit(".", 1)[-1] == "overload":
            return True
    for stmt in node.body:
        if isinstance(stmt, ast.Pass) or isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                and (stmt.value.value is Ellipsis or isinstance(stmt.value.value, str)):
            continue
        if isinstance(stmt, ast.Raise) and stmt.exc is not None:
            exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
            name = _dotted(exc)
            if name and name.rsplit(".", 1)[-1] == "NotImplementedError":
                continue
        return False
    return True


class _PythonFile:
    def __init__(self, file_path: str, text: str, module_qn: str, tree: ast.Module):
        self.file_path, self.module_qn, self.tree = file_path, module_qn, tree
        self.lines = split_lines(text)
        self.is_package = file_path.endswith("__init__.py")

    def extract(self) -> Extraction:
        ex = Extraction(module_summary=first_sentence(ast.get_docstring(self.tree) or ""))
        found = self.find_definitions()
        ex.definitions = [self.definition(node, qualname, owner, found)
                          for node, qualname, owner in found]
        import_nodes = self.collect_calls(ex)
        ex.imports = self.imports(import_nodes)
        ex.routes = extract_routes(self.tree, self.module_qn, self.file_path, self.lines)
        return ex

    # -- definitions ---------------------------------------------------------------------
    def find_definitions(self) -> list[tuple[ast.AST, str, int | None]]:
        """(node, qualname, owner index) for every class, and every function not nested in a
        function, in source order. Functions inside functions fold into their enclosing one."""
        raw: list[tuple[ast.AST, str, ast.AST | None]] = []
        stack: list[tuple[ast.AST, str, ast.AST | None]] = [
            (stmt, "", None) for stmt in reversed(self.tree.body)]
        while stack:
            node, prefix, owner = stack.pop()
            if isinstance(node, _DEFS):
                raw.append((node, prefix + node.name, owner))
                if isinstance(node, ast.ClassDef):
                    stack.extend((s, f"{prefix}{node.name}.", node) for s in reversed(node.body))
                continue
            if isinstance(node, ast.stmt):
                for name in _BLOCK_FIELDS:
                    for child in reversed(getattr(node, name, None) or []):
                        stack.append((child, prefix, owner))
            elif isinstance(node, (ast.ExceptHandler, ast.match_case)):
                stack.extend((s, prefix, owner) for s in reversed(node.body))
        raw.sort(key=lambda item: (_start_line(item[0]), item[0].col_offset))
        index = {id(node): i for i, (node, _, _) in enumerate(raw)}
        return [(node, qualname, index[id(owner)] if owner is not None else None)
                for node, qualname, owner in raw]

    def definition(self, node, qualname, owner, found) -> Definition:
        start, end = _start_line(node), node.end_lineno
        is_class = isinstance(node, ast.ClassDef)
        in_class = owner is not None and isinstance(found[owner][0], ast.ClassDef)
        kind = "class" if is_class else ("method" if in_class else "function")
        d = Definition(
            kind=kind, name=node.name, qualname=qualname, start_line=start, end_line=end,
            text="".join(self.lines[start - 1:end]), title=self.title(node),
            summary=self.summary(node, start), owner=owner,
        )
        if is_class:
            d.outline = self.outline(node)
            d.bases = [(b, line) for b, line in
                       ((_dotted(base), base.lineno) for base in node.bases) if b]
        else:
            d.declaration = _is_declaration(node)
        return d

    def title(self, node) -> str:
        try:
            if isinstance(node, ast.ClassDef):
                args = [ast.unparse(b) for b in node.bases]
                args += [f"{k.arg}={ast.unparse(k.value)}" if k.arg else f"**{ast.unparse(k.value)}"
                         for k in node.keywords]
                title = f"class {node.name}({', '.join(args)})" if args else f"class {node.name}"
            else:
                prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
                returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
                title = f"{prefix} {node.name}({ast.unparse(node.args)}){returns}"
        except (RecursionError, ValueError):
            title = self.lines[node.lineno - 1].strip().rstrip(":")
        return " ".join(title.split())[:_TITLE_MAX]

    def summary(self, node, start: int) -> str:
        doc = ast.get_docstring(node)
        if doc:
            return first_sentence(doc)
        comments: list[str] = []  # a `# ...` block right above the definition
        number = start - 1
        while number >= 1 and self.lines[number - 1].strip().startswith("#"):
            comments.insert(0, self.lines[number - 1].strip().lstrip("#").strip())
            number -= 1
        return first_sentence("\n".join(comments))

    def outline(self, node: ast.ClassDef) -> str:
        """The class's own source with its members' bodies elided, so the class child stays small
        yet holds all of the class's own text: header, docstring, fields, comments (`#:` attribute
        docs), the statements under `if`/`try`; a method keeps its signature, then `...`; a nested
        class its header line (its own outline has the rest). Blank lines between statements go."""
        start, end = _start_line(node), node.end_lineno
        if node.body[0].lineno == node.lineno:  # `class A: pass`
            return "".join(self.lines[start - 1:end])
        drop: set[int] = set()           # lines of member bodies
        ellipsis: dict[int, str] = {}    # a method's last signature line -> the `...` after it
        blank_ok: set[int] = set()       # lines of simple statements (a docstring's blank lines)
        stack = list(node.body)
        while stack:
            stmt = stack.pop()
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                sig_end = stmt.body[0].lineno - 1 if stmt.body[0].lineno > stmt.lineno else stmt.lineno
                drop.update(range(sig_end + 1, stmt.end_lineno + 1))
                if sig_end < stmt.end_lineno:
                    ellipsis[sig_end] = f"{self.lines[stmt.lineno - 1][: stmt.col_offset]}    ...\n"
            elif isinstance(stmt, ast.ClassDef):
                drop.update(range(stmt.lineno + 1, stmt.end_lineno + 1))
            elif isinstance(stmt, (ast.ExceptHandler, ast.match_case)):
                stack.extend(stmt.body)
            elif any(getattr(stmt, name, None) for name in _BLOCK_FIELDS):
                stack.extend(s for name in _BLOCK_FIELDS for s in getattr(stmt, name, None) or [])
            else:
                blank_ok.update(range(_start_line(stmt), stmt.end_lineno + 1))
        out = []
        for number in range(start, end + 1):
            line = self.lines[number - 1]
            if number in drop or (not line.strip() and number not in blank_ok):
                continue
            out.append(line)
            if number in ellipsis:
                out.append(ellipsis[number])
        text = "".join(out)
        if len(text) > OUTLINE_MAX_CHARS:  # `code.class_rest` windows what the cap leaves out
            text = text[: text.rfind("\n", 0, OUTLINE_MAX_CHARS) + 1] + "    ...\n"
        return text

    # -- facts ---------------------------------------------------------------------------
    def snippet(self, node: ast.AST) -> str:
        line = self.lines[node.lineno - 1].encode("utf-8")
        end = node.end_col_offset if node.end_lineno == node.lineno else len(line)
        return line[node.col_offset:end].decode("utf-8", "replace").strip()[:120]

    def collect_calls(self, ex: Extraction) -> list[ast.AST]:
        """One walk over the tree: every callee name chain goes to the innermost definition
        whose lines hold it (first occurrence of each), or to the module; class-body code
        (run at definition time) belongs to the class. A decorator counts as a call of the
        decorated function (it is one: `f = deco(f)`). Returns the import statements seen."""
        defs = ex.definitions
        starts = [d.start_line for d in defs]
        found: dict[int | None, dict[str, tuple[str, int, str]]] = {}
        import_nodes = []
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call):
                sites = [(node.func, node)]
            elif isinstance(node, _DEFS):
                sites = [(d, d) for d in node.decorator_list if not isinstance(d, ast.Call)]
            else:
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    import_nodes.append(node)
                continue
            for func, site in sites:
                expr = _dotted(func)
                if not expr:
                    continue
                # defs nest by lines, and a definition's container is its owner
                index = bisect.bisect_right(starts, site.lineno) - 1
                owner = index if index >= 0 else None
                while owner is not None and defs[owner].end_line < site.lineno:
                    owner = defs[owner].owner
                calls = found.setdefault(owner, {})
                if expr not in calls or site.lineno < calls[expr][1]:
                    calls[expr] = (expr, site.lineno, self.snippet(site))
        for owner, calls in found.items():
            ordered = sorted(calls.values(), key=lambda call: (call[1], call[0]))
            if owner is None:
                ex.module_calls = ordered
            else:
                defs[owner].calls = ordered
        return import_nodes

    def package_for(self, level: int) -> str:
        parts = self.module_qn.split(".") if self.module_qn else []
        if not self.is_package:
            parts = parts[:-1]
        return ".".join(parts[: max(0, len(parts) - (level - 1))])

    def imports(self, import_nodes: list[ast.AST]) -> list[dict]:
        facts = []
        for node in import_nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    bound = alias.name if alias.asname else alias.name.split(".")[0]
                    facts.append(dict(kind="import", imported=alias.name, from_module="",
                                      name="", alias=alias.asname or bound, bound=bound,
                                      line=node.lineno, text=self.snippet(node)))
            elif isinstance(node, ast.ImportFrom):
                base = self.package_for(node.level) if node.level else ""
                module = ".".join(p for p in (base, node.module or "") if p)
                for alias in node.names:
                    if alias.name == "*":
                        facts.append(dict(kind="star", imported=module, from_module=module,
                                          name="*", alias="", bound=module, line=node.lineno,
                                          text=self.snippet(node)))
                        continue
                    target = f"{module}.{alias.name}" if module else alias.name
                    facts.append(dict(kind="from", imported=target, from_module=module,
                                      name=alias.name, alias=alias.asname or alias.name,
                                      bound=target, line=node.lineno, text=self.snippet(node)))
        return sorted(facts, key=lambda f: f["line"])
