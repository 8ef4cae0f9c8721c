"""The report equals a recount from raw events, and reads only the rollup."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from marketing_pipelines.cli import main
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.measurement.events.write import record_events
from marketing_pipelines.measurement.report.build import measurement_report
from marketing_pipelines.measurement.report.rendering import render
from marketing_pipelines_tests.factories import add_campaign, replace_rollup_day
from marketing_pipelines_tests.measurement.generated import DAYS, generated_events, seed

MENTIONS_EVENTS = re.compile(r"\bmarketing_event\b", re.IGNORECASE)


@pytest.fixture
def rolled_up(engine: sa.Engine) -> list[dict[str, Any]]:
    events = generated_events(per_day=60)
    seed(engine, events)
    for day in DAYS:
        replace_rollup_day(engine, day)
    return events


def in_range(events: list[dict[str, Any]], campaign: str) -> pd.DataFrame:
    frame = pd.DataFrame(events)
    frame["day"] = pd.to_datetime(frame["occurred_at"], utc=True, format="ISO8601").dt.floor("D").dt.date
    return frame[(frame["campaign_id"] == campaign) & frame["day"].isin(DAYS)]


def test_report_equals_a_recount_from_raw_events_without_reading_them(
    engine: sa.Engine, rolled_up: list[dict[str, Any]]
) -> None:
    statements: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        with engine.connect() as conn:
            report = measurement_report(conn, "alpha", DAYS[0], DAYS[-1])
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)
    assert statements, "the listener saw no statement at all"
    assert not [s for s in statements if MENTIONS_EVENTS.search(s)]

    raw = in_range(rolled_up, "alpha")
    by_type = raw.groupby(["stage", "event_type"]).agg(raw_count=("event_id", "size"), uniques=("actor_id", "nunique"))
    assert {(t.stage, t.event_type): (t.raw_count, t.unique_actors) for t in report.totals} == {
        key: (row.raw_count, row.uniques) for key, row in by_type.iterrows()
    }
    # Range uniques come from merged sketches; below a few hundred actors HLL is exact, so equality is the test.
    assert all(not t.unique_actors_exact for t in report.totals)

    daily = raw.groupby(["day", "stage", "event_type"]).agg(
        raw_count=("event_id", "size"), uniques=("actor_id", "nunique")
    )
    assert {(d.day, d.stage, d.event_type): (d.raw_count, d.unique_actors) for d in report.daily} == {
        key: (row.raw_count, row.uniques) for key, row in daily.iterrows()
    }

    by_stage = raw.groupby("stage").agg(raw_count=("event_id", "size"), uniques=("actor_id", "nunique"))
    assert {f.stage: (f.unique_actors, f.raw_count) for f in report.funnel} == {
        stage: (row.uniques, row.raw_count) for stage, row in by_stage.iterrows()
    }
    sizes = [f.unique_actors for f in report.funnel]
    assert sizes == sorted(sizes, reverse=True)
    assert report.funnel[0].from_previous is None
    assert report.funnel[1].from_previous == round(sizes[1] / sizes[0], 4)


def test_a_single_day_row_reports_its_exact_count(engine: sa.Engine, rolled_up: list[dict[str, Any]]) -> None:
    with engine.connect() as conn:
        report = measurement_report(conn, "bravo", DAYS[1], DAYS[1])
    assert report.totals and all(t.unique_actors_exact for t in report.totals)
    assert {d.day for d in report.daily} == {DAYS[1]}


def test_stage_order_and_bad_input(engine: sa.Engine, rolled_up: list[dict[str, Any]]) -> None:
    with engine.connect() as conn:
        report = measurement_report(conn, "alpha", stage_order=["conversion", "awareness", "nowhere"])
        assert [f.stage for f in report.funnel] == ["conversion", "awareness", "nowhere"]
        assert report.funnel[2].unique_actors == 0 and report.funnel[2].from_first == 0
        assert (report.start, report.end) == (DAYS[0], DAYS[-1])
        with pytest.raises(InvalidInput, match="unknown campaign 'nope'"):
            measurement_report(conn, "nope")
        with pytest.raises(InvalidInput, match="is after"):
            measurement_report(conn, "alpha", DAYS[2], DAYS[0])


def test_renderings_carry_the_same_numbers(engine: sa.Engine, rolled_up: list[dict[str, Any]]) -> None:
    with engine.connect() as conn:
        report = measurement_report(conn, "charlie", DAYS[0], DAYS[-1])
    as_json = json.loads(render(report, "json"))
    assert sum(t["raw_count"] for t in as_json["totals"]) == sum(t.raw_count for t in report.totals)
    rows = list(csv.DictReader(io.StringIO(render(report, "csv"))))
    assert {r["section"] for r in rows} == {"total", "daily", "funnel"}
    assert sum(int(r["raw_count"]) for r in rows if r["section"] == "daily") == sum(d.raw_count for d in report.daily)
    table = render(report, "table")
    assert "Funnel" in table and f"Campaign charlie, {DAYS[0]} .. {DAYS[-1]}" in table


def test_report_command(db_url: str, rolled_up: list[dict[str, Any]], tmp_path: Path) -> None:
    runner = CliRunner(env={"MARKETING_DATABASE_URL": db_url})
    args = ["report", "--campaign", "delta", "--from", DAYS[0].isoformat(), "--to", DAYS[-1].isoformat()]
    result = runner.invoke(main, [*args, "--format", "json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["campaign_id"] == "delta"
    bad = runner.invoke(main, ["report", "--campaign", "delta", "--from", "26/11/2026"])
    assert bad.exit_code == 1 and "--from '26/11/2026' is not a day" in bad.output


def test_a_day_rolled_up_empty_reads_as_empty_and_a_day_never_rolled_up_as_missing(engine: sa.Engine) -> None:
    # Of five days: 1 and 4 hold events, 2 is rolled up with nothing to count, 3 and 5 were never rolled up.
    add_campaign(engine, "quiet")
    days = [date(2026, 11, d) for d in (1, 2, 3, 4, 5)]
    event = {"campaign_id": "quiet", "stage": "awareness", "event_type": "page_view", "actor_id": "a"}
    with engine.begin() as conn:
        for day in (days[0], days[3]):
            occurred = datetime(day.year, day.month, day.day, 12, tzinfo=UTC).isoformat()
            record_events(conn, [{**event, "event_id": f"q-{day}", "occurred_at": occurred}])
    for day in [*days[:2], days[3]]:
        replace_rollup_day(engine, day)
    with engine.connect() as conn:
        report = measurement_report(conn, "quiet", days[0], days[-1])
        empty = measurement_report(conn, "quiet", days[1], days[2])
    assert report.built_without_rows == ((days[1], days[1]),)
    assert report.not_built == ((days[2], days[2]), (days[4], days[4]))
    table = render(report, "table")
    assert "Rolled up, nothing of this campaign (counts are 0): 2026-11-02" in table
    assert "Never rolled up: 2026-11-03, 2026-11-05: materialize measurement_daily_rollup" in table
    # A range with no row at all says which of its days were built, not "materialize" for all of them.
    assert render(empty, "table").splitlines()[2:] == [
        "Rolled up, nothing of this campaign (counts are 0): 2026-11-02",
        "Never rolled up: 2026-11-03: materialize measurement_daily_rollup for these days "
        "(marketing-pipelines backfill --from ... --to ...).",
    ]
    as_json = json.loads(render(empty, "json"))
    assert (as_json["built_without_rows"], as_json["not_built"]) == (
        [["2026-11-02", "2026-11-02"]],
        [["2026-11-03", "2026-11-03"]],
    )
