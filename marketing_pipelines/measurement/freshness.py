"""``today_is_current``: a WARN check that today's rollup holds the events ingested for today, and its sensor.

The check measures what a reader of today's numbers cares about: the oldest event for today that
today's rollup does not hold yet (one ingested after ``rolled_up_at``), and how long ago it arrived.
It WARNs once that is longer than twice ``MARKETING_LATE_EVENTS_INTERVAL_SECONDS`` past the late-events
sensor's 60 s settle margin: the sensor is not ticking, or its runs fail or wait in the queue.

Dagster's freshness-check factories measure something else here. ``build_last_update_freshness_checks``
asks for a materialization of any partition within the window, so it WARNs on every quiet hour in
which nothing needed rebuilding; ``build_time_partition_freshness_checks`` only asks that today's
partition exists; both are superseded in 1.13 (each load prints a warning), and their sensor launches
a run per evaluation. ``measurement_freshness_sensor`` records the evaluation without a run, as
``queue_health_sensor`` does; the check definition lists it under the rollup in the UI and computes
it afresh when executed from there. The rollup jobs leave it out of their selection, so their runs (the
schedule's, the late-events sensor's, job backfills) do not evaluate it; a materialization of the rollup
launched from the asset's page selects the asset's checks, this one too, and evaluates it after the
rollup (WARN at most, as the sensor would).
"""

from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.measurement.keys import ROLLUP_KEY, TODAY_IS_CURRENT_KEY
from marketing_pipelines.measurement.retention import WITHIN_RETENTION, retention_evaluation
from marketing_pipelines.measurement.rollup.event_days import day_bounds
from marketing_pipelines.measurement.rollup.late import DayBacklog, day_backlog
from marketing_pipelines.measurement.sensors import DEFAULT_SETTLE_SECONDS
from marketing_pipelines.measurement.sources import Source
from marketing_pipelines.settings import Settings

TODAY_IS_CURRENT = TODAY_IS_CURRENT_KEY.name


def warn_after(interval_seconds: int) -> timedelta:
    """How old the oldest event missing from today's rollup may get: two sensor intervals past the settle margin.

    An event waits up to the margin plus one interval for the tick that requests its day, then for
    the run; a second interval leaves room for a slow queue before a missed tick shows.
    """
    return timedelta(seconds=2 * interval_seconds + DEFAULT_SETTLE_SECONDS)


def today_freshness(conn: sa.Connection, now: datetime, limit: timedelta, first: date) -> dict[str, Any]:
    """The check's outcome for ``now``'s UTC day (none to build before ``first``, the first partition),
    as the fields an evaluation and a check result share."""
    today = now.astimezone(UTC).date()
    backlog = DayBacklog(today, None, 0, None) if today < first else day_backlog(conn, today)
    # An event dated ahead and ingested before today became today's at midnight: its wait starts there.
    waiting_since = max(backlog.oldest_ingested_at, day_bounds(today)[0]) if backlog.oldest_ingested_at else now
    lag = max(now - waiting_since, timedelta(0))
    metadata = {
        "day": dg.MetadataValue.text(today.isoformat()),
        "events_not_rolled_up": dg.MetadataValue.int(backlog.events),
        "lag_seconds": dg.MetadataValue.float(round(lag.total_seconds(), 3)),
        "warn_after_seconds": dg.MetadataValue.float(limit.total_seconds()),
        **({"rolled_up_at": dg.MetadataValue.timestamp(backlog.rolled_up_at)} if backlog.rolled_up_at else {}),
    }
    built = f"built {backlog.rolled_up_at:%H:%M:%S} UTC" if backlog.rolled_up_at else "not built yet"
    if not backlog.events:
        return _fields(True, f"Today's rollup ({today}, {built}) holds every event ingested for today.", metadata)
    missing = f"Today's rollup ({today}, {built}) misses {backlog.events} events, the oldest waiting {_seconds(lag)} s"
    if lag <= limit:
        return _fields(True, f"{missing}: within {_seconds(limit)} s.", metadata)
    return _fields(
        False,
        f"{missing}: more than {_seconds(limit)} s (twice MARKETING_LATE_EVENTS_INTERVAL_SECONDS past the settle "
        "margin). Is measurement_late_events_sensor running, and are its measurement_rollup_job runs succeeding?",
        metadata,
    )


