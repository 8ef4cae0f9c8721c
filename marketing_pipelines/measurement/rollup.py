"""The daily rollup's SQL: one UTC day of events and imports, aggregated in the database, replaced in one transaction.

The day boundary is UTC: a day holds events with ``occurred_at`` in [day 00:00 UTC, next day 00:00 UTC).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.db.engine import is_postgres
from marketing_pipelines.db.fetch import stream_tuples
from marketing_pipelines.db.schema import (
    campaign,
    github_release_download_daily,
    marketing_event,
    measurement_daily_rollup,
    measurement_weekly_sketch,
    site_analytics_daily,
)
from marketing_pipelines.db.types import UTCDateTime
from marketing_pipelines.measurement import sketches

FIRST_PARTY = "first_party"
SITE_ANALYTICS = "site_analytics"
GITHUB_RELEASES = "github_releases"
# Importer rows get a fixed stage and event type so they sit beside first-party rows in one table.
SITE_STAGE, SITE_EVENT_TYPE = "site", "pageview"
RELEASE_STAGE, RELEASE_EVENT_TYPE = "release", "download"

RowKey = tuple[str, str, str]  # campaign_id, stage, event_type
# pg_advisory_xact_lock(namespace, week) serialises weekly refreshes of one week across processes.
WEEK_LOCK_NAMESPACE = 0x6D70_7700  # "mpw\0"


def day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time.min, tzinfo=UTC)
    return start, start + timedelta(days=1)


def _in_day(day: date) -> sa.ColumnElement[bool]:
    start, end = day_bounds(day)
    return sa.and_(marketing_event.c.occurred_at >= start, marketing_event.c.occurred_at < end)


@dataclass(frozen=True)
class FirstPartyAggregate:
    campaign_id: str
    stage: str
    event_type: str
    raw_count: int
    unique_actors: int


def first_party_day(conn: sa.Connection, day: date) -> list[tuple[FirstPartyAggregate, bytes | None]]:
    """One day's first-party rollup rows with their HLL sketches, from a single grouped query.

    The database groups the day by (campaign, stage, event type, actor) and counts; Python then
    sums the counts, counts the actors and feeds each actor to its row's sketch. The rows fetched
    are bounded by the day's distinct actors per row, not by its events, and the day is scanned
    once (a separate count(DISTINCT) query would sort the day a second time; benchmarks/rollup_build.py
    times that plain GROUP BY next to this).
    """
    e = marketing_event
    query = sa.select(e.c.campaign_id, e.c.stage, e.c.event_type, e.c.actor_id, sa.func.count()).where(_in_day(day))
    query = query.group_by(e.c.campaign_id, e.c.stage, e.c.event_type, e.c.actor_id)
    totals: dict[RowKey, list[int]] = {}  # key -> [raw_count, unique_actors]
    built: dict[RowKey, sketches.datasketches.hll_sketch] = {}
    for campaign_id, stage, event_type, actor_id, n in stream_tuples(conn, query):
        key = (campaign_id, stage, event_type)
        acc = totals.get(key)
        if acc is None:
            acc = totals[key] = [0, 0]
        acc[0] += n
        if actor_id is not None:
            acc[1] += 1
            sketch = built.get(key)
            if sketch is None:
                sketch = built[key] = sketches.new_sketch()
            sketch.update(actor_id)
    return [
        (FirstPartyAggregate(*key, raw_count=acc[0], unique_actors=acc[1]), _serialized(built.get(key)))
        for key, acc in totals.items()
    ]


def _serialized(sketch: sketches.datasketches.hll_sketch | None) -> bytes | None:
    return sketches.serialize(sketch) if sketch is not None else None


def _importer_rows(
    day: date,
    now: datetime,
    source: str,
    stage: str,
    event_type: str,
    total: sa.ColumnElement[int],
    join: sa.FromClause,
) -> sa.Select[tuple[object, ...]]:
    return (
        sa.select(
            sa.literal(day, sa.Date).label("day"),
            campaign.c.id.label("campaign_id"),
            sa.literal(source).label("source"),
            sa.literal(stage).label("stage"),
            sa.literal(event_type).label("event_type"),
            sa.func.sum(total).label("raw_count"),
            # Unknown, not zero: downloads carry no actor, and Plausible's per-page visitors do not add up to visitors.
            sa.null().label("unique_actors"),
            sa.null().label("actors_hll"),
            sa.literal(now, UTCDateTime()).label("rolled_up_at"),
        )
        .select_from(join)
        .group_by(campaign.c.id)
    )


_ROLLUP_COLUMNS = [
    "day",
    "campaign_id",
    "source",
    "stage",
    "event_type",
    "raw_count",
    "unique_actors",
    "actors_hll",
    "rolled_up_at",
]


@dataclass(frozen=True)
class RollupSummary:
    day: date
    rows: int
    first_party_rows: int
    first_party_events: int
    unique_actors_sum: int
    site_pageviews: int
    downloads: int
    campaigns: int
    week_start: date
    week_rows: int  # measurement_weekly_sketch rows of the day's week after its refresh


@contextmanager
def partition_transaction(engine: sa.Engine) -> Iterator[sa.Connection]:
    """One transaction that sees one snapshot of the events for all its statements.

    On PostgreSQL READ COMMITTED would let an event committed between the count query and the
    sketch query land in one but not the other; REPEATABLE READ reads both from one snapshot.
    SQLite's BEGIN IMMEDIATE already excludes every other writer for the transaction.
    """
    with engine.connect() as conn:
        if is_postgres(conn):
            conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            if is_postgres(conn):
                # The day's GROUP BY spills to disk at PostgreSQL's default 4 MB from ~100k events.
                conn.exec_driver_sql("SET LOCAL work_mem = '64MB'")
            yield conn


def replace_rollup_day(engine: sa.Engine, day: date) -> RollupSummary:
    """Rebuild one day of ``measurement_daily_rollup``, then its week in ``measurement_weekly_sketch``."""
    [summary] = replace_rollup_days(engine, [day])
    return summary


def replace_rollup_days(engine: sa.Engine, days: Sequence[date]) -> list[RollupSummary]:
    """Rebuild each of ``days`` in ``measurement_daily_rollup``, then each of their weeks once.

    Idempotent: each day's rows are deleted and rebuilt from the sources in one transaction of its
    own, so a re-run (retry, backfill, late events) replaces the day and never adds to it, and a
    range that fails half-way keeps the days it finished. The weekly sketches are refreshed after
    the days, once per week touched: a backfill of a year rewrites each week once, not seven times.
    """
    built = [(day, _replace_day(engine, day)) for day in days]
    week_rows = {monday: refresh_week(engine, monday) for monday in sorted({week_start(day) for day in days})}
    return [_summary(day, totals, campaigns, week_rows[week_start(day)]) for day, (totals, campaigns) in built]


def _replace_day(engine: sa.Engine, day: date) -> tuple[list[sa.Row[Any]], int]:
    """One day's delete-and-rebuild in its own transaction; returns its totals by source and its campaign count."""
    now = datetime.now(UTC)
    r = measurement_daily_rollup
    with partition_transaction(engine) as conn:
        first_party = first_party_day(conn, day)
        conn.execute(sa.delete(r).where(r.c.day == day))
        if first_party:
            conn.execute(
                sa.insert(r),
                [
                    {
                        "day": day,
                        "campaign_id": a.campaign_id,
                        "source": FIRST_PARTY,
                        "stage": a.stage,
                        "event_type": a.event_type,
                        "raw_count": a.raw_count,
                        "unique_actors": a.unique_actors,
                        "actors_hll": hll,
                        "rolled_up_at": now,
                    }
                    for a, hll in first_party
                ],
            )
        s, g = site_analytics_daily, github_release_download_daily
        conn.execute(
            sa.insert(r).from_select(
                _ROLLUP_COLUMNS,
                _importer_rows(
                    day,
                    now,
                    SITE_ANALYTICS,
                    SITE_STAGE,
                    SITE_EVENT_TYPE,
                    s.c.pageviews,
                    s.join(campaign, campaign.c.utm_campaign == s.c.utm_campaign),
                ).where(s.c.day == day),
            )
        )
        conn.execute(
            sa.insert(r).from_select(
                _ROLLUP_COLUMNS,
                _importer_rows(
                    day,
                    now,
                    GITHUB_RELEASES,
                    RELEASE_STAGE,
                    RELEASE_EVENT_TYPE,
                    g.c.downloads,
                    g.join(campaign, campaign.c.github_repo == g.c.repo),
                    # A baseline row's downloads are unknown (no earlier snapshot), so it is left out, not counted as 0.
                ).where(g.c.day == day, g.c.baseline.is_(False)),
            )
        )
        totals = conn.execute(
            sa.select(
                r.c.source,
                sa.func.count().label("rows"),
                sa.func.coalesce(sa.func.sum(r.c.raw_count), 0).label("raw_count"),
                sa.func.coalesce(sa.func.sum(r.c.unique_actors), 0).label("unique_actors"),
            )
            .where(r.c.day == day)
            .group_by(r.c.source)
        ).all()
        campaigns = conn.execute(sa.select(sa.func.count(sa.distinct(r.c.campaign_id))).where(r.c.day == day)).scalar()
    return list(totals), int(campaigns or 0)


