"""The rollup and the report as DataFrames, the day's funnel as Markdown, and the rollup's IO manager.

No ``from __future__ import annotations``: Dagster reads the assets' context annotations as real types.
"""

import random
import re
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import dagster as dg
import pandas as pd
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import site_analytics_daily
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.measurement.events.write import record_events
from marketing_pipelines.measurement.report.build import measurement_report
from marketing_pipelines.measurement.report.frames import (
    ROLLUP_DTYPES,
    RollupFrameIOManager,
    report_frames,
    rollup_frame,
)
from marketing_pipelines.measurement.report.rendering import MAX_FUNNEL_CAMPAIGNS, funnel_markdown
from marketing_pipelines_tests.factories import add_campaign, replace_rollup_day

DAYS = (date(2026, 11, 18), date(2026, 11, 19), date(2026, 11, 20))
CAMPAIGNS = ("spring-launch", "summer_sale", "winter-promo")
STAGES = {
    "awareness": ("page_view", "email_open"),
    "consideration": ("signup_started",),
    "conversion": ("purchase",),
}
UTM = {"spring-launch": "spring"}  # only this campaign gets site-analytics rows (unique_actors NULL)
PAGEVIEWS = 40


def event(campaign: str, day: date, stage: str, event_type: str, actor: str | None, n: int) -> dict[str, Any]:
    moment = datetime.combine(day, datetime.min.time(), tzinfo=UTC) + timedelta(seconds=n)
    return {
        "event_id": f"{campaign}-{day}-{n}",
        "campaign_id": campaign,
        "stage": stage,
        "event_type": event_type,
        "actor_id": actor,
        "occurred_at": moment.isoformat(),
    }


def generated(seed: int = 3, per_day: int = 90, actors: int = 30) -> list[dict[str, Any]]:
    """Random events of every campaign on DAYS, with repeat actors and some without an actor."""
    rng = random.Random(seed)
    events = []
    for campaign in CAMPAIGNS:
        for day in DAYS:
            for n in range(per_day):
                stage = rng.choice(list(STAGES))
                actor = None if rng.random() < 0.1 else f"{campaign}-{rng.randrange(actors)}"
                events.append(event(campaign, day, stage, rng.choice(STAGES[stage]), actor, n))
    return events


def seed_events(engine: sa.Engine, events: Iterable[dict[str, Any]], utm: dict[str, str] | None = None) -> None:
    events = list(events)
    for campaign in sorted({e["campaign_id"] for e in events}):
        add_campaign(engine, campaign, **({"utm_campaign": utm[campaign]} if utm and campaign in utm else {}))
    with engine.begin() as conn:
        record_events(conn, events, source="test")


def add_pageviews(engine: sa.Engine, days: Iterable[date]) -> None:
    now = datetime.now(UTC)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(site_analytics_daily),
            [
                {"day": d, "utm_campaign": u, "page": "/", "visitors": 5, "pageviews": PAGEVIEWS, "fetched_at": now}
                for d in days
                for u in UTM.values()
            ],
        )


@pytest.fixture
def rolled_up(engine: sa.Engine) -> list[dict[str, Any]]:
    events = generated()
    seed_events(engine, events, UTM)
    add_pageviews(engine, DAYS)
    for day in DAYS:
        replace_rollup_day(engine, day)
    return events


def as_int(value: Any) -> int | None:
    return None if pd.isna(value) else int(value)


def as_float(value: Any) -> float | None:
    return None if pd.isna(value) else float(value)


def assert_rollup_dtypes(frame: pd.DataFrame) -> None:
    assert list(frame.columns) == list(ROLLUP_DTYPES)
    assert {c: str(t) for c, t in frame.dtypes.items()} == {
        "day": "datetime64[ns]",
        "campaign_id": "str",
        "source": "str",
        "stage": "str",
        "event_type": "str",
        "raw_count": "Int64",
        "unique_actors": "Int64",
        "rolled_up_at": "datetime64[ns, UTC]",
    }


