"""Slow and greedy clients cannot take `mtrag serve` from the others: a request's head and body are
read against one deadline (a 408, then the connection closes), and one client address is served
on a bounded number of connections at once - its others wait without a worker thread, and past
the waiting limit are refused with a 429. Read with real sockets, against a server in this process
(the limits' details) and a real `mtrag serve` process on a published home (the attack of issue
#58: more sockets trickling a header byte at a time than the server has worker threads)."""
from __future__ import annotations

import json
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mtrag_resources.serving import http as mhttp
from mtrag_resources.serving.http_limits import ClientSlots, client_key
from tests.http_helpers import running_server

MTRAG = Path(sys.executable).with_name("mtrag")
REPO = Path(__file__).resolve().parents[1]


class _Reader:
    max_hops_limit = 6

    def status(self):
        return {"generation": None, "sources": {}, "stale": []}


def _connect(port: int, source: str = "127.0.0.1", timeout: float = 10) -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))  # every 127/8 address is loopback: another client address
    sock.settimeout(timeout)
    sock.connect(("127.0.0.1", port))
    return sock


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    try:
        while b := sock.recv(65536):
            chunks.append(b)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def _status_and_error(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)["error"]


@pytest.mark.unit
def test_client_keys_and_slots():
    assert client_key("10.1.2.3") == "10.1.2.3"
    assert client_key("::ffff:10.1.2.3") == "10.1.2.3"
    assert client_key("2001:db8::1") == client_key("2001:db8::ffff:1") == "2001:db8::/64"
    assert client_key("2001:db8:0:1::1") != client_key("2001:db8::1")
    slots = ClientSlots(per_client=2, waiting=1)
    assert [slots.admit("a", n) for n in range(4)] == ["run", "run", "wait", "refuse"]
    assert slots.admit("b", 9) == "run"  # another address has its own slots
    assert slots.release("a") == 2  # the waiting connection takes the freed slot
    assert slots.admit("a", 5) == "wait"
    assert slots.release("a") == 5 and slots.release("a") is None and slots.release("a") is None
    assert slots.admit("a", 6) == "run"


@pytest.mark.unit
def test_a_request_not_read_by_its_deadline_is_a_408_and_a_silent_one_is_closed():
    with running_server(_Reader(), read_deadline=1.0) as server:
        port = server.server_address[1]
        started = time.monotonic()
        trickling, silent = _connect(port), _connect(port)
        trickling.sendall(b"GET /healthz HTTP/1.0\r\n")
        while not select.select([trickling], [], [], 0.1)[0]:  # a header byte every 0.1 s: no read times out
            trickling.sendall(b"a")
            assert time.monotonic() - started < 5
        status, error = _status_and_error(_answer(trickling))
        assert (status, error["code"]) == (408, "request_timeout")
        assert "MTRAG_HTTP_READ_DEADLINE_S" in error["message"]
        assert _answer(silent) == b""  # sent nothing: closed without an answer
        assert time.monotonic() - started < 5
        # a body counts too: its head came at once, its bytes never did
        body = _connect(port)
        body.sendall(b"POST /v1/paths HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{")
        assert _status_and_error(_answer(body))[0] == 408
        for sock in (trickling, silent, body):
            sock.close()


@pytest.mark.unit
def test_one_address_is_served_on_a_bounded_number_of_connections(capsys):
    with running_server(_Reader(), read_deadline=1.0, connections_per_client=1) as server:
        server._slots.waiting = 1
        port = server.server_address[1]
        held = _connect(port, "127.0.0.2")  # served, sending nothing
        queued = _connect(port, "127.0.0.2")  # waits for `held`'s slot, holding no worker
        refused = _connect(port, "127.0.0.2")
        status, error = _status_and_error(_answer(refused))
        assert (status, error["code"]) == (429, "too_many_requests") and "127.0.0.2" in error["message"]
        other = _connect(port, "127.0.0.3")  # another address is served at once
        other.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        assert _answer(other).endswith(b'{"ok": true}')
        queued.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")  # answered once `held` is closed at its deadline
        assert _answer(queued).endswith(b'{"ok": true}')
        assert _answer(held) == b""
        for sock in (held, queued, refused, other):
            sock.close()
    assert "mtrag-http 127.0.0.2 - - 429" in capsys.readouterr().err


