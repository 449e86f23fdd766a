"""The build session: what a process keeps between builds (decoded tables, graph facts, resolution
memos, open stores and drivers), owned in one place with a lifetime and a bound per cache.

A module reaches its cache through a handle made once at import, `session_cache(name, max_entries)`:
a mapping that stands for that cache of the current session. A long-lived process (the build
server, `mtrag watch`) opens a session when it starts and closes it when it leaves; every other
process uses the one made on first use. The current session is the one module-level state the
product code keeps (tests/test_module_state.py holds the rest to a short list)."""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

_MISSING = object()
Evicted = Callable[[Any, Any], None]


class BoundedCache(OrderedDict):
    """A mapping that forgets its least recently used entry past `max_entries`. `on_evict(key,
    value)` runs for each entry that leaves by eviction or by the session's close (a handle to
    close), not for those a caller deletes."""

    def __init__(self, max_entries: int, on_evict: Evicted | None = None):
        super().__init__()
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        self.max_entries = max_entries
        self.on_evict = on_evict

    # Each step tolerates another thread's change in between (the fast lane runs stages on a pool):
    # a lost touch or eviction costs at most a recomputation.
    def __getitem__(self, key, _get=OrderedDict.__getitem__):
        value = _get(self, key)
        try:
            self.move_to_end(key)
        except KeyError:
            pass
        return value

    def get(self, key, default=None, _get=OrderedDict.get):
        value = _get(self, key, _MISSING)
        if value is _MISSING:
            return default
        try:
            self.move_to_end(key)
        except KeyError:
            pass
        return value

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        try:
            self.move_to_end(key)
        except KeyError:
            pass
        while len(self) > self.max_entries:
            try:
                old_key, old = self.popitem(last=False)
            except KeyError:
                break
            if self.on_evict is not None:
                self.on_evict(old_key, old)

    def close(self) -> None:
        entries = list(self.items()) if self.on_evict is not None else ()
        super().clear()
        for key, value in entries:
            self.on_evict(key, value)


class BuildSession:
    """The caches and resources of one process's run of builds. `close()` empties every cache,
    runs the evict hook of each entry that has one (closing drivers and parked stores) and then
    the closers given to `on_close`, last first."""

    def __init__(self):
        self._caches: dict[str, BoundedCache] = {}
        self._closers: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self.closed = False

    def cache(self, name: str, max_entries: int, on_evict: Evicted | None = None) -> BoundedCache:
        """The session's cache `name`, made on first use with this bound."""
        found = self._caches.get(name)
        if found is None:
            with self._lock:
                found = self._caches.setdefault(name, BoundedCache(max_entries, on_evict))
        return found

    def on_close(self, closer: Callable[[], None]) -> None:
        self._closers.append(closer)

    def stats(self) -> dict[str, int]:
        """Entries per cache, by name."""
        return {name: len(cache) for name, cache in sorted(dict(self._caches).items())}  # a copy: caches come meanwhile

    def close(self) -> None:
        self.closed = True
        errors = []
        for cache in list(self._caches.values()):
            try:
                cache.close()
            except Exception as e:  # noqa: BLE001 - one failed closer does not keep the others open
                errors.append(e)
        while self._closers:
            try:
                self._closers.pop()()
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        if self is _current:
            _install(None)
        if errors:
            raise errors[0]


class SessionCache(MutableMapping):
    """A module's handle on its cache in the current session. The handle holds that session's
    mapping and is pointed at the next one when the session changes, so a lookup costs one call."""

    __slots__ = ("name", "max_entries", "on_evict", "_map", "__weakref__")

    def __init__(self, name: str, max_entries: int, on_evict: Evicted | None = None):
        self.name, self.max_entries, self.on_evict = name, max_entries, on_evict
        self._map: BoundedCache | None = None

    def _bind(self, session: BuildSession | None) -> None:
        self._map = None if session is None else session.cache(self.name, self.max_entries, self.on_evict)

    def mapping(self) -> BoundedCache:
        """The current session's cache itself (for a loop that looks up many keys)."""
        found = self._map
        if found is None:
            current_session()
            found = self._map
        return found

    def __getitem__(self, key):
        return (self._map if self._map is not None else self.mapping())[key]

    def get(self, key, default=None):
        return (self._map if self._map is not None else self.mapping()).get(key, default)

    def __contains__(self, key) -> bool:
        return key in (self._map if self._map is not None else self.mapping())

    def __setitem__(self, key, value) -> None:
        (self._map if self._map is not None else self.mapping())[key] = value

    def __delitem__(self, key) -> None:
        del self.mapping()[key]

    def pop(self, key, *default):
        return self.mapping().pop(key, *default)

    def popitem(self, last: bool = True):
        return self.mapping().popitem(last=last)

    def move_to_end(self, key, last: bool = True) -> None:
        self.mapping().move_to_end(key, last=last)

    def clear(self) -> None:
        self.mapping().clear()

    def keys(self):
        return self.mapping().keys()

    def values(self):
        return self.mapping().values()

    def items(self):
        return self.mapping().items()

    def __iter__(self) -> Iterator:
        return iter(self.mapping())

    def __len__(self) -> int:
        return len(self.mapping())

    def __repr__(self) -> str:
        return f"SessionCache({self.name!r}, max_entries={self.max_entries})"


# The current session and the handles that follow it: the process-wide holder, the one documented
# module-level state of the product code.
_current: BuildSession | None = None
_handles: "weakref.WeakValueDictionary[int, SessionCache]" = weakref.WeakValueDictionary()  # by id
_holder_lock = threading.RLock()


def _install(session: BuildSession | None) -> None:
    global _current
    with _holder_lock:
        _current = session
        for handle in list(_handles.values()):
            handle._bind(session)


def current_session() -> BuildSession:
    """The process's session, made on first use."""
    session = _current
    if session is None:
        with _holder_lock:
            if _current is None:
                _install(BuildSession())
            session = _current
    return session


def use_session(session: BuildSession) -> BuildSession:
    """Make `session` the current one (the one the module handles reach); returns it."""
    _install(session)
    return session


def new_session() -> BuildSession:
    """A fresh, empty session made current (the last one is left to its owner to close)."""
    return use_session(BuildSession())


def session_cache(name: str, max_entries: int, on_evict: Evicted | None = None) -> SessionCache:
    """The handle of a module's cache `name` (made once, at import)."""
    handle = SessionCache(name, max_entries, on_evict)
    with _holder_lock:
        _handles[id(handle)] = handle
        handle._bind(_current)
    return handle
