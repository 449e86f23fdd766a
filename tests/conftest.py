from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.neo4j_fixture import *  # noqa: F401,F403

REPO = Path(__file__).resolve().parents[1]
# Chinese technical articles written for the tests (CJK chunking and search); inside the repository,
# so a clone needs nothing beside it.
CJK_DOCS = Path(__file__).resolve().parent / "data" / "cjk"

KINDS = ("unit", "integration")

# `mtrag build` would leave a build server warming up in each test's home after building (the
# default, `auto`); the tests use a server only where they start one, and test `auto` by name.
os.environ["MTRAG_BUILD_SERVER"] = "use"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Fail the collection when a test is not classified: exactly one of `unit` / `integration`
    (pyproject.toml registers the markers), and `slow` / `neo4j` tests are `integration`. Runs before
    `-m` deselects anything, so `-m unit` also refuses an unclassified test elsewhere."""
    bad = []
    for item in items:
        kinds = [k for k in KINDS if item.get_closest_marker(k)]
        heavy = [m for m in ("slow", "neo4j") if item.get_closest_marker(m)]
        if len(kinds) != 1:
            bad.append(f"{item.nodeid}: marked {kinds or 'neither unit nor integration'}")
        elif heavy and kinds != ["integration"]:
            bad.append(f"{item.nodeid}: {heavy} but not integration")
    if bad:
        raise pytest.UsageError("unclassified tests (mark each `unit` or `integration`, see pyproject.toml):\n  "
                                + "\n  ".join(bad))


@pytest.fixture
def mtrag_env(tmp_path, monkeypatch, neo4j_uri):
    """A private MTRAG_HOME, sources file and Dagster instance; the session's Neo4j, emptied."""
    from tests.corpus import write_corpus
    paths = write_corpus(tmp_path / "corpus")
    home = tmp_path / "home"
    use_fresh_home(monkeypatch, home, paths["sources"], neo4j_uri)
    paths["home"] = home
    return paths


def _wipe_neo4j(uri: str) -> None:
    from mtrag_resources.stores.neo4j_store import Neo4jStore
    store = Neo4jStore(uri, os.environ.get("NEO4J_USER"), os.environ.get("NEO4J_PASSWORD"))
    try:
        store._write("MATCH (n) DETACH DELETE n")  # tests run one at a time on one server
    finally:
        store.close()


def use_fresh_home(mp, home: Path, sources: Path, neo4j_uri: str) -> None:
    """Point the environment (through monkeypatch `mp`) at a test's own home and sources file,
    with the session's Neo4j emptied."""
    mp.setenv("MTRAG_HOME", str(home))
    mp.setenv("MTRAG_SOURCES", str(sources))
    mp.setenv("DAGSTER_HOME", str(home / "dagster_home"))
    mp.setenv("NEO4J_URI", neo4j_uri)
    _wipe_neo4j(neo4j_uri)


@pytest.fixture(scope="module")
def published(tmp_path_factory, neo4j_uri):
    """One published generation of the test corpus, shared by a module's read-only tests."""
    from tests.build_helpers import build
    from tests.corpus import write_corpus
    root = tmp_path_factory.mktemp("published")
    paths = write_corpus(root / "corpus")
    paths["home"] = root / "home"
    with pytest.MonkeyPatch.context() as mp:
        use_fresh_home(mp, paths["home"], paths["sources"], neo4j_uri)
        build()
        yield paths
