"""Reads whose rows skip SQLAlchemy's per-row result handling, for the two hot reads that need it.

SQLAlchemy builds a ``Row`` and runs the column types' result processors for every row fetched.
For the rollup's grouped scan (a million rows) and the report's daily rows (thousands per request)
that was a quarter and a tenth of the time (docs/PERFORMANCE.md), so on PostgreSQL these helpers
hand the compiled statement straight to a psycopg2 cursor and return its tuples. They are only for
queries whose result columns need no SQLAlchemy type processing (text, integers, dates; ``bytea``
comes back as a ``memoryview``) and whose parameters psycopg2 adapts as they are (bind processors
such as ``UTCDateTime``'s do not run). SQLite goes through SQLAlchemy, whose types it needs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.db.engine import is_postgres


def _compiled(conn: sa.Connection, query: sa.Select[Any]) -> tuple[str, Any]:
    # render_postcompile turns an expanding IN (...) parameter into plain binds psycopg2 can take.
    compiled = query.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    return str(compiled), compiled.params


def fetch_tuples(conn: sa.Connection, query: sa.Select[Any]) -> Sequence[tuple[Any, ...]]:
    """A small read's rows as plain tuples, in the caller's transaction."""
    if not is_postgres(conn):
        return conn.execute(query).all()
    sql, params = _compiled(conn, query)
    with conn.connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def stream_tuples(conn: sa.Connection, query: sa.Select[Any], batch: int = 20_000) -> Iterator[tuple[Any, ...]]:
    """A large read's rows as plain tuples, fetched ``batch`` at a time.

    On PostgreSQL this is a named (server-side) psycopg2 cursor in the caller's transaction, so a
    million-row read never sits in memory at once.
    """
    if not is_postgres(conn):
        yield from conn.execute(query.execution_options(yield_per=batch))
        return
    sql, params = _compiled(conn, query)
    cursor = conn.connection.cursor(f"stream_{uuid.uuid4().hex}")
    try:
        cursor.itersize = batch
        cursor.execute(sql, params)
        yield from cursor
    finally:
        cursor.close()
