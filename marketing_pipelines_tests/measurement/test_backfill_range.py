"""A backfill run over a range of days writes exactly what one run per day writes, row for row, on both databases."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from typing import Any

import dagster as dg
import httpx
import sqlalchemy as sa

from marketing_pipelines.db.schema import (
    campaign,
    github_release_asset_snapshot,
    github_release_download_daily,
    measurement_daily_rollup,
    measurement_weekly_sketch,
    site_analytics_daily,
)
from marketing_pipelines.measurement.checks import check_unique_actors_within_raw_count
from marketing_pipelines.measurement.importers.github import GitHubReleasesClient
from marketing_pipelines.measurement.keys import DOWNLOADS_KEY, ROLLUP_KEY, SITE_KEY
from marketing_pipelines.measurement.sources import SOURCES
from marketing_pipelines_tests.built import DEFAULTS, measurement_assets
from marketing_pipelines_tests.measurement.fake_services import Api, mocked_github, mocked_plausible
from marketing_pipelines_tests.measurement.generated import CAMPAIGNS, DAYS, generated_events, seed
from marketing_pipelines_tests.measurement.runs import materialize_measurement

KEYS = [SITE_KEY, DOWNLOADS_KEY, ROLLUP_KEY]
REPO = "acme/widget"
# Columns that hold the time they were written, which differs between two builds of the same rows.
WRITTEN_AT = {"rolled_up_at", "fetched_at", "built_at", "daily_rolled_up_at"}


def plausible_answer(request: httpx.Request) -> httpx.Response:
    """Plausible's v2 answer for the asked range: two pages of one campaign per day, counts derived from the day."""
    first, last = (date.fromisoformat(d) for d in json.loads(request.content)["date_range"])
    results = []
    day = first
    while day <= last:
        n = day.toordinal() % 17
        results += [
            {"dimensions": [day.isoformat(), "alpha26", "/"], "metrics": [10 + n, 20 + n]},
            {"dimensions": [day.isoformat(), "alpha26", "/pricing"], "metrics": [n, 2 * n]},
        ]
        day += timedelta(days=1)
    return httpx.Response(200, json={"results": results, "meta": {}, "query": {}})


def seed_sources(engine: sa.Engine) -> None:
    """Events for every campaign over DAYS, and stored GitHub snapshots for the day before DAYS and each of DAYS.

    The days ended long ago, so the GitHub importer derives each day's downloads from the stored
    snapshots without a request, exactly as a backfill of old days does.
    """
    seed(engine, generated_events())
    with engine.begin() as conn:
        conn.execute(
            sa.update(campaign).where(campaign.c.id == CAMPAIGNS[0]).values(utm_campaign="alpha26", github_repo=REPO)
        )
        snapshots = []
        for offset, day in enumerate([DAYS[0] - timedelta(days=1), *DAYS]):
            for asset_id, base in ((1, 100), (2, 40)):
                snapshots.append(
                    {
                        "asset_id": asset_id,
                        "day": day,
                        "repo": REPO,
                        "release_id": 10,
                        "release_tag": "v1.0.0",
                        "asset_name": f"widget-{asset_id}.tar.gz",
                        "download_count": base + offset * (3 if asset_id == 1 else 5),
                        "fetched_at": datetime.now(UTC),
                    }
                )
        conn.execute(sa.insert(github_release_asset_snapshot), snapshots)


def old_days_github() -> GitHubReleasesClient:
    """A configured GitHub client that fails any request: days that ended long ago must not need one."""
    return mocked_github(Api(lambda request: httpx.Response(500)))


