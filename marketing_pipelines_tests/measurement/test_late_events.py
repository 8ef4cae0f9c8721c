"""Late events re-run exactly the days whose rollup misses them, contiguous days together; today's check says how stale.

A day is changed when an event was ingested after its rollup was built (``rolled_up_at``), not
when the sensor first saw the event: a load followed by a backfill changes nothing.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines import run_tags
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import measurement_daily_rollup, measurement_rollup_day
from marketing_pipelines.measurement.assets import (
    RANGE_END_TAG,
    RANGE_START_TAG,
    ROLLUP_IO_MANAGER,
    measurement_rollup_job,
)
from marketing_pipelines.measurement.events.validate import EventRow
from marketing_pipelines.measurement.events.write import record_events, store_events
from marketing_pipelines.measurement.freshness import (
    TODAY_IS_CURRENT,
    build_freshness_sensor,
    today_freshness,
    warn_after,
)
from marketing_pipelines.measurement.keys import TODAY_IS_CURRENT_KEY
from marketing_pipelines.measurement.report.frames import RollupFrameIOManager
from marketing_pipelines.measurement.rollup.late import day_backlog, days_ingested_against_rollup
from marketing_pipelines.measurement.sensors import RollupRange, build_late_events_sensor, rollup_ranges
from marketing_pipelines.settings import load_settings
from marketing_pipelines_tests.built import DEFAULTS, measurement_assets, today_is_current, unconfigured_importers
from marketing_pipelines_tests.factories import add_campaign
from marketing_pipelines_tests.measurement.generated import materialize_rollup

D = date(2026, 11, 2)
WEEK = [D + timedelta(days=n) for n in range(7)]
CAMPAIGN = "alpha"


def event(event_id: str, day: date, hour: int = 12) -> EventRow:
    occurred = datetime(day.year, day.month, day.day, hour, tzinfo=UTC)
    return EventRow(event_id, CAMPAIGN, "awareness", "page_view", occurred, "web", f"actor-{event_id}", {}, "{}")


def ingest(engine: sa.Engine, days: list[date], prefix: str, ingested_at: datetime | None = None) -> None:
    """One event per day, in one batch stamped ``ingested_at`` (now): the loader's own write path."""
    with engine.begin() as conn:
        store_events(conn, [event(f"{prefix}-{day}", day) for day in days], ingested_at or datetime.now(UTC), False)


def seeded_week(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance, ingested_at: datetime | None = None
) -> None:
    """Three events a day over WEEK, rolled up by one backfill run of the whole week."""
    add_campaign(engine, CAMPAIGN)
    for n in range(3):
        ingest(engine, WEEK, f"seed{n}", ingested_at)
    assert materialize_rollup(db_url, instance, *WEEK).success


def tick(sensor: dg.SensorDefinition, instance: dg.DagsterInstance, db_url: str, cursor: str | None) -> dg.SensorResult:
    result = sensor(
        dg.build_sensor_context(instance=instance, cursor=cursor, resources={"app_db": AppDatabase(url=db_url)})
    )
    assert isinstance(result, dg.SensorResult)
    return result


def spans(result: dg.SensorResult) -> list[str]:
    """Each run request as the days it covers: ``2026-11-02`` or ``2026-11-02..2026-11-04``."""
    out = []
    for request in result.run_requests or []:
        if request.partition_key:
            assert RANGE_START_TAG not in request.tags
            out.append(request.partition_key)
        else:
            out.append(f"{request.tags[RANGE_START_TAG]}..{request.tags[RANGE_END_TAG]}")
    return out


def build_at(engine: sa.Engine, built: datetime) -> None:
    """Make every rollup row look built at ``built``, as a run at that moment would have stamped them."""
    with engine.begin() as conn:
        conn.execute(sa.update(measurement_daily_rollup).values(rolled_up_at=built))
        conn.execute(sa.update(measurement_rollup_day).values(rolled_up_at=built))


