"""A sensor tick with nothing to do logs nothing: its skip reason is on the tick in the UI, not in the logs."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import pytest

from marketing_pipelines.agents.resources import AgentSettings
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.executions.queue import schedule_execution
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.measurement.sensors import build_late_events_sensor
from marketing_pipelines_tests.built import DEFAULTS, due_executions_sensor, queued_agent_runs_sensor
from marketing_pipelines_tests.factories import add_campaign


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def tick(
    sensor: dg.SensorDefinition, instance: dg.DagsterInstance, db_url: str, cursor: str | None
) -> tuple[Any, str | None, list[str]]:
    """One evaluation: its result, the cursor it leaves, and what it logged."""
    context = dg.build_sensor_context(
        instance=instance,
        cursor=cursor,
        resources={
            "app_db": AppDatabase(url=db_url),
            "execution_settings": ExecutionSettings(),
            "agent_settings": AgentSettings(),
        },
    )
    # The sensor's logger is the context's own (not a child of the root logger caplog watches).
    records = Records()
    context.log.addHandler(records)
    result = sensor(context)
    cursor = result.cursor if isinstance(result, dg.SensorResult) and result.cursor is not None else context.cursor
    return result, cursor, [r.getMessage() for r in records.records]


@pytest.mark.parametrize(
    "sensor",
    [
        due_executions_sensor,
        # Its first tick applies the pool limit (and says so); the second is a steady-state empty tick.
        queued_agent_runs_sensor,
        build_late_events_sensor(DEFAULTS, settle_seconds=0),
    ],
    ids=lambda s: s.name,
)
def test_a_tick_with_nothing_to_do_logs_nothing(sensor: dg.SensorDefinition, sqlite_url: str) -> None:
    with dg.instance_for_test() as instance:
        _, cursor, _ = tick(sensor, instance, sqlite_url, None)
        result, _, logged = tick(sensor, instance, sqlite_url, cursor)
    assert logged == []
    assert isinstance(result, dg.SkipReason) or not result.run_requests


def test_a_tick_that_launches_runs_says_so(sqlite_url: str) -> None:
    # Holds the capture above to account: a tick with work does reach the handler.
    engine = get_engine(sqlite_url)
    campaign = add_campaign(engine)
    with engine.begin() as conn:
        schedule_execution(conn, campaign_id=campaign, stage="launch", action="log", due_at=datetime.now(UTC))
    with dg.instance_for_test() as instance:
        result, _, logged = tick(due_executions_sensor, instance, sqlite_url, None)
    assert result.run_requests and logged
