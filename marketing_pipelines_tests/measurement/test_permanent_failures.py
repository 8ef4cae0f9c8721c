"""A measurement step that fails the same way on every attempt fails its run at once; only what may pass later retries.

Real in-process Dagster runs of the rollup with a RetryPolicy of 3 retries and no delay, on real databases.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, date, datetime
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import measurement_daily_rollup
from marketing_pipelines.measurement.assets import (
    RANGE_END_TAG,
    RANGE_START_TAG,
    ROLLUP_IO_MANAGER,
    build_measurement_assets,
    left_out_importers,
)
from marketing_pipelines.measurement.events.write import record_events
from marketing_pipelines.measurement.keys import ROLLUP_KEY
from marketing_pipelines.measurement.report.frames import RollupFrameIOManager
from marketing_pipelines_tests.built import DEFAULTS
from marketing_pipelines_tests.factories import add_campaign

RETRY_AT_ONCE = dg.RetryPolicy(max_retries=3)


def run_rollup(db_url: str, first: date, last: date) -> dg.ExecuteInProcessResult:
    """The rollup over first..last as one range run, as a backfill run carries its range (tags)."""
    return dg.materialize(
        build_measurement_assets(DEFAULTS, retry_policy=RETRY_AT_ONCE, left_out=left_out_importers(DEFAULTS)),
        selection=[ROLLUP_KEY],
        instance=dg.DagsterInstance.ephemeral(),
        resources={"app_db": AppDatabase(url=db_url), ROLLUP_IO_MANAGER: RollupFrameIOManager(url=db_url)},
        tags={RANGE_START_TAG: first.isoformat(), RANGE_END_TAG: last.isoformat()},
        raise_on_error=False,
    )


def events_of(result: dg.ExecuteInProcessResult, event_type: dg.DagsterEventType) -> list[dg.DagsterEvent]:
    return [e for e in result.all_events if e.event_type == event_type]


def the_failure(result: dg.ExecuteInProcessResult) -> str:
    assert result.dagster_run.status == dg.DagsterRunStatus.FAILURE
    [failure] = events_of(result, dg.DagsterEventType.STEP_FAILURE)
    assert failure.step_failure_data is not None
    return str(failure.step_failure_data.error)


def test_days_before_the_partitions_start_fail_at_once_and_write_nothing(engine: sa.Engine, db_url: str) -> None:
    # A run created where MARKETING_MEASUREMENT_START_DATE was earlier than this code location's (2026-01-01).
    add_campaign(engine)
    event = {"campaign_id": "spring-launch", "stage": "awareness", "event_type": "page_view", "actor_id": "a"}
    with engine.begin() as conn:
        for n, day in enumerate((date(2025, 12, 30), date(2026, 1, 1))):
            occurred = datetime(day.year, day.month, day.day, 12, tzinfo=UTC).isoformat()
            record_events(conn, [{**event, "event_id": f"e{n}", "occurred_at": occurred}])
    result = run_rollup(db_url, date(2025, 12, 30), date(2026, 1, 2))
    error = the_failure(result)
    assert events_of(result, dg.DagsterEventType.STEP_UP_FOR_RETRY) == []
    assert "2 of the run's days (2025-12-30..2025-12-31) are not partitions of this code location" in error
    assert "start on 2026-01-01 (MARKETING_MEASUREMENT_START_DATE)" in error
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(measurement_daily_rollup)).scalar_one() == 0


@pytest.mark.parametrize(
    ("database", "retried", "says"),
    [
        # A database without the schema: every attempt meets it until someone runs `db upgrade`.
        ("empty", 0, "SchemaNotReady"),
        # Nothing listens: the server may be back for the next attempt.
        ("unreachable", 3, "cannot connect to"),
    ],
)
def test_only_a_failure_a_later_attempt_may_not_meet_is_retried(
    tmp_path: Path, database: str, retried: int, says: str
) -> None:
    if database == "empty":
        sqlite3.connect(tmp_path / "empty.db").close()
        url = f"sqlite:///{tmp_path / 'empty.db'}"
    else:
        url = "postgresql://postgres@127.0.0.1:1/nothing_listens"
    result = run_rollup(url, date(2026, 11, 2), date(2026, 11, 3))
    assert says in the_failure(result)
    assert len(events_of(result, dg.DagsterEventType.STEP_UP_FOR_RETRY)) == retried