def test_after_a_backfill_ten_ticks_request_nothing(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    sensor = build_late_events_sensor(DEFAULTS, settle_seconds=0)
    # The sensor is already watching when the events are loaded and backfilled (the demo under a running UI).
    cursor = tick(sensor, instance, db_url, None).cursor
    seeded_week(engine, db_url, instance)
    for _ in range(10):
        result = tick(sensor, instance, db_url, cursor)
        assert not result.run_requests, spans(result)
        assert result.cursor and result.cursor >= (cursor or "")
        cursor = result.cursor


def test_a_late_event_ingested_before_the_sensors_first_tick_is_still_rolled_up(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    # `ui` started before the database existed: its sensor skipped until the demo created and filled it, so
    # its first real tick comes after a late event for a day the demo had already rolled up.
    sensor = build_late_events_sensor(DEFAULTS, settle_seconds=0)
    seeded_week(engine, db_url, instance)
    ingest(engine, [WEEK[3]], "late")
    first = tick(sensor, instance, db_url, None)
    assert spans(first) == [WEEK[3].isoformat()]
    assert materialize_rollup(db_url, instance, WEEK[3]).success
    assert not tick(sensor, instance, db_url, first.cursor).run_requests


def test_one_late_event_requests_its_day_alone(engine: sa.Engine, db_url: str, instance: dg.DagsterInstance) -> None:
    sensor = build_late_events_sensor(DEFAULTS, settle_seconds=0)
    seeded_week(engine, db_url, instance)
    cursor = tick(sensor, instance, db_url, None).cursor
    ingest(engine, [WEEK[3]], "late")
    result = tick(sensor, instance, db_url, cursor)
    assert spans(result) == [WEEK[3].isoformat()]
    [request] = result.run_requests or []
    assert request.run_key == f"late-events:{WEEK[3]}:{result.cursor}"
    assert request.tags[run_tags.LATE_EVENTS] == "1"
    # Rolled up again: nothing is late any more, however often the sensor looks.
    assert materialize_rollup(db_url, instance, WEEK[3]).success
    assert not tick(sensor, instance, db_url, cursor).run_requests


def execute(request: dg.RunRequest, db_url: str, instance: dg.DagsterInstance) -> list[str]:
    """Run a request as the daemon would launch it (its job, tags and partition); the partitions it materialized."""
    defs = dg.Definitions(
        assets=measurement_assets,
        jobs=[measurement_rollup_job],
        resources={
            "app_db": AppDatabase(url=db_url),
            **unconfigured_importers(),
            ROLLUP_IO_MANAGER: RollupFrameIOManager(url=db_url),
        },
    )
    result = defs.resolve_job_def(measurement_rollup_job.name).execute_in_process(
        instance=instance, tags=request.tags, partition_key=request.partition_key
    )
    assert result.success
    return [e.partition or "" for e in result.get_asset_materialization_events()]


def test_late_days_go_into_ranges_in_as_few_runs_as_the_policy_allows(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    sensor = build_late_events_sensor(DEFAULTS, settle_seconds=0)
    seeded_week(engine, db_url, instance)
    cursor = tick(sensor, instance, db_url, None).cursor
    late = [WEEK[0], WEEK[1], WEEK[2], WEEK[5]]
    ingest(engine, late, "late")
    ingest(engine, [WEEK[1]], "late-again")
    result = tick(sensor, instance, db_url, cursor)
    assert spans(result) == [f"{WEEK[0]}..{WEEK[2]}", WEEK[5].isoformat()]
    assert [r.tags[run_tags.LATE_EVENTS] for r in result.run_requests or []] == ["4", "1"]
    assert len({r.run_key for r in result.run_requests or []}) == 2
    assert all((r.run_key or "").endswith(f":{result.cursor}") for r in result.run_requests or [])
    # The range run is what a backfill run is: one materialization per day of it, each day rebuilt.
    materialized = [p for request in result.run_requests or [] for p in execute(request, db_url, instance)]
    assert materialized == [d.isoformat() for d in late]
    with engine.connect() as conn:
        assert all(d.late_events == 0 for d in days_ingested_against_rollup(conn, None, datetime.now(UTC)))
    assert not tick(sensor, instance, db_url, cursor).run_requests

    # MARKETING_BACKFILL_DAYS_PER_RUN=2 cuts the same days into runs of two days at most.
    ingest(engine, late, "later")
    cut = tick(
        build_late_events_sensor(load_settings(backfill_days_per_run=2), settle_seconds=0),
        instance,
        db_url,
        result.cursor,
    )
    assert spans(cut) == [f"{WEEK[0]}..{WEEK[1]}", WEEK[2].isoformat(), WEEK[5].isoformat()]


@pytest.mark.parametrize(
    ("days", "max_days", "expected"),
    [
        # one day: a run of its own
        ([0], 92, [(0, 0)]),
        # contiguous days share a run; a gap starts another
        ([0, 1, 2, 5], 92, [(0, 2), (5, 5)]),
        # a long stretch is cut every max_days days
        ([0, 1, 2, 3, 4], 2, [(0, 1), (2, 3), (4, 4)]),
        # max_days 1 is one run per day
        ([3, 4], 1, [(3, 3), (4, 4)]),
        # across a month end, in day order whatever the input order
        ([29, 27, 28], 92, [(27, 29)]),
    ],
)
def test_rollup_ranges(days: list[int], max_days: int, expected: list[tuple[int, int]]) -> None:
    ranges = rollup_ranges({D + timedelta(days=n): 1 for n in days}, max_days)
    assert [(r.first, r.last) for r in ranges] == [(D + timedelta(days=a), D + timedelta(days=b)) for a, b in expected]
    assert [r.late_events for r in ranges] == [b - a + 1 for a, b in expected]
    assert RollupRange(D, D, 1).span == D.isoformat()


@pytest.mark.parametrize(
    ("stamped", "inserted", "requested"),
    [
        # stamped long before the build, which read it: nothing to do
        (timedelta(hours=-2), "before", False),
        # stamped just before the build, which read it: the recount matches
        (timedelta(seconds=-10), "before", False),
        # stamped just before the build but committed after it (a batch still open): the recount differs
        (timedelta(seconds=-10), "after", True),
        # stamped after the build: late
        (timedelta(seconds=60), "after", True),
    ],
    ids=["long-before", "just-before-and-read", "just-before-committed-after", "after"],
)
def test_an_event_is_late_only_if_the_rollup_was_built_without_it(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance, stamped: timedelta, inserted: str, requested: bool
) -> None:
    now = datetime.now(UTC)
    built = now - timedelta(minutes=30)
    add_campaign(engine, CAMPAIGN)
    ingest(engine, WEEK, "seed", now - timedelta(hours=3))
    if inserted == "before":
        ingest(engine, [WEEK[2]], "case", built + stamped)
    assert materialize_rollup(db_url, instance, *WEEK).success
    build_at(engine, built)
    if inserted == "after":
        ingest(engine, [WEEK[2]], "case", built + stamped)
    # The deployed settle margin (60 s); every stamp here is older than it.
    result = tick(build_late_events_sensor(DEFAULTS), instance, db_url, (now - timedelta(hours=4)).isoformat())
    assert spans(result) == ([WEEK[2].isoformat()] if requested else [])


def test_days_never_materialized_are_left_to_the_schedule(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    sensor = build_late_events_sensor(DEFAULTS, settle_seconds=0)
    seeded_week(engine, db_url, instance)
    cursor = tick(sensor, instance, db_url, None).cursor
    ingest(engine, [WEEK[0] - timedelta(days=3), WEEK[6], WEEK[6] + timedelta(days=1)], "outside")
    assert spans(tick(sensor, instance, db_url, cursor)) == [WEEK[6].isoformat()]


def test_today_is_kept_current_even_after_a_run_that_did_not_happen(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    sensor = build_late_events_sensor(DEFAULTS, settle_seconds=0)
    add_campaign(engine, CAMPAIGN)
    today = datetime.now(UTC).date()
    with engine.begin() as conn:
        record_events(
            conn,
            [
                {
                    "event_id": "t1",
                    "campaign_id": CAMPAIGN,
                    "stage": "awareness",
                    "event_type": "page_view",
                    "occurred_at": datetime.now(UTC).isoformat(),
                }
            ],
        )
    # Never materialized, no cursor yet: today is still requested (the first tick reads today alone).
    first = tick(sensor, instance, db_url, None)
    assert spans(first) == [today.isoformat()]
    # That run failed or never ran: the next tick asks again, though no event arrived in its window.
    second = tick(sensor, instance, db_url, first.cursor)
    assert spans(second) == [today.isoformat()]
    assert first.run_requests and second.run_requests
    assert first.run_requests[0].run_key != second.run_requests[0].run_key
    assert materialize_rollup(db_url, instance, today).success
    assert not tick(sensor, instance, db_url, second.cursor).run_requests


# --- the freshness check -----------------------------------------------------------------------

NOON = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
LIMIT = timedelta(minutes=11)


@pytest.mark.parametrize(
    ("events_ingested", "built", "passed", "missing", "lag"),
    [
        # no event for today: nothing to hold
        ([], None, True, 0, 0),
        # an event 5 minutes old and no rollup yet: within the limit
        ([-5], None, True, 1, 300),
        # the oldest of two events has waited 20 minutes: WARN
        ([-20, -1], None, False, 2, 1200),
        # the rollup was built after both events: current
        ([-20, -1], -0.5, True, 0, 0),
        # built 30 minutes ago, an event from 12 minutes ago is not in it: WARN
        ([-40, -12], -30, False, 1, 720),
        # an event dated today but ingested yesterday waits from midnight, not from its ingestion
        ([-60 * 24], None, False, 1, 12 * 3600),
    ],
)
def test_today_freshness(
    engine: sa.Engine,
    db_url: str,
    instance: dg.DagsterInstance,
    events_ingested: list[float],
    built: float | None,
    passed: bool,
    missing: int,
    lag: int,
) -> None:
    add_campaign(engine, CAMPAIGN)
    day = NOON.date()
    for n, minutes in enumerate(events_ingested):
        with engine.begin() as conn:
            store_events(conn, [event(f"e{n}", day, hour=11)], NOON + timedelta(minutes=minutes), False)
    if built is not None:
        assert materialize_rollup(db_url, instance, day).success
        build_at(engine, NOON + timedelta(minutes=built))
    with engine.connect() as conn:
        fields = today_freshness(conn, NOON, LIMIT, DEFAULTS.measurement_start_date)
        assert day_backlog(conn, day).events == missing
    assert (fields["passed"], fields["severity"]) == (passed, dg.AssetCheckSeverity.WARN)
    assert fields["metadata"]["events_not_rolled_up"] == dg.MetadataValue.int(missing)
    assert fields["metadata"]["lag_seconds"] == dg.MetadataValue.float(float(lag))
    assert ("misses" in fields["description"]) == bool(missing)


def test_today_rolled_up_empty_is_built_not_missing(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    # Today built at 11:30 with no event; one ingested at 11:48 is what it misses, and it was built.
    add_campaign(engine, CAMPAIGN)
    day = NOON.date()
    assert materialize_rollup(db_url, instance, day).success
    build_at(engine, NOON - timedelta(minutes=30))
    with engine.begin() as conn:
        store_events(conn, [event("late", day, hour=11)], NOON - timedelta(minutes=12), False)
    with engine.connect() as conn:
        fields = today_freshness(conn, NOON, LIMIT, DEFAULTS.measurement_start_date)
    assert fields["description"].startswith(f"Today's rollup ({day}, built 11:30:00 UTC) misses 1 events")
    assert "rolled_up_at" in fields["metadata"]


def test_the_threshold_is_twice_the_interval_past_the_settle_margin() -> None:
    assert warn_after(300) == timedelta(seconds=660)
    assert warn_after(30) == timedelta(seconds=120)


def test_the_sensor_records_the_check_without_a_run_and_the_ui_shows_it(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    add_campaign(engine, CAMPAIGN)
    sensor = build_freshness_sensor(load_settings(late_events_interval_seconds=30))
    quiet = tick(sensor, instance, db_url, None)
    # An event for today ingested two hours before now (or at midnight, if sooner), never rolled up.
    now = datetime.now(UTC)
    with engine.begin() as conn:
        store_events(conn, [event("stale", now.date(), hour=0)], now - timedelta(hours=2), False)
    stale = tick(sensor, instance, db_url, quiet.cursor)
    assert not quiet.run_requests and not stale.run_requests
    [fine], [late] = quiet.asset_events, stale.asset_events
    assert isinstance(fine, dg.AssetCheckEvaluation) and isinstance(late, dg.AssetCheckEvaluation)
    assert (fine.asset_check_key, fine.passed) == (TODAY_IS_CURRENT_KEY, True)
    # The limit is 120 s here; in a UTC day's first 120 s the wait, counted from midnight, is still within it.
    if now - warn_after(30) > datetime.combine(now.date(), datetime.min.time(), tzinfo=UTC):
        assert (late.passed, late.severity) == (False, dg.AssetCheckSeverity.WARN)
        assert stale.cursor == "failing"
    # The daemon records what the sensor returns as a runless event: the check's latest result in the UI.
    instance.report_runless_asset_event(late)
    summary = instance.event_log_storage.get_asset_check_summary_records([TODAY_IS_CURRENT_KEY])[TODAY_IS_CURRENT_KEY]
    record = summary.last_completed_check_execution_record
    assert record is not None and record.event is not None
    assert record.event.asset_check_evaluation == late


def test_the_check_executes_on_its_own_as_from_the_ui_and_leaves_rollup_runs_green(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    add_campaign(engine, CAMPAIGN)
    ingest(engine, [*WEEK[:3], datetime.now(UTC).date()], "seed")
    check_job = dg.define_asset_job("check_only", selection=dg.AssetSelection.checks(TODAY_IS_CURRENT_KEY))
    defs = dg.Definitions(
        assets=measurement_assets,
        asset_checks=[today_is_current],
        jobs=[measurement_rollup_job, check_job],
        resources={
            "app_db": AppDatabase(url=db_url),
            **unconfigured_importers(),
            ROLLUP_IO_MANAGER: RollupFrameIOManager(url=db_url),
        },
    )
    # "Execute" on the check in the UI: a run of the check alone, reading the database afresh.
    alone = defs.resolve_job_def("check_only").execute_in_process(instance=instance)
    [evaluation] = alone.get_asset_check_evaluations()
    assert evaluation.asset_check_key == TODAY_IS_CURRENT_KEY
    assert evaluation.metadata["events_not_rolled_up"] == dg.MetadataValue.int(1)
    # The rollup job leaves this check out of its selection: its run, a range run here, does not evaluate it
    # and stays green.
    rollup = defs.resolve_job_def(measurement_rollup_job.name).execute_in_process(
        instance=instance, tags={RANGE_START_TAG: WEEK[0].isoformat(), RANGE_END_TAG: WEEK[2].isoformat()}
    )
    assert rollup.success
    assert TODAY_IS_CURRENT not in {e.check_name for e in rollup.get_asset_check_evaluations()}
