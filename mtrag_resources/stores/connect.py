"""Open each store from Settings: the embedded defaults, or servers named by environment."""
from __future__ import annotations

from ..config import Settings


def open_qdrant(settings: Settings, path=None):
    from .qdrant_store import QdrantStore
    if settings.qdrant_url:
        return QdrantStore(url=settings.qdrant_url, api_key=settings.qdrant_api_key)
    return QdrantStore(path=path or settings.qdrant_path)


def open_fts(settings: Settings, path=None):
    from .fts_store import FtsStore
    return FtsStore(path or settings.fts_path)


def open_neo4j(settings: Settings):
    from ..neo4j_server import neo4j_connection
    from .neo4j_store import Neo4jStore
    uri, user, password = neo4j_connection(settings)
    return Neo4jStore(uri, user, password)
