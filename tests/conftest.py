from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.neo4j_fixture import *  # noqa: F401,F403

REPO = Path(__file__).resolve().parents[1]
SEEDS = REPO.parent / "shared" / "seeds"


@pytest.fixture
def mtrag_env(tmp_path, monkeypatch, neo4j_uri):
    """A private MTRAG_HOME, sources file and Dagster instance; the session's Neo4j, emptied."""
    from tests.corpus import write_corpus
    paths = write_corpus(tmp_path / "corpus")
    home = tmp_path / "home"
    _point_env_at(monkeypatch, home, paths["sources"], neo4j_uri)
    _wipe_neo4j(neo4j_uri)
    paths["home"] = home
    return paths


def _wipe_neo4j(uri: str) -> None:
    from mtrag_resources.stores.neo4j_store import Neo4jStore
    store = Neo4jStore(uri, os.environ.get("NEO4J_USER"), os.environ.get("NEO4J_PASSWORD"))
    try:
        store._write("MATCH (n) DETACH DELETE n")  # tests run one at a time on one server
    finally:
        store.close()


def _point_env_at(mp, home: Path, sources: Path, neo4j_uri: str) -> None:
    mp.setenv("MTRAG_HOME", str(home))
    mp.setenv("MTRAG_SOURCES", str(sources))
    mp.setenv("DAGSTER_HOME", str(home / "dagster_home"))
    mp.setenv("NEO4J_URI", neo4j_uri)


@pytest.fixture(scope="module")
def published(tmp_path_factory, neo4j_uri):
    """One published generation of the test corpus, shared by a module's read-only tests."""
    from tests.build_helpers import build
    from tests.corpus import write_corpus
    root = tmp_path_factory.mktemp("published")
    paths = write_corpus(root / "corpus")
    paths["home"] = root / "home"
    with pytest.MonkeyPatch.context() as mp:
        _point_env_at(mp, paths["home"], paths["sources"], neo4j_uri)
        _wipe_neo4j(neo4j_uri)
        build()
        yield paths
