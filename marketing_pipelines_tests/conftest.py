"""Shared fixtures: real databases (a SQLite file per test, a throwaway PostgreSQL database).

PostgreSQL tests read MARKETING_TEST_POSTGRES_URL (default: the local server, user postgres).
Without a reachable server they skip with the reason locally, and fail under CI=true, where
a skipped database test would hide exactly what CI is for.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines import redact
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.migrate import upgrade
from marketing_pipelines.db.schema import metadata
from marketing_pipelines_tests.machine import require_or_skip
from marketing_pipelines_tests.webserver import Recorder, webhook_server

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


def _admin_url() -> str:
    return os.environ.get("MARKETING_TEST_POSTGRES_URL", DEFAULT_PG_URL)


@pytest.fixture(autouse=True)
def _secrets_remembered_per_test() -> Iterator[None]:
    """Each test starts with the secrets this process remembered before it (``redact.remember_secrets``):
    one test's key or site id must not be hidden in the next test's text."""
    remembered = redact.remembered_snapshot()
    yield
    redact.forget_since(remembered)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated SQLite file; each test copies it instead of migrating again."""
    path = tmp_path_factory.mktemp("template") / "template.db"
    engine = get_engine(f"sqlite:///{path}")
    upgrade(engine)
    engine.dispose()
    return path


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    path = tmp_path / "app.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    admin_url = _admin_url()
    # pool_pre_ping: test_soak.py restarts the server, which closes the connection this pool holds.
    admin = sa.create_engine(
        admin_url.replace("postgresql://", "postgresql+psycopg2://", 1),
        isolation_level="AUTOCOMMIT",
        pool_pre_ping=True,
    )
    try:
        with admin.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.OperationalError as exc:
        reason = f"PostgreSQL not reachable at {admin_url}: {str(exc.orig).strip().splitlines()[0]}"
        require_or_skip(reason)
    name = f"mp_test_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    upgrade(get_engine(url))
    yield url
    get_engine(url).dispose()
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture
def pg_url(pg_database: str) -> str:
    """The session's PostgreSQL database, emptied before each test."""
    tables = ", ".join(f'"{t.name}"' for t in metadata.sorted_tables)
    with get_engine(pg_database).begin() as conn:
        conn.execute(sa.text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    return pg_database


@pytest.fixture
def dagster_pg(pg_url: str) -> Iterator[tuple[str, dict[str, str]]]:
    """A throwaway PostgreSQL database for Dagster's storage: its URL and the DAGSTER_PG_* variables for it."""
    name = f"mp_dagster_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(get_engine(pg_url).url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(pg_url)
    try:
        yield (
            url.set(database=name).render_as_string(hide_password=False),
            {
                "DAGSTER_PG_HOST": url.host or "127.0.0.1",
                "DAGSTER_PG_PORT": str(url.port or 5432),
                "DAGSTER_PG_USER": url.username or "postgres",
                "DAGSTER_PG_PASSWORD": url.password or "",
                "DAGSTER_PG_DB": name,
            },
        )
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Runs a test on both databases; each test hands the URL to what it runs (resources, CLI env)."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture
def engine(db_url: str) -> sa.Engine:
    return get_engine(db_url)


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    """A throwaway Dagster instance (its own temporary DAGSTER_HOME)."""
    with dg.instance_for_test() as inst:
        yield inst


@pytest.fixture
def hook() -> Iterator[Recorder]:
    """A local webhook receiver on 127.0.0.1 that records every POST."""
    with webhook_server() as recorder:
        yield recorder


# README.md states how long the two selections take on a 2-core machine; a run of either prints its own time
# beside that figure, so a README that has drifted shows at the end of every full run (never a failure: the
# machine's speed is no test result).
README_TIMES = re.compile(r"takes about (?P<fast>\d+) minutes instead of about (?P<full>\d+)")
_started = time.monotonic()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    whole = not config.args or config.args == config.getini("testpaths")
    selection = {"": "full", "not slow": "fast"}.get(config.option.markexpr or "")
    stated = README_TIMES.search((Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8"))
    if not whole or selection is None or stated is None:
        return
    minutes = (time.monotonic() - _started) / 60
    terminalreporter.write_line(
        f"README.md says the {selection} suite takes about {stated[selection]} minutes on 2 cores; "
        f"this run took {minutes:.1f} on {os.cpu_count()} ({minutes / int(stated[selection]):.2f} of it)"
    )
