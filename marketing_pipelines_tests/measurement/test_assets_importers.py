"""The importer assets on real databases, with the HTTP clients answered by httpx.MockTransport."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from typing import Any

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import (
    github_release_asset_snapshot,
    github_release_download_daily,
    measurement_daily_rollup,
    site_analytics_daily,
)
from marketing_pipelines.measurement.assets import (
    IMPORT_RETRY_POLICY,
    ROLLUP_IO_MANAGER,
    build_measurement_assets,
    left_out_importers,
    measurement_daily_job,
)
from marketing_pipelines.measurement.checks import SITE_COUNTS_CONSISTENT, check_no_unflagged_negative_delta
from marketing_pipelines.measurement.importers.github import GitHubReleasesClient
from marketing_pipelines.measurement.importers.plausible import PlausibleClient
from marketing_pipelines.measurement.importers.store import import_repo_day
from marketing_pipelines.measurement.keys import DOWNLOADS_KEY, ROLLUP_KEY, SITE_KEY
from marketing_pipelines.measurement.report.frames import RollupFrameIOManager
from marketing_pipelines_tests.built import DEFAULTS, measurement_assets, unconfigured_importers
from marketing_pipelines_tests.factories import add_campaign
from marketing_pipelines_tests.measurement.fake_services import (
    Api,
    github_asset,
    github_release,
    mocked_github,
    mocked_plausible,
)
from marketing_pipelines_tests.measurement.runs import materialize_measurement

REPO = "acme/widget"
site_asset, github_release_downloads_daily, rollup_asset = SITE_KEY, DOWNLOADS_KEY, ROLLUP_KEY


def releases(counts: dict[int, int], etag: str = '"v1"') -> httpx.Response:
    listed = [github_asset(asset_id, f"widget-{asset_id}.tar.gz", n) for asset_id, n in counts.items()]
    return httpx.Response(200, json=[github_release(10, "v1.0.0", listed)], headers={"etag": etag})


def plausible_rows(day: date, rows: list[tuple[str, str, int, int]]) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "results": [{"dimensions": [day.isoformat(), c, p], "metrics": [v, pv]} for c, p, v, pv in rows],
            "meta": {},
            "query": {},
        },
    )


def materialize(
    selection: list[dg.AssetKey], db_url: str, day: date, instance: dg.DagsterInstance | None = None, **clients: Any
) -> dg.ExecuteInProcessResult:
    return materialize_measurement(selection, db_url, [day], instance, **clients)


def metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, Any]:
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key == dg.AssetKey(asset)]
    return {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}


def test_unconfigured_importers_materialize_nothing_and_the_rollup_still_runs(engine: sa.Engine, db_url: str) -> None:
    add_campaign(engine, "alpha", utm_campaign="alpha26", github_repo=REPO)
    instance = dg.DagsterInstance.ephemeral()
    day = date(2026, 11, 26)
    # The deployment's definitions on the defaults: the importers are left out, the daily job is the rollup.
    defs = dg.Definitions(
        assets=build_measurement_assets(DEFAULTS, left_out=left_out_importers(DEFAULTS)),
        jobs=[measurement_daily_job],
        resources={"app_db": AppDatabase(url=db_url), ROLLUP_IO_MANAGER: RollupFrameIOManager(url=db_url)},
    )
    result = defs.resolve_job_def(measurement_daily_job.name).execute_in_process(
        instance=instance, partition_key=day.isoformat()
    )
    assert result.success
    # The importers' days stay missing (a backfill fills them once configured).
    assert [e.asset_key for e in result.get_asset_materialization_events()] == [ROLLUP_KEY]
    assert instance.get_materialized_partitions(SITE_KEY) == set()
    assert instance.get_materialized_partitions(DOWNLOADS_KEY) == set()
    assert instance.get_materialized_partitions(ROLLUP_KEY) == {day.isoformat()}
    assert metadata(result, "measurement_daily_rollup")["rows"] == 0


def test_an_importer_given_an_unconfigured_client_fails_its_run_and_the_other_importer_still_imports(
    engine: sa.Engine, db_url: str
) -> None:
    # Definitions assembled by hand with every importer in, Plausible's client not configured: the step fails
    # at once, without a retry, naming what to set; GitHub still imports; the rollup does not run.
    add_campaign(engine, "alpha", utm_campaign="alpha26", github_repo=REPO)
    day = datetime.now(UTC).date() - timedelta(days=1)
    github_api = Api(lambda request: releases({7: 1000}))
    result = run_measurement(
        measurement_assets,
        dg.AssetSelection.assets(SITE_KEY, DOWNLOADS_KEY, ROLLUP_KEY),
        db_url,
        day,
        PlausibleClient(),
        mocked_github(github_api),
    )
    assert not result.success
    assert result.dagster_run.status == dg.DagsterRunStatus.FAILURE
    [failure] = step_events(result, dg.DagsterEventType.STEP_FAILURE)
    assert failure.step_key == "site_analytics_daily"
    assert "plausible is not configured: set PLAUSIBLE_API_KEY and PLAUSIBLE_SITE_ID" in str(
        failure.step_failure_data.error
    )
    assert step_events(result, dg.DagsterEventType.STEP_UP_FOR_RETRY) == []
    assert [e.asset_key for e in result.get_asset_materialization_events()] == [DOWNLOADS_KEY]
    assert len(github_api.requests) == 1
    assert ROLLUP_KEY not in {e.asset_key for e in result.get_asset_materialization_events()}


def test_site_analytics_replaces_its_day_and_maps_by_utm_campaign(engine: sa.Engine, db_url: str) -> None:
    add_campaign(engine, "alpha", utm_campaign="alpha26")
    day = date(2026, 11, 26)
    answers = [
        [("alpha26", "/", 30, 41), ("alpha26", "/pricing", 5, 6), ("stray", "/", 1, 1)],
        [("alpha26", "/", 31, 44)],  # Plausible revised the day; a re-run must replace, not add
    ]
    api = Api(lambda request: plausible_rows(day, answers[min(len(api.requests), 2) - 1]))
    first = materialize([site_asset], db_url, day, plausible=mocked_plausible(api))
    assert {"rows": 3, "pageviews": 48, "unmapped_utm_campaigns": 1}.items() <= metadata(
        first, "site_analytics_daily"
    ).items()
    assert json.loads(api.requests[0].content)["date_range"] == [day.isoformat()] * 2

    second = materialize([site_asset, rollup_asset], db_url, day, plausible=mocked_plausible(api))
    assert second.success
    t, r = site_analytics_daily, measurement_daily_rollup
    with engine.connect() as conn:
        assert conn.execute(sa.select(t.c.utm_campaign, t.c.page, t.c.pageviews)).all() == [("alpha26", "/", 44)]
        assert conn.execute(sa.select(r.c.campaign_id, r.c.source, r.c.raw_count, r.c.unique_actors)).all() == [
            ("alpha", "site_analytics", 44, None)
        ]


def deltas(engine: sa.Engine, day: date) -> dict[int, tuple[int, int, bool, bool]]:
    g = github_release_download_daily
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(g.c.asset_id, g.c.downloads, g.c.raw_delta, g.c.baseline, g.c.negative_clamped).where(
                g.c.day == day
            )
        )
        return {row[0]: tuple(row[1:]) for row in rows}


def test_download_deltas_across_days(engine: sa.Engine) -> None:
    add_campaign(engine, "alpha", github_repo=REPO)
    days = [date(2026, 11, 24) + timedelta(days=i) for i in range(4)]
    soon_after = {
        d: datetime.combine(d + timedelta(days=1), datetime.min.time(), tzinfo=UTC) + timedelta(minutes=15)
        for d in days
    }
    answers: list[Any] = [
        releases({1: 100, 2: 50}, '"d1"'),
        # Asset 1 was deleted and re-uploaded as 4 (its count restarts); asset 2's count went down.
        releases({2: 40, 4: 5}, '"d2"'),
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.headers.get("if-none-match") == '"d2"':
            return httpx.Response(304, headers={"etag": '"d2"'})
        return answers.pop(0)

    api = Api(handler)
    client = mocked_github(api)

    first = import_repo_day(engine, client, REPO, days[0], now=soon_after[days[0]])
    assert (first.snapshot, first.baseline, first.downloads) == ("fetched", True, 0)
    assert deltas(engine, days[0]) == {1: (0, 0, True, False), 2: (0, 0, True, False)}

    second = import_repo_day(engine, client, REPO, days[1], now=soon_after[days[1]])
    assert deltas(engine, days[1]) == {2: (0, -10, False, True), 4: (5, 5, False, False)}
    assert (second.downloads, second.negative_clamped) == (5, 1)

    third = import_repo_day(engine, client, REPO, days[2], now=soon_after[days[2]])
    assert third.snapshot == "not_modified"
    assert api.requests[-1].headers["if-none-match"] == '"d2"'
    assert deltas(engine, days[2]) == {2: (0, 0, False, False), 4: (0, 0, False, False)}

    # A day that ended long ago cannot be snapshotted: nothing is fetched or written.
    requests_before = len(api.requests)
    old = import_repo_day(engine, client, REPO, date(2026, 11, 1), now=soon_after[days[3]])
    assert (old.snapshot, old.deltas, len(api.requests)) == ("missing", (), requests_before)
    # Re-running an old day that has a snapshot re-derives it from storage, identically.
    again = import_repo_day(engine, client, REPO, days[1], now=soon_after[days[3]])
    assert again.snapshot == "stored" and deltas(engine, days[1]) == {2: (0, -10, False, True), 4: (5, 5, False, False)}

    with engine.connect() as conn:
        assert check_no_unflagged_negative_delta(conn, [days[1]]).passed
    with engine.begin() as conn:
        g = github_release_download_daily
        conn.execute(sa.update(g).where(g.c.day == days[1], g.c.asset_id == 2).values(negative_clamped=False))
    with engine.connect() as conn:
        assert not check_no_unflagged_negative_delta(conn, [days[1]]).passed


def test_github_asset_yesterday_then_today(engine: sa.Engine, db_url: str) -> None:
    add_campaign(engine, "alpha", github_repo=REPO)
    add_campaign(engine, "bravo")  # no repository: not asked for
    today = datetime.now(UTC).date()
    answers = [releases({7: 1000}, '"a"'), releases({7: 1012}, '"b"')]
    api = Api(lambda request: answers.pop(0))
    instance = dg.DagsterInstance.ephemeral()
    selection = [github_release_downloads_daily, rollup_asset]

    first = materialize(selection, db_url, today - timedelta(days=1), instance, github=mocked_github(api))
    expected = {"rows": 1, "repos_baseline": 1, "downloads": 0}
    assert expected.items() <= metadata(first, "github_release_downloads_daily").items()
    second = materialize(selection, db_url, today, instance, github=mocked_github(api))
    assert metadata(second, "github_release_downloads_daily")["downloads"] == 12
    assert all(c.passed for c in second.get_asset_check_evaluations())
    assert [str(r.url) for r in api.requests] == [f"https://api.github.com/repos/{REPO}/releases?per_page=100"] * 2

    r = measurement_daily_rollup
    with engine.connect() as conn:
        rows = conn.execute(sa.select(r.c.day, r.c.campaign_id, r.c.raw_count, r.c.unique_actors, r.c.source)).all()
        snapshots = conn.execute(sa.select(sa.func.count()).select_from(github_release_asset_snapshot)).scalar()
    # The baseline day has no known downloads, so it has no rollup row; today has 12, actors unknown (NULL).
    assert rows == [(today, "alpha", 12, None, "github_releases")]
    assert snapshots == 2


def test_a_moved_repository_still_imports_and_the_asset_says_where_it_went(engine: sa.Engine, db_url: str) -> None:
    # GitHub answers a renamed or transferred repository's old name with 301 to /repositories/{id}.
    add_campaign(engine, "alpha", github_repo=REPO)
    moved = "https://api.github.com/repositories/1296269/releases?per_page=100"

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == f"/repos/{REPO}/releases":
            return httpx.Response(301, headers={"location": moved}, json={"message": "Moved Permanently"})
        return releases({7: 1000})

    result = materialize(
        [github_release_downloads_daily], db_url, datetime.now(UTC).date(), github=mocked_github(Api(handler))
    )
    meta = metadata(result, "github_release_downloads_daily")
    assert meta["status"] == "imported" and meta["rows"] == 1
    assert meta["moved_repos"] == {REPO: moved}


def plausible_days(request: httpx.Request, rows: dict[date, list[tuple[str, str, int, int]]]) -> httpx.Response:
    """The rows of the asked range's days."""
    first, last = (date.fromisoformat(d) for d in json.loads(request.content)["date_range"])
    results = [
        {"dimensions": [day.isoformat(), c, p], "metrics": [v, pv]}
        for day, day_rows in rows.items()
        if first <= day <= last
        for c, p, v, pv in day_rows
    ]
    return httpx.Response(200, json={"results": results, "meta": {}, "query": {}})