def _seconds(delta: timedelta) -> int:
    return int(delta.total_seconds())


def _fields(passed: bool, description: str, metadata: Mapping[str, dg.MetadataValue]) -> dict[str, Any]:
    return {
        "asset_key": ROLLUP_KEY,
        "check_name": TODAY_IS_CURRENT,
        "passed": passed,
        # WARN, not ERROR: stale numbers for today are worth a look, not a page (the alerts sensor sends ERRORs).
        "severity": dg.AssetCheckSeverity.WARN,
        "description": description,
        "metadata": dict(metadata),
    }


def build_today_is_current(settings: Settings) -> dg.AssetChecksDefinition:
    """The check, its threshold from MARKETING_LATE_EVENTS_INTERVAL_SECONDS."""
    limit, first = warn_after(settings.late_events_interval_seconds), settings.measurement_start_date

    @dg.asset_check(
        asset=ROLLUP_KEY,
        name=TODAY_IS_CURRENT,
        description=(
            "Today's rollup holds the events ingested for today, give or take: WARN when the oldest event it "
            f"misses was ingested more than {_seconds(limit)} s ago (twice MARKETING_LATE_EVENTS_INTERVAL_SECONDS "
            f"plus the late-events sensor's {DEFAULT_SETTLE_SECONDS} s settle margin). "
            "measurement_freshness_sensor evaluates it every interval without a run."
        ),
        blocking=False,
    )
    def today_is_current(app_db: AppDatabase) -> dg.AssetCheckResult:
        with app_db.ready_engine().connect() as conn:
            return dg.AssetCheckResult(**today_freshness(conn, datetime.now(UTC), limit, first))

    return today_is_current


def build_freshness_sensor(
    settings: Settings, name: str = "measurement_freshness_sensor", retention_sources: Sequence[Source] = ()
) -> dg.SensorDefinition:
    """The sensor, every MARKETING_LATE_EVENTS_INTERVAL_SECONDS; tests build one with another interval. It also
    records ``within_retention`` (retention.py) of each of ``retention_sources``, the configured importers whose
    source forgets days."""
    interval_seconds, first = settings.late_events_interval_seconds, settings.measurement_start_date
    limit = warn_after(interval_seconds)
    retention_note = (
        f" Also records {WITHIN_RETENTION} of {', '.join(s.asset for s in retention_sources)}."
        if retention_sources
        else ""
    )

    @dg.sensor(
        name=name,
        minimum_interval_seconds=interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            f"Every {interval_seconds} s (MARKETING_LATE_EVENTS_INTERVAL_SECONDS), records the "
            f"measurement_daily_rollup check {TODAY_IS_CURRENT}: WARN when today's rollup misses an event ingested "
            f"more than {_seconds(limit)} s ago. Launches no run.{retention_note}"
        ),
    )
    def freshness_sensor(context: dg.SensorEvaluationContext, app_db: AppDatabase) -> dg.SensorResult | dg.SkipReason:
        engine = app_db.ready_engine_or_skip()
        if isinstance(engine, dg.SkipReason):
            return engine
        with engine.connect() as conn:
            fields = today_freshness(conn, datetime.now(UTC), limit, first)
        # The daemon's log gets a line when the check starts failing, not one per tick while it stays so.
        if not fields["passed"] and context.cursor != "failing":
            context.log.warning(fields["description"])
        retention = [retention_evaluation(context.instance, source, first) for source in retention_sources]
        return dg.SensorResult(
            asset_events=[dg.AssetCheckEvaluation(**f) for f in (fields, *retention)],
            skip_reason=fields["description"],
            cursor="" if fields["passed"] else "failing",
        )

    return freshness_sensor
