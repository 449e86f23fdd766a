"""Fixtures for tests of the Dagster instance on PostgreSQL: `pg_server_url` (MTRAG_TEST_PG_URL when
the test command exported one, else a local server started under a temporary home and stopped at
the end of the session) and `pg_url` (a fresh database on it for one test, dropped afterwards, so
no test sees another's runs). The other tests keep SQLite: nothing here sets MTRAG_DAGSTER_PG_URL."""
from __future__ import annotations

import os
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest

from mtrag_resources.core.config import Settings
from mtrag_resources.stores.postgres_server import PostgresServer

__all__ = ["pg_server_url", "pg_url", "with_database"]


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


@pytest.fixture(scope="session")
def pg_server_url(tmp_path_factory):
    url = os.environ.get("MTRAG_TEST_PG_URL")
    if url:
        yield url
        return
    server = PostgresServer(Settings(home=tmp_path_factory.mktemp("mtrag_pg_home")))
    url = server.start(timeout=120)
    try:
        yield url
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server_url):
    import psycopg2

    name = f"mtrag_test_{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(with_database(pg_server_url, "postgres"))
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        yield with_database(pg_server_url, name)
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.close()