def _summary(day: date, totals: list[sa.Row[Any]], campaigns: int, week_rows: int) -> RollupSummary:
    by_source = {t.source: t for t in totals}

    def total(source: str, field: str) -> int:
        row = by_source.get(source)
        return int(getattr(row, field)) if row is not None else 0

    return RollupSummary(
        day=day,
        rows=sum(t.rows for t in totals),
        first_party_rows=total(FIRST_PARTY, "rows"),
        first_party_events=total(FIRST_PARTY, "raw_count"),
        unique_actors_sum=total(FIRST_PARTY, "unique_actors"),
        site_pageviews=total(SITE_ANALYTICS, "raw_count"),
        downloads=total(GITHUB_RELEASES, "raw_count"),
        campaigns=campaigns,
        week_start=week_start(day),
        week_rows=week_rows,
    )


def week_start(day: date) -> date:
    """The Monday of ``day``'s ISO week: the key of measurement_weekly_sketch."""
    return day - timedelta(days=day.weekday())


@dataclass(frozen=True)
class WeekRow:
    """What one measurement_weekly_sketch row is built from: the week's daily rows of one key."""

    days: int
    raw_count: int
    daily_rolled_up_at: datetime
    actors_hll: bytes | None


DailyMember = tuple[int, int | None, bytes | None, datetime]  # raw_count, unique_actors, actors_hll, rolled_up_at


