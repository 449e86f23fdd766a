"""HTTP front of the reader: POST /v1/query, POST /v1/paths, GET /v1/status, GET /healthz and
GET /openapi.json (the OpenAPI 3.1 document of all of them, serving/openapi.py).

Stdlib ThreadingHTTPServer: small, no extra dependency, and every limit is explicit - request
size, one deadline to read a request's head and body, the connections one client address is served
on at once (serving/http_limits.py), loopback by default, an API key (compared in constant time)
required for any other bind. GET /healthz needs no key (a probe cannot send one; it says only
`{"ok": true}`). A team's key (MTRAG_API_KEYS_FILE, serving/api_keys.py) reads only its team's
sources: its queries, paths and status are answered by the reader scoped to them, where another
team's source id is as unknown as one never published and its symbols are "no such symbol".

Every error is a JSON body `{"error": {"code", "message", "field"?}}` with the status HTTP defines
for it: 400 a body that is not JSON, or a query whose `sources` names an id the published
generation does not hold (code `unknown_source`, field `sources`), 401 no or a wrong API key, 404
no such route, or a /v1/paths `from`/`to` that names no symbol of the published generation (code
`unknown_symbol`), 405 (with `Allow`) a route asked with another method, 408 a request not read
by its deadline, 409 the query embedder is not the published generation's, 411 no Content-Length,
413 a body over MAX_BODY_BYTES, 415 a Content-Type that is not JSON, 422 a JSON body with an
invalid field (`field` names it), 429 too many connections from one client address, 503 the
published generation cannot be served (a manifest or store cannot be read), 500 only for a bug
(its traceback goes to stderr). Each request writes one access-log line to stderr: method, path,
status, milliseconds."""
from __future__ import annotations

import io
import ipaddress
import json
import signal
import socket
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mtrag_resources.core.errors import BusyError, ConfigError, MtragError
from mtrag_resources.core.unicode_text import may_hold_surrogates, without_lone_surrogates
from mtrag_resources.stores.contract import is_store_failure
from mtrag_resources.serving import http_limits, openapi
from mtrag_resources.serving.api_keys import ApiKeys
from mtrag_resources.serving.query_log import QueryLog
from mtrag_resources.serving.reader import EmbedderMismatch, QueryError
from mtrag_resources.serving.requests import (KINDS, MAX_K, MODES, PATH_RELATIONS, UnknownSource, UnknownSymbol,
                                              check_known_symbols, check_sources, validate_text)

MAX_BODY_BYTES = 64 * 1024
LINGER_S = 0.5  # a refused request's client is given this long to read its answer before the close
SOCKET_TIMEOUT_S = 30  # writing an answer to a client that stopped reading
WORKERS = 32  # request threads; one client address holds at most `connections_per_client` of them
QUERY_FIELDS = {"text", "query", "k", "kind", "mode", "sources"}
PATHS_FIELDS = {"from", "to", "rel", "direction", "max_hops", "verified_only", "limit"}
MAX_PATHS_LIMIT = openapi.MAX_PATHS_LIMIT
ROUTES = {"/v1/query": ("POST",), "/v1/paths": ("POST",), "/v1/status": ("GET",), "/healthz": ("GET",),
          "/openapi.json": ("GET",)}
# The handler method that answers each route, once its key and method are accepted.
ANSWERS = {"/v1/query": "_answer_query", "/v1/paths": "_answer_paths", "/v1/status": "_answer_status",
           "/healthz": "_answer_healthz", "/openapi.json": "_answer_openapi"}
# The code of each error status (the error body's `code`); a status not named here is "error".
CODES = {400: "bad_request", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed",
         408: "request_timeout", 409: "conflict", 411: "length_required", 413: "payload_too_large",
         414: "uri_too_long", 415: "unsupported_media_type", 422: "unprocessable", 429: "too_many_requests",
         431: "headers_too_large", 500: "internal", 503: "unavailable", 505: "http_version_not_supported"}