def run_measurement(
    assets: list[dg.AssetsDefinition],
    selection: dg.AssetSelection,
    db_url: str,
    day: date,
    plausible: PlausibleClient,
    github: GitHubReleasesClient | None = None,
) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        assets,
        selection=selection,
        partition_key=day.isoformat(),
        instance=dg.DagsterInstance.ephemeral(),
        resources={
            "app_db": AppDatabase(url=db_url),
            **unconfigured_importers(),
            "plausible": plausible,
            "github": github or GitHubReleasesClient(),
            ROLLUP_IO_MANAGER: RollupFrameIOManager(url=db_url),
        },
        raise_on_error=False,
    )


def site_check(result: dg.ExecuteInProcessResult) -> dg.AssetCheckEvaluation:
    [evaluation] = [e for e in result.get_asset_check_evaluations() if e.check_name == SITE_COUNTS_CONSISTENT]
    return evaluation


def test_site_counts_check_passes_on_good_days_and_names_the_bad_day(engine: sa.Engine, db_url: str) -> None:
    add_campaign(engine, "alpha", utm_campaign="alpha26")
    good, odd, broken = date(2026, 11, 24), date(2026, 11, 25), date(2026, 11, 26)
    days = [good, odd, broken]
    rows = {
        good: [("alpha26", "/", 30, 41), ("alpha26", "/pricing", 0, 0)],
        # A custom event on a page can count a visitor there without a pageview: odd, not impossible.
        odd: [("alpha26", "/", 30, 41), ("alpha26", "/signup", 3, 0)],
        # A negative count can come from no Plausible answer and would lower the rollup's sum.
        broken: [("alpha26", "/", 5, -2)],
    }
    api = Api(lambda request: plausible_days(request, rows))
    ranged = materialize_measurement([SITE_KEY], db_url, days, plausible=mocked_plausible(api))
    assert ranged.success
    check = site_check(ranged)
    assert not check.passed
    assert check.severity == dg.AssetCheckSeverity.ERROR
    assert {k: v.value for k, v in check.metadata.items()} == {
        "negative_count_rows": 1,
        "visitors_over_pageviews_rows": 1,
        "failing_days": 2,
        "first_failing_days": f"{odd.isoformat()}, {broken.isoformat()}",
    }

    rows[broken] = [("alpha26", "/", 5, 7)]
    only_odd = site_check(materialize_measurement([SITE_KEY], db_url, days, plausible=mocked_plausible(api)))
    assert (only_odd.passed, only_odd.severity) == (False, dg.AssetCheckSeverity.WARN)
    assert only_odd.metadata["first_failing_days"].value == odd.isoformat()

    passing = site_check(materialize_measurement([SITE_KEY], db_url, [good], plausible=mocked_plausible(api)))
    assert passing.passed and passing.metadata["failing_days"].value == 0


