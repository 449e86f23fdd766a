"""Web routes (ingest/routes.py): Flask, FastAPI and Django apps written here, parsed with `ast`
(never imported), composed across files, and resolved by the code graph into Endpoint nodes with
ROUTES_TO edges to their handlers."""
from __future__ import annotations

import ast
import os
from textwrap import dedent

import pytest

from mtrag_resources.ingest.chunking.code import LANGUAGE_BY_SUFFIX, chunk_code, module_name_for
from mtrag_resources.ingest.chunking.windows import split_lines
from mtrag_resources.ingest.code_graph import endpoint_node_id, resolve_code_graph
from mtrag_resources.ingest.routes import compose_endpoints, extract_routes, join_path
from mtrag_resources.stores.fts_query import endpoint_aliases, normalize_alias

pytestmark = pytest.mark.unit

FLASK = {
    "src/webapp/__init__.py": '''\
        from flask import Flask
        from .auth import auth_bp
        from .api import api

        app = Flask(__name__)
        app.register_blueprint(auth_bp)
        app.register_blueprint(api, url_prefix="/api/v2")


        @app.route("/")
        def index():
            return "hi"


        @app.route("/login", methods=["GET", "POST"])
        def login():
            return check_password()


        def check_password():
            return True


        def health():
            return "ok"


        app.add_url_rule("/health", "health", health)
        app.add_url_rule("/ping", view_func=health, methods=["HEAD"])


        def create_app():
            inner = Flask("inner")

            @inner.route("/nested")
            def nested_view():
                return "nested"

            return inner
        ''',
    "src/webapp/auth.py": '''\
        from flask import Blueprint

        auth_bp = Blueprint("auth", __name__, url_prefix="/auth")


        @auth_bp.post("/logout")
        def logout():
            return ""


        @auth_bp.route("/profile/<int:user_id>", methods=("GET", "PUT"))
        def profile(user_id):
            return str(user_id)
        ''',
    "src/webapp/api.py": '''\
        from flask import Blueprint
        from flask.views import MethodView

        api = Blueprint("api", __name__, url_prefix="/api")


        class UserAPI(MethodView):
            def get(self, id):
                return str(id)

            def delete(self, id):
                return ""


        api.add_url_rule("/users/<int:id>", view_func=UserAPI.as_view("user"))
        ''',
}

FASTAPI = {
    "svc/main.py": '''\
        from fastapi import FastAPI
        from svc.routers import items
        from .users import router as users_router

        app = FastAPI()
        app.include_router(items.router, prefix="/v1")
        app.include_router(users_router)


        @app.get("/status")
        async def status():
            return {"ok": True}


        @app.api_route("/echo", methods=["GET", "POST"])
        def echo():
            return {}
        ''',
    "svc/routers/items.py": '''\
        from fastapi import APIRouter

        router = APIRouter(prefix="/items", tags=["items"])


        @router.get("/")
        def list_items():
            return []


        @router.get("/{item_id}")
        def read_item(item_id: int):
            return load_item(item_id)


        @router.delete("/{item_id}")
        def delete_item(item_id: int):
            return None


        def load_item(item_id):
            return {"id": item_id}


        def bulk_create():
            return []


        router.add_api_route("/bulk", bulk_create, methods=["POST"])
        ''',
    "svc/users.py": '''\
        from fastapi import APIRouter

        router: APIRouter = APIRouter(prefix="/users")


        @router.post("")
        def create_user():
            return {}
        ''',
}

# The Django project lies one folder down (`web/`): `include("accounts.urls")` names the module
# as Django's path sees it, not as the source's root does.
DJANGO = {
    "web/mysite/urls.py": '''\
        from django.contrib import admin
        from django.urls import include, path, re_path
        from thirdparty.views import external_view

        from blog import views as blog_views
        from .views import home

        urlpatterns = [
            path("admin/", admin.site.urls),
            path("accounts/", include("accounts.urls")),
            re_path(r"^blog/", include([path("<slug:slug>/", blog_views.post_detail)])),
            path("ext/", external_view),
            path("", home),
        ]
        ''',
    "web/mysite/views.py": '''\
        def home(request):
            return None
        ''',
    "web/accounts/urls.py": '''\
        from django.urls import path, re_path

        from . import views
        from .views import ProfileView

        app_name = "accounts"
        urlpatterns = [
            path("login/", views.login_view, name="login"),
            path("profile/", ProfileView.as_view(), name="profile"),
            re_path(r"^archive/(?P<year>[0-9]{4})/$", views.archive),
        ]
        ''',
    "web/accounts/views.py": '''\
        from django.views import View


        def login_view(request):
            return authenticate(request)


        def authenticate(request):
            return None


        def archive(request, year):
            return None


        class ProfileView(View):
            def get(self, request):
                return None
        ''',
    "web/blog/views.py": '''\
        def post_detail(request, slug):
            return None
        ''',
}


