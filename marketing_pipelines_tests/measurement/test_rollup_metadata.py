"""The rollup as the UI shows it: each day's counts per campaign, stage and event type, and its checks per partition."""

from __future__ import annotations

import base64
import json
import re
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.engine import is_postgres
from marketing_pipelines.db.schema import github_release_download_daily, site_analytics_daily
from marketing_pipelines.measurement.assets import source_metric_name, source_metrics
from marketing_pipelines.measurement.checks import FIRST_PARTY_COUNT_MATCHES, UNIQUE_ACTORS_WITHIN_RAW_COUNT
from marketing_pipelines.measurement.events.files import load_events_file
from marketing_pipelines.measurement.keys import ROLLUP_KEY
from marketing_pipelines.measurement.rollup.daily import MAX_SHOWN_COUNTS
from marketing_pipelines_tests.factories import add_campaign
from marketing_pipelines_tests.measurement.generated import (
    DAYS,
    generated_events,
    materialize_rollup,
    rollup_rows_frame,
    seed,
)

DAY = date(2026, 11, 26)
# Event types as files may carry them, each with what the UI shows for it.
SHOWN = {
    "page_view": "page_view",
    "open\x1b[2J": "open\\x1b[2J",  # an escape sequence that would clear a terminal
    "click\u202e": "click\\u202e",  # a right-to-left override, which reorders what follows
}
COLUMNS = ["campaign_id", "source", "stage", "event_type", "raw_count", "unique_actors"]


def write_jsonl(path: Path, events: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return path


def day_events() -> list[dict[str, Any]]:
    """Two campaigns, several stages and event types on DAY (some without an actor), and events either side of it."""
    plan = [
        # campaign, stage, event type, actors (None: an event without one)
        ("alpha", "awareness", "page_view", ["a1", "a2", "a2", "a3", None]),
        ("alpha", "awareness", "open\x1b[2J", ["a1", "a1"]),
        ("alpha", "consider\x07", "click\u202e", ["a2"]),
        ("bravo", "awareness", "page_view", ["b1", "b2", None, None]),
        ("bravo", "conversion", "purchase", ["b1", "b1", "b2"]),
    ]
    events = []
    for campaign, stage, event_type, actors in plan:
        for n, actor in enumerate(actors):
            events.append(
                {
                    "event_id": f"{campaign}-{stage}-{event_type}-{n}",
                    "campaign_id": campaign,
                    "stage": stage,
                    "event_type": event_type,
                    "occurred_at": f"{DAY}T{10 + n:02d}:00:00Z",
                    **({"actor_id": actor} if actor else {}),
                }
            )
    # The days either side: not in DAY's table.
    for n, moment in enumerate(("2026-11-25T23:59:59.999999Z", "2026-11-27T00:00:00Z")):
        events.append(
            {
                "event_id": f"edge-{n}",
                "campaign_id": "alpha",
                "stage": "awareness",
                "event_type": "page_view",
                "occurred_at": moment,
                "actor_id": "a9",
            }
        )
    return events


def expected_counts(events: list[dict[str, Any]], day: date) -> list[dict[str, Any]]:
    """The table's rows counted straight from the events, with text as the UI must show it."""
    raw: Counter[tuple[str, str, str]] = Counter()
    actors: defaultdict[tuple[str, str, str], set[str]] = defaultdict(set)
    for e in events:
        if e["occurred_at"].startswith(day.isoformat()):
            key = (e["campaign_id"], e["stage"], e["event_type"])
            raw[key] += 1
            if "actor_id" in e:
                actors[key].add(e["actor_id"])
    return sorted(
        (
            {
                "campaign_id": campaign,
                "source": "first_party",
                "stage": stage.replace("\x07", "\\x07"),
                "event_type": SHOWN.get(event_type, event_type),
                "raw_count": n,
                "unique_actors": len(actors[(campaign, stage, event_type)]),
            }
            for (campaign, stage, event_type), n in raw.items()
        ),
        key=lambda row: [row[c] for c in COLUMNS[:4]],
    )


def rollup_metadata(instance: dg.DagsterInstance, day: date) -> dict[str, dg.MetadataValue]:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=ROLLUP_KEY, asset_partitions=[day.isoformat()]), limit=1
    ).records
    assert records, f"no materialization of {day}"
    materialization = records[0].asset_materialization
    assert materialization is not None
    return dict(materialization.metadata)


def table_rows(metadata: dict[str, dg.MetadataValue]) -> list[dict[str, Any]]:
    table = metadata["counts"]
    assert isinstance(table, dg.TableMetadataValue)
    assert table.schema is not None and [c.name for c in table.schema.columns] == COLUMNS
    return [dict(record.data) for record in table.records]