def test_an_assets_checks_run_with_it_and_cannot_be_left_out(engine: sa.Engine, db_url: str) -> None:
    # A plain asset's checks are part of its step: a selection without them is refused, not computed half.
    add_campaign(engine, "alpha", utm_campaign="alpha26")
    day = date(2026, 11, 26)
    api = Api(lambda request: plausible_rows(day, [("alpha26", "/", 5, -2)]))
    with pytest.raises(dg.DagsterInvalidDefinitionError):
        run_measurement(
            measurement_assets, dg.AssetSelection.assets(SITE_KEY).without_checks(), db_url, day, mocked_plausible(api)
        )
    assert api.requests == []
    result = run_measurement(measurement_assets, dg.AssetSelection.assets(SITE_KEY), db_url, day, mocked_plausible(api))
    assert [e.asset_key for e in result.get_asset_materialization_events()] == [SITE_KEY]
    assert [(c.check_name, c.passed) for c in result.get_asset_check_evaluations()] == [(SITE_COUNTS_CONSISTENT, False)]


def test_every_measurement_step_retries_with_backoff_and_jitter() -> None:
    for asset in measurement_assets:
        policy = asset.op.retry_policy
        assert policy == IMPORT_RETRY_POLICY, asset.key
        assert policy is not None and policy.max_retries == 3 and policy.delay and policy.delay >= 10
        assert (policy.backoff, policy.jitter) == (dg.Backoff.EXPONENTIAL, dg.Jitter.PLUS_MINUS)


