"""What a slow or greedy client may hold of `mtrag serve`: each request's head and body are read
against one deadline (not a timeout per socket read, which a client sending a byte a second never
trips), and one client address (an IPv6 /64) is served on at most `per_client` connections at once;
its further connections wait their turn without holding a worker thread, up to `WAITING_PER_CLIENT`,
and beyond that are refused with a 429. Both limits are read from the environment
(MTRAG_HTTP_READ_DEADLINE_S, MTRAG_HTTP_CONNECTIONS_PER_CLIENT)."""
from __future__ import annotations

import collections
import io
import ipaddress
import socket
import threading
import time

from mtrag_resources.core.config import env, env_float
from mtrag_resources.core.errors import ConfigError

READ_DEADLINE_S = 10.0
CONNECTIONS_PER_CLIENT = 16
# connections of one address that wait for a free slot; more are refused at once (each holds a
# file descriptor, not a thread)
WAITING_PER_CLIENT = 64


def read_deadline_from_env() -> float:
    """MTRAG_HTTP_READ_DEADLINE_S: seconds to read a request's head and body (default 10)."""
    return env_float("MTRAG_HTTP_READ_DEADLINE_S", READ_DEADLINE_S, 3600, "not a number of seconds from 0 to 3600")


def connections_per_client_from_env() -> int:
    """MTRAG_HTTP_CONNECTIONS_PER_CLIENT: connections one client address is served on at once."""
    raw = env("MTRAG_HTTP_CONNECTIONS_PER_CLIENT", str(CONNECTIONS_PER_CLIENT))
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= 10_000:
        raise ConfigError(f"MTRAG_HTTP_CONNECTIONS_PER_CLIENT={raw!r}: not a whole number from 1 to 10000")
    return int(raw)


def client_key(host: str) -> str:
    """Whose connection this is: the IPv4 address, or the IPv6 /64 (one host usually holds a whole
    /64, so counting its single addresses would limit nothing)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if address.version == 6:
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


class DeadlineReader(io.RawIOBase):
    """A socket's reading side that refuses to read past a deadline (`arm`): each read waits at
    most the time left (and at most `idle_timeout`), so a request trickled in a byte at a time
    still ends when the deadline does (TimeoutError). `received` counts the bytes read since `arm`."""

    def __init__(self, sock: socket.socket, idle_timeout: float):
        super().__init__()
        self._sock, self._idle_timeout = sock, idle_timeout
        self.deadline: float | None = None
        self.received = 0
        self.expired = False

    def arm(self, seconds: float) -> None:
        self.deadline, self.received, self.expired = time.monotonic() + seconds, 0, False

    def disarm(self) -> None:
        self.deadline = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.expired = True
                raise TimeoutError("the request was not read before its deadline")
            self._sock.settimeout(min(left, self._idle_timeout))
        try:
            n = self._sock.recv_into(buffer)
        except TimeoutError:
            self.expired = self.deadline is not None
            raise
        self.received += n
        return n


class ClientSlots:
    """Which connections are served now: at most `per_client` per client key; the others wait in
    arrival order (at most `waiting` per key) for `release` to hand them on."""

    RUN, WAIT, REFUSE = "run", "wait", "refuse"

    def __init__(self, per_client: int, waiting: int = WAITING_PER_CLIENT):
        self.per_client, self.waiting = per_client, waiting
        self._lock = threading.Lock()
        self._serving: collections.Counter[str] = collections.Counter()
        self._queued: dict[str, collections.deque] = {}

    def admit(self, key: str, item) -> str:
        with self._lock:
            if self._serving[key] < self.per_client:
                self._serving[key] += 1
                return self.RUN
            queue = self._queued.setdefault(key, collections.deque())
            if len(queue) >= self.waiting:
                return self.REFUSE
            queue.append(item)
            return self.WAIT

    def release(self, key: str):
        """A connection of `key` is done: the next waiting one (now counted as served), or None."""
        with self._lock:
            queue = self._queued.get(key)
            if queue:
                item = queue.popleft()
                if not queue:
                    del self._queued[key]
                return item
            self._serving[key] -= 1
            if self._serving[key] <= 0:
                del self._serving[key]
            return None

    def drain(self) -> list:
        """Every waiting connection, no longer waiting (the server is closing)."""
        with self._lock:
            items = [item for queue in self._queued.values() for item in queue]
            self._queued.clear()
            return items
