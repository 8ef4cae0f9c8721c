"""measurement_daily_rollup: partitions equal an independent pandas recount, re-runs are idempotent, checks bite."""

from __future__ import annotations

from datetime import UTC, date, datetime

import dagster as dg
import pandas as pd
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.schema import (
    github_release_download_daily,
    marketing_event,
    measurement_daily_rollup,
    site_analytics_daily,
)
from marketing_pipelines.measurement import sketches
from marketing_pipelines.measurement.checks import (
    FIRST_PARTY_COUNT_MATCHES,
    check_first_party_count,
    check_unique_actors_within_raw_count,
)
from marketing_pipelines.measurement.events.write import record_events
from marketing_pipelines_tests.factories import add_campaign, replace_rollup_day
from marketing_pipelines_tests.measurement.generated import (
    DAYS,
    ROLLUP_COLUMNS,
    generated_events,
    materialize_rollup,
    pandas_recount,
    rollup_rows_frame,
    seed,
)


def test_partitions_match_an_independent_recount(engine: sa.Engine, db_url: str) -> None:
    events = generated_events()
    seed(engine, events)
    instance = dg.DagsterInstance.ephemeral()
    for day in DAYS:
        result = materialize_rollup(db_url, instance, day)
        assert result.success
        assert all(c.passed for c in result.get_asset_check_evaluations())

    expected = pandas_recount(events)
    expected = expected[expected["day"].isin(DAYS)].reset_index(drop=True)
    actual = rollup_rows_frame(engine)
    pd.testing.assert_frame_equal(actual[ROLLUP_COLUMNS], expected[ROLLUP_COLUMNS], check_dtype=False)
    # The generated midnights put events on each side of every boundary; the neighbours outside DAYS are not rolled up.
    assert set(actual["day"]) == set(DAYS)


def test_each_rows_sketch_holds_its_actors(engine: sa.Engine) -> None:
    events = generated_events(per_day=40)
    seed(engine, events)
    replace_rollup_day(engine, DAYS[1])
    r = measurement_daily_rollup
    with engine.connect() as conn:
        rows = conn.execute(sa.select(r.c.unique_actors, r.c.actors_hll).where(r.c.day == DAYS[1])).all()
    assert rows
    for unique_actors, hll in rows:
        if unique_actors == 0:
            assert hll is None
        else:
            assert sketches.estimate(sketches.deserialize(hll)) == unique_actors


def test_rematerializing_a_partition_is_idempotent(engine: sa.Engine, db_url: str) -> None:
    seed(engine, generated_events(per_day=50))
    instance = dg.DagsterInstance.ephemeral()
    first = materialize_rollup(db_url, instance, DAYS[1])
    before = rollup_rows_frame(engine)
    second = materialize_rollup(db_url, instance, DAYS[1])
    pd.testing.assert_frame_equal(rollup_rows_frame(engine), before)
    metadata = [r.get_asset_materialization_events()[0].materialization.metadata for r in (first, second)]
    assert metadata[0]["rows"] == metadata[1]["rows"]
    assert metadata[0]["first_party_events"].value == int(before["raw_count"].sum())
    # Its week in the weekly sketch index is rebuilt too: one row per key of the one rolled-up day.
    assert metadata[1]["week_start"].value == "2026-11-23"
    assert metadata[1]["weekly_sketch_rows"].value == len(before) == metadata[1]["rows"].value


def test_a_day_is_utc_midnight_to_midnight(engine: sa.Engine) -> None:
    add_campaign(engine, "alpha")
    at = {
        "e-prev": "2026-11-26T18:59:59.999999-05:00",  # 23:59:59.999999Z on the 26th
        "e-start": "2026-11-27T05:30:00+05:30",  # 00:00Z on the 27th
        "e-end": "2026-11-28T13:59:59+14:00",  # 23:59:59Z on the 27th
        "e-next": "2026-11-27T16:00:00-08:00",  # 00:00Z on the 28th
    }
    with engine.begin() as conn:
        record_events(
            conn,
            [
                {"event_id": k, "campaign_id": "alpha", "stage": "s", "event_type": "t", "occurred_at": v}
                for k, v in at.items()
            ],
        )
    summary = replace_rollup_day(engine, date(2026, 11, 27))
    assert summary.first_party_events == 2


