"""Web routes found statically with Python's `ast` (the app is never imported): Flask, FastAPI and
Django. Two pure steps:

* `extract_routes(tree, module_qn)`, per Python file (code_python calls it on the tree it parsed):
  facts, each a dict with `fact` one of
  - `router`: an app or router object, `name = Flask(...)` / `Blueprint(..., url_prefix=)` /
    `FastAPI(...)` / `APIRouter(prefix=)`, or a Django pattern list (`urlpatterns = [...]`, and any
    list of `path()` calls in a `urls.py`), with its own prefix;
  - `route`: one declaration: `@app.route(rule, methods=[...])` (default GET), `@bp.get(...)` and
    the other method shortcuts (Flask 2+, FastAPI), `@app.api_route(path, methods=)`,
    `add_url_rule(rule, endpoint, view_func, methods=)`, `add_api_route(path, endpoint, methods=)`,
    Django `path()` / `re_path()` / `url()` (method `ANY`); its router (an expression as written),
    path, methods and handler (the decorated definition's qualified name, or an expression:
    `views.login`, `SomeView` for `SomeView.as_view()`);
  - `mount`: `register_blueprint(bp, url_prefix=)` (Flask: the mount's prefix replaces the
    blueprint's own), `include_router(router, prefix=)` / `mount(path, app)` (FastAPI: the mount's
    prefix goes before the router's own), Django `path(prefix, include(...))` (a module string,
    a pattern list, or an inline list).
  Only what is written as constants counts: a prefix or path built at run time is not guessed.
* `compose_endpoints(facts, aliases)`, per source: routers resolved across files through the import
  aliases (`from .auth import bp`, a Django include string by module name), prefixes composed along
  the mounts (a router mounted nowhere is a root), one endpoint per (route, prefix, method) named
  `METHOD /path`. The code graph then resolves each handler the way it resolves a call."""
from __future__ import annotations

import ast
import posixpath
import re

HTTP_METHODS = ("get", "post", "put", "delete", "patch", "head", "options", "trace")
# constructor name -> (framework, keyword of its own prefix)
ROUTER_CLASSES = {"Flask": ("flask", ""), "Blueprint": ("flask", "url_prefix"),
                  "FastAPI": ("fastapi", ""), "APIRouter": ("fastapi", "prefix")}
DJANGO_PATTERNS = ("path", "re_path", "url")
ANY = "ANY"
_MAX_PREFIXES = 32   # mounts of one router followed (a router mounted in many places)
_MAX_ALIAS_HOPS = 8  # re-exports followed to find a router
# A file none of whose lines could declare a route, router or mount is not walked (most files:
# walking every tree costs about what parsing it does).
_MAYBE = re.compile(r"^\s*@[\w.]+\.(?:route|api_route|get|post|put|delete|patch|head|options|trace)\s*\("
                    r"|\b(?:add_url_rule|add_api_route|register_blueprint|include_router|mount|urlpatterns"
                    r"|Flask|Blueprint|FastAPI|APIRouter)\b", re.M)


def _dotted(node: ast.AST | None) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _last(node: ast.AST) -> str:
    name = _dotted(node)
    return name.rsplit(".", 1)[-1] if name else ""


def _str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _arg(call: ast.Call, index: int, keyword: str) -> ast.AST | None:
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    if index < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[:index + 1]):
        return call.args[index]
    return None


def _methods(call: ast.Call, default: list[str]) -> list[str]:
    """`methods=[...]` as written (upper case, in order), `default` without it, ANY when it is not
    a list of constants."""
    node = _arg(call, 99, "methods")
    if node is None:
        return default
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)) and node.elts and all(_str(e) for e in node.elts):
        return list(dict.fromkeys(_str(e).upper() for e in node.elts))
    return [ANY]


def join_path(prefix: str, path: str) -> str:
    """`prefix` + `path` as the frameworks join them (one `/` between), always starting with `/`:
    ("/auth", "/login") -> "/auth/login", ("/items", "/") -> "/items/", ("accounts/", "") ->
    "/accounts/"."""
    if not prefix:
        joined = path
    elif not path:
        joined = prefix
    else:
        joined = prefix.rstrip("/") + "/" + path.lstrip("/")
    return "/" + joined.lstrip("/")


def _django_route(pattern: str, func: str) -> str:
    """A Django pattern as a path: a regex's anchors dropped (`^articles/$` -> `articles/`)."""
    if func != "path":
        pattern = pattern.removeprefix("^").removesuffix("$")
    return pattern


