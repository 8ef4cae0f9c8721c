"""The report's reads from ``measurement_daily_rollup`` and ``measurement_weekly_sketch``, and what they fill.

A range is read in at most three statements: the daily rows (with the sketches of the days outside
whole weeks), the weekly sketches, and only when some week is stale the daily sketches of that week.
A key is one (source, stage, event type); the daily rows are summed per key into a ``KeyRange`` while
they are read, with each whole week's fingerprint (``WeekSums``), and ``plan_sketches`` chooses which
weekly or daily sketches make up each key's range union. The rollup asset's day funnel reads one day's
rows here too (``first_party_rows_by_campaign``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any, NamedTuple

import sqlalchemy as sa

from marketing_pipelines.db.fetch import fetch_tuples
from marketing_pipelines.db.schema import measurement_daily_rollup, measurement_weekly_sketch
from marketing_pipelines.measurement import sketches
from marketing_pipelines.measurement.report.model import DailyPoint
from marketing_pipelines.measurement.rollup.daily import FIRST_PARTY
from marketing_pipelines.measurement.rollup.weekly import week_start

Key = tuple[str, str, str]  # source, stage, event_type
Sketch = sketches.datasketches.hll_sketch
Blob = bytes | memoryview  # psycopg2 returns bytea as a memoryview


@dataclass(slots=True)
class WeekSums:
    """One key's daily rows of one whole week as they stand now: the fingerprint its weekly row must match."""

    rows: int
    raw_count: int
    rolled_up_at: Any  # latest, as ``instant_sql`` reads it
    days: list[date]

    def matches(self, days: int, raw_count: int, daily_rolled_up_at: Any) -> bool:
        """Whether a weekly row built from (days, raw_count, daily_rolled_up_at) still holds these days."""
        return self.rows == days and self.raw_count == raw_count and self.rolled_up_at == daily_rolled_up_at


@dataclass(slots=True)
class KeyRange:
    """One key's daily rows over the range, summed while they are read."""

    raw_count: int = 0
    days: int = 0
    last_unique: int | None = None  # the uniques of the latest day: exact for the range when days == 1
    unknown: bool = False  # some day's uniques are unknown (no sketch), so the range's are too
    edge_sketches: list[Blob | None] = field(default_factory=list)  # days outside the range's whole weeks
    weeks: dict[date, WeekSums] = field(default_factory=dict)  # by Monday, whole weeks only


# The span of no whole week: every day is before its first Monday or after its last Sunday.
NO_WHOLE_WEEK = (date.max, date.min)


def whole_week_span(start: date | None, end: date | None) -> tuple[date | None, date | None]:
    """The first Monday and last Sunday of the whole ISO weeks in [start, end] (None: unbounded).

    A range whose first Monday would fall after 9999-12-31, or whose last Sunday before 0001-01-01, holds
    no whole week (``NO_WHOLE_WEEK``): ``date`` cannot hold that day, and no rollup row is in such a week.
    """
    try:
        first = start + timedelta(days=(7 - start.weekday()) % 7) if start else None
        last = end - timedelta(days=(end.weekday() + 1) % 7) if end else None
    except OverflowError:
        return NO_WHOLE_WEEK
    return first, last


# --- which sketches make up a range's union ------------------------------------------------------------


@dataclass(frozen=True)
class SketchPlan:
    """Which sketches make up each key's range union: weekly rows where they are whole and fresh, else daily rows."""

    weeks: dict[Key, list[date]]  # week_start of each weekly sketch to use
    days: dict[Key, list[date]]  # days (inside whole weeks) whose daily sketch to use


def plan_sketches(ranges: dict[Key, KeyRange], fresh_weeks: Container[tuple[date, Key]]) -> SketchPlan:
    """Use a week's weekly sketch where ``fresh_weeks`` has it, the daily sketches of every other week's days.

    Edge days (outside whole weeks) are not planned: their sketches came with the daily rows.
    """
    weeks: dict[Key, list[date]] = {}
    days: dict[Key, list[date]] = {}
    for key, kr in ranges.items():
        if kr.unknown:
            continue  # the union is unknown anyway; no sketch is read
        for monday, week in kr.weeks.items():
            if (monday, key) in fresh_weeks:
                weeks.setdefault(key, []).append(monday)
            else:
                days.setdefault(key, []).extend(week.days)
    return SketchPlan(weeks=weeks, days=days)


