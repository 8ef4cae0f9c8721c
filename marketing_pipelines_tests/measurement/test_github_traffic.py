"""The GitHub traffic importer: its contract, the requests it sends, the answers it accepts and refuses, and its
asset and rollup rows on real databases, GitHub faked at the HTTP layer from the recorded answers' shape."""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.schema import measurement_daily_rollup, source_daily_metric
from marketing_pipelines.definitions import build_defs
from marketing_pipelines.http import RateLimited, ServiceError
from marketing_pipelines.measurement.assets import left_out_importers
from marketing_pipelines.measurement.importers.base import (
    ImporterNotConfigured,
    MetricImporter,
    RequestGate,
    hooks,
)
from marketing_pipelines.measurement.importers.github_traffic import GitHubTrafficClient, parse_traffic
from marketing_pipelines.measurement.keys import ROLLUP_KEY
from marketing_pipelines.measurement.sources import GITHUB_TRAFFIC, Counted, Quota, source_named
from marketing_pipelines.settings import load_settings
from marketing_pipelines_tests.factories import add_campaign, settings_from
from marketing_pipelines_tests.measurement.fake_services import Api, recorded
from marketing_pipelines_tests.measurement.runs import materialize_measurement
from marketing_pipelines_tests.measurement.test_importer_echoes import _failed_run, leaked

VIEWS = recorded("github_traffic/views_per_day.json")
CLONES = recorded("github_traffic/clones_per_day.json")
# The day the recorded answers were "asked": their last day.
RECORDED_TODAY = date(2016, 10, 24)
TOKEN = "ghp_T7rK2mQ9vX4bN8cL1wZ5yH3jF6dS0aPe"
TRAFFIC_KEY = dg.AssetKey(GITHUB_TRAFFIC.asset)
Table = Mapping[str, Mapping[date, tuple[int, int, int, int]]]  # repo -> day -> views, view uniques, clones, uniques


def mocked_traffic(
    api: Api, sleeps: list[float] | None = None, today: date | None = None, **fields: Any
) -> GitHubTrafficClient:
    class MockedGitHubTraffic(GitHubTrafficClient):
        def _client(self, gate: RequestGate | None = None) -> httpx.Client:
            return httpx.Client(
                base_url=self.base_url, timeout=self.timeout_s, event_hooks=hooks(gate), transport=api.transport()
            )

        def _sleep(self, seconds: float) -> None:
            if sleeps is not None:
                sleeps.append(seconds)

        def _today(self) -> date:
            return today or super()._today()

    return MockedGitHubTraffic(**{"token": TOKEN, "enabled": True, **fields})


def recorded_answers(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json=VIEWS if request.url.path.endswith("/views") else CLONES)


def github_error(status: int, message: str, **headers: str) -> httpx.Response:
    """GitHub's error body (docs.github.com/rest/using-the-rest-api/troubleshooting-the-rest-api)."""
    body = {"message": message, "documentation_url": "https://docs.github.com/rest", "status": str(status)}
    return httpx.Response(status, json=body, headers=headers)


def utc_today() -> date:
    return datetime.now(UTC).date()


class FakeGitHubTraffic:
    """Answers ``/repos/{owner}/{repo}/traffic/{views,clones}?per=day`` from a table of numbers as GitHub would:
    the 14 days up to today plus the day partly out of the window, a day without traffic left out."""

    def __init__(self, table: Table, today: date | None = None) -> None:
        self.table, self.today = table, today

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
        assert request.url.params["per"] == "day"
        _, _repos, owner, name, _traffic, kind = request.url.path.split("/")
        repo = f"{owner}/{name}"
        if repo not in self.table:
            return github_error(404, "Not Found")
        today = self.today or utc_today()
        count_at, uniques_at = (0, 1) if kind == "views" else (2, 3)
        entries = [
            {"timestamp": f"{day.isoformat()}T00:00:00Z", "count": row[count_at], "uniques": row[uniques_at]}
            for day, row in sorted(self.table[repo].items())
            if today - timedelta(days=14) <= day <= today and row[count_at]
        ]
        total = sum(e["count"] for e in entries)
        return httpx.Response(200, json={"count": total, "uniques": min(total, 3), kind: entries})


# --- the contract --------------------------------------------------------------------------------------------


