"""A real HTTP server on 127.0.0.1 for webhook tests: records requests, answers from a script."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes = b""  # the exact bytes received, which a signature covers


@dataclass
class Recorder:
    status: int = 200
    received: list[Received] = field(default_factory=list)
    on_request: Callable[[Received], None] | None = None
    # Per-request status (e.g. by path); ``status`` when None.
    status_for: Callable[[Received], int] | None = None
    # The response body; None: ``{"ok": <status < 300>}``.
    body: bytes | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    port: int = 0


@contextmanager
def webhook_server(status: int = 200) -> Iterator[Recorder]:
    recorder = Recorder(status=status)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            raw = self.rfile.read(length)
            item = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, json.loads(raw or b"null"), raw)
            recorder.received.append(item)
            if recorder.on_request:
                recorder.on_request(item)
            status = recorder.status_for(item) if recorder.status_for else recorder.status
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(recorder.body if recorder.body is not None else json.dumps({"ok": status < 300}).encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    recorder.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()