# --- the statements ---------------------------------------------------------------------------------------


def instant_sql(column: sa.ColumnElement[Any], dialect: sa.Dialect) -> sa.ColumnElement[Any]:
    """A timestamp column as a value that compares and orders like it but costs nothing to fetch.

    PostgreSQL: whole microseconds since the epoch (a bigint; psycopg2 builds an aware datetime per
    timestamptz, which took longer than the rest of the row). SQLite: the stored text, which is
    fixed-width UTC (``YYYY-MM-DD HH:MM:SS.ffffff``), so it orders as the instants do.
    """
    if dialect.name == "postgresql":
        return sa.cast(sa.extract("epoch", column) * 1_000_000, sa.BigInteger)
    return sa.type_coerce(column, sa.String)


def read_days(
    conn: sa.Connection, campaign_id: str, start: date | None, end: date | None
) -> tuple[list[DailyPoint], dict[Key, KeyRange]]:
    """The campaign's daily points over [start, end] in (day, source, stage, event type) order, and per key
    their range sums, weekly fingerprints and the sketches of the days outside whole weeks."""
    r = measurement_daily_rollup
    first, last = whole_week_span(start, end)
    # Days outside the whole weeks can only be merged from their daily sketch: read it with the row.
    edge = sa.or_(*([r.c.day < first] if first else []), *([r.c.day > last] if last else []), sa.false())
    query = sa.select(
        r.c.day,
        r.c.source,
        r.c.stage,
        r.c.event_type,
        r.c.raw_count,
        r.c.unique_actors,
        instant_sql(r.c.rolled_up_at, conn.dialect),
        sa.case((edge, r.c.actors_hll), else_=sa.null()),
    ).where(r.c.campaign_id == campaign_id)
    if start:
        query = query.where(r.c.day >= start)
    if end:
        query = query.where(r.c.day <= end)

    daily: list[DailyPoint] = []
    ranges: dict[Key, KeyRange] = {}
    mondays: dict[date, date | None] = {}  # None: an edge day
    for day, source, stage, event_type, raw_count, unique_actors, rolled_up_at, edge_hll in fetch_tuples(conn, query):
        daily.append(DailyPoint(day, source, stage, event_type, raw_count, unique_actors))
        key = (source, stage, event_type)
        kr = ranges.get(key)
        if kr is None:
            kr = ranges[key] = KeyRange()
        kr.raw_count += raw_count
        kr.days += 1
        kr.last_unique = unique_actors
        if unique_actors is None:
            kr.unknown = True
        if day in mondays:
            monday = mondays[day]
        else:
            inside = (first is None or day >= first) and (last is None or day <= last)
            monday = mondays[day] = week_start(day) if inside else None
        if monday is None:
            kr.edge_sketches.append(edge_hll)
            continue
        week = kr.weeks.get(monday)
        if week is None:
            kr.weeks[monday] = WeekSums(1, raw_count, rolled_up_at, [day])
        else:
            week.rows += 1
            week.raw_count += raw_count
            week.rolled_up_at = max(week.rolled_up_at, rolled_up_at)
            week.days.append(day)
    # Sorted here rather than in SQL: Python orders strings by code point on both databases, where
    # ORDER BY would follow the server's collation, and it is cheaper than the server's sort.
    daily.sort()
    return daily, ranges


