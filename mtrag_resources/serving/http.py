"""HTTP front of the reader: POST /v1/query, POST /v1/paths, GET /v1/status, GET /healthz.

Stdlib ThreadingHTTPServer: small, no extra dependency, and every limit is explicit - request
size, socket timeout, loopback by default, an API key (compared in constant time) required for
any other bind."""
from __future__ import annotations

import hmac
import ipaddress
import json
import socket
import traceback
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mtrag_resources.core.errors import ConfigError, MtragError
from mtrag_resources.serving.reader import EmbedderMismatch, QueryError

MAX_BODY_BYTES = 64 * 1024
SOCKET_TIMEOUT_S = 30
WORKERS = 32  # request threads; a stalled client holds one for at most SOCKET_TIMEOUT_S
QUERY_FIELDS = {"text", "query", "k", "kind", "mode"}
PATHS_FIELDS = {"from", "to", "rel", "direction", "max_hops", "verified_only", "limit"}


class BadRequest(MtragError, ValueError):
    http_status = 400


class UnsafeBind(ConfigError):
    """A bind beyond loopback without an API key."""


def _is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_handler(reader, api_key: str | None, socket_timeout: float = SOCKET_TIMEOUT_S):
    class Handler(BaseHTTPRequestHandler):
        server_version = "mtrag"
        sys_version = ""
        timeout = socket_timeout  # a client that stalls mid-request is dropped after this

        def log_message(self, fmt, *args):  # quiet by default; the access log is not our product
            pass

        def _send(self, status: int, body) -> None:
            if hasattr(body, "to_dict"):  # the reader's typed results (serving/results.py)
                body = body.to_dict()
            data = json.dumps(body, ensure_ascii=False).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _fail(self, exc: Exception) -> None:
            """A failure the request did not cause (a corrupt CURRENT, a store gone): the error's
            status (500 unless it names another) and its message, not a connection closed without a
            response; an unexpected one's traceback goes to stderr."""
            if isinstance(exc, MtragError):
                return self._send(exc.http_status, {"error": str(exc)})
            if isinstance(exc, (ConnectionError, TimeoutError)):  # the client left, or stalled past the socket timeout
                raise exc
            traceback.print_exc()
            return self._send(500, {"error": f"internal error: {type(exc).__name__}: {exc}"})

        def _authorized(self) -> bool:
            if not api_key:
                return True
            given = self.headers.get("X-API-Key") or ""
            auth = self.headers.get("Authorization") or ""
            if auth.startswith("Bearer "):
                given = auth[7:]
            return hmac.compare_digest(given.encode(), api_key.encode())

        def _body(self) -> dict:
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                raise BadRequest("Content-Length is required")
            if int(length) > MAX_BODY_BYTES:
                raise BadRequest(f"request body is {length} bytes; the limit is {MAX_BODY_BYTES}")
            raw = self.rfile.read(int(length))
            try:
                body = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise BadRequest(f"body is not JSON: {exc}") from exc
            if not isinstance(body, dict):
                raise BadRequest("body must be a JSON object")
            return body

        def do_GET(self):
            if not self._authorized():
                return self._send(401, {"error": "missing or wrong API key"})
            if self.path == "/healthz":
                return self._send(200, {"ok": True})
            if self.path == "/v1/status":
                try:
                    status = reader.status()
                except Exception as exc:  # noqa: BLE001 - answered with a status, see _fail
                    return self._fail(exc)
                return self._send(200, status)
            return self._send(404, {"error": f"no route GET {self.path[:100]}"})

        def do_POST(self):
            if not self._authorized():
                return self._send(401, {"error": "missing or wrong API key"})
            try:
                if self.path == "/v1/query":
                    body = self._body()
                    _no_unknown(body, QUERY_FIELDS)
                    text = body.get("text", body.get("query"))
                    return self._send(200, reader.query(text, k=body.get("k", 10), kind=body.get("kind"),
                                                        mode=body.get("mode", "hybrid")))
                if self.path == "/v1/paths":
                    body = self._body()
                    _no_unknown(body, PATHS_FIELDS)
                    rel = body.get("rel")
                    if isinstance(rel, str):
                        rel = [r.strip().upper() for r in rel.split(",") if r.strip()]
                    return self._send(200, reader.paths(body.get("from"), body.get("to"), rel,
                                                        body.get("direction", "out"), body.get("max_hops", 4),
                                                        bool(body.get("verified_only", True)),
                                                        int(body.get("limit", 10))))
                return self._send(404, {"error": f"no route POST {self.path[:100]}"})
            except (BadRequest, QueryError) as exc:
                return self._send(400, {"error": str(exc)})
            except EmbedderMismatch as exc:
                return self._send(409, {"error": str(exc)})
            except MtragError as exc:
                return self._send(exc.http_status, {"error": str(exc)})
            except (TypeError, ValueError) as exc:
                return self._send(400, {"error": f"bad request: {exc}"})
            except Exception as exc:  # noqa: BLE001 - answered with a status, see _fail
                return self._fail(exc)

    return Handler


def _no_unknown(body: dict, allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown}; allowed: {sorted(allowed)}")


class Server(ThreadingHTTPServer):
    """Requests run on a fixed pool of worker threads, not one new thread each: per-thread state
    (the FTS store's SQLite connection and page cache) is made once per worker and reused."""
    daemon_threads = True
    request_queue_size = 64
    workers = WORKERS

    def process_request(self, request, client_address):
        if getattr(self, "_pool", None) is None:
            self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="mtrag-http")
        self._pool.submit(self.process_request_thread, request, client_address)

    def server_close(self):
        super().server_close()
        if getattr(self, "_pool", None) is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def make_server(reader, host: str = "127.0.0.1", port: int = 8765, api_key: str | None = None,
                socket_timeout: float = SOCKET_TIMEOUT_S) -> Server:
    if not _is_loopback(host) and not api_key:
        raise UnsafeBind(f"refusing to bind {host}: set MTRAG_API_KEY to serve beyond loopback")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    Server.address_family = family
    return Server((host, port), make_handler(reader, api_key, socket_timeout))


def serve(reader, host: str = "127.0.0.1", port: int = 8765, api_key: str | None = None) -> None:
    server = make_server(reader, host, port, api_key)
    print(f"mtrag serving on http://{host}:{server.server_address[1]} (POST /v1/query, GET /v1/status)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
