"""A threaded HTTP server on loopback, started and stopped as a context manager (the test gateway and fake engine)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LocalHttpServer:
    """Serves ``handler`` on 127.0.0.1:``port`` (0: any free port) in a daemon thread while inside ``with``."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], port: int = 0):
        self.server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