def fresh_weekly_sketches(
    conn: sa.Connection, campaign_id: str, ranges: dict[Key, KeyRange], start: date | None, end: date | None
) -> dict[tuple[date, Key], Blob | None]:
    """Weekly sketches of the weeks wholly inside [start, end] whose fingerprint matches the daily rows now.

    The fingerprint (rows, summed raw_count, latest rolled_up_at) of each week as the daily rows
    stand now was summed by ``read_days``: a day rebuilt or added after its week was refreshed makes
    the week stale, and a stale week is not returned, so the report merges that week's daily
    sketches instead. Compared in Python: a join in SQL got a plan that depended on fresh table
    statistics (a nested loop re-aggregating per weekly row took 100 ms right after a backfill).
    """
    w = measurement_weekly_sketch
    query = sa.select(
        w.c.week_start,
        w.c.source,
        w.c.stage,
        w.c.event_type,
        w.c.days,
        w.c.raw_count,
        instant_sql(w.c.daily_rolled_up_at, conn.dialect),
        w.c.actors_hll,
    ).where(w.c.campaign_id == campaign_id)
    if start:
        query = query.where(w.c.week_start >= start)
    if end:
        if end < date.min + timedelta(days=6):
            return {}  # no week ends by then
        query = query.where(w.c.week_start <= end - timedelta(days=6))
    fresh: dict[tuple[date, Key], Blob | None] = {}
    for monday, source, stage, event_type, days, raw_count, rolled_up_at, actors_hll in fetch_tuples(conn, query):
        key = (source, stage, event_type)
        kr = ranges.get(key)
        week = kr.weeks.get(monday) if kr else None
        if week is not None and week.matches(days, raw_count, rolled_up_at):
            fresh[(monday, key)] = actors_hll
    return fresh


def range_sketches(
    conn: sa.Connection, campaign_id: str, ranges: dict[Key, KeyRange], start: date | None, end: date | None
) -> dict[Key, list[Blob | None]]:
    """The serialized sketches whose union is each key's range uniques.

    Whole fresh weeks come from measurement_weekly_sketch, edge days from their rows (read with
    them by ``read_days``), and only the days of stale weeks take one more read.
    """
    weekly = fresh_weekly_sketches(conn, campaign_id, ranges, start, end)
    plan = plan_sketches(ranges, weekly)
    parts: dict[Key, list[Blob | None]] = {}
    for key, kr in ranges.items():
        if not kr.unknown:
            parts[key] = [*kr.edge_sketches, *(weekly[(monday, key)] for monday in plan.weeks.get(key, ()))]
    stale = {(day, key) for key, days in plan.days.items() for day in days}
    if stale:
        r = measurement_daily_rollup
        query = sa.select(r.c.day, r.c.source, r.c.stage, r.c.event_type, r.c.actors_hll).where(
            r.c.campaign_id == campaign_id, r.c.day.in_(sorted({day for day, _ in stale}))
        )
        for day, source, stage, event_type, actors_hll in fetch_tuples(conn, query):
            key = (source, stage, event_type)
            if (day, key) in stale:
                parts[key].append(actors_hll)
    return parts


# --- one day's first-party rows, for the rollup asset's funnel ----------------------------------------------


def first_party_events_by_campaign(conn: sa.Connection, day: date) -> dict[str, int]:
    """First-party events per campaign on ``day``, from the rollup (no sketches read)."""
    r = measurement_daily_rollup
    query = (
        sa.select(r.c.campaign_id, sa.func.sum(r.c.raw_count))
        .where(r.c.day == day, r.c.source == FIRST_PARTY)
        .group_by(r.c.campaign_id)
    )
    return {campaign_id: int(events) for campaign_id, events in conn.execute(query)}


class FunnelRow(NamedTuple):
    """One first-party rollup row of a day, as the funnel needs it."""

    stage: str
    event_type: str
    raw_count: int
    unique_actors: int | None
    actors_hll: bytes | memoryview | None  # psycopg2 returns bytea as a memoryview


def first_party_rows_by_campaign(
    conn: sa.Connection, day: date, campaign_ids: Sequence[str]
) -> dict[str, list[FunnelRow]]:
    """These campaigns' first-party rollup rows of ``day``, with their sketches."""
    r = measurement_daily_rollup
    query = sa.select(r.c.campaign_id, r.c.stage, r.c.event_type, r.c.raw_count, r.c.unique_actors, r.c.actors_hll)
    query = query.where(r.c.day == day, r.c.source == FIRST_PARTY, r.c.campaign_id.in_(list(campaign_ids)))
    rows: dict[str, list[FunnelRow]] = defaultdict(list)
    for campaign_id, *fields in conn.execute(query):
        rows[campaign_id].append(FunnelRow(*fields))
    return rows
