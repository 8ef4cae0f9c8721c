"""Engines for the application database: URL normalisation, SQLite set-up, one engine per URL.

The driver is chosen here, once: PostgreSQL URLs always use psycopg2 (SQLAlchemy 2.1 would
map a bare ``postgresql://`` to psycopg 3, which is not installed), so a user can paste the
URL their provider shows them.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

SQLITE_BUSY_TIMEOUT_MS = 30_000


class DatabaseUnavailable(RuntimeError):
    """The database URL is malformed or the server cannot be reached; the message names the fix.

    ``transient``: the server did not answer, which a later attempt may not meet (a malformed URL or a
    missing SQLite file stays what it is).
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def may_succeed_later(exc: BaseException) -> bool:
    """Whether a database error is one a later attempt may not meet: the server unreachable or gone mid-way,
    a lock or serialization conflict with another transaction (SQLAlchemy's OperationalError on both
    databases), a pool timeout, or a key another writer inserted first (two rebuilds of one day at once).
    Anything else (a missing schema, a bad URL, a programming error) fails the same way every time."""
    if isinstance(exc, DatabaseUnavailable):
        return exc.transient
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, sa.exc.IntegrityError):
        # Only a duplicate key can be another writer's doing; a CHECK, NOT NULL or foreign key violation is the
        # row's own and fails every attempt alike.
        return is_duplicate_key(exc)
    return isinstance(exc, sa.exc.OperationalError | sa.exc.TimeoutError | ConnectionError | TimeoutError)


def is_duplicate_key(exc: sa.exc.IntegrityError) -> bool:
    """A unique or primary key violation: PostgreSQL's SQLSTATE 23505, SQLite's "UNIQUE constraint failed"."""
    code = getattr(exc.orig, "pgcode", None)
    if code is not None:
        return bool(code == "23505")
    return "UNIQUE constraint failed" in str(exc.orig)


def normalize_url(url: str) -> URL:
    """Parse a user-given URL and pin the driver we ship (psycopg2 for PostgreSQL)."""
    try:
        parsed = make_url(url)
    except sa.exc.ArgumentError:
        raise DatabaseUnavailable(
            f"MARKETING_DATABASE_URL {url!r} is not a database URL; "
            "expected e.g. sqlite:///path/to/file.db or postgresql://user@host:5432/db"
        ) from None
    backend = parsed.get_backend_name()
    if backend in ("postgres", "postgresql"):
        return parsed.set(drivername="postgresql+psycopg2")
    if backend == "sqlite":
        return parsed.set(drivername="sqlite+pysqlite")
    raise DatabaseUnavailable(f"unsupported database {backend!r} in MARKETING_DATABASE_URL; use sqlite or postgresql")


def _configure_sqlite(engine: sa.Engine) -> None:
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        # Take transaction control away from pysqlite so BEGIN IMMEDIATE below is what runs.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # WAL lets readers run beside the one writer; busy_timeout makes a second process
        # wait for the write lock instead of failing with "database is locked".
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # IMMEDIATE takes the write lock at BEGIN. A deferred transaction that reads and then
        # writes can fail with SQLITE_BUSY_SNAPSHOT without waiting when another process wrote
        # in between; taking the lock first makes every transaction wait its turn instead.
        conn.exec_driver_sql("BEGIN IMMEDIATE")


@functools.cache
def get_engine(url: str) -> sa.Engine:
    """One engine (and pool) per URL per process; sensors tick many times in one code server."""
    normalized = normalize_url(url)
    if normalized.get_backend_name() == "sqlite":
        # No directory is created here: only `db upgrade` (and the demo) create a database.
        engine = sa.create_engine(normalized, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        _configure_sqlite(engine)
        return engine
    # Sessions are named in pg_stat_activity: "marketing-pipelines" unless the URL names them
    # (?application_name=replica-a tells an operator, or a test, whose session holds or waits on a lock).
    connect_args: dict[str, object] = {"connect_timeout": 10}
    if "application_name" not in normalized.query:
        connect_args["application_name"] = "marketing-pipelines"
    return sa.create_engine(normalized, pool_pre_ping=True, pool_size=5, max_overflow=5, connect_args=connect_args)


def sqlite_path(engine: sa.Engine) -> Path | None:
    """The absolute path of a file-backed SQLite database, else None."""
    database = engine.url.database if engine.dialect.name == "sqlite" else None
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database).resolve()


def create_sqlite_folder(engine: sa.Engine) -> None:
    """Make the folder of a SQLite database file; for the commands that create the database."""
    path = sqlite_path(engine)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)


def check_connection(engine: sa.Engine) -> None:
    """Raise DatabaseUnavailable with one clear line when the database cannot be reached.

    A SQLite file that does not exist is reported, not created: connecting would create it.
    """
    path = sqlite_path(engine)
    if path is not None and not path.exists():
        raise DatabaseUnavailable(f"no SQLite database at {path}: run `marketing-pipelines db upgrade` to create it")
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        where = engine.url.render_as_string(hide_password=True)
        raise DatabaseUnavailable(
            f"cannot connect to {where}: {reason}. Check MARKETING_DATABASE_URL and that the server is running.",
            transient=True,
        ) from None


def is_postgres(conn_or_engine: sa.Connection | sa.Engine) -> bool:
    return conn_or_engine.dialect.name == "postgresql"


def insert_ignoring_conflicts(conn: sa.Connection, table: sa.Table, *index_elements: sa.Column[Any]) -> Any:
    """``INSERT ... ON CONFLICT DO NOTHING`` on either database: a row whose key exists is skipped.

    One statement instead of a read then an insert, so concurrent writers of the same key do not
    collide on the unique constraint. ``index_elements`` names the conflict target when needed.
    """
    # The dialect's own module, loaded here: at the top, SQLAlchemy's PostgreSQL dialect would load in
    # every command-line call on SQLite too (the start-up budget: docs/PERFORMANCE.md, section 11).
    from sqlalchemy.dialects import postgresql, sqlite

    dialect_insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    return dialect_insert(table).on_conflict_do_nothing(index_elements=list(index_elements) or None)


def one_of(conn: sa.Connection, column: sa.ColumnElement[Any], values: Iterable[Any]) -> sa.ColumnElement[bool]:
    """``column IN (values)``; on PostgreSQL ``column = ANY(:array)``, one parameter for every value.

    A batch's statements (a thousand ids) then have one text whatever their size: SQLAlchemy renders
    no parameter per value at each execution, and the server parses the same short statement.
    """
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects import postgresql  # as in insert_ignoring_conflicts

        return column == sa.any_(sa.bindparam(None, list(values), type_=postgresql.ARRAY(column.type)))
    return column.in_(list(values))