def merge_week(members: list[DailyMember]) -> WeekRow:
    """Fold a week's daily rows (raw_count, unique_actors, actors_hll, rolled_up_at) of one key into a weekly row.

    The sketch is NULL when any day's uniques are unknown, as the report's union would be.
    """
    known = all(m[1] is not None for m in members)
    sketch = sketches.merge(m[2] for m in members) if known else None
    return WeekRow(
        days=len(members),
        raw_count=sum(m[0] for m in members),
        daily_rolled_up_at=max(m[3] for m in members),
        actors_hll=sketches.serialize(sketch) if sketch is not None else None,
    )


def refresh_week(engine: sa.Engine, monday: date) -> int:
    """Rebuild one week of measurement_weekly_sketch from the daily rollup; returns the rows written.

    Runs after the day's own transaction has committed, under a per-week lock taken before any
    read: two days of one week rebuilt at once (a parallel backfill) then refresh one after the
    other, and the second reads the first's committed rows. Inside the day's REPEATABLE READ
    snapshot it could not see them and would leave a row that misses a day. If this never runs
    (the process died in between), the report notices the stale fingerprint and uses daily sketches.
    """
    d, w = measurement_daily_rollup, measurement_weekly_sketch
    now = datetime.now(UTC)
    with engine.begin() as conn:  # READ COMMITTED on PostgreSQL; BEGIN IMMEDIATE on SQLite
        if is_postgres(conn):
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(WEEK_LOCK_NAMESPACE, monday.toordinal())))
        rows = conn.execute(
            sa.select(
                d.c.campaign_id,
                d.c.source,
                d.c.stage,
                d.c.event_type,
                d.c.raw_count,
                d.c.unique_actors,
                d.c.actors_hll,
                d.c.rolled_up_at,
            ).where(d.c.day >= monday, d.c.day < monday + timedelta(days=7))
        ).all()
        groups: dict[tuple[str, str, str, str], list[DailyMember]] = {}
        for row in rows:
            key = (row.campaign_id, row.source, row.stage, row.event_type)
            groups.setdefault(key, []).append((row.raw_count, row.unique_actors, row.actors_hll, row.rolled_up_at))
        conn.execute(sa.delete(w).where(w.c.week_start == monday))
        built = [(key, merge_week(members)) for key, members in groups.items()]
        if built:
            conn.execute(
                sa.insert(w),
                [
                    {
                        "week_start": monday,
                        "campaign_id": key[0],
                        "source": key[1],
                        "stage": key[2],
                        "event_type": key[3],
                        "days": week.days,
                        "raw_count": week.raw_count,
                        "daily_rolled_up_at": week.daily_rolled_up_at,
                        "actors_hll": week.actors_hll,
                        "built_at": now,
                    }
                    for key, week in built
                ],
            )
    return len(built)