class _File:
    def __init__(self, tree: ast.Module, module_qn: str, lines: list[str], is_urls: bool):
        self.tree, self.module_qn, self.lines, self.is_urls = tree, module_qn, lines, is_urls
        self.facts: list[dict] = []
        self.routers: dict[str, str] = {}          # local name -> framework
        self.as_view: dict[str, str] = {}          # `view = UserAPI.as_view("users")`: view -> UserAPI
        self.class_methods: dict[str, set[str]] = {}  # qualname -> its method names (MethodView)
        # (def, qualname, nested in a function, scope: the function holding it or "")
        self.decorated: list[tuple[ast.AST, str, bool, str]] = []

    def text(self, node: ast.AST) -> str:
        line = self.lines[node.lineno - 1] if 0 < node.lineno <= len(self.lines) else ""
        return line.strip()[:200]

    def add(self, fact: str, node: ast.AST, scope: str, **fields) -> None:
        self.facts.append({"fact": fact, "line": node.lineno, "text": self.text(node), "scope": scope, **fields})

    # -- the whole file ------------------------------------------------------------------
    def walk(self) -> tuple[list, list]:
        """Every assignment and method call with its scope (the function that holds it, "" at
        module or class level), and every decorated function with its qualified name as the code
        graph gives it: classes nest, anything inside a function folds into that function (its
        node holds the code)."""
        assigns, calls = [], []
        stack: list[tuple[ast.AST, str, str]] = [(s, "", "") for s in reversed(self.tree.body)]
        while stack:
            node, prefix, fold = stack.pop()
            children, child_prefix, child_fold = list(ast.iter_child_nodes(node)), prefix, fold
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                child_fold = fold or prefix + node.name
                if node.decorator_list:
                    self.decorated.append((node, child_fold, bool(fold), fold))
            elif isinstance(node, ast.ClassDef) and not fold:
                child_prefix = f"{prefix}{node.name}."
                self.class_methods[prefix + node.name] = {
                    s.name for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                assigns.append((node, fold))
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                calls.append((node, fold))
            stack.extend((c, child_prefix, child_fold) for c in reversed(children))
        return assigns, calls

    def extract(self) -> list[dict]:
        assigns, calls = self.walk()
        for node, scope in assigns:
            self.assignment(node, scope)
        for node, qual, nested, scope in self.decorated:
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call):
                    self.decorator(deco, qual, nested, scope)
        for call, scope in calls:
            self.method_call(call, scope)
        return sorted(self.facts, key=lambda f: (f["line"], f["fact"], f.get("path", "")))

    def assignment(self, node, scope: str) -> None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        value = node.value
        if not names or value is None:
            return
        if isinstance(value, ast.Call):
            ctor = _last(value.func)
            if ctor in ROUTER_CLASSES and not isinstance(node, ast.AugAssign):
                framework, keyword = ROUTER_CLASSES[ctor]
                prefix = _str(_arg(value, 99, keyword)) if keyword else ""
                for name in names:
                    self.routers[name] = framework
                    self.add("router", node, scope, name=name, framework=framework, prefix=prefix or "")
                return
            if isinstance(value.func, ast.Attribute) and value.func.attr == "as_view":
                cls = _dotted(value.func.value)
                if cls:
                    for name in names:
                        self.as_view[name] = cls
                return
        patterns = self.pattern_calls(value)
        if patterns and (self.is_urls or "urlpatterns" in names):
            for name in names:
                if name not in self.routers:
                    self.routers[name] = "django"
                    self.add("router", node, scope, name=name, framework="django", prefix="")
                self.django_list(name, patterns, "", scope)

    @staticmethod
    def pattern_calls(value: ast.AST) -> list[ast.Call]:
        """The `path()` / `re_path()` / `url()` calls of a pattern list (`[...]`, `[...] + [...]`)."""
        lists, stack = [], [value]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.BinOp):
                stack.extend([node.right, node.left])
            elif isinstance(node, (ast.List, ast.Tuple)):
                lists.extend(node.elts)
        return [e for e in lists if isinstance(e, ast.Call) and _last(e.func) in DJANGO_PATTERNS
                and e.args and _str(e.args[0]) is not None]

    def django_list(self, router: str, patterns: list[ast.Call], prefix: str, scope: str) -> None:
        for call in patterns:
            func = _last(call.func)
            route = join_path(prefix, _django_route(_str(call.args[0]), func)).lstrip("/") \
                if prefix else _django_route(_str(call.args[0]), func)
            view = _arg(call, 1, "view")
            if view is None:
                continue
            if isinstance(view, ast.Call) and _last(view.func) == "include":
                self.django_include(router, view, route, call, scope)
                continue
            handler = self.view_handler(view)
            if handler:
                self.add("route", call, scope, router=router, framework="django", path=route, methods=[ANY],
                         handler=handler, handler_def=False, nested=False)

    def django_include(self, router: str, include: ast.Call, route: str, call: ast.Call, scope: str) -> None:
        target = include.args[0] if include.args else _arg(include, 0, "arg")
        if isinstance(target, ast.Tuple) and target.elts:  # include((patterns, app_name))
            target = target.elts[0]
        if isinstance(target, ast.List):  # include([path(...), ...]): the same list, prefixed
            self.django_list(router, self.pattern_calls(target), route, scope)
            return
        module, expr = _str(target), _dotted(target)
        if module or expr:
            self.add("mount", call, scope, parent=router, child=expr or "", child_module=module or "",
                     framework="django", prefix=route)

    def view_handler(self, view: ast.AST) -> str:
        """The handler a view expression names: `views.login`, `SomeView` for `SomeView.as_view()`,
        a dotted string (old Django), a name bound to `X.as_view(...)`; "" for anything else
        (`admin.site.urls`, a lambda)."""
        if isinstance(view, ast.Call) and isinstance(view.func, ast.Attribute) and view.func.attr == "as_view":
            return _dotted(view.func.value) or ""
        text = _str(view)
        if text is not None:
            return text if text.replace(".", "").replace("_", "").isalnum() else ""
        name = _dotted(view)
        if not name or name.rsplit(".", 1)[-1] == "urls":  # an include in disguise
            return ""
        return self.as_view.get(name, name)

    def decorator(self, deco: ast.Call, qual: str, nested: bool, scope: str) -> None:
        if not isinstance(deco.func, ast.Attribute):
            return
        attr, router = deco.func.attr, _dotted(deco.func.value) or ""
        if attr in HTTP_METHODS:
            methods, framework = [attr.upper()], self.routers.get(router.split(".")[0], "")
        elif attr == "route":
            methods, framework = _methods(deco, ["GET"]), "flask"
        elif attr == "api_route":
            methods, framework = _methods(deco, ["GET"]), "fastapi"
        else:
            return
        path = _str(_arg(deco, 0, "rule" if attr == "route" else "path"))
        if path is None or not (path.startswith("/") or path == "" and router in self.routers):
            return
        self.add("route", deco, scope, router=router, framework=framework, path=path, methods=methods,
                 handler=qual, handler_def=True, nested=nested)

    def method_call(self, call: ast.Call, scope: str) -> None:
        attr, owner = call.func.attr, _dotted(call.func.value) or ""
        if attr in ("add_url_rule", "add_api_route"):
            flask = attr == "add_url_rule"
            path = _str(_arg(call, 0, "rule" if flask else "path"))
            view = _arg(call, 2, "view_func") if flask else _arg(call, 1, "endpoint")
            if path is None or view is None or not path.startswith("/"):
                return
            handler = self.view_handler(view)
            if not handler:
                return
            default = ["GET"]
            own = self.class_methods.get(handler)
            if flask and own and own & set(HTTP_METHODS):  # a MethodView answers the methods it defines
                default = [m.upper() for m in HTTP_METHODS if m in own]
            self.add("route", call, scope, router=owner, framework="flask" if flask else "fastapi", path=path,
                     methods=_methods(call, default), handler=handler, handler_def=False, nested=False)
        elif attr in ("register_blueprint", "include_router", "mount"):
            flask = attr == "register_blueprint"
            if attr == "mount":
                prefix, child = _str(_arg(call, 0, "path")), _dotted(_arg(call, 1, "app"))
                if prefix is None:
                    return
            else:
                child = _dotted(_arg(call, 0, "blueprint" if flask else "router"))
                prefix = _str(_arg(call, 99, "url_prefix" if flask else "prefix"))
            if child:
                self.add("mount", call, scope, parent=owner, child=child, child_module="",
                         framework="flask" if flask else "fastapi", prefix=prefix)


