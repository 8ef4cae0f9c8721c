"""Migrations create exactly the tables the code declares, on both databases."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from marketing_pipelines.agents.users import add_user
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.migrate import alembic_config, current_revision, head_revision, upgrade
from marketing_pipelines.db.schema import agent_run, measurement_daily_rollup, measurement_rollup_day, metadata
from marketing_pipelines.db.schema_version import SchemaNotReady, code_head_revision, ensure_schema_current
from marketing_pipelines_tests.factories import add_campaign


def test_migrated_schema_matches_the_models(engine: sa.Engine) -> None:
    assert current_revision(engine) == head_revision()
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": False}), metadata)
    assert diff == []


def test_the_cheap_head_is_alembics_head() -> None:
    # ensure_schema_current compares against code_head_revision without importing Alembic.
    assert code_head_revision() == head_revision()


@pytest.mark.parametrize(
    ("recorded", "message"),
    [
        # One revision behind: the fix is to upgrade the database.
        ("0001", "is at revision 0001, behind {head}: run `marketing-pipelines db upgrade`"),
        # A revision from newer code: the fix is to upgrade the package.
        ("9999", "is at revision 9999, newer than this code knows (head {head}): upgrade marketing-pipelines"),
    ],
)
def test_a_schema_not_at_head_is_refused_with_its_fix(sqlite_url: str, recorded: str, message: str) -> None:
    engine = get_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = :v"), {"v": recorded})
    with pytest.raises(SchemaNotReady, match=re.escape(message.format(head=head_revision()))):
        ensure_schema_current(engine)


@pytest.fixture(params=["sqlite", "postgres"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of each kind, dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    server = sa.engine.make_url(request.getfixturevalue("pg_database"))
    name = f"mp_migration_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(get_engine(server.render_as_string(hide_password=False)).url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        get_engine(server.set(database=name).render_as_string(hide_password=False)).dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_0009_leaves_runs_still_to_run_with_grants_on_their_campaign_only(empty_url: str) -> None:
    engine = get_engine(empty_url)
    upgrade(engine, "0008")
    add_campaign(engine, "spring-launch")
    old_capture = [["campaign:read", "*"], ["execution:write", "other"], ["measurement:read", "spring-launch"]]
    now = datetime.now(UTC)
    with engine.begin() as conn:
        add_user(conn, "ana")
        for status in ("QUEUED", "RUNNING", "SUCCEEDED"):
            conn.execute(
                sa.insert(agent_run).values(
                    agent="measurement_analyst", campaign_id="spring-launch", input={}, status=status,
                    requested_by="ana", permissions=old_capture, model_provider="offline", requested_at=now,
                    updated_at=now, attempts=0, max_attempts=3, max_run_seconds=60,
                )
            )  # fmt: skip
    upgrade(engine)
    with engine.connect() as conn:
        held = dict(conn.execute(sa.select(agent_run.c.status, agent_run.c.permissions)).all())
    scoped = [["campaign:read", "spring-launch"], ["measurement:read", "spring-launch"]]
    # A run still to run holds nothing beyond its campaign; a finished one keeps the record of what it held.
    assert held == {"QUEUED": scoped, "RUNNING": scoped, "SUCCEEDED": old_capture}


def test_0014_records_the_days_already_rolled_up_as_built(empty_url: str) -> None:
    engine = get_engine(empty_url)
    upgrade(engine, "0013")
    add_campaign(engine, "spring-launch")
    earlier, later = datetime(2026, 11, 2, 1, tzinfo=UTC), datetime(2026, 11, 2, 3, tzinfo=UTC)
    row = {"day": date(2026, 11, 1), "campaign_id": "spring-launch", "source": "first_party", "raw_count": 1}
    with engine.begin() as conn:
        conn.execute(
            sa.insert(measurement_daily_rollup),
            [
                {**row, "stage": "awareness", "event_type": "page_view", "rolled_up_at": earlier},
                {**row, "stage": "awareness", "event_type": "click", "rolled_up_at": later},
            ],
        )
    upgrade(engine)
    with engine.connect() as conn:
        built = conn.execute(sa.select(measurement_rollup_day)).all()
    assert [(d, at.astimezone(UTC), n) for d, at, n in built] == [(date(2026, 11, 1), later, 2)]


def test_0016_lets_the_rollup_hold_rows_of_the_contracts_sources(empty_url: str) -> None:
    engine = get_engine(empty_url)
    upgrade(engine, "0015")
    add_campaign(engine, "spring-launch")
    row = {
        "day": date(2026, 11, 1),
        "campaign_id": "spring-launch",
        "source": "posthog",
        "stage": "product",
        "event_type": "posthog_event",
        "raw_count": 3,
        "rolled_up_at": datetime(2026, 11, 2, 1, tzinfo=UTC),
    }
    # Before: a source built on the contract failed every rollup of a day it imported.
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(sa.insert(measurement_daily_rollup).values(row))
    upgrade(engine)
    with engine.begin() as conn:
        conn.execute(sa.insert(measurement_daily_rollup).values(row))
    # Back down, the newer sources' rows go (the rollup rebuilds them) and the old check holds again.
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0015")
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(measurement_daily_rollup)).scalar_one() == 0
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(sa.insert(measurement_daily_rollup).values(row))
