"""Which UTC days received events after their rollup was built: the late-events sensor's and the freshness check's SQL.

A day's rollup records when it was built: every ``measurement_daily_rollup`` row of the day carries
the same ``rolled_up_at``. An event whose ``ingested_at`` is later arrived after that build, so the
day's numbers miss it. Both queries read a narrow range of the ``ingested_at`` index (a sensor
window, or what arrived since a recent build) rather than a whole day's or the whole table's
events; only a day never built is read whole, through the ``occurred_at`` index.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta

import sqlalchemy as sa

from marketing_pipelines.db.schema import marketing_event, measurement_daily_rollup, measurement_rollup_day
from marketing_pipelines.measurement.rollup.event_days import day_bounds, utc_day


@dataclass(frozen=True)
class IngestedDay:
    """One UTC day among the events ingested in a window, against its last rollup."""

    day: date
    # Events of the window ingested after the day's rollup was built; all of them when it has no rollup rows.
    late_events: int
    rolled_up_at: datetime | None
    # The latest event of the window ingested before that build (None: none was).
    last_ingested_before: datetime | None

    def ingested_shortly_before_build(self, margin: timedelta) -> bool:
        """Whether an event was stamped less than ``margin`` before the build: its batch may have committed
        after the build read the day, so only a recount tells whether the day holds it."""
        if self.rolled_up_at is None or self.last_ingested_before is None:
            return False
        return self.rolled_up_at - self.last_ingested_before < margin


def days_ingested_against_rollup(conn: sa.Connection, since: datetime | None, until: datetime) -> list[IngestedDay]:
    """Each UTC day of the events ingested in (since, until], in day order, with its late events and last rollup.

    One statement. The window's events are read once through ``ix_marketing_event_ingested_at``
    (a CTE); each of their days' build time is the max ``rolled_up_at`` of its rows, read through
    the rollup's primary key (``day`` leads it), for those days only.
    """
    e, r = marketing_event, measurement_daily_rollup
    window = sa.select(utc_day(e.c.occurred_at, conn.dialect).label("day"), e.c.ingested_at).where(
        e.c.ingested_at <= until
    )
    if since is not None:
        window = window.where(e.c.ingested_at > since)
    ingested = window.cte("ingested")
    days = sa.select(ingested.c.day).distinct().subquery("days")
    # A scalar subquery per day rather than a join to the grouped table: the planner cannot push the few days
    # into a GROUP BY and would read every rollup row on each tick. MATERIALIZED keeps it once per day: SQLite
    # would otherwise inline it into the join and run it for every event of the window.
    built = (
        sa.select(
            days.c.day,
            sa.select(sa.func.max(r.c.rolled_up_at))
            .where(r.c.day == days.c.day)
            .scalar_subquery()
            .label("rolled_up_at"),
        )
        .cte("built")
        .prefix_with("MATERIALIZED")
    )
    after = sa.or_(built.c.rolled_up_at.is_(None), ingested.c.ingested_at > built.c.rolled_up_at)
    before = ingested.c.ingested_at <= built.c.rolled_up_at
    query = (
        sa.select(
            ingested.c.day,
            sa.func.count(sa.case((after, 1))),
            sa.func.max(built.c.rolled_up_at),
            sa.func.max(sa.case((before, ingested.c.ingested_at))),
        )
        .select_from(ingested.outerjoin(built, built.c.day == ingested.c.day))
        .group_by(ingested.c.day)
        .order_by(ingested.c.day)
    )
    return [IngestedDay(day, int(late), built_at, before) for day, late, built_at, before in conn.execute(query)]


@dataclass(frozen=True)
class DayBacklog:
    """Events of one UTC day that its rollup does not hold yet."""

    day: date
    rolled_up_at: datetime | None
    events: int  # ingested after rolled_up_at (every event of the day when the day was never built)
    oldest_ingested_at: datetime | None


def day_backlog(conn: sa.Connection, day: date, until: datetime | None = None) -> DayBacklog:
    """The events of ``day`` ingested after its last rollup (and at or before ``until``, when given).

    Two statements on purpose: the build time is read first and bound as a value, so the planner
    sees how recent it is and walks the ``ingested_at`` index from there. As a subquery its value
    would be unknown at planning time and PostgreSQL may walk the whole day on the occurred_at index.
    """
    e, built = marketing_event, measurement_rollup_day
    # The day's build, rows or none: a day built empty is built (measurement_rollup_day), not missing.
    rolled_up_at = conn.execute(sa.select(built.c.rolled_up_at).where(built.c.day == day)).scalar()
    start, end = day_bounds(day)
    query = sa.select(sa.func.count(), sa.func.min(e.c.ingested_at)).where(
        e.c.occurred_at >= start, e.c.occurred_at < end
    )
    if rolled_up_at is not None:
        query = query.where(e.c.ingested_at > rolled_up_at)
    if until is not None:
        query = query.where(e.c.ingested_at <= until)
    events, oldest = conn.execute(query).one()
    return DayBacklog(day, rolled_up_at, int(events), oldest)


def last_rollup_build(conn: sa.Connection) -> datetime | None:
    """When the rollup last rebuilt any day (``measurement_rollup_day``), None before its first build."""
    return conn.execute(sa.select(sa.func.max(measurement_rollup_day.c.rolled_up_at))).scalar_one_or_none()