def extract_routes(tree: ast.Module, module_qn: str, file_path: str, lines: list[str]) -> list[dict]:
    """The route facts of one parsed Python file (see the module docstring); `lines` its text."""
    is_urls = posixpath.basename(file_path) == "urls.py" or "/urls/" in f"/{file_path}"
    if not is_urls and not _MAYBE.search("".join(lines)):
        return []
    return _File(tree, module_qn, lines, is_urls).extract()


# -- per source ----------------------------------------------------------------------------------
def _router_key(module: str, scope: str, name: str) -> str:
    """A router's name in the source: `module.name`, or `module.func.<locals>.name` for one made
    inside a function (each test or app factory has its own `app`)."""
    return f"{module}.{scope}.<locals>.{name}" if scope else f"{module}.{name}"


def compose_endpoints(facts: list[dict], aliases: dict[str, dict[str, str]]) -> list[dict]:
    """Endpoints of a source from its files' route facts (each with its file's `module_qn`):
    routers resolved through `aliases` (module -> local name -> the dotted name it binds, as the
    code graph's resolver holds them), prefixes composed along the mounts. Each endpoint is its
    route fact plus `method`, `path` (full) and `name` (`METHOD /path`), sorted by name, file, line."""
    mounts = _Mounts(facts, aliases)
    endpoints = []
    for f in facts:
        if f["fact"] != "route":
            continue
        for prefix in mounts.prefixes(mounts.router_of(f["module_qn"], f["router"], f["scope"])):
            path = join_path(prefix, f["path"])
            for method in f["methods"]:
                endpoints.append({**f, "method": method, "path": path, "name": f"{method} {path}"})
    endpoints.sort(key=lambda e: (e["name"], e.get("file_path", ""), e["line"], e["handler"]))
    return endpoints