def test_a_days_materialization_holds_its_counts_per_campaign_stage_and_event_type(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    add_campaign(engine, "alpha")
    add_campaign(engine, "bravo")
    events = day_events()
    assert load_events_file(engine, write_jsonl(tmp_path / "events.jsonl", events)).loaded == len(events)

    assert materialize_rollup(db_url, instance, DAY).success
    metadata = rollup_metadata(instance, DAY)

    expected = expected_counts(events, DAY)
    assert table_rows(metadata) == expected
    on_day = [e for e in events if e["occurred_at"].startswith(DAY.isoformat())]
    totals = {key: metadata[key].value for key in ("events", "campaigns", "event_types", "first_party_events", "rows")}
    assert totals == {
        "events": len(on_day),
        "campaigns": 2,
        "event_types": len({e["event_type"] for e in on_day}),
        "first_party_events": len(on_day),
        "rows": len(expected),
    }
    # The whole day is shown, so there is nothing to note.
    assert not {"rows_shown", "rows_total", "counts_note"} & set(metadata)
    # The funnel (Markdown) writes the control character in a stage name visibly too.
    funnel = metadata["funnel"].value
    assert isinstance(funnel, str) and "\x07" not in funnel and "consider\\\\x07" in funnel


def test_a_day_with_more_rows_than_the_bound_shows_its_largest_and_says_so(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    add_campaign(engine, "alpha")
    doubled = 5  # event types with two events: the largest rows, shown whatever their names
    total = MAX_SHOWN_COUNTS + doubled
    events = [
        {
            "event_id": f"e{t}-{n}",
            "campaign_id": "alpha",
            "stage": "awareness",
            "event_type": f"type-{t:03d}",
            "occurred_at": f"{DAY}T12:00:00Z",
        }
        for t in range(total)
        for n in range(2 if t >= total - doubled else 1)
    ]
    load_events_file(engine, write_jsonl(tmp_path / "events.jsonl", events))

    assert materialize_rollup(db_url, instance, DAY).success
    metadata = rollup_metadata(instance, DAY)

    rows = table_rows(metadata)
    assert len(rows) == MAX_SHOWN_COUNTS
    # The largest rows sort last by name: kept by raw_count, not by name.
    largest = {f"type-{t:03d}" for t in range(total - doubled, total)}
    assert {r["event_type"] for r in rows if r["raw_count"] == 2} == largest
    assert (metadata["rows_shown"].value, metadata["rows_total"].value) == (MAX_SHOWN_COUNTS, total)
    assert metadata["rows"].value == total and metadata["events"].value == len(events)
    note = metadata["counts_note"].value
    assert isinstance(note, str) and f"{MAX_SHOWN_COUNTS} largest rows by raw_count of {total}" in note


BAD_DAY = DAYS[1]


@pytest.fixture
def bad_rows_on_bad_day(engine: sa.Engine) -> Iterator[None]:
    """A trigger that writes every first-party rollup row of BAD_DAY with more unique actors than events.

    A rollup bug planted in the database, so the check fails inside a real run. PostgreSQL keeps
    a trigger across the session's tests, so it is dropped afterwards.
    """
    with engine.begin() as conn:
        if is_postgres(conn):
            conn.exec_driver_sql(
                "CREATE FUNCTION plant_bad_row() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN NEW.unique_actors := NEW.raw_count + 1; RETURN NEW; END $$"
            )
            conn.exec_driver_sql(
                "CREATE TRIGGER plant_bad_row BEFORE INSERT ON measurement_daily_rollup FOR EACH ROW "
                f"WHEN (NEW.day = DATE '{BAD_DAY}' AND NEW.source = 'first_party') EXECUTE FUNCTION plant_bad_row()"
            )
        else:
            conn.exec_driver_sql(
                "CREATE TRIGGER plant_bad_row AFTER INSERT ON measurement_daily_rollup "
                f"WHEN NEW.day = '{BAD_DAY}' AND NEW.source = 'first_party' BEGIN "
                "UPDATE measurement_daily_rollup SET unique_actors = raw_count + 1 WHERE day = NEW.day "
                "AND campaign_id = NEW.campaign_id AND source = NEW.source AND stage = NEW.stage "
                "AND event_type = NEW.event_type; END"
            )
    try:
        yield
    finally:
        drop_bad_rows_trigger(engine)


def drop_bad_rows_trigger(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        if is_postgres(conn):
            conn.exec_driver_sql("DROP TRIGGER IF EXISTS plant_bad_row ON measurement_daily_rollup")
            conn.exec_driver_sql("DROP FUNCTION IF EXISTS plant_bad_row()")
        else:
            conn.exec_driver_sql("DROP TRIGGER IF EXISTS plant_bad_row")


def partition_statuses(instance: dg.DagsterInstance, check_name: str) -> dict[str, str]:
    """Each partition's latest result of the check as the UI's partition view reads it (only results it shows)."""
    infos = instance.event_log_storage.get_asset_check_partition_info([dg.AssetCheckKey(ROLLUP_KEY, check_name)])
    # A result not naming the partition's latest materialization is stale: the UI shows no status for it.
    return {i.partition_key or "": i.latest_execution_status.value for i in infos if i.is_current}


@pytest.mark.usefixtures("bad_rows_on_bad_day")
def test_a_range_runs_failing_day_fails_on_that_days_partition_only(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance
) -> None:
    seed(engine, generated_events(per_day=20))

    result = materialize_rollup(db_url, instance, *DAYS)  # one run over the range, as a backfill runs it
    assert result.success  # the check's failure is the day's, shown on its partition; the run's work succeeded

    days = {d.isoformat() for d in DAYS}
    assert partition_statuses(instance, UNIQUE_ACTORS_WITHIN_RAW_COUNT) == {
        d: "FAILED" if d == BAD_DAY.isoformat() else "SUCCEEDED" for d in days
    }
    assert partition_statuses(instance, FIRST_PARTY_COUNT_MATCHES) == dict.fromkeys(days, "SUCCEEDED")
    failed = [e for e in result.get_asset_check_evaluations() if not e.passed]
    assert [(e.check_name, e.partition) for e in failed] == [(UNIQUE_ACTORS_WITHIN_RAW_COUNT, BAD_DAY.isoformat())]
    assert failed[0].metadata["violating_rows"].value == rollup_metadata(instance, BAD_DAY)["first_party_rows"].value

    # Fixed and re-run, the day passes on its partition; the other days keep their results.
    drop_bad_rows_trigger(engine)
    assert materialize_rollup(db_url, instance, BAD_DAY).success
    assert partition_statuses(instance, UNIQUE_ACTORS_WITHIN_RAW_COUNT) == dict.fromkeys(days, "SUCCEEDED")


CHECK_PARTITIONS_QUERY = """
query {
  assetNodes(assetKeys: [{path: ["measurement_daily_rollup"]}]) {
    assetChecksOrError {
      ... on AssetChecks {
        checks {
          name
          partitionStatuses { ... on AssetCheckTimePartitionStatuses { ranges { startKey endKey status } } }
        }
      }
    }
  }
}
"""


@pytest.mark.slow
@pytest.mark.usefixtures("bad_rows_on_bad_day")
def test_the_ui_shows_a_range_runs_failing_day_on_its_partition(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    # The GraphQL the UI's check "Partitions" tab reads, from the deployment's definitions in a code server.
    from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql

    seed(engine, generated_events(per_day=20))
    assert materialize_rollup(db_url, instance, *DAYS).success
    # The code server is a child process; its definitions are built from the settings this test gives.
    code = tmp_path / "code_location.py"
    settings = {"database_url": db_url, "measurement_start_date": DAYS[0].isoformat()}
    code.write_text(
        "from marketing_pipelines.definitions import build_defs\n"
        "from marketing_pipelines.settings import load_settings\n"
        f"defs = build_defs(load_settings(**{settings!r}))\n"
    )

    with define_out_of_process_context(str(code), None, instance) as context:
        answer = execute_dagster_graphql(context, CHECK_PARTITIONS_QUERY)

    assert not answer.errors
    [node] = answer.data["assetNodes"]
    ranges = {
        check["name"]: [(r["startKey"], r["endKey"], r["status"]) for r in check["partitionStatuses"]["ranges"]]
        for check in node["assetChecksOrError"]["checks"]
        if check["partitionStatuses"] is not None  # today_is_current is about today alone, not partitioned
    }
    first, bad, last = (d.isoformat() for d in DAYS)
    assert ranges[UNIQUE_ACTORS_WITHIN_RAW_COUNT] == [
        (first, first, "SUCCEEDED"),
        (bad, bad, "FAILED"),
        (last, last, "SUCCEEDED"),
    ]
    assert ranges[FIRST_PARTY_COUNT_MATCHES] == [(first, last, "SUCCEEDED")]


def add_imports(engine: sa.Engine, pageviews: dict[date, int], downloads: dict[date, int]) -> None:
    """Site pageviews and release downloads of campaign alpha (which must exist) on some days."""
    add_campaign(engine, "alpha", utm_campaign="alpha-utm", github_repo="acme/alpha")
    fetched = datetime.now(UTC)
    release = {"asset_id": 1, "repo": "acme/alpha", "release_tag": "v1", "asset_name": "a.tgz", "raw_delta": 0}
    with engine.begin() as conn:
        conn.execute(
            sa.insert(site_analytics_daily),
            [
                {
                    "day": d,
                    "utm_campaign": "alpha-utm",
                    "page": "/",
                    "visitors": 1,
                    "pageviews": n,
                    "fetched_at": fetched,
                }
                for d, n in pageviews.items()
            ],
        )
        conn.execute(
            sa.insert(github_release_download_daily),
            [
                {**release, "day": d, "download_count": n, "downloads": n, "baseline": False, "negative_clamped": False}
                for d, n in downloads.items()
            ],
        )


def test_each_sources_daily_total_is_a_number_the_ui_plots(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance
) -> None:
    seed(engine, generated_events(per_day=20))
    pageviews, downloads = {DAYS[0]: 40, DAYS[2]: 7}, {DAYS[1]: 12}
    add_imports(engine, pageviews, downloads)

    assert materialize_rollup(db_url, instance, *DAYS).success  # a range run: one materialization per day

    first_party = rollup_rows_frame(engine).groupby("day")["raw_count"].sum()
    for day in DAYS:
        metadata = rollup_metadata(instance, day)
        numbers = {key: value for key, value in metadata.items() if key.startswith("source_")}
        assert all(isinstance(value, dg.IntMetadataValue) for value in numbers.values())
        # Every source on every day, 0 without rows: the Plots tab draws each as one line over the partitions.
        assert {key: value.value for key, value in numbers.items()} == {
            "source_first_party_events": int(first_party[day]),
            "source_site_analytics_pageviews": pageviews.get(day, 0),
            "source_github_releases_downloads": downloads.get(day, 0),
        }
        assert metadata["events"].value == sum(value.value for value in numbers.values())


def test_a_source_beyond_the_three_gets_a_stable_name() -> None:
    assert source_metric_name("crm") == "source_crm_count"
    assert source_metric_name("CRM export/v2") == "source_crm_export_v2_count"
    assert source_metrics({"crm": 4, "first_party": 9}) == {
        "source_first_party_events": 9,
        "source_site_analytics_pageviews": 0,
        "source_github_releases_downloads": 0,
        "source_crm_count": 4,
    }


SVG_PARTS = {"svg", "title", "rect", "text"}
SVG_ATTRIBUTES = {"width", "height", "role", "font-size", "font-family", "x", "y", "fill", "text-anchor"}
HOSTILE_STAGES = ("<script>alert(1)</script>", '"><img src=x onerror=alert(2)>', "esc\x1b[2Jape", "\u202eback")


def test_the_funnel_picture_shows_hostile_stage_names_as_text(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    add_campaign(engine, "alpha")
    events = [
        {"event_id": f"h{n}-{m}", "campaign_id": "alpha", "stage": stage, "event_type": "page_view",
         "occurred_at": f"{DAY}T1{m}:00:00Z", "actor_id": f"a{m}"}
        for n, stage in enumerate(HOSTILE_STAGES)
        for m in range(n + 1)
    ]  # fmt: skip
    load_events_file(engine, write_jsonl(tmp_path / "events.jsonl", events))
    assert materialize_rollup(db_url, instance, DAY).success

    chart = rollup_metadata(instance, DAY)["funnel_chart"].value
    assert isinstance(chart, str)
    # Outside its images the Markdown holds only our words and the campaign id.
    images = re.findall(r"!\[funnel\]\(data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)\)", chart)
    assert len(images) == 1 and "<" not in re.sub(r"!\[funnel\]\([^)]*\)", "", chart)
    svg = ET.fromstring(base64.b64decode(images[0]))  # well-formed, or the UI would show a broken image
    names = {element.tag.split("}")[-1] for element in svg.iter()}
    assert names <= SVG_PARTS
    assert {attribute for element in svg.iter() for attribute in element.attrib} - {"xmlns"} <= SVG_ATTRIBUTES
    texts = [element.text or "" for element in svg.iter() if element.tag.endswith("text")]
    shown = [stage.replace("\x1b", "\\x1b").replace("\u202e", "\\u202e") for stage in HOSTILE_STAGES]
    # Each stage's label is its name as written, cut at 28 characters (the table beside it has it whole).
    assert all(any(t == name or (t[-1] == "…" and name.startswith(t[:-1])) for t in texts) for name in shown)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\u202e]", base64.b64decode(images[0]).decode())
