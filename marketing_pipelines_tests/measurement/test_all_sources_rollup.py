"""The rollup of one range run importing every source built on the contract beside first-party events, on generated
data: equal to an independent recount per source, campaign and day; numbers true of their day only (visitors,
persons) stored per day and never summed into it. GitHub release downloads are left out here: their deltas come
from snapshots taken within a day of a day's end, which a range of past days cannot have (test_assets_importers
covers them day by day)."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from datetime import UTC, date, datetime, timedelta
from typing import Any

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines.db.schema import measurement_daily_rollup, source_daily_metric
from marketing_pipelines.measurement.events.validate import EventRow
from marketing_pipelines.measurement.events.write import store_events
from marketing_pipelines.measurement.keys import ROLLUP_KEY, SITE_KEY
from marketing_pipelines.measurement.sources import GA4, GITHUB_TRAFFIC, NPM_DOWNLOADS, POSTHOG, PYPI_DOWNLOADS
from marketing_pipelines_tests.factories import add_campaign
from marketing_pipelines_tests.measurement.fake_services import (
    Api,
    FakeGoogle,
    FakePostHog,
    ga4_report,
    mocked_ga4,
    mocked_plausible,
)
from marketing_pipelines_tests.measurement.runs import materialize_measurement
from marketing_pipelines_tests.measurement.test_assets_importers import plausible_days
from marketing_pipelines_tests.measurement.test_github_traffic import FakeGitHubTraffic, mocked_traffic, traffic_table
from marketing_pipelines_tests.measurement.test_package_downloads_importer import (
    NpmDownloadsFake,
    PyPIStatsFake,
    downloads_table,
    mocked_npm,
    mocked_pypistats,
)
from marketing_pipelines_tests.measurement.test_posthog_importer import mocked_posthog

CAMPAIGNS = {  # id -> (utm_campaign, pypi_package, npm_package, github_repo)
    "alpha": ("alpha26", "acme-widget", "@acme/sdk", "acme/widget"),
    "beta": ("beta26", None, "acme-cli", None),
    "gamma": ("gamma26", "acme-lib", None, "acme/lib"),
}
CONTRACT_SOURCES = (GA4, POSTHOG, PYPI_DOWNLOADS, NPM_DOWNLOADS, GITHUB_TRAFFIC)
UTM = {utm: campaign for campaign, (utm, _, _, _) in CAMPAIGNS.items()}


def run_days() -> list[date]:
    # Within pypistats' 180 days, so every source can still be read.
    today = datetime.now(UTC).date()
    return [today - timedelta(days=n) for n in range(8, 3, -1)]


def ga4_answer(rows: list[tuple[date, str, int, int, int]]) -> Any:
    """GA4's runReport over ``rows``: the rows of the request's date range and campaigns (its inListFilter)."""

    def report(body: dict[str, Any]) -> dict[str, Any]:
        [span] = body["dateRanges"]
        first, last = date.fromisoformat(span["startDate"]), date.fromisoformat(span["endDate"])
        wanted = set(body["dimensionFilter"]["filter"]["inListFilter"]["values"])
        return ga4_report([row for row in rows if first <= row[0] <= last and row[1] in wanted])

    return report


def rollup(engine: sa.Engine) -> dict[tuple[date, str, str, str, str], tuple[int, int | None]]:
    r = measurement_daily_rollup
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(r.c.day, r.c.campaign_id, r.c.source, r.c.stage, r.c.event_type, r.c.raw_count, r.c.unique_actors)
        ).all()
    return {(d, c, s, st, et): (n, u) for d, c, s, st, et, n, u in rows}


def test_every_source_on_the_contract_is_in_the_joint_run() -> None:
    # A source added to SOURCES without a place here fails this, not silently the recount.
    from marketing_pipelines.measurement.sources import METRIC_TABLE, SOURCES

    assert {s.name for s in SOURCES if s.table == METRIC_TABLE} == {s.name for s in CONTRACT_SOURCES}


def test_a_rollup_of_every_source_equals_an_independent_recount(engine: sa.Engine, db_url: str) -> None:
    for campaign, (utm, pypi, npm, repo) in CAMPAIGNS.items():
        add_campaign(engine, campaign, utm_campaign=utm, pypi_package=pypi, npm_package=npm, github_repo=repo)
    days, rng = run_days(), random.Random(47)

    # First-party events, and what each source answers: campaigns' own keys and strays no campaign maps.
    events = [
        EventRow(f"e{n}", rng.choice(list(CAMPAIGNS)), stage, "page_view", occurred, "web", f"actor-{rng.randrange(9)}",
                 {}, "{}")
        for n in range(300)
        for stage in [rng.choice(["awareness", "signup"])]
        for occurred in [datetime.combine(rng.choice(days), datetime.min.time(), tzinfo=UTC)
                         + timedelta(minutes=rng.randrange(1440))]
    ]  # fmt: skip
    with engine.begin() as conn:
        store_events(conn, events, datetime.now(UTC), False)
    site = {
        d: [(utm, page, rng.randrange(1, 20), rng.randrange(20, 60)) for utm in [*UTM, "stray"] for page in ("/", "/p")]
        for d in days
    }
    posthog_events = [
        (datetime.combine(d, datetime.min.time(), tzinfo=UTC) + timedelta(minutes=rng.randrange(1440)),
         rng.choice([*UTM, "stray", None]), f"person-{rng.randrange(12)}")
        for d in days for _ in range(60)
    ]  # fmt: skip
    # GA4: (day, utm_campaign, sessions, page views, users), users never more than sessions.
    ga4_rows = [
        (d, utm, sessions, sessions + rng.randrange(40), rng.randrange(1, sessions + 1))
        for d in days for utm in [*UTM, "stray"] for sessions in [rng.randrange(1, 30)]
    ]  # fmt: skip
    traffic = traffic_table(datetime.now(UTC).date())  # acme/widget, acme/lib and a repository of no campaign
    pypi_table = downloads_table(["acme-widget", "acme-lib", "not-ours"], days, seed=5)
    npm_table = downloads_table(["@acme/sdk", "acme-cli", "not-ours"], days, seed=9)

    result = materialize_measurement(
        [
            SITE_KEY,
            *(dg.AssetKey(s.asset) for s in (GA4, POSTHOG, PYPI_DOWNLOADS, NPM_DOWNLOADS, GITHUB_TRAFFIC)),
            ROLLUP_KEY,
        ],
        db_url,
        days,
        plausible=mocked_plausible(Api(lambda request: plausible_days(request, site))),
        ga4=mocked_ga4(Api(FakeGoogle(ga4_answer(ga4_rows)))),
        posthog=mocked_posthog(Api(FakePostHog(posthog_events))),
        pypistats=mocked_pypistats(Api(PyPIStatsFake(pypi_table))),
        npm_downloads=mocked_npm(Api(NpmDownloadsFake(npm_table))),
        github_traffic=mocked_traffic(Api(FakeGitHubTraffic(traffic))),
    )
    assert result.success

    # The recount, from the generated data alone.
    expected: Counter[tuple[date, str, str, str, str]] = Counter()
    actors: dict[tuple[date, str, str], set[str]] = defaultdict(set)
    for e in events:
        expected[(e.occurred_at.date(), e.campaign_id, "first_party", e.stage, "page_view")] += 1
        actors[(e.occurred_at.date(), e.campaign_id, e.stage)].add(e.actor_id or "")
    for d, rows in site.items():
        for utm, _page, _visitors, pageviews in rows:
            if utm in UTM:
                expected[(d, UTM[utm], "site_analytics", "site", "pageview")] += pageviews
    for d, utm, sessions, page_views, _users in ga4_rows:
        if utm in UTM:
            expected[(d, UTM[utm], "ga4", "site", "ga4_session")] += sessions
            expected[(d, UTM[utm], "ga4", "site", "ga4_pageview")] += page_views
    persons: dict[tuple[date, str], set[str]] = defaultdict(set)
    for at, utm, person in posthog_events:
        if utm in UTM:
            expected[(at.date(), UTM[utm], "posthog", "product", "posthog_event")] += 1
            persons[(at.date(), utm)].add(person)
    for campaign, (_, pypi, npm, repo) in CAMPAIGNS.items():
        for d in days:
            if pypi:
                expected[(d, campaign, "pypi_downloads", "package", "pypi_download")] += pypi_table[pypi][d]
            if npm:
                expected[(d, campaign, "npm_downloads", "package", "npm_download")] += npm_table[npm][d]
            if repo:
                views, _, clones, _ = traffic[repo][d]
                expected[(d, campaign, "github_traffic", "repository", "github_view")] += views
                expected[(d, campaign, "github_traffic", "repository", "github_clone")] += clones

    got = rollup(engine)
    # A day an importer answered 0 for may be a row of 0: the same count as no row.
    assert {key: n for key, (n, _) in got.items() if n} == {key: n for key, n in expected.items() if n}
    for (d, campaign, source, stage, _), (_, uniques) in got.items():
        if source == "first_party":
            assert uniques == len(actors[(d, campaign, stage)])  # exact per day
        else:
            assert uniques is None, (source, "an imported row's actors are unknown: never a sum of uniques")
    # PostHog's persons are stored per day as PostHog counted them, and summed nowhere.
    m = source_daily_metric
    with engine.connect() as conn:
        stored = conn.execute(
            sa.select(m.c.day, m.c.key, m.c.value).where(m.c.source == "posthog", m.c.metric == "persons")
        ).all()
    assert {(d, k): v for d, k, v in stored} == {key: len(people) for key, people in persons.items()}
    # GA4's users likewise: per day and campaign as GA4 counted them.
    with engine.connect() as conn:
        users = conn.execute(
            sa.select(m.c.day, m.c.key, m.c.value).where(m.c.source == "ga4", m.c.metric == "total_users")
        ).all()
    assert sorted(users) == sorted((d, utm, n) for d, utm, _, _, n in ga4_rows if utm in UTM)
