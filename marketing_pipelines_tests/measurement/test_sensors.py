"""measurement_late_events_sensor re-requests exactly the days that got late events; the schedule asks for yesterday."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import dagster as dg
import pandas as pd
import sqlalchemy as sa

from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.measurement.events.write import record_events
from marketing_pipelines.measurement.sensors import build_late_events_sensor
from marketing_pipelines_tests.built import DEFAULTS, measurement_daily_schedule, measurement_late_events_sensor
from marketing_pipelines_tests.measurement.generated import (
    DAYS,
    generated_events,
    materialize_rollup,
    rollup_rows_frame,
    seed,
)


def late(event_id: str, day: date, stage: str = "awareness", event_type: str = "page_view") -> dict[str, str]:
    return {
        "event_id": event_id,
        "campaign_id": "alpha",
        "stage": stage,
        "event_type": event_type,
        "actor_id": f"late-{event_id}",
        "occurred_at": f"{day.isoformat()}T12:00:00+00:00",
    }


def test_a_late_event_changes_exactly_its_day(engine: sa.Engine, db_url: str) -> None:
    seed(engine, generated_events(per_day=30))
    instance = dg.DagsterInstance.ephemeral()
    for day in DAYS:
        assert materialize_rollup(db_url, instance, day).success
    before = rollup_rows_frame(engine)
    sensor = build_late_events_sensor(DEFAULTS, settle_seconds=0)
    resources = {"app_db": AppDatabase(url=db_url)}

    first = sensor(dg.build_sensor_context(instance=instance, resources=resources))
    assert isinstance(first, dg.SensorResult) and not first.run_requests and first.cursor

    today = datetime.now(UTC).date()
    never_materialized = DAYS[0] - timedelta(days=5)
    with engine.begin() as conn:
        record_events(conn, [late("l1", DAYS[1]), late("l2", never_materialized), late("l3", today)])
    second = sensor(dg.build_sensor_context(instance=instance, resources=resources, cursor=first.cursor))
    assert isinstance(second, dg.SensorResult)
    requests = list(second.run_requests or [])
    assert [r.partition_key for r in requests] == [DAYS[1].isoformat(), today.isoformat()]
    assert all(second.cursor in (r.run_key or "") for r in requests)
    assert second.cursor and second.cursor > first.cursor

    for request in requests:
        assert materialize_rollup(db_url, instance, date.fromisoformat(request.partition_key or "")).success
    after = rollup_rows_frame(engine)
    unchanged = after[after["day"] != DAYS[1]]
    pd.testing.assert_frame_equal(
        unchanged[unchanged["day"] != today].reset_index(drop=True),
        before[before["day"] != DAYS[1]].reset_index(drop=True),
    )
    key = ["day", "campaign_id", "stage", "event_type"]
    merged = before[before["day"] == DAYS[1]].merge(after[after["day"] == DAYS[1]], on=key, suffixes=("_before", ""))
    grew = merged[merged["raw_count"] != merged["raw_count_before"]]
    assert grew[key].values.tolist() == [[DAYS[1], "alpha", "awareness", "page_view"]]
    assert (grew["raw_count"] - grew["raw_count_before"]).tolist() == [1]
    assert (grew["unique_actors"] - grew["unique_actors_before"]).tolist() == [1]

    third = sensor(dg.build_sensor_context(instance=instance, resources=resources, cursor=second.cursor))
    assert isinstance(third, dg.SensorResult) and not third.run_requests


def test_the_deployed_sensor_waits_for_events_to_settle(engine: sa.Engine, db_url: str) -> None:
    seed(engine, generated_events(per_day=5))
    instance = dg.DagsterInstance.ephemeral()
    materialize_rollup(db_url, instance, DAYS[1])
    resources = {"app_db": AppDatabase(url=db_url)}
    cursor = (datetime.now(UTC) - timedelta(minutes=10)).isoformat()
    with engine.begin() as conn:
        record_events(conn, [late("fresh", DAYS[1])])
    # Ingested seconds ago: inside the settle margin, so not yet requested and still after the new cursor.
    result = measurement_late_events_sensor(
        dg.build_sensor_context(instance=instance, resources=resources, cursor=cursor)
    )
    assert isinstance(result, dg.SensorResult) and not result.run_requests
    assert result.cursor and result.cursor < datetime.now(UTC).isoformat()


def test_schedule_requests_yesterdays_partition() -> None:
    context = dg.build_schedule_context(scheduled_execution_time=datetime(2026, 11, 27, 0, 15, tzinfo=UTC))
    # The importers of the default settings revise nothing: one run, yesterday's.
    [request] = measurement_daily_schedule(context)
    assert isinstance(request, dg.RunRequest)
    assert (request.partition_key, request.run_key) == ("2026-11-26", "measurement-daily:2026-11-26")
    early = measurement_daily_schedule(
        dg.build_schedule_context(scheduled_execution_time=datetime(2020, 1, 1, 0, 15, tzinfo=UTC))
    )
    assert isinstance(early, dg.SkipReason)