def graph(files: dict[str, str], source_id: str = "web"):
    parsed = []
    for path, text in files.items():
        pf = chunk_code(source_id, path, dedent(text), LANGUAGE_BY_SUFFIX[os.path.splitext(path)[1]])
        pf.language = "python"
        parsed.append(pf)
    return resolve_code_graph(source_id, parsed)


def routes_of(nodes, relations) -> dict[str, set[tuple[str, str]]]:
    """Endpoint name -> {(handler qualified name, confidence)} (empty: no handler in the source)."""
    by_id = {n.node_id: n for n in nodes}
    out = {n.name: set() for n in nodes if n.label == "Endpoint"}
    for r in relations:
        if r.rel_type == "ROUTES_TO":
            out[by_id[r.src_id].name].add((by_id[r.dst_id].qualified_name, r.confidence))
    return out


def endpoints_of(files: dict[str, str]) -> list[dict]:
    """routes.py alone: per-file facts, import aliases as the code graph holds them, composed."""
    facts, aliases = [], {}
    for path, text in files.items():
        text = dedent(text)
        module = module_name_for(path)
        pf = chunk_code("s", path, text, "python")
        aliases[module] = {f["alias"]: f["bound"] for f in pf.imports if f["alias"]}
        facts += [{**f, "module_qn": module} for f in extract_routes(ast.parse(text), module, path, split_lines(text))]
    return compose_endpoints(facts, aliases)


def test_flask_routes_blueprints_methods_and_add_url_rule():
    nodes, relations = graph(FLASK)
    assert routes_of(nodes, relations) == {
        "GET /": {("webapp.index", "VERIFIED")},
        "GET /login": {("webapp.login", "VERIFIED")},
        "POST /login": {("webapp.login", "VERIFIED")},
        "GET /health": {("webapp.health", "VERIFIED")},      # add_url_rule(rule, endpoint, view_func)
        "HEAD /ping": {("webapp.health", "VERIFIED")},       # view_func=..., methods=[...]
        # the blueprint's own url_prefix; a method shortcut (Flask 2); a tuple of methods
        "POST /auth/logout": {("webapp.auth.logout", "VERIFIED")},
        "GET /auth/profile/<int:user_id>": {("webapp.auth.profile", "VERIFIED")},
        "PUT /auth/profile/<int:user_id>": {("webapp.auth.profile", "VERIFIED")},
        # register_blueprint(url_prefix=) replaces the blueprint's "/api"; a MethodView answers
        # the methods it defines, and its handler is the class
        "GET /api/v2/users/<int:id>": {("webapp.api.UserAPI", "VERIFIED")},
        "DELETE /api/v2/users/<int:id>": {("webapp.api.UserAPI", "VERIFIED")},
        # a view defined inside the app factory: its code is in create_app's node, not certain
        "GET /nested": {("webapp.create_app", "INFERRED")},
    }


def test_endpoint_node_and_edge_carry_evidence_and_the_handler_chunk():
    nodes, relations = graph(FLASK)
    by_id = {n.node_id: n for n in nodes}
    endpoint = by_id[endpoint_node_id("web", "POST /login")]
    handler = next(n for n in nodes if n.qualified_name == "webapp.login")
    assert (endpoint.label, endpoint.name, endpoint.qualified_name) == ("Endpoint", "POST /login", "POST /login")
    assert endpoint.chunk_id == handler.chunk_id and endpoint.file_path == "src/webapp/__init__.py"
    edge = next(r for r in relations if r.rel_type == "ROUTES_TO" and r.src_id == endpoint.node_id)
    assert edge.dst_id == handler.node_id
    assert (edge.evidence_file, edge.evidence_start) == ("src/webapp/__init__.py", 15)
    assert edge.evidence_text == '@app.route("/login", methods=["GET", "POST"])'
    assert edge.evidence_hash and edge.evidence_hash == handler.content_hash  # the handler's own chunk
    # the handler keeps its CALLS: an endpoint leads on to what the handler calls
    calls = {(by_id[r.src_id].qualified_name, by_id[r.dst_id].qualified_name) for r in relations
             if r.rel_type == "CALLS"}
    assert ("webapp.login", "webapp.check_password") in calls


def test_fastapi_routers_prefixes_and_include_router():
    assert routes_of(*graph(FASTAPI)) == {
        "GET /status": {("svc.main.status", "VERIFIED")},
        "GET /echo": {("svc.main.echo", "VERIFIED")},          # api_route(methods=[...])
        "POST /echo": {("svc.main.echo", "VERIFIED")},
        # include_router's prefix goes before the router's own APIRouter(prefix="/items")
        "GET /v1/items/": {("svc.routers.items.list_items", "VERIFIED")},
        "GET /v1/items/{item_id}": {("svc.routers.items.read_item", "VERIFIED")},
        "DELETE /v1/items/{item_id}": {("svc.routers.items.delete_item", "VERIFIED")},
        "POST /v1/items/bulk": {("svc.routers.items.bulk_create", "VERIFIED")},  # add_api_route
        # an annotated router, imported under another name, included without a prefix; path ""
        "POST /users": {("svc.users.create_user", "VERIFIED")},
    }