def test_rollup_frame_has_the_reports_daily_numbers(engine: sa.Engine, rolled_up: list[dict[str, Any]]) -> None:
    frame = rollup_frame(engine, campaign_id="spring-launch", start=DAYS[0], end=DAYS[-1])
    assert_rollup_dtypes(frame)
    assert "actors_hll" not in frame.columns
    keys = ["day", "campaign_id", "source", "stage", "event_type"]
    assert frame.equals(frame.sort_values(keys, ignore_index=True))
    assert set(frame["campaign_id"]) == {"spring-launch"}

    with engine.connect() as conn:
        report = measurement_report(conn, "spring-launch", DAYS[0], DAYS[-1])
    from_frame = {
        (row.day.date(), row.source, row.stage, row.event_type): (row.raw_count, as_int(row.unique_actors))
        for row in frame.itertuples()
    }
    assert from_frame == {
        (d.day, d.source, d.stage, d.event_type): (d.raw_count, d.unique_actors) for d in report.daily
    }

    # Independent of both: first-party raw counts recounted from the events, and the imported pageviews.
    recount = Counter(
        (date.fromisoformat(e["occurred_at"][:10]), e["stage"], e["event_type"])
        for e in rolled_up
        if e["campaign_id"] == "spring-launch"
    )
    first_party = frame[frame["source"] == "first_party"]
    assert {(r.day.date(), r.stage, r.event_type): r.raw_count for r in first_party.itertuples()} == dict(recount)
    site = frame[frame["source"] == "site_analytics"]
    assert list(site["raw_count"]) == [PAGEVIEWS] * len(DAYS)
    assert site["unique_actors"].isna().all()


def test_rollup_frame_filters_and_validates(engine: sa.Engine, rolled_up: list[dict[str, Any]]) -> None:
    everything = rollup_frame(engine)
    assert set(everything["campaign_id"]) == set(CAMPAIGNS)
    assert {d.date() for d in everything["day"]} == set(DAYS)

    with engine.connect() as conn:
        gap = rollup_frame(conn, days=[DAYS[2], DAYS[0]])
    assert {d.date() for d in gap["day"]} == {DAYS[0], DAYS[2]}
    assert len(gap) == len(everything[everything["day"] != pd.Timestamp(DAYS[1])])

    one = rollup_frame(engine, campaign_id="winter-promo", start=DAYS[1], end=DAYS[1], days=DAYS)
    assert {d.date() for d in one["day"]} == {DAYS[1]} and set(one["campaign_id"]) == {"winter-promo"}

    with pytest.raises(InvalidInput, match="unknown campaign 'nope'"):
        rollup_frame(engine, campaign_id="nope")
    with pytest.raises(InvalidInput, match="is after"):
        rollup_frame(engine, start=DAYS[2], end=DAYS[0])


def test_report_frames_carry_the_reports_values(engine: sa.Engine, rolled_up: list[dict[str, Any]]) -> None:
    with engine.connect() as conn:
        report = measurement_report(conn, "spring-launch", DAYS[0], DAYS[-1], stage_order=["awareness", "conversion"])
    frames = report_frames(report)

    assert frames.totals["unique_actors_exact"].dtype == bool
    assert frames.funnel["unique_actors_exact"].dtype == bool
    # One integer dtype for every count of every frame, as rollup_frame has it.
    for frame in (frames.totals, frames.daily, frames.funnel):
        assert {str(frame[c].dtype) for c in ("raw_count", "unique_actors")} == {"Int64"}
    assert set(frames.totals["campaign_id"]) == set(frames.daily["campaign_id"]) == {"spring-launch"}
    # The daily points are rollup_frame's rows, columns, order and dtypes, less rolled_up_at.
    direct = rollup_frame(engine, campaign_id="spring-launch", start=DAYS[0], end=DAYS[-1])
    pd.testing.assert_frame_equal(frames.daily, direct.drop(columns="rolled_up_at"))

    assert [
        (t.source, t.stage, t.event_type, t.raw_count, as_int(t.unique_actors), t.unique_actors_exact)
        for t in frames.totals.itertuples()
    ] == [(t.source, t.stage, t.event_type, t.raw_count, t.unique_actors, t.unique_actors_exact) for t in report.totals]
    # The range's site rows have no uniques; its first-party ones are merged estimates.
    assert frames.totals["unique_actors"].isna().sum() == 1
    assert not frames.totals["unique_actors_exact"].any()

    assert [
        (d.day.date(), d.source, d.stage, d.event_type, d.raw_count, as_int(d.unique_actors))
        for d in frames.daily.itertuples()
    ] == [tuple(point) for point in report.daily]

    assert [
        (
            f.stage,
            f.unique_actors,
            f.unique_actors_exact,
            f.raw_count,
            as_float(f.from_previous),
            as_float(f.from_first),
        )
        for f in frames.funnel.itertuples()
    ] == [
        (f.stage, f.unique_actors, f.unique_actors_exact, f.raw_count, f.from_previous, f.from_first)
        for f in report.funnel
    ]
    assert list(frames.funnel["stage"]) == ["awareness", "conversion"]
    assert pd.isna(frames.funnel["from_previous"].iloc[0]) and frames.funnel["from_previous"].iloc[1] > 0