def test_the_importer_declares_github_traffics_contract() -> None:
    assert isinstance(GitHubTrafficClient(), MetricImporter)
    assert GitHubTrafficClient.contract is GITHUB_TRAFFIC.contract and source_named("github_traffic") is GITHUB_TRAFFIC
    contract = GITHUB_TRAFFIC.contract
    # 14 days kept, ending now: the oldest is partial, so 13 whole days are read, and lost past them.
    assert (contract.lookback_days, contract.retention_days, contract.revision_days) == (13, 13, 1)
    assert contract.count_kind == "daily" and contract.match == "github_repo"
    assert contract.counted == (
        Counted("views", "repository", "github_view"),
        Counted("clones", "repository", "github_clone"),
    )
    assert contract.range_only == ("view_uniques", "clone_uniques")
    assert contract.quota == Quota(5000, 3600.0)  # the REST API's limit, shared with every use of the token
    assert (GITHUB_TRAFFIC.asset, GITHUB_TRAFFIC.resource_key, GITHUB_TRAFFIC.settings) == (
        "github_traffic_daily",
        "github_traffic",
        ("github_token", "github_traffic_enabled"),
    )


# --- the requests and the recorded answers ---------------------------------------------------------------------


def test_the_recorded_answers_become_views_and_clones_per_day() -> None:
    api = Api(recorded_answers)
    asked: list[httpx.Request] = []
    first, last = date(2016, 10, 22), date(2016, 10, 24)
    by_day = mocked_traffic(api, today=RECORDED_TODAY).daily_metrics(first, last, ["acme/widget"], gate=asked.append)
    assert {day: [(r.key, r.metric, r.value) for r in rows] for day, rows in by_day.items()} == {
        date(2016, 10, 22): [
            ("acme/widget", "views", 566),
            ("acme/widget", "view_uniques", 168),
            ("acme/widget", "clones", 5),
            ("acme/widget", "clone_uniques", 5),
        ],
        date(2016, 10, 23): [
            ("acme/widget", "views", 675),
            ("acme/widget", "view_uniques", 184),
            ("acme/widget", "clones", 6),
            ("acme/widget", "clone_uniques", 5),
        ],
        date(2016, 10, 24): [
            ("acme/widget", "views", 614),
            ("acme/widget", "view_uniques", 237),
            ("acme/widget", "clones", 7),
            ("acme/widget", "clone_uniques", 5),
        ],
    }
    assert [str(r.url) for r in api.requests] == [
        "https://api.github.com/repos/acme/widget/traffic/views?per=day",
        "https://api.github.com/repos/acme/widget/traffic/clones?per=day",
    ]
    assert asked == api.requests  # the shared quota was asked before each request
    for request in api.requests:
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
        assert request.headers["accept"] == "application/vnd.github+json"
        assert request.headers["x-github-api-version"] == "2022-11-28"


def test_the_recorded_answers_have_the_shape_the_importer_reads() -> None:
    views = parse_traffic(VIEWS, "views", "acme/widget", RECORDED_TODAY)
    clones = parse_traffic(CLONES, "clones", "acme/widget", RECORDED_TODAY)
    assert len(views) == len(clones) == 15 and min(views) == date(2016, 10, 10)
    assert all(uniques <= count for count, uniques in [*views.values(), *clones.values()])


def test_a_day_left_out_of_the_answer_is_zero() -> None:
    # GitHub leaves out a day without traffic; within the window that day had none.
    payload = copy.deepcopy(VIEWS)
    payload["views"] = [e for e in payload["views"] if e["timestamp"] != "2016-10-23T00:00:00Z"]
    api = Api(lambda request: httpx.Response(200, json=payload if request.url.path.endswith("/views") else CLONES))
    by_day = mocked_traffic(api, today=RECORDED_TODAY).daily_metrics(
        date(2016, 10, 23), date(2016, 10, 23), ["acme/widget"]
    )
    assert {r.metric: r.value for r in by_day[date(2016, 10, 23)]} == {
        "views": 0,
        "view_uniques": 0,
        "clones": 6,
        "clone_uniques": 5,
    }


def test_each_repository_costs_two_requests_whatever_the_range() -> None:
    api = Api(recorded_answers)
    by_day = mocked_traffic(api, today=RECORDED_TODAY).daily_metrics(
        date(2016, 10, 11), date(2016, 10, 24), ["acme/widget", "acme/lib", "acme/widget"]
    )
    assert len(api.requests) == 4 and len(by_day) == 14
    assert {r.key for rows in by_day.values() for r in rows} == {"acme/widget", "acme/lib"}


