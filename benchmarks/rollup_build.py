"""Seconds to build one UTC day of ``measurement_daily_rollup`` (``rollup.daily.replace_rollup_days`` of that day),
next to the same aggregation in pandas and in DuckDB over the same rows.

The day holds N events (20 campaigns, 4 stages, 6 event types, actors drawn with repetition).
The references compute what the rollup's first-party rows hold, count and exact distinct actors
per (campaign, stage, event type), over rows already in memory: a pandas DataFrame, and an
in-memory DuckDB table (the practical ceiling); both are loaded before the clock starts. They
build no HLL sketch, the project does, so the project's time is split into its parts, each run
on its own in a REPEATABLE READ transaction as the rollup does:

- ``group by``: the database's own GROUP BY with count(DISTINCT actor_id), no sketches (``group_by_query``);
- ``distinct fetch``: the sketch query (SELECT DISTINCT campaign, stage, event type, actor) read into
  Python without touching a sketch;
- ``sketch pass``: ``first_party_day``, the rollup's single grouped query plus one HLL update per actor row.

Every measurement is the median of ``--repeat`` runs, the methods alternating within each run.

    python benchmarks/rollup_build.py --events 100000 1000000 --database postgres sqlite --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import date

import duckdb
import pandas as pd
import sqlalchemy as sa
from _common import print_table, throwaway_database
from _measurement_events import generate_events, load_events

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import marketing_event as e
from marketing_pipelines.measurement.rollup.daily import first_party_day, partition_transaction, replace_rollup_days
from marketing_pipelines.measurement.rollup.event_days import day_bounds

DAY = date(2026, 1, 5)
DUCKDB_QUERY = (
    "SELECT campaign_id, stage, event_type, count(*) AS raw_count, count(DISTINCT actor_id) AS unique_actors "
    "FROM marketing_event WHERE occurred_at >= $start AND occurred_at < $end GROUP BY ALL"
)


def group_by_query(day: date) -> sa.Select[tuple[str, str, str, int, int]]:
    """Counts and exact distinct actors per (campaign, stage, event type) of one day, all in SQL."""
    start, end = day_bounds(day)
    return (
        sa.select(
            e.c.campaign_id,
            e.c.stage,
            e.c.event_type,
            sa.func.count(),
            sa.func.count(sa.distinct(e.c.actor_id)),
        )
        .where(e.c.occurred_at >= start, e.c.occurred_at < end)
        .group_by(e.c.campaign_id, e.c.stage, e.c.event_type)
    )


def distinct_actor_query(day: date) -> sa.Select[tuple[str, str, str, str]]:
    """The day's distinct (row, actor) pairs, fetched without building sketches: the transfer cost alone."""
    start, end = day_bounds(day)
    return (
        sa.select(e.c.campaign_id, e.c.stage, e.c.event_type, e.c.actor_id)
        .where(e.c.occurred_at >= start, e.c.occurred_at < end, e.c.actor_id.is_not(None))
        .distinct()
    )


def fetch_distinct_actors(engine: sa.Engine, day: date) -> int:
    rows = 0
    with partition_transaction(engine) as conn:
        for _ in conn.execute(distinct_actor_query(day).execution_options(yield_per=10_000)):
            rows += 1
    return rows


def group_by_only(engine: sa.Engine, day: date) -> int:
    with partition_transaction(engine) as conn:
        return len(conn.execute(group_by_query(day)).all())


def sketch_pass(engine: sa.Engine, day: date) -> int:
    with partition_transaction(engine) as conn:
        return len(first_party_day(conn, day))


def pandas_rollup(frame: pd.DataFrame) -> pd.DataFrame:
    start, end = day_bounds(DAY)
    day = frame[(frame["occurred_at"] >= start) & (frame["occurred_at"] < end)]
    return day.groupby(["campaign_id", "stage", "event_type"], sort=False).agg(
        raw_count=("actor_id", "size"), unique_actors=("actor_id", "nunique")
    )


def duckdb_rollup(con: duckdb.DuckDBPyConnection) -> list[tuple[object, ...]]:
    start, end = day_bounds(DAY)
    return con.execute(DUCKDB_QUERY, {"start": start, "end": end}).fetchall()


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    began = time.perf_counter()
    result = fn()
    return time.perf_counter() - began, result