def rebuild_all_weeks(engine: sa.Engine) -> tuple[int, int]:
    """Refresh every week that has daily rollup rows; returns (weeks, weekly rows written)."""
    d = measurement_daily_rollup
    with engine.connect() as conn:
        days = conn.execute(sa.select(d.c.day).distinct()).scalars().all()
    mondays = sorted({week_start(day) for day in days})
    return len(mondays), sum(refresh_week(engine, monday) for monday in mondays)


def events_per_day(conn: sa.Connection, days: Sequence[date]) -> dict[date, int]:
    """Events that occurred on each of ``days`` (UTC), from one grouped query over their span."""
    e = marketing_event
    day = utc_day(e.c.occurred_at, conn.dialect).label("day")
    start, end = day_bounds(min(days))[0], day_bounds(max(days))[1]
    rows = conn.execute(
        sa.select(day, sa.func.count()).where(e.c.occurred_at >= start, e.c.occurred_at < end).group_by(day)
    )
    counts = {row[0]: int(row[1]) for row in rows}
    return {d: counts.get(d, 0) for d in days}


def rollup_first_party_per_day(conn: sa.Connection, days: Sequence[date]) -> dict[date, int]:
    """The first-party raw_count total the rollup holds for each of ``days``, from one grouped query."""
    r = measurement_daily_rollup
    rows = conn.execute(
        sa.select(r.c.day, sa.func.sum(r.c.raw_count))
        .where(r.c.day.in_(list(days)), r.c.source == FIRST_PARTY)
        .group_by(r.c.day)
    )
    totals = {row[0]: int(row[1]) for row in rows}
    return {d: totals.get(d, 0) for d in days}


def utc_day(column: sa.ColumnElement[datetime], dialect: sa.Dialect) -> sa.ColumnElement[date]:
    """The UTC calendar day of a timestamp column, computed in the database."""
    if dialect.name == "postgresql":
        return sa.type_coerce(sa.func.date(sa.func.timezone("UTC", column)), sa.Date)
    # SQLite stores UTCDateTime as naive UTC text, whose date() is the UTC day.
    return sa.type_coerce(sa.func.date(column), sa.Date)


def days_with_events_ingested(conn: sa.Connection, since: datetime | None, until: datetime) -> dict[date, int]:
    """UTC days of the events ingested in (since, until], with how many events each; served by the ingested_at index."""
    e = marketing_event
    day = utc_day(e.c.occurred_at, conn.dialect).label("day")
    query = sa.select(day, sa.func.count()).where(e.c.ingested_at <= until).group_by(day)
    if since is not None:
        query = query.where(e.c.ingested_at > since)
    return {row[0]: int(row[1]) for row in conn.execute(query)}
