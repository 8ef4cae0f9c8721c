"""The daily rollup's SQL: one UTC day of events and imports, aggregated in the database, replaced in one transaction.

Each day's week in the weekly sketch index (``weekly``) is refreshed after the day; the UTC day itself is in
``event_days``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.db.engine import is_postgres
from marketing_pipelines.db.fetch import stream_tuples
from marketing_pipelines.db.schema import (
    campaign,
    github_release_download_daily,
    marketing_event,
    measurement_daily_rollup,
    measurement_rollup_day,
    site_analytics_daily,
    source_daily_metric,
)
from marketing_pipelines.db.types import UTCDateTime
from marketing_pipelines.measurement import sketches
from marketing_pipelines.measurement.rollup.event_days import day_bounds
from marketing_pipelines.measurement.rollup.weekly import refresh_week, week_start
from marketing_pipelines.measurement.sources import METRIC_TABLE, SOURCES, Source

FIRST_PARTY = "first_party"
SITE_ANALYTICS = "site_analytics"
GITHUB_RELEASES = "github_releases"
SOURCES_BY_NAME = {source.name: source for source in SOURCES}
# Importer rows get the stage and event type their source's contract names, beside first-party rows in one table.
[_SITE_COUNTED] = SOURCES_BY_NAME[SITE_ANALYTICS].contract.counted
[_RELEASE_COUNTED] = SOURCES_BY_NAME[GITHUB_RELEASES].contract.counted
SITE_STAGE, SITE_EVENT_TYPE = _SITE_COUNTED.stage, _SITE_COUNTED.event_type
RELEASE_STAGE, RELEASE_EVENT_TYPE = _RELEASE_COUNTED.stage, _RELEASE_COUNTED.event_type

# What one rollup row of each source counts, as the report's charts and the per-source metadata name it.
SOURCE_COUNT_NOUNS = {FIRST_PARTY: "events", SITE_ANALYTICS: "pageviews", GITHUB_RELEASES: "downloads"}

RowKey = tuple[str, str, str]  # campaign_id, stage, event_type
# A day's rows shown in its materialization's metadata, at most (the largest by raw_count): the event log
# keeps every materialization, so a day of many campaigns and event types must not write a table of thousands.
MAX_SHOWN_COUNTS = 200


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
        (
            FirstPartyAggregate(*key, raw_count=acc[0], unique_actors=acc[1]),
            sketches.serialize(built[key]) if key in built else None,
        )
        for key, acc in totals.items()
    ]


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
class DayCount:
    """One rollup row of a day without its sketch: what the materialization's counts table shows."""

    campaign_id: str
    source: str
    stage: str
    event_type: str
    raw_count: int
    unique_actors: int | None  # None for imported rows, whose actors are unknown


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
    events: int  # raw_count of every row of the day, all sources
    event_types: int  # distinct event types of the day, all sources
    # The day's largest rows (at most MAX_SHOWN_COUNTS), read in the transaction that wrote them.
    counts: tuple[DayCount, ...]
    # raw_count of the day per source that has rows (any source the rollup holds, not only the three above).
    source_counts: dict[str, int] = field(default_factory=dict)


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


def replace_rollup_days(engine: sa.Engine, days: Sequence[date]) -> list[RollupSummary]:
    """Rebuild each of ``days`` in ``measurement_daily_rollup``, then each of their weeks once.

    Idempotent: each day's rows are deleted and rebuilt from the sources in one transaction of its
    own, so a re-run (retry, backfill, late events) replaces the day and never adds to it, and a
    range that fails half-way keeps the days it finished. The weekly sketches are refreshed after
    the days, once per week touched: a backfill of a year rewrites each week once, not seven times.
    """
    built = [(day, _replace_day(engine, day)) for day in days]
    week_rows = {monday: refresh_week(engine, monday) for monday in sorted({week_start(day) for day in days})}
    return [_summary(day, written, week_rows[week_start(day)]) for day, written in built]


@dataclass(frozen=True)
class _DayWritten:
    totals: list[sa.Row[Any]]  # by source
    campaigns: int
    event_types: int
    counts: tuple[DayCount, ...]