def test_no_repository_sends_no_request_and_a_malformed_one_costs_only_itself() -> None:
    api = Api(recorded_answers)
    client = mocked_traffic(api, today=RECORDED_TODAY)
    day = date(2016, 10, 24)
    assert client.daily_metrics(day, day, []) == {day: []}
    assert api.requests == []
    by_day = client.daily_metrics(day, day, ["../../user", "acme/widget?x=1", "acme/widget"])
    assert {r.key for r in by_day[day]} == {"acme/widget"}
    assert [r.url.path for r in api.requests] == [
        "/repos/acme/widget/traffic/views",
        "/repos/acme/widget/traffic/clones",
    ]


def test_a_renamed_repository_is_followed_within_the_api() -> None:
    def moved(request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/repos/acme/old-name/"):
            kind = request.url.path.rsplit("/", 1)[1]
            return httpx.Response(301, headers={"location": f"/repositories/42/traffic/{kind}?per=day"})
        return recorded_answers(request)

    api = Api(moved)
    day = date(2016, 10, 24)
    by_day = mocked_traffic(api, today=RECORDED_TODAY).daily_metrics(day, day, ["acme/old-name"])
    assert {(r.key, r.metric, r.value) for r in by_day[day]} >= {("acme/old-name", "views", 614)}
    assert [r.url.path for r in api.requests] == [
        "/repos/acme/old-name/traffic/views",
        "/repositories/42/traffic/views",
        "/repos/acme/old-name/traffic/clones",
        "/repositories/42/traffic/clones",
    ]
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in api.requests)


def test_a_redirect_off_the_api_is_not_followed() -> None:
    api = Api(lambda request: httpx.Response(302, headers={"location": "https://evil.example/steal"}))
    day = date(2016, 10, 24)
    with pytest.raises(ServiceError, match="off the configured API"):
        mocked_traffic(api, today=RECORDED_TODAY).daily_metrics(day, day, ["acme/widget"])
    assert len(api.requests) == 1


# --- answers refused -----------------------------------------------------------------------------------------


def _views(*entries: Any, **top: Any) -> dict[str, Any]:
    return {"count": 10, "uniques": 2, "views": list(entries), **top}


def _entry(timestamp: str = "2016-10-24T00:00:00Z", count: Any = 5, uniques: Any = 2) -> dict[str, Any]:
    return {"timestamp": timestamp, "count": count, "uniques": uniques}