class HttpError(MtragError):
    """An answer other than 200: its status, `code` (CODES by default), message and the request
    field at fault (None: none), and extra response headers (`Allow`)."""

    def __init__(self, status: int, message: str, field: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.http_status = status
        self.code = code or CODES.get(status, "error")
        self.field = field
        self.headers = headers or {}

    def body(self) -> dict:
        err = {"code": self.code, "message": str(self)}
        if self.field is not None:
            err["field"] = self.field
        return {"error": err}


class BadRequest(HttpError, ValueError):
    """A body that is not JSON (400)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(400, message, field)


class Unprocessable(HttpError, ValueError):
    """Well-formed JSON with an invalid field (422)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(422, message, field)


class UnsafeBind(ConfigError):
    """A bind beyond loopback without an API key."""


def _is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _as_http_error(exc: Exception) -> HttpError | None:
    """The answer to an exception (None: a connection error, re-raised by the caller)."""
    if isinstance(exc, HttpError):
        return exc
    if isinstance(exc, EmbedderMismatch):
        return HttpError(409, str(exc), code="embedder_mismatch")
    if isinstance(exc, UnknownSource):  # a well-formed scope naming a source that is not published
        return HttpError(400, str(exc), field=exc.field, code="unknown_source")
    if isinstance(exc, UnknownSymbol):  # the CLI's "no such symbol", not an empty list of paths
        return HttpError(404, str(exc), field=exc.field, code="unknown_symbol")
    if isinstance(exc, QueryError):  # the reader refused a field value the body's checks let through
        return HttpError(422, str(exc))
    if isinstance(exc, BusyError):
        return HttpError(409, str(exc))
    if isinstance(exc, MtragError):  # mtrag refused to serve on purpose: a manifest, a store
        return HttpError(503, str(exc)) if exc.http_status >= 500 else HttpError(exc.http_status, str(exc))
    if isinstance(exc, (ConnectionError, TimeoutError)):  # the client left, or stalled past the socket timeout
        return None
    if is_store_failure(exc):  # a store cannot be opened or read
        return HttpError(503, f"store unavailable: {type(exc).__name__}: {exc}")
    traceback.print_exc()
    return HttpError(500, f"internal error: {type(exc).__name__}: {exc}")


def _shown(value) -> str:
    """A refused value for an error message: its JSON, at most 80 characters."""
    try:
        return json.dumps(value)[:80]
    except (RecursionError, ValueError):  # nested past the encoder's depth, a huge number
        return type(value).__name__


def _int(body: dict, name: str, default: int, low: int, high: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise Unprocessable(f"{name} must be an integer from {low} to {high}, got {_shown(value)}", name)
    if not low <= value <= high:
        shown = value if abs(value) < 10**12 else "a larger number"  # str() of 10**5000 raises
        raise Unprocessable(f"{name} must be an integer from {low} to {high}, got {shown}", name)
    return value


def _enum(body: dict, name: str, default, allowed, nullable: bool = False):
    value = body.get(name, default)
    if value is None and nullable:
        return None
    if not isinstance(value, str) or value not in allowed:
        raise Unprocessable(f"{name} {_shown(value)} is not one of {sorted(allowed)}", name)
    return value


def _text(value, name: str) -> str:
    try:
        return validate_text(value, name)
    except QueryError as exc:
        raise Unprocessable(str(exc), name) from exc


def _sources(body: dict) -> list[str] | None:
    """`sources`: absent or null (every published source), else 1 to 50 source ids (duplicates
    collapsed); whether each is published the reader checks (400 `unknown_source`)."""
    try:
        return check_sources(body.get("sources"))
    except QueryError as exc:
        raise Unprocessable(str(exc), "sources") from exc


def _no_unknown(body: dict, allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise Unprocessable(f"unknown field(s) {unknown}; allowed: {sorted(allowed)}", unknown[0])


def query_args(body: dict) -> dict:
    """The reader's query arguments from a /v1/query body; Unprocessable naming the field at fault."""
    _no_unknown(body, QUERY_FIELDS)
    if "text" in body and "query" in body:
        raise Unprocessable("give the query as `text` or as `query`, not both", "query")
    name = "text" if "text" in body else "query"
    if name not in body:  # the field left out is named `query`, as the MCP tool names it
        raise Unprocessable("query is missing (the query text, as `query` or `text`)", "query")
    return {"text": _text(body[name], name), "k": _int(body, "k", 10, 1, MAX_K),
            "kind": _enum(body, "kind", None, KINDS, nullable=True), "mode": _enum(body, "mode", "hybrid", MODES),
            "sources": _sources(body)}


def paths_args(body: dict, max_hops_limit: int) -> dict:
    """The reader's paths arguments from a /v1/paths body; Unprocessable naming the field at fault."""
    _no_unknown(body, PATHS_FIELDS)
    if "from" not in body:
        raise Unprocessable("from is missing (the symbol the paths start from)", "from")
    to = body.get("to")
    rel = body.get("rel")
    if isinstance(rel, str):
        rel = [r.strip().upper() for r in rel.split(",") if r.strip()]
    elif rel is not None and not (isinstance(rel, list) and all(isinstance(r, str) for r in rel)):
        raise Unprocessable("rel must be a list of relation types or a comma-separated string", "rel")
    bad = [r for r in (rel or []) if r not in PATH_RELATIONS]
    if bad:
        raise Unprocessable(f"unknown relation type(s) {[b[:40] for b in bad][:5]}; allowed: {list(PATH_RELATIONS)}",
                            "rel")
    verified_only = body.get("verified_only", True)
    if not isinstance(verified_only, bool):
        raise Unprocessable("verified_only must be true or false", "verified_only")
    return {"from_name": _text(body["from"], "from"), "to_name": None if to is None else _text(to, "to"),
            "rel_types": rel or None, "direction": _enum(body, "direction", "out", ("out", "in")),
            "max_hops": _int(body, "max_hops", 4, 1, max_hops_limit), "verified_only": verified_only,
            "limit": _int(body, "limit", 10, 1, MAX_PATHS_LIMIT)}


def _printable(path: str, limit: int = 200) -> str:
    """A request path fit for one log line: control characters escaped, at most `limit` characters."""
    return path[:limit].encode("unicode_escape", "backslashreplace").decode("ascii", "replace")


def _authorization_token(header: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; the scheme in any case (RFC 7235)."""
    scheme, _, token = header.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _raw_answer(status: int, reason: str, body: dict) -> bytes:
    """A whole HTTP/1.0 answer, for a connection whose request was never parsed (408, 429)."""
    data = json.dumps(body).encode("utf-8")
    return (f"HTTP/1.0 {status} {reason}\r\nContent-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode("ascii") + data


def _discard_input(sock: socket.socket, seconds: float) -> None:
    """Read and drop what the client still sends, for at most `seconds` or until it closes: a
    socket closed with unread input is reset, and the reset can destroy the answer before the
    client reads it."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(65536):
                return
        except OSError:
            return


def _principal(headers, keys: ApiKeys):
    """Who a request's key is (api_keys.Principal), or None: no or a wrong key. A bearer token
    wins over `X-API-Key`."""
    given = headers.get("X-API-Key") or ""
    bearer = _authorization_token(headers.get("Authorization") or "")
    if bearer is not None:
        given = bearer
    return keys.authenticate(given)


def _content_length(headers) -> int:
    """The body's declared size: 411 none, 400 not a number, 413 over MAX_BODY_BYTES."""
    length = headers.get("Content-Length")
    if length is None:
        if "chunked" in (headers.get("Transfer-Encoding") or "").lower():
            raise HttpError(411, "Content-Length is required (chunked bodies are not read)")
        raise HttpError(411, "Content-Length is required")
    if not length.isdigit() or not length.isascii():
        raise BadRequest(f"Content-Length {length[:40]!r} is not a number of bytes")
    if len(length.lstrip("0")) > 12 or int(length) > MAX_BODY_BYTES:  # no int() of 5000 digits
        raise HttpError(413, f"request body is {length[:40]} bytes; the limit is {MAX_BODY_BYTES}")
    return int(length)


def _json_object(headers, raw: bytes) -> dict:
    """A read body as a JSON object: 415 not JSON's Content-Type, 400 not JSON, 422 not an object."""
    ctype = (headers.get("Content-Type") or "application/json").split(";")[0].strip().lower()
    if ctype != "application/json" and not ctype.endswith("+json"):
        raise HttpError(415, f"Content-Type {ctype[:80]!r} is not application/json")
    try:
        text = raw.decode("utf-8")
        body = json.loads(text)
        if may_hold_surrogates(text):  # a lone `\ud800` encodes nowhere, the answer's JSON neither
            body = without_lone_surrogates(body)
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, a 5000-digit number, deep nesting
        raise BadRequest(f"body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise Unprocessable(f"body must be a JSON object, not {type(body).__name__}")
    return body


class _Handler(BaseHTTPRequestHandler):
    """One connection's requests. make_handler subclasses it with what it answers from: the
    reader, the keys accepted, the deadlines and the OpenAPI document."""
    server_version = "mtrag"
    sys_version = ""
    timeout = SOCKET_TIMEOUT_S  # writing an answer; also how long a read may stall
    read_deadline = http_limits.READ_DEADLINE_S
    reader = None
    keys: ApiKeys | None = None
    max_hops_limit = openapi.MAX_HOPS
    openapi_document = b""

    def setup(self):
        super().setup()
        # the head and body are read against one deadline (http_limits.DeadlineReader)
        self.rfile.close()
        self._deadline_reader = http_limits.DeadlineReader(self.connection, self.timeout)
        self.rfile = io.BufferedReader(self._deadline_reader)

    def log_message(self, fmt, *args):  # the stdlib's own lines; the access log is _log_access
        pass

    def log_request(self, code="-", size="-"):
        self._status = int(code) if str(code).isdigit() else code

    def handle_one_request(self):
        self._started, self._status, self.requestline = time.monotonic(), None, ""
        self._deadline_reader.arm(self.read_deadline)
        try:
            super().handle_one_request()
        finally:
            if self._status is None and self._deadline_reader.expired and self._deadline_reader.received:
                self._request_timed_out()
            if self._status is not None:
                self._log_access()

    def _request_timed_out(self) -> None:
        """A request begun but not read before its deadline: a 408 saying so, then the
        connection closes (one that sent nothing is closed without a word)."""
        self.close_connection = True
        self._status = 408
        message = (f"the request was not read within {self.read_deadline:g} s (MTRAG_HTTP_READ_DEADLINE_S), "
                   f"or stalled for {self.timeout:g} s")
        try:
            self.connection.settimeout(1)
            self.connection.sendall(_raw_answer(408, "Request Timeout", HttpError(408, message).body()))
            self.connection.shutdown(socket.SHUT_WR)
            _discard_input(self.connection, LINGER_S)
        except OSError:
            pass

    def _log_access(self) -> None:
        ms = (time.monotonic() - self._started) * 1000
        method = getattr(self, "command", None) or "-"
        path = getattr(self, "path", None) or "-"
        print(f"mtrag-http {self.client_address[0]} {_printable(method, 20)} {_printable(path)} "
              f"{self._status} {ms:.1f}ms", file=sys.stderr, flush=True)

    def send_error(self, code, message=None, explain=None):
        """The stdlib's own refusals (a bad request line, 414, 431, 505) as JSON error bodies."""
        self.close_connection = True
        self._send(int(code), HttpError(int(code), message or explain or "request refused").body())

    def _send(self, status: int, body, headers: dict | None = None) -> None:
        if hasattr(body, "to_dict"):  # the reader's typed results (serving/results.py)
            body = body.to_dict()
        data = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=False).encode("utf-8")
        self._deadline_reader.disarm()  # the request is read; its answer is written under `timeout`
        self.connection.settimeout(self.timeout)
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if getattr(self, "command", None) != "HEAD":
            self.wfile.write(data)

    def _refuse(self, exc: Exception) -> None:
        err = _as_http_error(exc)
        if err is None:
            raise exc
        self._send(err.http_status, err.body(), err.headers)

    def _body(self) -> dict:
        length = _content_length(self.headers)
        return _json_object(self.headers, self.rfile.read(length))

    def _answering(self, principal):
        """The reader that answers this key: a team's key gets the reader scoped to its sources
        (reader.ScopedReader)."""
        return self.reader if principal.sources is None else self.reader.scoped(principal.sources)

    def _route(self) -> None:
        """Authentication, then 404 and 405, then the route's own answer (ANSWERS)."""
        path = self.path.split("?", 1)[0]
        methods = ROUTES.get(path)
        # liveness is open to a probe that cannot send a key; it says nothing but `{"ok": true}`
        principal = _principal(self.headers, self.keys) if path != "/healthz" else None
        if path != "/healthz" and principal is None:
            raise HttpError(401, "missing or wrong API key", headers={"WWW-Authenticate": "Bearer"})
        if methods is None:
            raise HttpError(404, f"no route {self.command[:20]} {self.path[:100]}")
        method = "GET" if self.command == "HEAD" else self.command
        if method not in methods:
            raise HttpError(405, f"{path} takes {', '.join(methods)}, not {self.command[:20]}",
                            headers={"Allow": ", ".join(methods)})
        getattr(self, ANSWERS[path])(principal)

    def _answer_healthz(self, principal) -> None:
        self._send(200, {"ok": True})

    def _answer_openapi(self, principal) -> None:
        self._send(200, self.openapi_document)

    def _answer_status(self, principal) -> None:
        self._send(200, self._answering(principal).status())

    def _answer_query(self, principal) -> None:
        answering = self._answering(principal)
        args = query_args(self._body())
        t0 = time.perf_counter()
        answer = answering.query(**args)
        if self.query_log is not None:
            self.query_log.record(args, answer, (time.perf_counter() - t0) * 1000,
                                  principal.name if principal.sources is not None else None)
        self._send(200, answer)

    def _answer_paths(self, principal) -> None:
        answering = self._answering(principal)
        args = paths_args(self._body(), self.max_hops_limit)
        answer = answering.paths(args["from_name"], args["to_name"], args["rel_types"], args["direction"],
                                 args["max_hops"], args["verified_only"], args["limit"])
        check_known_symbols(answering, answer, {"from": args["from_name"], "to": args["to_name"]})
        self._send(200, answer)

    def _dispatch(self) -> None:
        try:
            self._route()
        except Exception as exc:  # noqa: BLE001 - every failure is answered with a status, see _as_http_error
            self._refuse(exc)

    def __getattr__(self, name: str):
        if name.startswith("do_"):  # every method, so none gets the stdlib's HTML 501
            return self._dispatch
        raise AttributeError(name)


def make_handler(reader, api_key: str | None, socket_timeout: float = SOCKET_TIMEOUT_S,
                 read_deadline: float = http_limits.READ_DEADLINE_S, keys: ApiKeys | None = None,
                 query_log: QueryLog | None = None):
    """The request handler class for one server. `keys`: the keys accepted (None: `api_key`
    alone, when given); `query_log`: where answered questions are recorded (None: nowhere)."""
    max_hops_limit = getattr(reader, "max_hops_limit", openapi.MAX_HOPS)
    return type("Handler", (_Handler,), {
        "reader": reader, "keys": keys if keys is not None else ApiKeys(api_key), "query_log": query_log,
        "timeout": socket_timeout, "read_deadline": read_deadline, "max_hops_limit": max_hops_limit,
        "openapi_document": json.dumps(openapi.document(max_hops_limit)).encode("utf-8")})


class Server(ThreadingHTTPServer):
    """Requests run on a fixed pool of worker threads, not one new thread each: per-thread state
    (the FTS store's SQLite connection and page cache) is made once per worker and reused. One
    client address is served on at most `connections_per_client` connections at once; its others
    wait, holding no worker, so a client that trickles its requests cannot take every worker
    (http_limits.ClientSlots)."""
    daemon_threads = True
    request_queue_size = 64
    workers = WORKERS

    def __init__(self, address, handler, connections_per_client: int = http_limits.CONNECTIONS_PER_CLIENT):
        self._slots = http_limits.ClientSlots(connections_per_client)
        self._pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="mtrag-http")
        super().__init__(address, handler)

    def handle_error(self, request, client_address):
        # a client that hangs up before its answer is written is no server error: no traceback
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)

    def process_request(self, request, client_address):
        key = http_limits.client_key(client_address[0])
        verdict = self._slots.admit(key, (request, client_address))
        if verdict == http_limits.ClientSlots.RUN:
            self._pool.submit(self._serve_then_next, request, client_address, key)
        elif verdict == http_limits.ClientSlots.REFUSE:
            self._refuse_connection(request, client_address)

    def _serve_then_next(self, request, client_address, key: str) -> None:
        while True:
            self.process_request_thread(request, client_address)
            waiting = self._slots.release(key)
            if waiting is None:
                return
            request, client_address = waiting

    def _refuse_connection(self, request, client_address) -> None:
        """A 429 for an address with too many connections waiting, written without blocking the
        accepting thread; the request is never read."""
        message = f"too many connections from {client_address[0]}: at most {self._slots.per_client} are " \
                  f"served at once and {self._slots.waiting} wait"
        try:
            request.setblocking(False)
            request.send(_raw_answer(429, "Too Many Requests", HttpError(429, message).body()))
        except OSError:
            pass
        self.shutdown_request(request)
        print(f"mtrag-http {client_address[0]} - - 429 0.0ms", file=sys.stderr, flush=True)

    def server_close(self):
        super().server_close()
        for request, _ in self._slots.drain():
            self.shutdown_request(request)
        self._pool.shutdown(wait=False, cancel_futures=True)


def make_server(reader, host: str = "127.0.0.1", port: int = 8765, api_key: str | None = None,
                socket_timeout: float = SOCKET_TIMEOUT_S, read_deadline: float = http_limits.READ_DEADLINE_S,
                connections_per_client: int = http_limits.CONNECTIONS_PER_CLIENT,
                keys: ApiKeys | None = None, query_log: QueryLog | None = None) -> Server:
    """`keys`: the keys accepted, team keys included (None: `api_key` alone, when given)."""
    keys = keys if keys is not None else ApiKeys(api_key)
    if not _is_loopback(host) and not keys.required:
        raise UnsafeBind(f"refusing to bind {host}: set MTRAG_API_KEY or MTRAG_API_KEYS_FILE to serve beyond "
                         "loopback")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    Server.address_family = family
    return Server((host, port), make_handler(reader, api_key, socket_timeout, read_deadline, keys, query_log),
                  connections_per_client)


def serve(reader, host: str = "127.0.0.1", port: int = 8765, api_key: str | None = None) -> None:
    """Serve until SIGTERM or SIGINT (Ctrl-C). Both are handled here, in the main thread, rather
    than left to their dispositions: a server started under a parent that ignores them (a
    non-interactive shell's background job, some supervisors) would otherwise outlive every stop by
    its pid."""
    keys = ApiKeys.from_env(api_key)  # a bad keys file is refused before the port is bound
    query_log = QueryLog.from_env()  # so is an unwritable query log
    server = make_server(reader, host, port, api_key, read_deadline=http_limits.read_deadline_from_env(),
                         connections_per_client=http_limits.connections_per_client_from_env(), keys=keys,
                         query_log=query_log)
    if threading.current_thread() is threading.main_thread():
        def stop(signum, frame) -> None:
            # shutdown() waits for serve_forever to end, so not from the thread that runs it; a
            # request made before serve_forever starts is honoured when it does.
            threading.Thread(target=server.shutdown, name="mtrag-http-stop", daemon=True).start()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stop)
    teams = f"; team keys: {', '.join(p.name for p in keys.teams)}" if keys.teams else ""
    logged = f"; questions logged to {query_log.path}" if query_log else ""
    print(f"mtrag serving on http://{host}:{server.server_address[1]} (POST /v1/query, GET /v1/status{teams}{logged})",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
