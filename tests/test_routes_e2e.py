"""Web routes through the real pipeline: a folder source holding a tiny Flask app, a FastAPI app and
a Django project, built by a Dagster run into every store; its endpoints are Endpoint nodes in
Neo4j with ROUTES_TO edges to their handlers, anchors of `paths`, and exact aliases of the
handlers' chunks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mtrag_resources.core.layout import SourceLayout
from mtrag_resources.publish.manifest import load_current
from mtrag_resources.serving.reader import IndexReader
from mtrag_resources.stores.connect import open_fts, open_neo4j
from mtrag_resources.stores.tables import read_rows
from tests.build_helpers import build, latest_metadata, settings
from tests.conftest import use_fresh_home

pytestmark = [pytest.mark.integration, pytest.mark.neo4j]

REPO = Path(__file__).resolve().parents[1]
MTRAG = str(Path(sys.executable).with_name("mtrag"))

FILES = {
    "flaskapp/__init__.py": '''\
        """A tiny Flask app."""
        from flask import Flask

        from .auth import auth_bp

        app = Flask(__name__)
        app.register_blueprint(auth_bp, url_prefix="/account")


        @app.route("/login", methods=["GET", "POST"])
        def login():
            """Sign a user in with a password."""
            return check_password()


        def check_password():
            """Compare the submitted password with the stored hash."""
            return hash_password() == "stored"


        def hash_password():
            return "stored"
        ''',
    "flaskapp/auth.py": '''\
        from flask import Blueprint

        auth_bp = Blueprint("auth", __name__, url_prefix="/auth")


        @auth_bp.post("/logout")
        def logout():
            """End the session."""
            return ""
        ''',
    "fastapp/main.py": '''\
        from fastapi import FastAPI

        from fastapp.items import router

        api = FastAPI()
        api.include_router(router, prefix="/api")
        ''',
    "fastapp/items.py": '''\
        from fastapi import APIRouter

        router = APIRouter(prefix="/items")


        @router.get("/{item_id}")
        def read_item(item_id: int):
            """One item by id."""
            return load_item(item_id)


        def load_item(item_id):
            return {"id": item_id}
        ''',
    "djsite/urls.py": '''\
        from django.urls import include, path

        urlpatterns = [
            path("accounts/", include("accounts.urls")),
        ]
        ''',
    "accounts/urls.py": '''\
        from django.urls import path

        from . import views

        urlpatterns = [
            path("profile/", views.ProfileView.as_view(), name="profile"),
            path("signup/", views.signup),
        ]
        ''',
    "accounts/views.py": '''\
        from django.views import View


        class ProfileView(View):
            """The signed-in user's profile page."""

            def get(self, request):
                return None


        def signup(request):
            return None
        ''',
}
ENDPOINTS = {  # name -> the handler's qualified name
    "GET /login": "flaskapp.login", "POST /login": "flaskapp.login",
    "POST /account/logout": "flaskapp.auth.logout",
    "GET /api/items/{item_id}": "fastapp.items.read_item",
    "ANY /accounts/profile/": "accounts.views.ProfileView",
    "ANY /accounts/signup/": "accounts.views.signup",
}


@pytest.fixture
def webapps(tmp_path, monkeypatch, neo4j_uri):
    root = tmp_path / "corpus"
    for path, text in FILES.items():
        (root / "webapps" / path).parent.mkdir(parents=True, exist_ok=True)
        (root / "webapps" / path).write_text(textwrap.dedent(text))
    sources = root / "sources.yaml"
    sources.write_text('sources:\n  - {id: webapps, kind: code, path: webapps, include: ["**/*.py"]}\n')
    home = tmp_path / "home"
    use_fresh_home(monkeypatch, home, sources, neo4j_uri)
    build()
    return home


def _chunk_of(symbol: str) -> str:
    rows = read_rows(SourceLayout(settings(), "webapps").chunks)
    return next(r["chunk_id"] for r in rows if r["symbol"] == symbol and r["role"] == "child")


def test_routes_reach_neo4j_paths_and_exact_aliases(webapps):
    manifest = load_current(settings().manifest_dir)
    assert manifest["generation"] == 1 and set(manifest["sources"]) == {"webapps"}  # the gate passed
    table = latest_metadata("canonical_graph", "webapps")["nodes_by_label"]  # markdown, as the UI shows it
    assert f"| Endpoint | {len(ENDPOINTS)} |" in table.splitlines()
    rows = read_rows(SourceLayout(settings(), "webapps").chunks)

    neo = open_neo4j(settings())
    try:
        counts = neo.counts("webapps")
        assert counts["nodes"]["Endpoint"] == len(ENDPOINTS)
        assert counts["relationships"]["ROUTES_TO"] == len(ENDPOINTS)
        assert counts["chunks"] == len(rows)  # what counts_reconcile compares: endpoints add no chunk node
        for name, handler in ENDPOINTS.items():
            anchor = neo.resolve_anchors([name])
            assert [(a["label"], a["name"]) for a in anchor] == [("Endpoint", name)]
            assert anchor[0]["chunk_id"] == _chunk_of(handler)
            found = neo.paths([name], rel_types=["ROUTES_TO"], max_hops=1)
            assert [[n["qualified_name"] for n in p["nodes"]] for p in found] == [[name, handler]]
            edge = found[0]["edges"][0]
            assert edge["type"] == "ROUTES_TO" and edge["confidence"] == "VERIFIED"
            assert edge["evidence"]["file"] and edge["evidence"]["hash"] and edge["evidence"]["start_line"] > 0
        django = neo.paths(["ANY /accounts/profile/"], rel_types=["ROUTES_TO"], max_hops=1)[0]["edges"][0]
        assert django["evidence"]["file"] == "accounts/urls.py"
        assert django["evidence"]["text"].startswith('path("profile/", views.ProfileView.as_view()')
    finally:
        neo.close()

    reader = IndexReader(home=str(webapps), log_proposals=False)
    try:
        # default relations: from the endpoint through ROUTES_TO to the handler and on through CALLS
        answer = reader.paths("GET /login")
        chains = [[n["qualified_name"] for n in p["nodes"]] for p in answer["paths"]]
        assert ["GET /login", "flaskapp.login", "flaskapp.check_password", "flaskapp.hash_password"] in chains
        assert {e["type"] for p in answer["paths"] for e in p["edges"]} == {"ROUTES_TO", "CALLS"}
        # `in`: which endpoints reach a function
        callers = reader.paths("flaskapp.check_password", direction="in", max_hops=2)
        assert ["flaskapp.check_password", "flaskapp.login", "GET /login"] in \
            [[n["qualified_name"] for n in p["nodes"]] for p in callers["paths"]]

        login_chunk = _chunk_of("flaskapp.login")
        exact = reader.query("GET /login", mode="exact")
        assert [h["chunk_id"] for h in exact["hits"]] == [login_chunk] and exact["exact"]["matched"]
        hybrid = reader.query("GET /login")
        assert hybrid["hits"][0]["chunk_id"] == login_chunk and "exact" in hybrid["hits"][0]["channels"]
        assert hybrid["hits"][0]["symbol"] == "flaskapp.login"
        # the path alone, another method's endpoint, a Django endpoint naming a class
        assert reader.query("/login", mode="exact")["hits"][0]["chunk_id"] == login_chunk
        assert reader.query("post /account/logout", mode="exact")["hits"][0]["symbol"] == "flaskapp.auth.logout"
        assert reader.query("ANY /accounts/profile/", mode="exact")["hits"][0]["symbol"] == "accounts.views.ProfileView"
        assert reader.query("GET /nowhere", mode="exact")["hits"] == []
    finally:
        reader.close()

    fts = open_fts(settings())
    try:
        kinds = {(e["alias"], e["alias_kind"]) for e in fts.exact("GET /login")}
        assert kinds == {("GET /login", "endpoint")}
    finally:
        fts.close()

    # the command a user types
    out = subprocess.run([MTRAG, "paths", "--from", "GET /login", "--json"], env=dict(os.environ), cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    chains = [[n["qualified_name"] for n in p["nodes"]] for p in json.loads(out.stdout)["paths"]]
    assert ["GET /login", "flaskapp.login", "flaskapp.check_password"] in chains
    out = subprocess.run([MTRAG, "query", "GET /login", "--json", "--k", "3"], env=dict(os.environ), cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    top = json.loads(out.stdout)["hits"][0]
    assert (top["symbol"], top["file_path"]) == ("flaskapp.login", "flaskapp/__init__.py")
    assert "exact" in top["channels"]


def test_a_changed_prefix_moves_the_endpoint_in_every_store(webapps):
    """The prefix lives in one file, the route in another: after an edit of the first only, the
    endpoint's new name is in Neo4j and the aliases, and the old one is gone from both."""
    app = Path(os.environ["MTRAG_SOURCES"]).parent / "webapps" / "flaskapp" / "__init__.py"
    app.write_text(app.read_text().replace('url_prefix="/account"', 'url_prefix="/v2"'))
    build()
    assert latest_metadata("cas_chunks", "webapps")["files_parsed"] == 1
    logout = _chunk_of("flaskapp.auth.logout")
    neo, fts = open_neo4j(settings()), open_fts(settings())
    try:
        assert not neo.resolve_anchors(["POST /account/logout"])
        assert [a["chunk_id"] for a in neo.resolve_anchors(["POST /v2/logout"])] == [logout]
        assert neo.counts("webapps")["nodes"]["Endpoint"] == len(ENDPOINTS)
        assert fts.exact("POST /account/logout") == []
        assert [e["chunk_id"] for e in fts.exact("POST /v2/logout")] == [logout]
    finally:
        neo.close()
        fts.close()