REFUSED: dict[str, tuple[Any, str]] = {
    "a list": ([_entry()], "expected a JSON object, got list"),
    "views not a list": (_views(views={"2016-10-24": 5}), "'views' is not a list: dict"),
    "views missing": ({"count": 1, "uniques": 1}, "'views' is not a list: NoneType"),
    "an entry without uniques": (_views({"timestamp": "2016-10-24T00:00:00Z", "count": 5}), "is not an object"),
    "an entry that is a number": (_views(5), "is not an object"),
    "noon": (_views(_entry("2016-10-24T12:00:00Z")), "is not a UTC midnight"),
    "midnight elsewhere": (_views(_entry("2016-10-24T00:00:00+02:00")), "is not a UTC midnight"),
    "no time zone": (_views(_entry("2016-10-24T00:00:00")), "is not a UTC midnight"),
    "not a timestamp": (_views(_entry("yesterday")), "is not a UTC midnight"),
    "a timestamp as a number": (_views(_entry(1477267200)), "is not a UTC midnight"),  # type: ignore[arg-type]
    "a day before the window": (_views(_entry("2016-10-09T00:00:00Z")), "2016-10-09 is outside the 14 days"),
    "a day after tomorrow": (_views(_entry("2016-10-26T00:00:00Z")), "2016-10-26 is outside the 14 days"),
    "a boolean count": (_views(_entry(count=True, uniques=0)), "count is not a count"),
    "a float count": (_views(_entry(count=5.0)), "count is not a count"),
    "a count as text": (_views(_entry(count="5")), "count is not a count"),
    "a negative count": (_views(_entry(count=-1, uniques=0)), "count is not a count"),
    "a huge count": (_views(_entry(count=10**12 + 1)), "count is not a count"),
    "float uniques": (_views(_entry(uniques=1.5)), "uniques is not a count"),
    "more uniques than views": (_views(_entry(count=2, uniques=3)), "3 uniques of 2"),
    "a repeated day": (_views(_entry(), _entry(count=7)), "2016-10-24 came twice"),
    "a total that is no count": (_views(_entry(), count=-4), "count is not a count"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_an_answer_of_another_shape_is_refused_in_one_line(name: str) -> None:
    payload, expected = REFUSED[name]
    api = Api(lambda request: httpx.Response(200, json=payload if request.url.path.endswith("/views") else CLONES))
    day = date(2016, 10, 24)
    with pytest.raises(ServiceError) as refused:
        mocked_traffic(api, today=RECORDED_TODAY).daily_metrics(day, day, ["acme/widget"])
    message = str(refused.value)
    assert expected in message and "\n" not in message and not refused.value.transient
    assert message.startswith("github: unexpected views answer for acme/widget: ")


def test_non_finite_numbers_are_no_counts() -> None:
    text = json.dumps(_views(_entry())).replace('"count": 5', '"count": NaN')
    api = Api(lambda request: httpx.Response(200, text=text, headers={"content-type": "application/json"}))
    day = date(2016, 10, 24)
    with pytest.raises(ServiceError, match="count is not a count"):
        mocked_traffic(api, today=RECORDED_TODAY).daily_metrics(day, day, ["acme/widget"])


def test_a_day_past_the_window_is_refused_before_any_request() -> None:
    api = Api(recorded_answers)
    with pytest.raises(ServiceError, match="2016-10-10 is before 2016-10-11; nothing was requested"):
        mocked_traffic(api, today=RECORDED_TODAY).daily_metrics(date(2016, 10, 10), date(2016, 10, 12), ["a/b"])
    assert api.requests == []


# --- errors, limits and the token ------------------------------------------------------------------------------

ERRORS: dict[str, tuple[Callable[[httpx.Request], httpx.Response], str]] = {
    "403 without push access": (
        lambda r: github_error(403, "Must have push access to repository"),
        "traffic of acme/widget refused (HTTP 403: Must have push access to repository): GITHUB_TOKEN needs push "
        "access to the repository (a classic token with the repo scope, or a fine-grained token with the "
        'repository permission "Administration: read"), or unset MARKETING_GITHUB_TRAFFIC_ENABLED',
    ),
    "404, a private repository the token cannot see": (
        lambda r: github_error(404, "Not Found"),
        "traffic of acme/widget not found (HTTP 404): the repository does not exist, or GITHUB_TOKEN needs push access",
    ),
    "403 echoing the token": (
        lambda r: github_error(403, f"Resource not accessible by personal access token {TOKEN}"),
        "Administration: read",
    ),
    "401": (lambda r: github_error(401, "Bad credentials"), "credentials rejected (HTTP 401)"),
    "an HTML page": (lambda r: httpx.Response(200, text="<html>unicorn</html>"), "response was not valid JSON"),
}


@pytest.mark.parametrize("name", ERRORS)
def test_an_error_answer_fails_in_one_line_without_the_token(name: str) -> None:
    handler, expected = ERRORS[name]
    api = Api(handler)
    day = date(2016, 10, 24)
    with pytest.raises(ServiceError) as failed:
        mocked_traffic(api, today=RECORDED_TODAY).daily_metrics(day, day, ["acme/widget"])
    message = str(failed.value)
    assert expected in message and "\n" not in message, message
    assert leaked(message, TOKEN) == []
    assert len(api.requests) == 1 and not failed.value.transient


def test_a_429_waits_as_retry_after_says_then_succeeds() -> None:
    answers = iter([github_error(429, "slow down", **{"Retry-After": "7"})])
    api = Api(lambda request: next(answers, None) or recorded_answers(request))
    sleeps: list[float] = []
    asked: list[httpx.Request] = []
    day = date(2016, 10, 24)
    mocked_traffic(api, sleeps, today=RECORDED_TODAY).daily_metrics(day, day, ["acme/widget"], gate=asked.append)
    assert sleeps == [7.0] and len(api.requests) == 3 and asked == api.requests


def test_a_spent_primary_limit_hands_the_step_back_until_the_reset() -> None:
    # x-ratelimit-remaining 0 on a 403: a rate limit, not a permission error; wait until x-ratelimit-reset.
    reset = int(datetime.now(UTC).timestamp()) + 1800
    api = Api(
        lambda r: github_error(
            403, "API rate limit exceeded", **{"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)}
        )
    )
    sleeps: list[float] = []
    day = date(2016, 10, 24)
    with pytest.raises(RateLimited) as limited:
        mocked_traffic(api, sleeps, today=RECORDED_TODAY).daily_metrics(day, day, ["acme/widget"])
    assert 1700 < limited.value.retry_after_s <= 1800 and sleeps == [] and len(api.requests) == 1


def test_a_secondary_limit_waits_a_minute_in_dagster() -> None:
    api = Api(lambda r: github_error(403, "You have exceeded a secondary rate limit. Please wait a few minutes."))
    day = date(2016, 10, 24)
    with pytest.raises(RateLimited) as limited:
        mocked_traffic(api, today=RECORDED_TODAY).daily_metrics(day, day, ["acme/widget"])
    assert limited.value.retry_after_s == 60 and len(api.requests) == 1


# --- settings and definitions --------------------------------------------------------------------------------


def test_traffic_is_turned_on_by_a_token_and_its_flag() -> None:
    assert GitHubTrafficClient(token="t").not_configured_reason() == "set MARKETING_GITHUB_TRAFFIC_ENABLED=true"
    assert GitHubTrafficClient(enabled=True).not_configured_reason() == "set GITHUB_TOKEN"
    both = "set GITHUB_TOKEN and MARKETING_GITHUB_TRAFFIC_ENABLED=true"
    assert left_out_importers(settings_from({}))[TRAFFIC_KEY] == both
    # A releases token alone does not turn traffic on: it may lack push access.
    assert left_out_importers(settings_from({"GITHUB_TOKEN": "t"}))[TRAFFIC_KEY] == (
        "set MARKETING_GITHUB_TRAFFIC_ENABLED=true"
    )
    configured = load_settings(github_token="t", github_traffic_enabled=True)
    assert TRAFFIC_KEY not in left_out_importers(configured)
    defs = build_defs(configured)
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    assert TRAFFIC_KEY in graph.get_all_asset_keys()
    # A day not read within 13 days is lost: within_retention warns while one still can be.
    assert (TRAFFIC_KEY, "within_retention") in {(key.asset_key, key.name) for key in graph.asset_check_keys}
    releases_only = build_defs(settings_from({"GITHUB_TOKEN": "t"})).resolve_asset_graph()
    assert TRAFFIC_KEY not in releases_only.get_all_asset_keys()
    with pytest.raises(ImporterNotConfigured, match="MARKETING_GITHUB_TRAFFIC_ENABLED=true"):
        GitHubTrafficClient(token="t").daily_metrics(date(2026, 1, 1), date(2026, 1, 1), ["a/b"])


# --- through Dagster, on SQLite and PostgreSQL -----------------------------------------------------------------


def traffic_table(today: date) -> dict[str, dict[date, tuple[int, int, int, int]]]:
    """Numbers for every day of the window and a week before it; some days without views or clones."""
    table: dict[str, dict[date, tuple[int, int, int, int]]] = {}
    for r, repo in enumerate(("acme/widget", "acme/lib", "other/not-ours")):
        table[repo] = {}
        for n in range(21):
            day = today - timedelta(days=n)
            views, clones = (n * 7 + r * 13) % 40, (n * 3 + r) % 5
            table[repo][day] = (views, views // 3, clones, clones // 2)
    return table


def recount(table: Table, days: list[date], repos: Mapping[str, str]) -> dict[tuple[date, str, str], int]:
    """Each (day, campaign, event type)'s count, from the table itself."""
    counts: Counter[tuple[date, str, str]] = Counter()
    for repo, campaign in repos.items():
        for day in days:
            views, _, clones, _ = table[repo].get(day, (0, 0, 0, 0))
            counts[(day, campaign, "github_view")] += views
            counts[(day, campaign, "github_clone")] += clones
    return dict(counts)


def stored(engine: sa.Engine) -> dict[tuple[date, str, str], int]:
    m = source_daily_metric
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(m.c.day, m.c.key, m.c.metric, m.c.value).where(m.c.source == "github_traffic")
        ).all()
    return {(row.day, row.key, row.metric): row.value for row in rows}


def rollup_counts(engine: sa.Engine) -> dict[tuple[date, str, str], int]:
    r = measurement_daily_rollup
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(r.c.day, r.c.campaign_id, r.c.stage, r.c.event_type, r.c.raw_count, r.c.unique_actors).where(
                r.c.source == "github_traffic"
            )
        ).all()
    assert {(row.stage, row.unique_actors) for row in rows} <= {("repository", None)}
    return {(row.day, row.campaign_id, row.event_type): row.raw_count for row in rows}


def test_traffic_days_are_imported_and_rolled_up_per_campaign(engine: sa.Engine, db_url: str) -> None:
    add_campaign(engine, "widget", github_repo="acme/widget")
    add_campaign(engine, "lib", github_repo="acme/lib")
    today = utc_today()
    table = traffic_table(today)
    days = [today - timedelta(days=n) for n in (5, 4, 3)]
    api = Api(FakeGitHubTraffic(table))
    result = materialize_measurement([TRAFFIC_KEY, ROLLUP_KEY], db_url, days, github_traffic=mocked_traffic(api))
    assert result.success and len(api.requests) == 4  # views and clones of each repository, for the whole range
    # Every metric of every (day, repository), a day without traffic as 0, from the table alone.
    assert stored(engine) == {
        (day, repo, metric): value
        for repo in ("acme/widget", "acme/lib")
        for day in days
        for metric, value in zip(("views", "view_uniques", "clones", "clone_uniques"), table[repo][day], strict=True)
    }
    expected = recount(table, days, {"acme/widget": "widget", "acme/lib": "lib"})
    # Every stored row rolls up, a day without traffic as a row of 0.
    assert rollup_counts(engine) == expected
    assert sum(expected.values()) > 0 and 0 in expected.values()  # the data holds days with and without traffic


def test_a_day_past_the_lookback_is_refused_unrequested_and_its_rows_kept(engine: sa.Engine, db_url: str) -> None:
    add_campaign(engine, "widget", github_repo="acme/widget")
    today = utc_today()
    table = traffic_table(today)
    api = Api(FakeGitHubTraffic(table))
    old, recent = today - timedelta(days=13), today - timedelta(days=12)
    assert materialize_measurement([TRAFFIC_KEY], db_url, [old, recent], github_traffic=mocked_traffic(api)).success
    before, requests = stored(engine), len(api.requests)
    assert {day for day, _, _ in before} == {old, recent}

    # A day later the oldest is past the lookback (today - 14): a re-run refuses it before any request.
    too_old = today - timedelta(days=14)
    with engine.begin() as conn:
        conn.execute(source_daily_metric.update().where(source_daily_metric.c.day == old).values(day=too_old))
    kept = stored(engine)
    result = materialize_measurement(
        [TRAFFIC_KEY], db_url, [too_old], github_traffic=mocked_traffic(api), raise_on_error=False
    )
    assert not result.success and len(api.requests) == requests
    [failure] = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert "can be read only 13 days back" in str(failure.step_failure_data.error)
    assert stored(engine) == kept and any(day == too_old for day, _, _ in kept)


ECHOES: dict[str, Callable[[httpx.Request], httpx.Response]] = {
    "403 quoting the token": lambda r: github_error(403, f"token {TOKEN} must have push access"),
    "404 quoting the token cut": lambda r: github_error(404, f"Not Found for {TOKEN[:-5]}"),
    "a bad entry quoting the token": lambda r: httpx.Response(
        200, json={"count": 1, "uniques": 1, "views": [_entry(TOKEN)], "clones": [_entry(TOKEN)]}
    ),
}


@pytest.mark.parametrize("shape", ECHOES)
def test_a_github_echo_of_its_token_lands_on_no_surface_of_a_failed_run(
    shape: str, engine: sa.Engine, db_url: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    add_campaign(engine, "widget", github_repo="acme/widget")
    api = Api(ECHOES[shape])
    client = mocked_traffic(api)
    day = utc_today() - timedelta(days=2)
    failure, surfaces = _failed_run(tmp_path, engine, db_url, capfd, TRAFFIC_KEY, day, github_traffic=client)
    assert api.requests and "github:" in failure
    assert leaked(surfaces, TOKEN) == []