def test_importer_rows_map_to_campaigns_and_downloads_have_unknown_uniques(engine: sa.Engine) -> None:
    add_campaign(engine, "alpha", utm_campaign="alpha26", github_repo="acme/widget")
    add_campaign(engine, "bravo", github_repo="acme/widget")  # two campaigns may count one repository
    day = date(2026, 11, 26)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(site_analytics_daily),
            [
                {
                    "day": day,
                    "utm_campaign": "alpha26",
                    "page": "/",
                    "visitors": 10,
                    "pageviews": 15,
                    "fetched_at": now,
                },
                {"day": day, "utm_campaign": "alpha26", "page": "/p", "visitors": 4, "pageviews": 5, "fetched_at": now},
                {"day": day, "utm_campaign": "other", "page": "/", "visitors": 9, "pageviews": 9, "fetched_at": now},
            ],
        )
        base = {"repo": "acme/widget", "release_tag": "v1", "raw_delta": 0, "negative_clamped": False}
        conn.execute(
            sa.insert(github_release_download_daily),
            [
                {**base, "day": day, "asset_id": 1, "asset_name": "a", "download_count": 7, "downloads": 7,
                 "raw_delta": 7, "baseline": False},
                {**base, "day": day, "asset_id": 2, "asset_name": "b", "download_count": 3, "downloads": 3,
                 "raw_delta": 3, "baseline": False},
                # A baseline has no known downloads: left out, not counted.
                {**base, "day": day, "asset_id": 3, "asset_name": "c", "download_count": 500, "downloads": 0,
                 "baseline": True},
            ],
        )  # fmt: skip
    summary = replace_rollup_day(engine, day)
    r = measurement_daily_rollup
    with engine.connect() as conn:
        rows = {
            (row.campaign_id, row.source): (row.raw_count, row.unique_actors, row.actors_hll)
            for row in conn.execute(sa.select(r).where(r.c.day == day))
        }
    assert rows == {
        ("alpha", "site_analytics"): (20, None, None),
        ("alpha", "github_releases"): (10, None, None),
        ("bravo", "github_releases"): (10, None, None),
    }
    assert (summary.site_pageviews, summary.downloads, summary.first_party_events) == (20, 20, 0)


def test_count_check_fails_after_a_late_event_and_unique_check_on_a_bad_row(engine: sa.Engine) -> None:
    seed(engine, generated_events(per_day=20))
    day = DAYS[0]
    replace_rollup_day(engine, day)
    with engine.connect() as conn:
        assert check_first_party_count(conn, [day])[day].passed
        assert check_unique_actors_within_raw_count(conn, [day])[day].passed
    with engine.begin() as conn:
        record_events(
            conn,
            [
                {
                    "event_id": "late",
                    "campaign_id": "alpha",
                    "stage": "s",
                    "event_type": "t",
                    "occurred_at": f"{day}T12:00Z",
                }
            ],
        )
        r = measurement_daily_rollup
        some = conn.execute(sa.select(r.c.campaign_id, r.c.stage, r.c.event_type).where(r.c.day == day).limit(1)).one()
        conn.execute(
            sa.update(r)
            .where(r.c.day == day, r.c.campaign_id == some[0], r.c.stage == some[1], r.c.event_type == some[2])
            .values(unique_actors=r.c.raw_count + 1)
        )
    with engine.connect() as conn:
        count_check = check_first_party_count(conn, [day])[day]
        assert not count_check.passed and count_check.check_name == FIRST_PARTY_COUNT_MATCHES
        assert count_check.metadata["events"].value == count_check.metadata["rollup_raw_count"].value + 1
        assert not check_unique_actors_within_raw_count(conn, [day])[day].passed


@pytest.mark.parametrize("day", [DAYS[1]])
def test_rollup_reads_one_day_through_the_occurred_at_index(engine: sa.Engine, day: date) -> None:
    # Guard against a rewrite that filters with a function on occurred_at, which no index can serve.
    from marketing_pipelines.measurement.rollup.daily import _in_day

    sql = str(sa.select(marketing_event.c.event_id).where(_in_day(day)).compile(engine))
    assert "marketing_event.occurred_at >=" in sql and "marketing_event.occurred_at <" in sql