class _Mounts:
    """A source's routers and what mounts each one where: the prefixes its routes are served under."""

    def __init__(self, facts: list[dict], aliases: dict[str, dict[str, str]]):
        self.aliases = aliases
        self.routers = {_router_key(f["module_qn"], f["scope"], f["name"]): f for f in facts if f["fact"] == "router"}
        self.incoming: dict[str, list[tuple[str | None, dict]]] = {}
        for f in facts:
            if f["fact"] != "mount":
                continue
            child = self.urls_module(f["child_module"]) if f["child_module"] else \
                self.router_of(f["module_qn"], f["child"], f["scope"])
            if child is not None:
                self.incoming.setdefault(child, []).append((self.router_of(f["module_qn"], f["parent"], f["scope"]), f))
        self._memo: dict[str, list[str]] = {}

    def router_of(self, module: str, expr: str, scope: str) -> str | None:
        """The router an expression names where it is written: a name of the function it is in
        (an app factory's `app`), of its module, or one the module imports."""
        if not expr:
            return None
        aliases, routers = self.aliases, self.routers
        head, _, rest = expr.partition(".")
        candidates = [_router_key(module, scope, expr)] if scope else []
        candidates.append(f"{module}.{expr}")
        if head in aliases.get(module, {}):
            candidates.append(".".join([aliases[module][head], *([rest] if rest else [])]))
        for name in candidates:
            for _ in range(_MAX_ALIAS_HOPS):
                if name in routers:
                    return name
                parts = name.split(".")
                for cut in range(len(parts) - 1, 0, -1):  # a re-export: `pkg/__init__.py: from .x import bp`
                    owner, local = ".".join(parts[:cut]), parts[cut]
                    if local in aliases.get(owner, {}):
                        name = ".".join([aliases[owner][local], *parts[cut + 1:]])
                        break
                else:
                    break
        return None

    def urls_module(self, module: str) -> str | None:
        """A Django include string: the pattern list of the module it names (an exact module
        name, else the one module whose name ends with it: the project folder may lead)."""
        exact = f"{module}.urlpatterns"
        if exact in self.routers:
            return exact
        found = sorted(n for n in self.routers if n.endswith(f".{module}.urlpatterns"))
        return found[0] if len(found) == 1 else None

    def prefixes(self, name: str | None, active: frozenset = frozenset()) -> list[str]:
        """The path prefixes router `name` is mounted under (`active`: the mounts being followed)."""
        if name is None:
            return [""]
        if name in self._memo:
            return self._memo[name]
        own = self.routers[name]["prefix"]
        mounts = [(p, m) for p, m in self.incoming.get(name, []) if p not in active and p != name]
        if not mounts:
            out = [own]
        else:
            out = []
            for parent, m in mounts:
                if m["framework"] == "flask":  # register_blueprint's url_prefix replaces the blueprint's
                    local = m["prefix"] if m["prefix"] is not None else own
                else:
                    local = join_path(m["prefix"] or "", own) if (m["prefix"] or own) else ""
                out += [join_path(p, local) if (p or local) else "" for p in self.prefixes(parent, active | {name})]
        out = list(dict.fromkeys(out))[:_MAX_PREFIXES]
        if not active:
            self._memo[name] = out
        return out
