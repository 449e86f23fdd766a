"""The build session (mtrag_resources/core/session.py): bounded caches, closers, the current
session and the module handles that follow it."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from mtrag_resources.core.session import current_session, new_session, session_cache, use_session

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh():
    """A new current session for the test; the one before comes back after it."""
    before = current_session()
    s = new_session()
    yield s
    s.close()
    use_session(before)


def test_a_bounded_cache_evicts_the_least_recently_used(fresh):
    cache = fresh.cache("t.lru", max_entries=3)
    for key in "abc":
        cache[key] = key.upper()
    assert cache["a"] == "A"       # a is now the most recently used
    assert cache.get("b") == "B"   # and then b
    cache["d"] = "D"               # past the bound: c, the least recently used, goes
    assert list(cache) == ["a", "b", "d"]
    cache["e"] = "E"
    assert "a" not in cache and len(cache) == 3


def test_eviction_calls_the_evict_hook_and_close_calls_it_for_the_rest(fresh):
    closed = []
    cache = fresh.cache("t.handles", max_entries=2, on_evict=lambda key, value: closed.append(value))
    cache["x"], cache["y"], cache["z"] = 1, 2, 3
    assert closed == [1]
    del cache["y"]  # a caller's own delete is the caller's to close
    assert closed == [1]
    fresh.on_close(lambda: closed.append("closer"))
    fresh.close()
    assert closed == [1, 3, "closer"] and len(cache) == 0 and fresh.stats()["t.handles"] == 0


def test_close_clears_every_cache_and_a_new_session_starts_empty(fresh):
    handle = session_cache("t.memo", max_entries=8)
    handle["k"] = "v"
    assert fresh.stats()["t.memo"] == 1
    fresh.close()
    assert fresh.stats()["t.memo"] == 0
    assert current_session() is not fresh  # the closed one is no longer current
    assert "k" not in handle and len(handle) == 0
    assert new_session().stats().get("t.memo", 0) == 0


def test_the_handle_follows_the_current_session(fresh):
    handle = session_cache("t.follow", max_entries=8)
    handle["k"] = 1
    other = new_session()
    assert "k" not in handle  # the new session's cache, empty
    handle["k"] = 2
    use_session(fresh)
    assert handle["k"] == 1 and other.cache("t.follow", 8)["k"] == 2
    assert handle.mapping() is fresh.cache("t.follow", 8)
    other.close()
    assert current_session() is fresh  # closing another session leaves the current one


def test_the_handle_keeps_the_bound_and_compares_as_a_mapping(fresh):
    handle = session_cache("t.bound", max_entries=2)
    handle.update({"a": 1, "b": 2, "c": 3})
    assert dict(handle) == {"b": 2, "c": 3} and handle == {"b": 2, "c": 3}
    assert handle.setdefault("d", 4) == 4 and list(handle.values()) == [3, 4]
    assert handle.pop("c") == 3 and handle.popitem() == ("d", 4) and handle == {}


def test_every_session_cache_of_the_product_code_has_its_own_name():
    """Two modules giving one name would share (and evict) each other's entries."""
    names = []
    for package in ("mtrag_resources", "mtrag_assets"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "session_cache":
                    names.append(node.args[0].value)
    assert len(names) >= 40
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert all(re.fullmatch(r"[a-z0-9_]+\.[a-z0-9_]+", n) for n in names), names


def test_a_module_cache_is_in_the_session_and_goes_with_it(fresh, tmp_path):
    """The tables' decoded rows (the largest cache) live in the current session: a new session
    decodes again; stats name it."""
    from mtrag_resources.stores import tables
    path = tmp_path / "t.parquet"
    tables.write_rows(path, [{"a": 1}, {"a": 2}])
    tables.read_rows(path)
    assert fresh.stats()["tables.decoded"] >= 1 and tables.cached_rows(path) is not None
    new_session()
    assert tables.cached_rows(path) is None
    use_session(fresh)
    assert tables.cached_rows(path) is not None

