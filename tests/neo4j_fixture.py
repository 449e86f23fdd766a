"""Session fixtures for tests that need a real Neo4j: `neo4j_uri` (NEO4J_URI when set, else a local
Community server started under a temporary home and stopped at the end) and `neo4j_store`."""
from __future__ import annotations

import os

import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.stores.neo4j_server import Neo4jServer

__all__ = ["neo4j_uri", "neo4j_store"]


@pytest.fixture(scope="session")
def neo4j_uri(tmp_path_factory):
    uri = os.environ.get("NEO4J_URI")
    if uri:
        yield uri
        return
    server = Neo4jServer(Settings(home=tmp_path_factory.mktemp("mtrag_neo4j_home")))
    uri = server.start(timeout=180)
    try:
        yield uri
    finally:
        server.stop()


@pytest.fixture(scope="session")
def neo4j_store(neo4j_uri):
    from mtrag_resources.stores.neo4j_store import Neo4jStore

    remote = bool(os.environ.get("NEO4J_URI"))
    user = os.environ.get("NEO4J_USER") if remote else None
    password = os.environ.get("NEO4J_PASSWORD") if remote else None
    store = Neo4jStore(neo4j_uri, user, password)
    store.ensure_schema()
    try:
        yield store
    finally:
        store.close()
