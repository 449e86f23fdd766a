"""A real `mtrag serve` HTTP server for a test: on a free loopback port, served from a thread."""
from __future__ import annotations

import threading
from contextlib import contextmanager

from mtrag_resources.serving.http import make_server


@contextmanager
def running_server(reader, host: str = "127.0.0.1", **options):
    """`make_server(reader, host, 0, **options)` serving from a daemon thread until the block ends;
    yields the server (its port is `server.server_address[1]`)."""
    server = make_server(reader, host, 0, **options)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