def step_events(result: dg.ExecuteInProcessResult, event_type: dg.DagsterEventType) -> list[dg.DagsterEvent]:
    return [e for e in result.all_events if e.event_type == event_type]


def test_a_transient_plausible_failure_retries_the_step_which_rewrites_its_day(engine: sa.Engine, db_url: str) -> None:
    add_campaign(engine, "alpha", utm_campaign="alpha26", github_repo=REPO)
    day = datetime.now(UTC).date() - timedelta(days=1)
    # 503 until the HTTP client's own attempts are spent (5), so only the step retry can get past it.
    api = Api(
        lambda request: httpx.Response(503) if len(api.requests) <= 5 else plausible_rows(day, [("alpha26", "/", 3, 4)])
    )
    github_api = Api(lambda request: releases({7: 1000}))
    retry_at_once = build_measurement_assets(DEFAULTS, retry_policy=dg.RetryPolicy(max_retries=1))
    result = run_measurement(
        retry_at_once,
        dg.AssetSelection.assets(SITE_KEY, DOWNLOADS_KEY, ROLLUP_KEY),
        db_url,
        day,
        mocked_plausible(api),
        mocked_github(github_api),
    )
    assert result.success
    assert len(step_events(result, dg.DagsterEventType.STEP_UP_FOR_RETRY)) == 1
    # Only the failed step is retried: GitHub's day was imported once, and the rollup ran after the retry.
    assert len(api.requests) == 6 and len(github_api.requests) == 1
    s, g, r = site_analytics_daily, github_release_download_daily, measurement_daily_rollup
    with engine.connect() as conn:
        assert conn.execute(sa.select(s.c.utm_campaign, s.c.page, s.c.pageviews)).all() == [("alpha26", "/", 4)]
        assert conn.execute(sa.select(g.c.asset_id, g.c.baseline).where(g.c.day == day)).all() == [(7, True)]
        assert (
            conn.execute(
                sa.select(sa.func.count())
                .select_from(github_release_asset_snapshot)
                .where(github_release_asset_snapshot.c.day == day)
            ).scalar()
            == 1
        )
        assert conn.execute(sa.select(r.c.source, r.c.raw_count)).all() == [("site_analytics", 4)]
    assert site_check(result).passed


def test_a_rejected_plausible_key_fails_without_a_step_retry(engine: sa.Engine, db_url: str) -> None:
    add_campaign(engine, "alpha", utm_campaign="alpha26")
    day = date(2026, 11, 26)
    api = Api(lambda request: httpx.Response(401, json={"error": "Invalid API key"}))
    result = run_measurement(
        build_measurement_assets(DEFAULTS, retry_policy=dg.RetryPolicy(max_retries=3)),
        dg.AssetSelection.assets(SITE_KEY, ROLLUP_KEY),
        db_url,
        day,
        mocked_plausible(api),
    )
    assert not result.success
    assert step_events(result, dg.DagsterEventType.STEP_UP_FOR_RETRY) == []
    assert len(api.requests) == 1
    [failure] = step_events(result, dg.DagsterEventType.STEP_FAILURE)
    assert "credentials rejected (HTTP 401)" in str(failure.step_failure_data.error)