def test_an_empty_range_gives_empty_frames_with_the_columns(engine: sa.Engine, rolled_up: list[dict[str, Any]]) -> None:
    later = (date(2026, 12, 1), date(2026, 12, 5))
    full = rollup_frame(engine, campaign_id="spring-launch")
    for empty in (
        rollup_frame(engine, campaign_id="spring-launch", start=later[0], end=later[1]),
        rollup_frame(engine, days=[]),
        rollup_frame(engine, days=[later[0]]),
    ):
        assert empty.empty
        assert_rollup_dtypes(empty)
        assert dict(empty.dtypes) == dict(full.dtypes)

    with engine.connect() as conn:
        empty_report = report_frames(measurement_report(conn, "spring-launch", *later))
        full_report = report_frames(measurement_report(conn, "spring-launch", DAYS[0], DAYS[-1]))
    for name in ("totals", "daily"):
        empty_frame, full_frame = getattr(empty_report, name), getattr(full_report, name)
        assert empty_frame.empty and not full_frame.empty
        assert dict(empty_frame.dtypes) == dict(full_frame.dtypes)
    # No stage order given and no rows: the funnel has no steps.
    assert empty_report.funnel.empty
    assert dict(empty_report.funnel.dtypes) == dict(full_report.funnel.dtypes)


def funnel_events(day: date) -> list[dict[str, Any]]:
    """A day of known funnels: spring-launch awareness 15 actors (two event types), 6, then 3."""
    plan: list[tuple[str, str, str, list[str | None]]] = [
        ("spring-launch", "awareness", "page_view", [f"a{i}" for i in range(10)] * 2),
        ("spring-launch", "awareness", "email_open", [f"a{i}" for i in range(5, 15)]),
        ("spring-launch", "consideration", "signup_started", [f"a{i}" for i in range(6)]),
        ("spring-launch", "conversion", "purchase", ["a0", "a1", "a2", None]),
        ("summer_sale", "retarget|email", "click", ["b1", "b2"]),
        ("summer_sale", "awareness", "page_view", ["b1", "b2", "b3", "b4"]),
    ]
    events, n = [], 0
    for campaign, stage, event_type, actors in plan:
        for actor in actors:
            events.append(event(campaign, day, stage, event_type, actor, n))
            n += 1
    return events


def test_funnel_markdown_of_a_known_day(engine: sa.Engine) -> None:
    day = DAYS[2]
    seed_events(engine, [*funnel_events(day), *funnel_events(DAYS[1])[:3]])
    replace_rollup_day(engine, DAYS[1])
    replace_rollup_day(engine, day)
    with engine.connect() as conn:
        text = funnel_markdown(conn, day)
        other = funnel_markdown(conn, date(2026, 11, 30))
    lines = text.splitlines()
    assert f"{day} (UTC)" in lines[0] and "2 campaigns" in lines[0]
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| campaign")]
    assert rows == [
        "| spring-launch | awareness | 30 | ~15 | - |",
        "| spring-launch | consideration | 6 | 6 | 40.0% |",
        "| spring-launch | conversion | 4 | 3 | 50.0% |",
        "| summer\\_sale | awareness | 4 | 4 | - |",
        "| summer\\_sale | retarget\\|email | 2 | 2 | 50.0% |",
    ]
    assert "more campaigns" not in text
    assert other == "No first-party rollup rows on 2026-11-30 (UTC)."
    assert isinstance(dg.MetadataValue.md(text), dg.MarkdownMetadataValue)


