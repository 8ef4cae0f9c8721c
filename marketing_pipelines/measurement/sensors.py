"""``measurement_late_events_sensor``: re-runs the rollup of days that received events after they were rolled up.

The cursor is an ``ingested_at`` high-water mark. Each tick looks at events ingested in
(cursor, now - settle] and requests the rollup of each of their UTC days that is already
materialized, plus today's partition, which it keeps current. Days never materialized are left
to the daily schedule or a backfill, which will read the events anyway.
"""

from datetime import UTC, date, datetime, timedelta

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.measurement.assets import measurement_partitions, measurement_rollup_job
from marketing_pipelines.measurement.checks import ROLLUP_KEY
from marketing_pipelines.measurement.rollup import days_with_events_ingested

# ingested_at is stamped before the loader's batch commits, so a batch committing after a tick can
# carry timestamps older than that tick's window end. Looking only at events older than this margin
# closes that gap as long as no batch transaction runs longer (batches of 1,000 rows take milliseconds).
DEFAULT_SETTLE_SECONDS = 60
# Each tick can re-run today's partition; five minutes bounds that to 12 runs an hour under steady traffic.
SENSOR_INTERVAL_SECONDS = 300


def late_event_days(
    engine: sa.Engine, instance: dg.DagsterInstance, since: datetime, until: datetime, today: date
) -> dict[date, int]:
    """Days (with their newly ingested event counts) whose rollup must be re-run: materialized ones, and today."""
    with engine.connect() as conn:
        ingested = days_with_events_ingested(conn, since, until)
    if not ingested:
        return {}
    materialized = instance.get_materialized_partitions(ROLLUP_KEY)
    first = measurement_partitions.start.date()
    return {
        day: count
        for day, count in sorted(ingested.items())
        if first <= day <= today and (day == today or day.isoformat() in materialized)
    }


def build_late_events_sensor(
    settle_seconds: float = DEFAULT_SETTLE_SECONDS, name: str = "measurement_late_events_sensor"
) -> dg.SensorDefinition:
    """The sensor; tests build one with ``settle_seconds=0`` instead of waiting out the margin."""

    @dg.sensor(
        name=name,
        job=measurement_rollup_job,
        minimum_interval_seconds=SENSOR_INTERVAL_SECONDS,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Re-runs measurement_daily_rollup for each already materialized UTC day that received events "
            "since the last tick (late events), and for today."
        ),
    )
    def late_events_sensor(context: dg.SensorEvaluationContext, app_db: AppDatabase) -> dg.SensorResult | dg.SkipReason:
        engine = app_db.ready_engine_or_skip()
        if isinstance(engine, dg.SkipReason):
            return engine
        now = datetime.now(UTC)
        until = now - timedelta(seconds=settle_seconds)
        if context.cursor is None:
            # Events ingested before the sensor first ran are covered by the schedule or a backfill; scanning
            # the whole table here could outlast the 60 s sensor timeout on a large history.
            return dg.SensorResult(
                skip_reason=f"First tick: watching events ingested after {until.isoformat()}.",
                cursor=until.isoformat(),
            )
        since = datetime.fromisoformat(context.cursor)
        if until <= since:
            return dg.SkipReason(f"Nothing settled since {since.isoformat()}.")
        days = late_event_days(engine, context.instance, since, until, now.date())
        cursor = until.isoformat()
        if not days:
            return dg.SensorResult(
                skip_reason=f"No events for materialized days or today ingested in ({since.isoformat()}, {cursor}].",
                cursor=cursor,
            )
        context.log.info("Re-running rollup for " + ", ".join(f"{d} ({n} new events)" for d, n in days.items()))
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(
                    # The window end is in the key: the same window never launches twice, a later window does.
                    run_key=f"late-events:{day.isoformat()}:{cursor}",
                    partition_key=day.isoformat(),
                    tags={"marketing/late_events": str(count)},
                )
                for day, count in days.items()
            ],
            cursor=cursor,
        )

    return late_events_sensor


measurement_late_events_sensor = build_late_events_sensor()