def _serve(env: dict) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([MTRAG, "serve", "--host", "127.0.0.1", "--port", "0"], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline() if ready else ""
    m = re.search(r"http://127\.0\.0\.1:(\d+) ", line)
    if not m:
        proc.kill()
        pytest.fail(f"mtrag serve did not start: {line!r}")
    return proc, int(m.group(1))


def _ask(port: int, method: str, path: str, body: dict | None = None, timeout: float = 10) -> tuple[float, int, dict]:
    data = b"" if body is None else json.dumps(body).encode()
    head = f"{method} {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    started = time.monotonic()
    with _connect(port, timeout=timeout) as sock:
        sock.sendall(head.encode() + data)
        raw = _answer(sock)
    seconds = time.monotonic() - started
    head, _, payload = raw.partition(b"\r\n\r\n")
    return seconds, int(head.split(b" ", 2)[1]), json.loads(payload)


@pytest.mark.integration
@pytest.mark.neo4j
def test_mtrag_serve_answers_while_more_sockets_than_workers_trickle_headers(published):
    proc, port = _serve({**os.environ, "MTRAG_HTTP_READ_DEADLINE_S": "2"})
    slow: list[socket.socket] = []
    try:
        query = {"text": "how is the total price with tax computed", "k": 3}
        paths = {"from": "shopcart.cart.Cart.total", "max_hops": 1}
        # the first query loads the embedder, the first paths plans its graph read: neither is timed
        assert _ask(port, "POST", "/v1/query", query, timeout=180)[1] == 200
        assert _ask(port, "POST", "/v1/paths", paths, timeout=60)[1] == 200
        for _ in range(mhttp.WORKERS + 8):
            sock = _connect(port, "127.0.0.2")
            sock.sendall(b"GET /healthz HTTP/1.0\r\n")
            slow.append(sock)
        answers: dict[socket.socket, bytes] = {}

        def trickle() -> None:
            """A header byte every 0.2 s on every open slow socket, until the server has closed
            them all (or 30 s); a closed one's answer is kept."""
            end = time.monotonic() + 30
            while time.monotonic() < end and len(answers) < len(slow):
                readable, _, _ = select.select([s for s in slow if s not in answers], [], [], 0.2)
                for sock in readable:
                    answers[sock] = _answer(sock)
                for sock in slow:
                    if sock not in answers:
                        try:
                            sock.send(b"a")
                        except OSError:
                            answers[sock] = b""

        attack = threading.Thread(target=trickle, daemon=True)
        started = time.monotonic()
        attack.start()
        time.sleep(1)  # every worker the slow address may have is now reading one of them
        seconds, code, body = _ask(port, "GET", "/healthz")
        assert (code, body) == (200, {"ok": True}) and seconds < 1, seconds
        seconds, code, body = _ask(port, "POST", "/v1/query", query)
        assert code == 200 and body["hits"] and seconds < 1, seconds
        seconds, code, body = _ask(port, "POST", "/v1/paths", paths)
        assert code == 200 and body["paths"] and seconds < 1, seconds
        assert len(answers) < len(slow)  # the attack was still on
        # The server closes every slow socket: each one it serves gets a 408 at its deadline, and
        # the ones that waited for a slot are served (and answered so) in turn.
        attack.join(timeout=60)
        closed_after = time.monotonic() - started
        assert len(answers) == len(slow), f"{len(slow) - len(answers)} slow sockets still open"
        assert all(_status_and_error(raw)[0] == 408 for raw in answers.values()), set(answers.values())
        assert closed_after < 20, closed_after
    finally:
        for sock in slow:
            sock.close()
        proc.terminate()
        proc.wait(timeout=60)
        proc.stdout.close()