def derived_tables(engine: sa.Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row the measurement assets write, without the columns that stamp when it was written."""
    tables = (site_analytics_daily, github_release_download_daily, measurement_daily_rollup, measurement_weekly_sketch)
    with engine.connect() as conn:
        return {
            t.name: sorted(
                (tuple(row) for row in conn.execute(sa.select(*[c for c in t.c if c.name not in WRITTEN_AT]))),
                key=repr,
            )
            for t in tables
        }


def wipe_derived(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        for t in (
            measurement_weekly_sketch,
            measurement_daily_rollup,
            github_release_download_daily,
            site_analytics_daily,
        ):
            conn.execute(sa.delete(t))


def per_day_metadata(result: dg.ExecuteInProcessResult) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (e.asset_key.to_user_string(), e.partition or ""): {
            k: getattr(v, "value", v) for k, v in e.materialization.metadata.items()
        }
        for e in result.get_asset_materialization_events()
    }


def test_a_range_run_equals_single_day_runs_row_for_row(engine: sa.Engine, db_url: str) -> None:
    seed_sources(engine)
    single_api, range_api = Api(plausible_answer), Api(plausible_answer)
    clients = {"github": old_days_github()}

    singles = [
        materialize_measurement(KEYS, db_url, [day], plausible=mocked_plausible(single_api), **clients) for day in DAYS
    ]
    assert all(r.success for r in singles)
    by_single_runs = derived_tables(engine)
    single_metadata = {k: v for r in singles for k, v in per_day_metadata(r).items()}

    wipe_derived(engine)
    instance = dg.DagsterInstance.ephemeral()
    ranged = materialize_measurement(
        KEYS, db_url, list(DAYS), instance, plausible=mocked_plausible(range_api), **clients
    )
    assert ranged.success

    assert derived_tables(engine) == by_single_runs
    # Every source reached the rollup, so the comparison covers all three sources.
    sources = {row[2] for row in by_single_runs["measurement_daily_rollup"]}
    assert sources == {"first_party", "site_analytics", "github_releases"}
    # One materialization per asset and day, each with that day's own metadata, as the single-day runs gave.
    assert per_day_metadata(ranged) == single_metadata
    assert len(single_metadata) == len(KEYS) * len(DAYS)
    for key in KEYS:
        assert instance.get_materialized_partitions(key) == {d.isoformat() for d in DAYS}
    # Plausible was asked once for the range, not once per day.
    assert len(single_api.requests) == len(DAYS) and len(range_api.requests) == 1
    assert json.loads(range_api.requests[0].content)["date_range"] == [DAYS[0].isoformat(), DAYS[-1].isoformat()]
    # The importers' checks: one result for the whole range; the rollup's: one per day, on the day's partition.
    assert sorted((c.check_name, c.partition or "") for c in ranged.get_asset_check_evaluations()) == [
        *(("first_party_count_matches_events", d.isoformat()) for d in DAYS),
        ("no_unflagged_negative_download_delta", ""),
        ("site_counts_consistent", ""),
        *(("unique_actors_within_raw_count", d.isoformat()) for d in DAYS),
    ]
    assert all(c.passed for c in ranged.get_asset_check_evaluations())


def test_a_rerun_of_a_range_replaces_its_days(engine: sa.Engine, db_url: str) -> None:
    seed_sources(engine)
    clients = {
        "plausible": mocked_plausible(Api(plausible_answer)),
        "github": mocked_github(Api(lambda r: httpx.Response(500))),
    }
    assert materialize_measurement(KEYS, db_url, list(DAYS), **clients).success
    once = derived_tables(engine)
    assert materialize_measurement(KEYS, db_url, list(DAYS), **clients).success
    assert derived_tables(engine) == once


def test_a_range_check_fails_only_the_failing_day(engine: sa.Engine, db_url: str) -> None:
    seed_sources(engine)
    assert materialize_measurement([ROLLUP_KEY], db_url, list(DAYS)).success
    r = measurement_daily_rollup
    with engine.begin() as conn:
        conn.execute(
            sa.update(r)
            .where(r.c.day == DAYS[1], r.c.campaign_id == CAMPAIGNS[0], r.c.source == "first_party")
            .values(unique_actors=r.c.raw_count + 1)
        )
    with engine.connect() as conn:
        checks = check_unique_actors_within_raw_count(conn, list(DAYS))
    assert {day: check.passed for day, check in checks.items()} == {DAYS[0]: True, DAYS[1]: False, DAYS[2]: True}
    assert checks[DAYS[1]].metadata["violating_rows"].value > 0


def test_the_assets_backfill_in_ranges() -> None:
    # Every importer's asset (sources.py) and the rollup, each in ranges.
    assert {asset.key for asset in measurement_assets} == {*KEYS, *(dg.AssetKey(s.asset) for s in SOURCES)}
    for asset in measurement_assets:
        policy = asset.backfill_policy
        assert policy is not None and policy.max_partitions_per_run == DEFAULTS.backfill_days_per_run, asset.key
