"""The weekly sketch index: ``measurement_weekly_sketch`` rows folded from a week's daily rollup rows, week by week."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import sqlalchemy as sa

from marketing_pipelines.db.engine import is_postgres
from marketing_pipelines.db.schema import measurement_daily_rollup, measurement_weekly_sketch
from marketing_pipelines.measurement import sketches

# pg_advisory_xact_lock(namespace, week) serialises weekly refreshes of one week across processes.
WEEK_LOCK_NAMESPACE = 0x6D70_7700  # "mpw\0"


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
