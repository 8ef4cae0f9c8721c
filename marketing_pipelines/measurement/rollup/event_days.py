"""The UTC day, and queries of marketing events by UTC day: the rollup checks' recount, the late-events sensor's scan.

The day boundary is UTC: a day holds events with ``occurred_at`` in [day 00:00 UTC, next day 00:00 UTC).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime, time, timedelta

import sqlalchemy as sa

from marketing_pipelines.db.schema import marketing_event


def day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time.min, tzinfo=UTC)
    return start, start + timedelta(days=1)


def utc_day(column: sa.ColumnElement[datetime], dialect: sa.Dialect) -> sa.ColumnElement[date]:
    """The UTC calendar day of a timestamp column, computed in the database."""
    if dialect.name == "postgresql":
        return sa.type_coerce(sa.func.date(sa.func.timezone("UTC", column)), sa.Date)
    # SQLite stores UTCDateTime as naive UTC text, whose date() is the UTC day.
    return sa.type_coerce(sa.func.date(column), sa.Date)


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