def test_funnel_markdown_is_bounded(engine: sa.Engine) -> None:
    day = DAYS[0]
    count = MAX_FUNNEL_CAMPAIGNS + 3
    # Campaign c{i} has i + 1 events on the day: the three smallest are the ones left out.
    events = [event(f"c{i:02d}", day, "awareness", "page_view", f"x{k}", k) for i in range(count) for k in range(i + 1)]
    seed_events(engine, events)
    replace_rollup_day(engine, day)
    with engine.connect() as conn:
        text = funnel_markdown(conn, day)
    rows = [line for line in text.splitlines() if re.match(r"\| c\d\d \|", line)]
    assert len(rows) == MAX_FUNNEL_CAMPAIGNS
    assert rows[0] == f"| c{count - 1:02d} | awareness | {count} | {count} | - |"
    assert not any(line.startswith(("| c00 ", "| c01 ", "| c02 ")) for line in rows)
    assert text.splitlines()[-1] == "… and 3 more campaigns (6 events)."
    assert f"{count} campaigns" in text.splitlines()[0]


# --- the IO manager, with a stand-in for the rollup asset ---------------------------------------------------

partitions = dg.DailyPartitionsDefinition(start_date="2026-11-01", timezone="UTC")
received: dict[str, pd.DataFrame] = {}


@dg.asset(name="measurement_daily_rollup", partitions_def=partitions, io_manager_key="rollup_frames")
def rollup_stand_in(context: dg.AssetExecutionContext, app_db: AppDatabase) -> None:
    replace_rollup_day(app_db.ready_engine(), context.partition_time_window.start.date())


@dg.asset(
    partitions_def=partitions,
    ins={
        "rollup": dg.AssetIn(
            "measurement_daily_rollup", partition_mapping=dg.TimeWindowPartitionMapping(start_offset=-2)
        )
    },
)
def three_day_view(context: dg.AssetExecutionContext, rollup: pd.DataFrame) -> dg.MaterializeResult:
    received[context.partition_key] = rollup
    return dg.MaterializeResult(metadata={"rows": len(rollup)})


def wired_resources(db_url: str) -> dict[str, Any]:
    # As the definitions wire them: both on the one application database.
    return {"app_db": AppDatabase(url=db_url), "rollup_frames": RollupFrameIOManager(url=db_url)}


def test_io_manager_loads_a_partition_and_a_downstream_range(engine: sa.Engine, db_url: str) -> None:
    seed_events(engine, generated(per_day=30))
    assets = [rollup_stand_in, three_day_view]
    instance = dg.DagsterInstance.ephemeral()
    for day in DAYS:
        result = dg.materialize(
            assets,
            selection=[rollup_stand_in],
            partition_key=day.isoformat(),
            instance=instance,
            resources=wired_resources(db_url),
        )
        assert result.success

    defs = dg.Definitions(assets=assets, resources=wired_resources(db_url))
    loaded = defs.load_asset_value("measurement_daily_rollup", partition_key=DAYS[1].isoformat())
    assert isinstance(loaded, pd.DataFrame)
    assert {d.date() for d in loaded["day"]} == {DAYS[1]}
    pd.testing.assert_frame_equal(loaded, rollup_frame(engine, days=[DAYS[1]]))

    with defs.get_asset_value_loader() as loader:
        ranged = loader.load_asset_value(
            "measurement_daily_rollup",
            partition_key_range=dg.PartitionKeyRange(DAYS[0].isoformat(), DAYS[2].isoformat()),
        )
    pd.testing.assert_frame_equal(ranged, rollup_frame(engine, start=DAYS[0], end=DAYS[2]))

    received.clear()
    result = dg.materialize(
        assets,
        selection=[three_day_view],
        partition_key=DAYS[2].isoformat(),
        instance=instance,
        resources=wired_resources(db_url),
    )
    assert result.success
    rollup = received[DAYS[2].isoformat()]
    assert {d.date() for d in rollup["day"]} == set(DAYS)
    pd.testing.assert_frame_equal(rollup, ranged)


def test_io_manager_refuses_to_store_a_value(db_url: str) -> None:
    @dg.asset(name="measurement_daily_rollup", partitions_def=partitions, io_manager_key="rollup_frames")
    def returns_a_frame() -> pd.DataFrame:
        return pd.DataFrame({"x": [1]})

    result = dg.materialize(
        [returns_a_frame],
        partition_key=DAYS[0].isoformat(),
        resources={"rollup_frames": RollupFrameIOManager(url=db_url)},
        raise_on_error=False,
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert "stores nothing" in str(failure.step_failure_data.error)
