"""``measurement_late_events_sensor``: re-runs the rollup of exactly the days whose events arrived after their rollup.

A day is changed when one of its events was ingested after the day's rollup was built (the
``rolled_up_at`` its rows carry), not merely since the sensor last looked: a load followed by a
backfill or the demo's run changes nothing. The cursor (an ``ingested_at`` high-water mark) only
bounds which events a tick reads: those ingested in (cursor, now - settle]. Of their days, the
sensor requests those already materialized, and today, which it also re-runs whenever today's
rollup misses a settled event (a failed run, an event dated ahead that became today's). Days never
materialized are left to the daily schedule or a backfill, which read the events anyway.

A tick's changed days go into as few runs as the backfill policy allows: contiguous days form one
range run, split every ``MARKETING_BACKFILL_DAYS_PER_RUN`` days, as a backfill run would.
"""

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines import run_tags
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.measurement.assets import (
    RANGE_END_TAG,
    RANGE_START_TAG,
    marketing_event_observation,
    measurement_rollup_job,
)
from marketing_pipelines.measurement.events.write import ingestion_reading
from marketing_pipelines.measurement.keys import ROLLUP_KEY
from marketing_pipelines.measurement.rollup.daily import rollup_first_party_per_day
from marketing_pipelines.measurement.rollup.event_days import events_per_day
from marketing_pipelines.measurement.rollup.late import day_backlog, days_ingested_against_rollup, last_rollup_build
from marketing_pipelines.settings import Settings

# ingested_at is stamped before the loader's batch commits, so a batch committing after a tick can
# carry timestamps older than that tick's window end. Looking only at events older than this margin
# closes that gap as long as no batch transaction runs longer (batches of 1,000 rows take milliseconds).
# The same holds against a rollup: an event stamped up to this long before a day's build may have
# committed after the build read the day, so such a day is recounted before it is called unchanged.
DEFAULT_SETTLE_SECONDS = 60


@dataclass(frozen=True)
class RollupRange:
    """Days first..last (inclusive) to roll up in one run, with how many late events they hold."""

    first: date
    last: date
    late_events: int

    @property
    def span(self) -> str:
        first, last = self.first.isoformat(), self.last.isoformat()
        return first if first == last else f"{first}..{last}"


def changed_days(
    conn: sa.Connection,
    instance: dg.DagsterInstance,
    since: datetime | None,
    until: datetime,
    today: date,
    first: date,
    settle: timedelta = timedelta(seconds=DEFAULT_SETTLE_SECONDS),
) -> dict[date, int]:
    """The days whose rollup misses events, in day order, each with how many events it misses.

    Among the days of the events ingested in (since, until]: those with an event ingested after the
    day's rollup was built (or with no rollup rows), and those whose last event came within
    ``settle`` before the build and whose rollup count differs from its events; kept if materialized,
    or today. Plus today whenever its rollup misses an event ingested by ``until``. ``since`` None
    (no cursor and no day built yet) looks at today alone: the window would be the whole table. Days before ``first``
    (the first partition) are left out.
    """
    changed: dict[date, int] = {}
    recount: list[date] = []
    window = days_ingested_against_rollup(conn, since, until) if since is not None else []
    for ingested in window:
        if not first <= ingested.day <= today:
            continue
        if ingested.late_events:
            changed[ingested.day] = ingested.late_events
        elif ingested.ingested_shortly_before_build(settle):
            recount.append(ingested.day)
    if recount:
        # The rollup's first-party raw_count is the day's event count as its build saw it.
        events, rolled_up = events_per_day(conn, recount), rollup_first_party_per_day(conn, recount)
        changed.update({day: abs(events[day] - rolled_up[day]) for day in recount if events[day] != rolled_up[day]})
    if first <= today:
        backlog = day_backlog(conn, today, until)
        if backlog.events:
            changed[today] = backlog.events
    if any(day != today for day in changed):
        materialized = instance.get_materialized_partitions(ROLLUP_KEY)
        changed = {day: n for day, n in changed.items() if day == today or day.isoformat() in materialized}
    return dict(sorted(changed.items()))


