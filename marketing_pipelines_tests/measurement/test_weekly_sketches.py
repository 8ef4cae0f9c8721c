"""The weekly sketch index: built with each day, used by the report only while it matches the daily rows."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pandas as pd
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from marketing_pipelines.cli import main
from marketing_pipelines.db.schema import measurement_daily_rollup as daily_table
from marketing_pipelines.db.schema import measurement_weekly_sketch as weekly_table
from marketing_pipelines.measurement import sketches
from marketing_pipelines.measurement.report.build import measurement_report
from marketing_pipelines.measurement.report.model import MeasurementReport
from marketing_pipelines.measurement.rollup.weekly import week_start
from marketing_pipelines_tests.factories import replace_rollup_day, sketch_of
from marketing_pipelines_tests.measurement.generated import seed

FIRST = date(2026, 11, 2)  # a Monday: the range holds two whole ISO weeks and three days of a third
DAYS = [FIRST + timedelta(days=i) for i in range(17)]
LAST = DAYS[-1]
STAGES = {"awareness": ("page_view",), "conversion": ("signup_completed", "purchase")}


def events(
    seed_value: int = 3, per_day: int = 40, day_list: list[date] = DAYS, actors: str = "actor"
) -> list[dict[str, Any]]:
    rng = random.Random(seed_value)
    out: list[dict[str, Any]] = []
    for day in day_list:
        for campaign in ("alpha", "bravo"):
            for _ in range(per_day):
                stage = rng.choice(list(STAGES))
                moment = datetime.combine(day, datetime.min.time(), tzinfo=UTC) + timedelta(
                    seconds=rng.uniform(0, 86_399)
                )
                out.append(
                    {
                        "event_id": f"w-{seed_value}-{len(out)}",
                        "campaign_id": campaign,
                        "stage": stage,
                        "event_type": rng.choice(STAGES[stage]),
                        # Actors recur across days, so a week's uniques are fewer than its days' sum.
                        "actor_id": f"{campaign}-{actors}-{rng.randrange(60)}",
                        "occurred_at": moment.isoformat(),
                        "source": "web",
                        "properties": {},
                    }
                )
    return out


def recount(all_events: list[dict[str, Any]], campaign: str) -> dict[tuple[str, str], tuple[int, int]]:
    frame = pd.DataFrame(all_events)
    frame = frame[frame["campaign_id"] == campaign]
    grouped = frame.groupby(["stage", "event_type"]).agg(n=("event_id", "size"), u=("actor_id", "nunique"))
    return {key: (int(row.n), int(row.u)) for key, row in grouped.iterrows()}


def totals(report: MeasurementReport) -> dict[tuple[str, str], tuple[int, int | None]]:
    return {(t.stage, t.event_type): (t.raw_count, t.unique_actors) for t in report.totals}


def report(engine: sa.Engine) -> MeasurementReport:
    with engine.connect() as conn:
        return measurement_report(conn, "alpha", FIRST, LAST)


@pytest.fixture
def built(engine: sa.Engine) -> list[dict[str, Any]]:
    generated = events()
    seed(engine, generated)
    for day in DAYS:
        replace_rollup_day(engine, day)
    return generated


def test_each_weekly_row_is_the_union_of_its_days(engine: sa.Engine, built: list[dict[str, Any]]) -> None:
    with engine.connect() as conn:
        weekly = conn.execute(sa.select(weekly_table)).mappings().all()
        daily = conn.execute(sa.select(daily_table)).mappings().all()
    assert {row["week_start"] for row in weekly} == {date(2026, 11, 2), date(2026, 11, 9), date(2026, 11, 16)}
    by_key: dict[tuple[Any, ...], list[Any]] = {}
    for row in daily:
        key = (week_start(row["day"]), row["campaign_id"], row["source"], row["stage"], row["event_type"])
        by_key.setdefault(key, []).append(row)
    assert len(weekly) == len(by_key)
    frame = pd.DataFrame(built)
    frame["week"] = pd.to_datetime(frame["occurred_at"], utc=True).dt.date.map(week_start)
    exact = frame.groupby(["week", "campaign_id", "stage", "event_type"])["actor_id"].nunique()
    for row in weekly:
        key = (row["week_start"], row["campaign_id"], row["source"], row["stage"], row["event_type"])
        members = by_key[key]
        assert row["days"] == len(members)
        assert row["raw_count"] == sum(m["raw_count"] for m in members)
        assert row["daily_rolled_up_at"] == max(m["rolled_up_at"] for m in members)
        # Below a few hundred actors the sketch is exact, so the union's estimate is the true weekly count.
        union = sketches.deserialize(row["actors_hll"])
        assert sketches.estimate(union) == exact[(row["week_start"], *key[1:2], *key[3:])]


def test_report_uses_whole_fresh_weeks_and_equals_a_recount(engine: sa.Engine, built: list[dict[str, Any]]) -> None:
    assert totals(report(engine)) == recount(built, "alpha")

    # Swap in a sketch of other actors while the fingerprint still matches: the report must now
    # show it, which proves the weekly row (not the daily ones) is what it merged.
    other = sketches.serialize(sketch_of(f"someone-else-{i}" for i in range(500)))
    with engine.begin() as conn:
        conn.execute(
            sa.update(weekly_table)
            .where(weekly_table.c.week_start == date(2026, 11, 9), weekly_table.c.campaign_id == "alpha")
            .values(actors_hll=other)
        )
    tampered = totals(report(engine))
    assert all(unique is not None and unique > 500 for _, unique in tampered.values())

    # A partial week at either end of the range is never served from its weekly row.
    with engine.connect() as conn:
        partial = measurement_report(conn, "alpha", date(2026, 11, 10), LAST)
    in_range = [e for e in built if e["occurred_at"][:10] >= "2026-11-10"]
    assert totals(partial) == recount(in_range, "alpha")


def test_a_stale_weekly_row_is_ignored_until_its_week_is_refreshed(
    engine: sa.Engine, db_url: str, built: list[dict[str, Any]]
) -> None:
    # Late events by new actors for a Tuesday, rolled up while the weekly refresh "dies": the weekly
    # row keeps its old fingerprint and sketch, as if the process stopped between the two transactions.
    late = events(seed_value=11, per_day=25, day_list=[date(2026, 11, 10)], actors="late")
    with engine.connect() as conn:
        before = conn.execute(sa.select(weekly_table).where(weekly_table.c.week_start == date(2026, 11, 9))).all()
    seed(engine, late)
    replace_rollup_day(engine, date(2026, 11, 10))
    with engine.begin() as conn:
        conn.execute(sa.delete(weekly_table).where(weekly_table.c.week_start == date(2026, 11, 9)))
        conn.execute(sa.insert(weekly_table), [row._asdict() for row in before])

    assert totals(report(engine)) == recount(built + late, "alpha")

    result = CliRunner(env={"MARKETING_DATABASE_URL": db_url}).invoke(main, ["db", "rebuild-weekly-sketches"])
    assert result.exit_code == 0, result.output
    assert "rebuilt 3 week(s)" in result.output
    with engine.connect() as conn:
        refreshed = conn.execute(
            sa.select(sa.func.sum(weekly_table.c.raw_count)).where(weekly_table.c.week_start == date(2026, 11, 9))
        ).scalar_one()
    assert refreshed == sum(1 for e in built + late if "2026-11-09" <= e["occurred_at"][:10] <= "2026-11-15")
    assert totals(report(engine)) == recount(built + late, "alpha")


def test_plan_uses_fresh_weeks_and_the_days_of_every_other_week(engine: sa.Engine, built: list[dict[str, Any]]) -> None:
    from dataclasses import replace

    from marketing_pipelines.measurement.report.reads import plan_sketches, read_days

    key = ("first_party", "awareness", "page_view")
    with engine.connect() as conn:
        daily, ranges = read_days(conn, "alpha", FIRST, LAST)
    assert [p.day for p in daily if (p.source, p.stage, p.event_type) == key] == DAYS
    kr = ranges[key]
    # Mon 2 Nov .. Sun 15 Nov are two whole weeks; Mon 16 .. Wed 18 Nov are edge days, whose sketches came
    # with their rows and are never planned.
    assert list(kr.weeks) == [date(2026, 11, 2), date(2026, 11, 9)]
    assert len(kr.edge_sketches) == 3 and all(kr.edge_sketches)

    plan = plan_sketches({key: kr}, {(date(2026, 11, 2), key), (date(2026, 11, 9), key)})
    assert plan.weeks == {key: [date(2026, 11, 2), date(2026, 11, 9)]} and plan.days == {}

    plan = plan_sketches({key: kr}, {(date(2026, 11, 9), key)})
    assert plan.weeks == {key: [date(2026, 11, 9)]} and plan.days == {key: DAYS[:7]}

    # Unknown uniques on any day: no sketch is read for that key at all.
    assert plan_sketches({key: replace(kr, unknown=True)}, {(date(2026, 11, 9), key)}) == type(plan)(weeks={}, days={})


def test_fingerprint_is_recomputed_from_the_daily_rows(engine: sa.Engine, built: list[dict[str, Any]]) -> None:
    from marketing_pipelines.measurement.report.reads import fresh_weekly_sketches, read_days

    def fresh(conn: sa.Connection, start: date, end: date) -> set[tuple[date, tuple[str, str, str]]]:
        _, ranges = read_days(conn, "alpha", start, end)
        return set(fresh_weekly_sketches(conn, "alpha", ranges, start, end))

    with engine.connect() as conn:
        assert fresh(conn, FIRST, LAST) == {
            (monday, (row.source, row.stage, row.event_type))
            for monday in (date(2026, 11, 2), date(2026, 11, 9))
            for row in conn.execute(
                sa.select(weekly_table).where(
                    weekly_table.c.campaign_id == "alpha", weekly_table.c.week_start == monday
                )
            )
        }
        # Partial weeks at either end are never returned.
        assert {m for m, _ in fresh(conn, date(2026, 11, 3), date(2026, 11, 15))} == {date(2026, 11, 9)}
    # Each part of the fingerprint on its own makes the week stale.
    d = daily_table
    one_row = sa.and_(d.c.campaign_id == "alpha", d.c.day == date(2026, 11, 10), d.c.stage == "awareness")
    for change in (
        {"raw_count": d.c.raw_count + 1},
        {"rolled_up_at": datetime(2030, 1, 1, tzinfo=UTC)},
    ):
        with engine.begin() as conn:
            conn.execute(sa.update(d).where(one_row).values(change))
        with engine.connect() as conn:
            stale = fresh(conn, FIRST, LAST)
        assert (date(2026, 11, 9), ("first_party", "awareness", "page_view")) not in stale
        replace_rollup_day(engine, date(2026, 11, 10))  # rebuilds the day and refreshes its week
    with engine.begin() as conn:
        conn.execute(sa.delete(d).where(one_row))
    with engine.connect() as conn:
        assert (date(2026, 11, 9), ("first_party", "awareness", "page_view")) not in fresh(conn, FIRST, LAST)


def _rebuild_day(db_url: str, day: date, rounds: int, start: Any, out: Any) -> None:
    from marketing_pipelines.db.engine import get_engine

    engine = get_engine(db_url)
    start.wait()
    try:
        for _ in range(rounds):
            replace_rollup_day(engine, day)
        out.put(None)
    except Exception as exc:  # reported to the test, which fails with it
        out.put(repr(exc))


@pytest.mark.slow
@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_days_of_one_week_rolled_up_at_once_leave_a_fresh_week(database: str, request: pytest.FixtureRequest) -> None:
    """Seven processes rebuild the seven days of one week at the same moment, several times over."""
    import multiprocessing as mp

    from marketing_pipelines.db.engine import get_engine
    from marketing_pipelines.measurement.report.reads import fresh_weekly_sketches, read_days

    db_url = request.getfixturevalue("sqlite_url" if database == "sqlite" else "pg_url")
    engine = get_engine(db_url)
    week = [date(2026, 11, 9) + timedelta(days=i) for i in range(7)]
    generated = events(day_list=week)
    seed(engine, generated)
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(len(week) + 1, timeout=120), ctx.Queue()
    procs = [ctx.Process(target=_rebuild_day, args=(db_url, day, 4, start, out)) for day in week]
    for p in procs:
        p.start()
    start.wait()
    errors = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert errors == [None] * len(week)

    with engine.connect() as conn:
        keys = conn.execute(
            sa.select(daily_table.c.campaign_id, daily_table.c.source, daily_table.c.stage, daily_table.c.event_type)
            .distinct()
            .where(daily_table.c.day.in_(week))
        ).all()
        for campaign in ("alpha", "bravo"):
            _, ranges = read_days(conn, campaign, week[0], week[-1])
            fresh = fresh_weekly_sketches(conn, campaign, ranges, week[0], week[-1])
            assert set(fresh) == {(week[0], tuple(k[1:])) for k in keys if k[0] == campaign}
    with engine.connect() as conn:
        report = measurement_report(conn, "alpha", week[0], week[-1])
    assert totals(report) == recount(generated, "alpha")
