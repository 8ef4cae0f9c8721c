"""Latency of ``measurement_report`` (read from the rollup only) for one campaign over 90 days as the raw
events grow, next to the first version's approach: every event of the campaign in the range loaded
from ``marketing_event`` into Python and aggregated there.

The raw table holds N events over the 90 days (20 campaigns, 4 stages, 6 event types, actors drawn
with repetition). The rollup of the 90 days is built first, untimed (its seconds are printed). The
raw approach computes what the report shows: counts and exact distinct actors per (stage, event type)
over the range, per day, and per stage (the funnel). Both run in one process against one database,
alternating, after one warm-up each; each latency is the median of its runs. The report is timed
twice: right after the backfill (``report ms after backfill``: the weekly index still holds the dead
row versions of each week's seven refreshes, no table statistics yet) and, for the ratio, after
``VACUUM ANALYZE`` of the two rollup tables, the state autovacuum leaves them in. The report's unique
actors over the range are HLL estimates, the raw ones exact: the largest difference is printed too.

    python benchmarks/report_latency.py --events 1000000 10000000
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import UTC, date, timedelta
from typing import Any

import sqlalchemy as sa
from _common import print_table, throwaway_database
from _measurement_events import campaign_ids, generate_events, load_events

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import marketing_event as e
from marketing_pipelines.measurement.report.build import measurement_report
from marketing_pipelines.measurement.report.model import MeasurementReport
from marketing_pipelines.measurement.rollup.daily import replace_rollup_days
from marketing_pipelines.measurement.rollup.event_days import day_bounds

FIRST_DAY = date(2026, 1, 1)


def raw_report(conn: sa.Connection, campaign_id: str, start: date, end: date) -> dict[str, Any]:
    """The first version: load the campaign's events of [start, end] and aggregate them in Python."""
    rows = conn.execute(
        sa.select(e.c.occurred_at, e.c.stage, e.c.event_type, e.c.actor_id).where(
            e.c.campaign_id == campaign_id,
            e.c.occurred_at >= day_bounds(start)[0],
            e.c.occurred_at < day_bounds(end)[1],
        )
    ).all()
    counts: Counter[tuple[str, str]] = Counter()
    actors: defaultdict[tuple[str, str], set[str]] = defaultdict(set)
    daily_counts: Counter[tuple[date, str, str]] = Counter()
    daily_actors: defaultdict[tuple[date, str, str], set[str]] = defaultdict(set)
    stage_actors: defaultdict[str, set[str]] = defaultdict(set)
    for occurred_at, stage, event_type, actor_id in rows:
        day = occurred_at.astimezone(UTC).date()
        counts[(stage, event_type)] += 1
        daily_counts[(day, stage, event_type)] += 1
        if actor_id is not None:
            actors[(stage, event_type)].add(actor_id)
            daily_actors[(day, stage, event_type)].add(actor_id)
            stage_actors[stage].add(actor_id)
    return {
        "totals": {key: (n, len(actors[key])) for key, n in counts.items()},
        "daily": {key: (n, len(daily_actors[key])) for key, n in daily_counts.items()},
        "funnel": {stage: len(members) for stage, members in stage_actors.items()},
    }


def largest_unique_error(report: MeasurementReport, raw: dict[str, Any]) -> float:
    """Largest |estimate - exact| / exact over the range totals and funnel steps, in %; counts must match exactly."""
    errors = [0.0]
    for t in report.totals:
        raw_count, exact = raw["totals"][(t.stage, t.event_type)]
        if raw_count != t.raw_count:
            raise SystemExit(f"raw_count of {t.stage}/{t.event_type}: report {t.raw_count}, events {raw_count}")
        errors.append(abs((t.unique_actors or 0) - exact) / max(exact, 1) * 100)
    for f in report.funnel:
        exact = raw["funnel"][f.stage]
        errors.append(abs(f.unique_actors - exact) / max(exact, 1) * 100)
    return max(errors)


def median_seconds(fn: Callable[[], object], runs: int) -> float:
    seconds = []
    for _ in range(runs):
        began = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def measure(
    database: str, events: int, days: int, campaigns: int, actors: int, repeat: int, raw_repeat: int
) -> tuple[object, ...]:
    frame = generate_events(events, FIRST_DAY, days, actors, campaigns)
    campaign_id = campaign_ids(campaigns)[0]
    start, end = FIRST_DAY, FIRST_DAY + timedelta(days=days - 1)
    campaign_events = int((frame["campaign_id"] == campaign_id).sum())
    with throwaway_database(database) as url:
        load_events(url, frame)
        del frame
        engine = get_engine(url)
        began = time.perf_counter()
        for offset in range(days):
            replace_rollup_days(engine, [start + timedelta(days=offset)])
        rollup_s = time.perf_counter() - began

        def project() -> MeasurementReport:
            with engine.connect() as conn:
                return measurement_report(conn, campaign_id, start, end)

        def raw() -> dict[str, Any]:
            with engine.connect() as conn:
                return raw_report(conn, campaign_id, start, end)

        error = largest_unique_error(project(), raw())  # also the warm-up of both
        # Right after the backfill the weekly index holds the dead versions of its weeks' earlier
        # refreshes (each day rebuilt its week) and the rollup tables have no statistics yet.
        after_backfill_s = median_seconds(project, repeat)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for table in ("measurement_daily_rollup", "measurement_weekly_sketch"):
                conn.execute(sa.text(f"VACUUM ANALYZE {table}" if database == "postgres" else f"ANALYZE {table}"))
        project()
        report_runs, raw_runs = [], []
        # Alternate so that both see the same machine load; the raw side runs fewer times because it is slow.
        for i in range(max(repeat, raw_repeat)):
            if i < repeat:
                report_runs.append(median_seconds(project, 1))
            if i < raw_repeat:
                raw_runs.append(median_seconds(raw, 1))
    report_s, raw_s = statistics.median(report_runs), statistics.median(raw_runs)
    return (
        events,
        campaign_events,
        rollup_s,
        after_backfill_s * 1000,
        report_s * 1000,
        raw_s * 1000,
        raw_s / report_s,
        raw_s / after_backfill_s,
        error,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, nargs="+", default=[100_000, 1_000_000], help="raw events in the table")
    parser.add_argument("--database", choices=["postgres", "sqlite"], nargs="+", default=["postgres"])
    parser.add_argument("--days", type=int, default=90, help="days of events, and the report's range (90)")
    parser.add_argument("--campaigns", type=int, default=20, help="campaigns the events spread over (20)")
    parser.add_argument(
        "--actors-per-event", type=float, default=0.25, help="actor population as a share of the events (0.25)"
    )
    parser.add_argument("--repeat", type=int, default=15, help="runs of the report; the median is printed")
    parser.add_argument("--raw-repeat", type=int, default=3, help="runs of the raw approach; the median is printed")
    args = parser.parse_args()
    for database in args.database:
        rows = [
            measure(
                database,
                events,
                args.days,
                args.campaigns,
                max(1, round(events * args.actors_per_event)),
                args.repeat,
                args.raw_repeat,
            )
            for events in args.events
        ]
        print_table(
            f"report of one campaign over {args.days} days on {database} (ms, medians; x = raw / report)",
            [
                "raw events",
                "campaign events",
                "rollup build s",
                "report ms after backfill",
                "report ms",
                "raw ms",
                "x faster",
                "x after backfill",
                "max uniq err %",
            ],
            rows,
        )


if __name__ == "__main__":
    main()