def test_django_urls_include_and_as_view():
    assert routes_of(*graph(DJANGO)) == {
        "ANY /": {("web.mysite.views.home", "VERIFIED")},
        # include("accounts.urls") found by module name although the project lies under web/
        "ANY /accounts/login/": {("web.accounts.views.login_view", "VERIFIED")},
        "ANY /accounts/profile/": {("web.accounts.views.ProfileView", "VERIFIED")},  # as_view(): the class
        "ANY /accounts/archive/(?P<year>[0-9]{4})/": {("web.accounts.views.archive", "VERIFIED")},  # re_path
        # an inline include([...]) under re_path(r"^blog/"); `from blog import views` names
        # `blog.views`, which this source calls `web.blog.views`: not resolved, as a call would not be
        "ANY /blog/<slug:slug>/": set(),
        # a view from outside the source: the endpoint exists, no edge is guessed
        "ANY /ext/": set(),
    }


def test_django_inline_include_resolves_when_the_import_does():
    """The same project at the source's root: `from blog import views` now names the module the
    source holds, and the inline include's handler resolves."""
    files = {k.removeprefix("web/"): v for k, v in DJANGO.items()}
    routes = routes_of(*graph(files))
    assert routes["ANY /blog/<slug:slug>/"] == {("blog.views.post_detail", "VERIFIED")}
    assert routes["ANY /accounts/profile/"] == {("accounts.views.ProfileView", "VERIFIED")}


def test_admin_urls_and_non_routes_make_no_endpoint():
    files = {
        "app/urls.py": '''\
            from django.urls import path
            from django.contrib import admin
            urlpatterns = [path("admin/", admin.site.urls)]
            ''',
        "app/cache.py": '''\
            import requests
            cache = {}


            @cache.get("key")          # not a path: no route
            def f():
                return requests.get("/not/a/route")


            other = [path("x/", f)]    # a list of path() calls outside urls.py and urlpatterns
            ''',
    }
    assert endpoints_of(files) == []


def test_composition_details_per_framework():
    eps = endpoints_of({
        "a/app.py": '''\
            from flask import Flask, Blueprint
            from fastapi import FastAPI, APIRouter

            app = Flask(__name__)
            parent = Blueprint("parent", __name__, url_prefix="/parent")
            child = Blueprint("child", __name__, url_prefix="/child")
            parent.register_blueprint(child)           # nested blueprints (Flask 2)
            app.register_blueprint(parent)
            app.register_blueprint(parent, url_prefix="/again")  # registered twice


            @child.route("/leaf", methods=["PATCH", "patch", "OPTIONS"])
            def leaf():
                return ""


            @app.route("/dyn", methods=METHODS)      # not constants: any method
            def dyn():
                return ""


            api = FastAPI()
            sub = FastAPI()
            api.mount("/sub", sub)
            r = APIRouter()
            sub.include_router(r, prefix="/r")


            @r.put("/x")
            def put_x():
                return ""
            ''',
    })
    names = [e["name"] for e in eps]
    assert names == ["ANY /dyn", "OPTIONS /again/child/leaf", "OPTIONS /parent/child/leaf",
                     "PATCH /again/child/leaf", "PATCH /parent/child/leaf", "PUT /sub/r/x"]
    leaf = next(e for e in eps if e["name"] == "PATCH /parent/child/leaf")
    assert (leaf["handler"], leaf["handler_def"], leaf["line"], leaf["module_qn"]) == ("leaf", True, 12, "a.app")


def test_join_path():
    assert join_path("/auth", "/login") == "/auth/login"
    assert join_path("/items", "/") == "/items/"
    assert join_path("/users", "") == "/users"
    assert join_path("accounts/", "login/") == "/accounts/login/"
    assert join_path("", "") == "/"
    assert join_path("/api/", "v1") == "/api/v1"


def test_endpoint_aliases_point_at_the_handler_chunk():
    nodes, relations = graph(FLASK)
    rows = lambda xs: [x.__dict__ for x in xs]  # noqa: E731 - the Parquet rows' shape
    aliases = endpoint_aliases(rows(nodes), rows(relations))
    handler = next(n for n in nodes if n.qualified_name == "webapp.login")
    assert ("GET /login", "endpoint", handler.chunk_id) in aliases
    assert ("POST /login", "endpoint", handler.chunk_id) in aliases
    assert ("/login", "endpoint_path", handler.chunk_id) in aliases
    assert len([a for a in aliases if a[0] == "/login"]) == 1  # one per (alias, chunk)
    assert normalize_alias("get  /LOGIN") == normalize_alias("GET /login")
    # an endpoint without a handler in the source names no chunk
    assert not [a for a in endpoint_aliases(rows(graph(DJANGO)[0]), rows(graph(DJANGO)[1])) if a[0] == "ANY /ext/"]
