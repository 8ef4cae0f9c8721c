"""A real HTTP server on 127.0.0.1 for webhook tests: records requests, answers from a script."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Server(ThreadingHTTPServer):
    """A threaded receiver with a real server's listen backlog (nginx: 511).

    Python's default is 5: a run sends MARKETING_WEBHOOK_CONCURRENCY (32) requests at once, and the
    overflow came back as connections reset (httpx ReadError), which no production receiver causes.
    """

    request_queue_size = 256
    daemon_threads = True


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes = b""  # the exact bytes received, which a signature covers
    peer: tuple[str, int] = ("", 0)  # the client's address and port: one per TCP connection


@dataclass
class Recorder:
    status: int = 200
    received: list[Received] = field(default_factory=list)
    on_request: Callable[[Received], None] | None = None
    # Per-request status (e.g. by path); ``status`` when None.
    status_for: Callable[[Received], int] | None = None
    # The response body; None: ``{"ok": <status < 300>}``.
    body: bytes | None = None
    # Per-request body (e.g. by what was sent); ``body`` when None. Safe with concurrent requests, unlike
    # setting ``body`` from ``on_request``.
    body_for: Callable[[Received], bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    port: int = 0


@contextmanager
def webhook_server(status: int = 200, keep_alive: bool = False) -> Iterator[Recorder]:
    """``keep_alive``: answer as HTTP/1.1, so a client may send several requests over one connection."""
    recorder = Recorder(status=status)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", "0"))
            raw = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            item = Received(self.path, headers, json.loads(raw or b"null"), raw, self.client_address[:2])
            recorder.received.append(item)
            if recorder.on_request:
                recorder.on_request(item)
            status = recorder.status_for(item) if recorder.status_for else recorder.status
            answer = recorder.body_for(item) if recorder.body_for else recorder.body
            answer = answer if answer is not None else json.dumps({"ok": status < 300}).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = _Server(("127.0.0.1", 0), Handler)
    recorder.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()