def day_counts(conn: sa.Connection, day: date, limit: int = MAX_SHOWN_COUNTS) -> tuple[DayCount, ...]:
    """The largest ``limit`` rollup rows of ``day`` by raw_count, sorted by campaign, source, stage and event type.

    One query through the primary key (``day`` leads it); the sketches are not read.
    """
    r = measurement_daily_rollup
    keys = (r.c.campaign_id, r.c.source, r.c.stage, r.c.event_type)
    largest = (
        sa.select(*keys, r.c.raw_count, r.c.unique_actors)
        .where(r.c.day == day)
        .order_by(r.c.raw_count.desc(), *keys)
        .limit(limit)
    )
    counts = [DayCount(*row) for row in conn.execute(largest)]
    return tuple(sorted(counts, key=lambda c: (c.campaign_id, c.source, c.stage, c.event_type)))


def site_analytics_rows(day: date, now: datetime) -> sa.Select[tuple[object, ...]]:
    """The day's rollup rows of site analytics: pageviews per campaign, matched by its utm_campaign."""
    s = site_analytics_daily
    join = s.join(campaign, campaign.c.utm_campaign == s.c.utm_campaign)
    return _importer_rows(day, now, SITE_ANALYTICS, SITE_STAGE, SITE_EVENT_TYPE, s.c.pageviews, join).where(
        s.c.day == day
    )


def release_download_rows(day: date, now: datetime) -> sa.Select[tuple[object, ...]]:
    """The day's rollup rows of GitHub release downloads per campaign, matched by its github_repo."""
    g = github_release_download_daily
    join = g.join(campaign, campaign.c.github_repo == g.c.repo)
    # A baseline row's downloads are unknown (no earlier snapshot), so it is left out, not counted as 0.
    return _importer_rows(day, now, GITHUB_RELEASES, RELEASE_STAGE, RELEASE_EVENT_TYPE, g.c.downloads, join).where(
        g.c.day == day, g.c.baseline.is_(False)
    )


def source_metric_rows(day: date, now: datetime, source: Source) -> list[sa.Select[tuple[object, ...]]]:
    """The day's rollup rows of a source built on the contract: per counted metric, its sum per campaign, matched
    by the campaign column the contract names. Its range-only metrics (uniques) are not summed into the rollup."""
    m = source_daily_metric
    join = m.join(campaign, campaign.c[source.contract.match] == m.c.key)
    return [
        _importer_rows(day, now, source.name, counted.stage, counted.event_type, m.c.value, join).where(
            m.c.source == source.name, m.c.day == day, m.c.metric == counted.metric
        )
        for counted in source.contract.counted
    ]


def imported_rows(day: date, now: datetime) -> list[sa.Select[tuple[object, ...]]]:
    """Every importer's rollup rows of ``day``: the first two from their own tables, the rest from the metrics."""
    built_on_contract = (s for s in SOURCES if s.table == METRIC_TABLE)
    return [
        site_analytics_rows(day, now),
        release_download_rows(day, now),
        *(rows for source in built_on_contract for rows in source_metric_rows(day, now, source)),
    ]


def _day_written(conn: sa.Connection, day: date) -> _DayWritten:
    """What the day's rollup rows hold now: per-source totals, distinct campaigns and event types, the counts."""
    r = measurement_daily_rollup
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
    campaigns, event_types = conn.execute(
        sa.select(sa.func.count(sa.distinct(r.c.campaign_id)), sa.func.count(sa.distinct(r.c.event_type))).where(
            r.c.day == day
        )
    ).one()
    return _DayWritten(list(totals), int(campaigns or 0), int(event_types or 0), day_counts(conn, day))


def _replace_day(engine: sa.Engine, day: date) -> _DayWritten:
    """One day's delete-and-rebuild in its own transaction; returns what it wrote, as the metadata shows it."""
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
        for imported in imported_rows(day, now):
            conn.execute(sa.insert(r).from_select(_ROLLUP_COLUMNS, imported))
        written = _day_written(conn, day)
        # The day is built, rows or none: an empty day reads as built empty, not as never built.
        conn.execute(sa.delete(measurement_rollup_day).where(measurement_rollup_day.c.day == day))
        rows = sum(t.rows for t in written.totals)
        conn.execute(sa.insert(measurement_rollup_day).values(day=day, rolled_up_at=now, row_count=rows))
        return written


def _summary(day: date, written: _DayWritten, week_rows: int) -> RollupSummary:
    totals = written.totals
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
        campaigns=written.campaigns,
        week_start=week_start(day),
        week_rows=week_rows,
        events=sum(int(t.raw_count) for t in totals),
        event_types=written.event_types,
        counts=written.counts,
        source_counts={t.source: int(t.raw_count) for t in totals},
    )


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