def explain(engine: sa.Engine) -> None:
    """EXPLAIN ANALYZE of the rollup's two event queries (PostgreSQL), to see where the database spends."""
    with engine.connect() as conn:
        for name, query in (("group by", group_by_query(DAY)), ("distinct actors", distinct_actor_query(DAY))):
            compiled = query.compile(conn, compile_kwargs={"literal_binds": True})
            plan = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS) {compiled}").scalars().all()
            print(f"\nEXPLAIN ANALYZE, {name}:\n  " + "\n  ".join(plan))


def check_same_result(url: str, frame: pd.DataFrame) -> None:
    """The rollup's first-party counts equal the pandas ones: the comparison is of the same work."""
    with get_engine(url).connect() as conn:
        project = {
            (a.campaign_id, a.stage, a.event_type): (a.raw_count, a.unique_actors)
            for a, _sketch in first_party_day(conn, DAY)
        }
    reference = {key: (int(row.raw_count), int(row.unique_actors)) for key, row in pandas_rollup(frame).iterrows()}
    if project != reference:
        raise SystemExit(f"rollup and pandas disagree on {len(set(project.items()) ^ set(reference.items()))} rows")


def measure(database: str, frame: pd.DataFrame, repeat: int, show_plan: bool) -> tuple[object, ...]:
    con = duckdb.connect()
    con.register("frame", frame)
    con.execute("CREATE TABLE marketing_event AS SELECT * FROM frame")
    con.unregister("frame")
    with throwaway_database(database) as url:
        load_s = load_events(url, frame)
        engine = get_engine(url)
        check_same_result(url, frame)
        if show_plan and engine.dialect.name == "postgresql":
            explain(engine)
        runs: dict[str, list[float]] = {k: [] for k in ("project", "group", "fetch", "sketch", "pandas", "duckdb")}
        distinct_rows = 0
        for _ in range(repeat):
            runs["project"].append(timed(lambda: replace_rollup_days(engine, [DAY]))[0])
            runs["group"].append(timed(lambda: group_by_only(engine, DAY))[0])
            seconds, distinct_rows = timed(lambda: fetch_distinct_actors(engine, DAY))
            runs["fetch"].append(seconds)
            runs["sketch"].append(timed(lambda: sketch_pass(engine, DAY))[0])
            runs["pandas"].append(timed(lambda: pandas_rollup(frame))[0])
            runs["duckdb"].append(timed(lambda: duckdb_rollup(con))[0])
    con.close()
    m = {k: statistics.median(v) for k, v in runs.items()}
    events = len(frame)
    return (
        events,
        distinct_rows,
        load_s,
        m["project"],
        events / m["project"],
        m["group"],
        m["fetch"],
        m["sketch"],
        m["pandas"],
        m["duckdb"],
        m["project"] / m["pandas"],
        m["project"] / m["duckdb"],
        m["group"] / m["duckdb"],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, nargs="+", default=[100_000, 1_000_000], help="events of the day")
    parser.add_argument("--database", choices=["postgres", "sqlite"], nargs="+", default=["postgres"])
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement; the median is printed")
    parser.add_argument(
        "--actors-per-event", type=float, default=0.25, help="actor population as a share of the events (0.25)"
    )
    parser.add_argument("--explain", action="store_true", help="print EXPLAIN ANALYZE of the queries (PostgreSQL)")
    args = parser.parse_args()
    for database in args.database:
        rows = []
        for events in args.events:
            frame = generate_events(events, DAY, 1, max(1, round(events * args.actors_per_event)))
            rows.append(measure(database, frame, args.repeat, args.explain))
            del frame
        print_table(
            f"one day's rollup on {database} (seconds, median of {args.repeat}; x = project / reference)",
            [
                "events",
                "distinct rows",
                "load s",
                "rollup s",
                "events/s",
                "group by s",
                "distinct fetch s",
                "sketch pass s",
                "pandas s",
                "duckdb s",
                "x pandas",
                "x duckdb",
                "group by x duckdb",
            ],
            rows,
        )


if __name__ == "__main__":
    main()
