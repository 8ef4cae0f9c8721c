"""Shared helpers of the benchmark scripts: throwaway databases and result tables.

Benchmarks print ratios measured side by side in one run: this machine is shared and noisy,
so absolute numbers drift between runs while a ratio taken within one run holds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.migrate import upgrade
from marketing_pipelines.db.schema import marketing_execution

DEFAULT_PG = os.environ.get("MARKETING_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@contextlib.contextmanager
def empty_postgres_database(prefix: str) -> Iterator[sa.URL]:
    """An empty database on the local PostgreSQL server, named ``prefix`` and a random suffix; dropped
    afterwards (``WITH (FORCE)``: a benchmark killed midway must not leave it held by its connections)."""
    admin = sa.create_engine(
        DEFAULT_PG.replace("postgresql://", "postgresql+psycopg2://", 1),
        isolation_level="AUTOCOMMIT",
        pool_pre_ping=True,
    )
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield sa.engine.make_url(DEFAULT_PG).set(database=name)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextlib.contextmanager
def throwaway_database(kind: str) -> Iterator[str]:
    """A migrated application database that is dropped afterwards: 'postgres' or 'sqlite'."""
    if kind == "sqlite":
        folder = Path(tempfile.mkdtemp(prefix="mp-bench-"))
        url = f"sqlite:///{folder / 'bench.db'}"
        upgrade(get_engine(url))
        try:
            yield url
        finally:
            get_engine(url).dispose()
            shutil.rmtree(folder, ignore_errors=True)
        return
    with empty_postgres_database("mp_bench") as empty:
        url = empty.render_as_string(hide_password=False)
        try:
            upgrade(get_engine(url))
            yield url
        finally:
            get_engine(url).dispose()


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) if cells else len(c) for i, c in enumerate(columns)]
    print(f"\n{title}")
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
    for r in cells:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
    return str(value)


class ReceiverServer(ThreadingHTTPServer):
    """The benchmarks' webhook receivers: a threaded HTTP server with a real server's listen backlog.

    Python's default backlog is 5: a run sends MARKETING_WEBHOOK_CONCURRENCY (16) requests at once, several
    runs at a time, and on a busy machine the overflow came back as connections reset (httpx ReadError)
    that a production receiver (nginx: 511) would never cause: the soak counted them as failed deliveries.
    """

    request_queue_size = 256
    daemon_threads = True


def insert_due(engine: sa.Engine, n: int, action: str, hook_url: str | None, campaign: str, first: int = 0) -> datetime:
    """Insert ``n`` executions (``log``, or ``webhook`` to ``hook_url``) due now in one statement; their due time."""
    # finished_at comes from the database clock (PostgreSQL now()), so due_at does too.
    with engine.connect() as conn:
        due = conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
    rows = [
        {
            "campaign_id": campaign,
            "stage": "launch",
            "action": action,
            "payload": (
                {"url": hook_url, "body": {"execution": i}} if action == "webhook" else {"message": f"bench {i}"}
            ),
            "due_at": due,
            "status": "SCHEDULED",
            "attempts": 0,
            "max_attempts": 3,
            "created_at": due,
            "updated_at": due,
        }
        for i in range(first, first + n)
    ]
    with engine.begin() as conn:
        conn.execute(sa.insert(marketing_execution), rows)
    return due


@contextlib.contextmanager
def counting_receiver(
    path: str, count: Callable[[Mapping[str, str]], int] = lambda _: 1
) -> Iterator[tuple[str, list[int]]]:
    """A local receiver that answers 204 at once; (its URL ending in ``path``, what ``count`` said of each POST's
    headers, in order)."""
    got: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            got.append(count(self.headers))
            self.send_response(204)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ReceiverServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{path}", got
    finally:
        server.shutdown()
        server.server_close()


def postgres_storage(pg: Mapping[str, str]) -> dict[str, Any]:
    """Dagster's ``storage.postgres.postgres_db`` config for the DAGSTER_PG_* values ``pg``."""
    postgres_db: dict[str, Any] = {
        "hostname": pg["DAGSTER_PG_HOST"],
        "port": int(pg["DAGSTER_PG_PORT"]),
        "username": pg["DAGSTER_PG_USER"],
        "db_name": pg["DAGSTER_PG_DB"],
        # As deploy/dagster.yaml: a bare postgresql:// resolves to psycopg 3 with SQLAlchemy 2.1.
        "scheme": "postgresql+psycopg2",
    }
    if pg["DAGSTER_PG_PASSWORD"]:
        postgres_db["password"] = pg["DAGSTER_PG_PASSWORD"]
    return postgres_db


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