def rollup_ranges(days: dict[date, int], max_days: int) -> list[RollupRange]:
    """Contiguous days as one range, each range at most ``max_days`` long, as the backfill policy cuts them."""
    ranges: list[RollupRange] = []
    for day in sorted(days):
        last = ranges[-1] if ranges else None
        if last and day == last.last + timedelta(days=1) and (day - last.first).days < max_days:
            ranges[-1] = RollupRange(last.first, day, last.late_events + days[day])
        else:
            ranges.append(RollupRange(day, day, days[day]))
    return ranges


def rollup_request(days: RollupRange, window_end: str) -> dg.RunRequest:
    """The run of one range. The window end is in the key: the same window never launches twice, a later one does."""
    run_key, tags = f"late-events:{days.span}:{window_end}", {run_tags.LATE_EVENTS: str(days.late_events)}
    if days.first == days.last:
        return dg.RunRequest(run_key=run_key, partition_key=days.first.isoformat(), tags=tags)
    # Dagster 1.13.27's RunRequest takes no partition_key_range (it drops unknown keywords silently): a range run
    # carries the tags a backfill run does, which Dagster validates against the partitions and the asset reads.
    return dg.RunRequest(
        run_key=run_key, tags={**tags, RANGE_START_TAG: days.first.isoformat(), RANGE_END_TAG: days.last.isoformat()}
    )


def build_late_events_sensor(
    settings: Settings, settle_seconds: float = DEFAULT_SETTLE_SECONDS, name: str = "measurement_late_events_sensor"
) -> dg.SensorDefinition:
    """The sensor as ``settings`` shape it; tests build one with ``settle_seconds=0`` instead of waiting out the margin.

    MARKETING_LATE_EVENTS_INTERVAL_SECONDS: each tick can re-run today's partition, so the interval bounds
    that (300 s: 12 runs an hour under steady traffic) and how stale today's numbers get (freshness.py
    checks it).
    """
    settle = timedelta(seconds=settle_seconds)
    interval, days_per_run = settings.late_events_interval_seconds, settings.backfill_days_per_run
    first = settings.measurement_start_date

    @dg.sensor(
        name=name,
        job=measurement_rollup_job,
        minimum_interval_seconds=interval,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Re-runs measurement_daily_rollup for the already materialized UTC days that received events after "
            "their rollup was built (late events), and for today, contiguous days in one run "
            f"(at most {days_per_run} days, MARKETING_BACKFILL_DAYS_PER_RUN). Ticks every "
            f"{interval} s at most (MARKETING_LATE_EVENTS_INTERVAL_SECONDS)."
        ),
    )
    def late_events_sensor(context: dg.SensorEvaluationContext, app_db: AppDatabase) -> dg.SensorResult | dg.SkipReason:
        engine = app_db.ready_engine_or_skip()
        if isinstance(engine, dg.SkipReason):
            return engine
        now = datetime.now(UTC)
        until = now - settle
        with engine.connect() as conn:
            # No cursor (the first tick, or the first since the database exists: `ui` started before the demo
            # made it): the window opens at the last rollup build, so a late event for a day built before the
            # sensor could read the database is still seen. Events ingested before every build are in it already;
            # scanning the whole table could outlast the 60 s sensor timeout on a large history.
            since = datetime.fromisoformat(context.cursor) if context.cursor else last_rollup_build(conn)
            if since is not None and until <= since:
                return dg.SkipReason(f"Nothing settled since {since.isoformat()}.")
            days = changed_days(conn, context.instance, since, until, now.date(), first, settle)
            observed = [marketing_event_observation(ingestion_reading(conn, now))]
        cursor = until.isoformat()
        if not days:
            window = f"in ({since.isoformat()}, {cursor}]" if since else f"by {cursor} (first tick: today only)"
            return dg.SensorResult(
                skip_reason=f"No materialized day, nor today, has events ingested {window} after its rollup.",
                cursor=cursor,
                asset_events=observed,
            )
        ranges = rollup_ranges(days, days_per_run)
        context.log.info(
            "Re-running rollup for " + ", ".join(f"{r.span} ({r.late_events} late events)" for r in ranges)
        )
        return dg.SensorResult(
            run_requests=[rollup_request(r, cursor) for r in ranges], cursor=cursor, asset_events=observed
        )

    return late_events_sensor
