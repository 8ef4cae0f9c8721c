"""Tests of the Plausible and GitHub importers against httpx.MockTransport, and of the download-delta rules."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from marketing_pipelines.http import RateLimited, ServiceError
from marketing_pipelines.measurement.importers.base import Importer, ImporterNotConfigured, RequestGate, hooks
from marketing_pipelines.measurement.importers.github import (
    DownloadDelta,
    GitHubReleasesClient,
    ReleaseAssetSnapshot,
    derive_download_deltas,
)
from marketing_pipelines.measurement.importers.plausible import PlausibleClient, SiteAnalyticsRow
from marketing_pipelines_tests.measurement.fake_services import github_asset, github_release

Handler = Callable[[httpx.Request], httpx.Response]

DAY = dt.date(2026, 11, 26)
RELEASES_URL = "https://api.github.com/repos/acme/widget/releases?per_page=100"
PAGE_2_URL = "https://api.github.com/repositories/4711/releases?per_page=100&page=2"


class Recorder:
    """Answers requests from a handler and keeps every request and every sleep it was asked for."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[httpx.Request] = []
        self.sleeps: list[float] = []

    def transport(self) -> httpx.MockTransport:
        def record(request: httpx.Request) -> httpx.Response:
            self.requests.append(request)
            return self.handler(request)

        return httpx.MockTransport(record)


def plausible(recorder: Recorder, **fields: Any) -> PlausibleClient:
    class MockedPlausible(PlausibleClient):
        def _client(self, gate: RequestGate | None = None) -> httpx.Client:
            return httpx.Client(
                base_url=self.base_url, timeout=self.timeout_s, event_hooks=hooks(gate), transport=recorder.transport()
            )

        def _sleep(self, seconds: float) -> None:
            recorder.sleeps.append(seconds)

    return MockedPlausible(**{"api_key": "plausible-key", "site_id": "example.com", **fields})


def github(recorder: Recorder, **fields: Any) -> GitHubReleasesClient:
    class MockedGitHub(GitHubReleasesClient):
        def _client(self, gate: RequestGate | None = None) -> httpx.Client:
            return httpx.Client(
                base_url=self.base_url, timeout=self.timeout_s, event_hooks=hooks(gate), transport=recorder.transport()
            )

        def _sleep(self, seconds: float) -> None:
            recorder.sleeps.append(seconds)

    return MockedGitHub(**{"token": "ghp_test", **fields})


def plausible_page(rows: list[tuple[str, str, int, int]], offset: int, limit: int) -> dict[str, Any]:
    return {
        "results": [
            {"dimensions": [DAY.isoformat(), campaign, page], "metrics": [visitors, pageviews]}
            for campaign, page, visitors, pageviews in rows
        ],
        "meta": {},
        "query": {
            "site_id": "example.com",
            "metrics": ["visitors", "pageviews"],
            "date_range": ["2026-11-26T00:00:00+00:00", "2026-11-26T23:59:59+00:00"],
            "filters": [["is_not", "visit:utm_campaign", ["(not set)"]]],
            "dimensions": ["time:day", "visit:utm_campaign", "event:page"],
            "order_by": [["time:day", "asc"], ["visit:utm_campaign", "asc"], ["event:page", "asc"]],
            "include": {},
            "pagination": {"limit": limit, "offset": offset},
        },
    }


def expected_plausible_body(offset: int, limit: int) -> dict[str, Any]:
    return {
        "site_id": "example.com",
        "metrics": ["visitors", "pageviews"],
        "date_range": ["2026-11-26", "2026-11-26"],
        "dimensions": ["time:day", "visit:utm_campaign", "event:page"],
        "filters": [["is_not", "visit:utm_campaign", ["(not set)"]]],
        "order_by": [["time:day", "asc"], ["visit:utm_campaign", "asc"], ["event:page", "asc"]],
        "pagination": {"limit": limit, "offset": offset},
    }


def snapshot(asset_id: int, downloads: int) -> ReleaseAssetSnapshot:
    return ReleaseAssetSnapshot(
        repo="acme/widget",
        release_id=1,
        release_tag="v1.0.0",
        asset_id=asset_id,
        asset_name=f"widget-{asset_id}.tar.gz",
        download_count=downloads,
        asset_created_at=dt.datetime(2026, 11, 1, tzinfo=dt.UTC),
    )


def test_both_importers_meet_the_importer_interface() -> None:
    assert isinstance(PlausibleClient(), Importer)
    assert isinstance(GitHubReleasesClient(), Importer)
    assert PlausibleClient.name != GitHubReleasesClient.name


def test_plausible_paginates_until_a_short_page_and_sends_the_documented_query() -> None:
    pages = {
        0: [("black-friday", "/", 40, 55), ("black-friday", "/pricing", 12, 14)],
        2: [("newsletter-11", "/blog/launch", 7, 9)],
    }

    def handler(request: httpx.Request) -> httpx.Response:
        offset = json.loads(request.content)["pagination"]["offset"]
        return httpx.Response(200, json=plausible_page(pages[offset], offset, 2))

    recorder = Recorder(handler)
    rows = plausible(recorder, page_size=2).campaign_stats(DAY, DAY)[DAY]

    assert rows == [
        SiteAnalyticsRow(day=DAY, utm_campaign="black-friday", page="/", visitors=40, pageviews=55),
        SiteAnalyticsRow(day=DAY, utm_campaign="black-friday", page="/pricing", visitors=12, pageviews=14),
        SiteAnalyticsRow(day=DAY, utm_campaign="newsletter-11", page="/blog/launch", visitors=7, pageviews=9),
    ]
    assert [json.loads(r.content) for r in recorder.requests] == [
        expected_plausible_body(offset=0, limit=2),
        expected_plausible_body(offset=2, limit=2),
    ]
    for request in recorder.requests:
        assert (request.method, str(request.url)) == ("POST", "https://plausible.io/api/v2/query")
        assert request.headers["authorization"] == "Bearer plausible-key"
        assert request.headers["content-type"] == "application/json"


def test_plausible_stops_after_an_empty_page_when_the_last_full_page_ended_exactly() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        offset = json.loads(request.content)["pagination"]["offset"]
        rows = [("spring", "/", 1, 1)] if offset == 0 else []
        return httpx.Response(200, json=plausible_page(rows, offset, 1))

    recorder = Recorder(handler)
    assert len(plausible(recorder, page_size=1).campaign_stats(DAY, DAY)[DAY]) == 1
    assert len(recorder.requests) == 2


def test_plausible_429_fails_after_one_request_without_retrying() -> None:
    # Plausible's hourly per-key limit answers 429 with this body and no Retry-After or rate-limit headers; a
    # retry within the hour only spends more of the same window.
    body = {"error": "Too many API requests. Your API key is limited to 600 requests per hour."}
    recorder = Recorder(lambda request: httpx.Response(429, json=body))

    with pytest.raises(ServiceError) as raised:
        plausible(recorder).campaign_stats(DAY, DAY)[DAY]

    assert not isinstance(raised.value, RateLimited)  # the asset would turn that into an hour-long Dagster retry
    assert raised.value.status == 429
    message = str(raised.value)
    assert "rate limited by Plausible (hourly request limit); retry after the hour" in message
    assert "limited to 600 requests per hour" in message
    assert len(recorder.requests) == 1
    assert recorder.sleeps == []
    assert not raised.value.transient  # nor a step retry: the window has not reset


def test_plausible_5xx_is_still_retried() -> None:
    answers = iter(
        [
            httpx.Response(502, text="<html><body>502 Bad Gateway</body></html>"),
            httpx.Response(200, json=plausible_page([("spring", "/", 3, 4)], 0, 10_000)),
        ]
    )
    recorder = Recorder(lambda request: next(answers))

    rows = plausible(recorder).campaign_stats(DAY, DAY)[DAY]

    assert [row.visitors for row in rows] == [3]
    assert len(recorder.sleeps) == 1 and 0 <= recorder.sleeps[0] <= 0.5
    assert len(recorder.requests) == 2


def test_plausible_5xx_outlasting_every_attempt_is_transient() -> None:
    recorder = Recorder(lambda request: httpx.Response(503, text="upstream unavailable"))

    with pytest.raises(ServiceError) as raised:
        plausible(recorder).campaign_stats(DAY, DAY)[DAY]

    # The asset lets Dagster's step retry try again later (IMPORT_RETRY_POLICY).
    assert raised.value.transient
    assert "gave up after 5 attempts (HTTP 503: upstream unavailable)" in str(raised.value)
    assert len(recorder.requests) == 5 and len(recorder.sleeps) == 4


def test_plausible_401_names_the_api_key_env_var() -> None:
    body = {"error": "Invalid API key or site ID. Please make sure you're using a valid API key."}
    recorder = Recorder(lambda request: httpx.Response(401, json=body))

    with pytest.raises(ServiceError) as raised:
        plausible(recorder).campaign_stats(DAY, DAY)[DAY]

    assert raised.value.status == 401
    assert "PLAUSIBLE_API_KEY" in str(raised.value)
    assert recorder.sleeps == []
    assert not raised.value.transient


def test_plausible_400_quotes_the_error_field() -> None:
    message = 'Invalid filter \'["is_not", "visit:utm_campaign"]\''
    recorder = Recorder(lambda request: httpx.Response(400, json={"error": message}))

    with pytest.raises(ServiceError) as raised:
        plausible(recorder).campaign_stats(DAY, DAY)[DAY]

    assert raised.value.status == 400
    assert message in str(raised.value)


def test_plausible_truncated_json_is_a_service_error() -> None:
    truncated = json.dumps(plausible_page([("spring", "/", 3, 4)], 0, 10_000))[:40]
    recorder = Recorder(
        lambda request: httpx.Response(200, content=truncated, headers={"content-type": "application/json"})
    )

    with pytest.raises(ServiceError, match="not valid JSON") as raised:
        plausible(recorder).campaign_stats(DAY, DAY)[DAY]

    assert not isinstance(raised.value, json.JSONDecodeError)


@pytest.mark.parametrize("status", [200, 400])  # a result body, and an error body read for its message
@pytest.mark.parametrize("importer", ["plausible", "github"])
def test_a_body_nested_past_the_parser_is_a_service_error_not_a_recursion_error(importer: str, status: int) -> None:
    hostile = "[" * 100_000  # response.json() recursed once per level: RecursionError, a traceback
    recorder = Recorder(
        lambda request: httpx.Response(status, content=hostile, headers={"content-type": "application/json"})
    )
    with pytest.raises(ServiceError):
        if importer == "plausible":
            plausible(recorder).campaign_stats(DAY, DAY)[DAY]
        else:
            github(recorder).list_release_assets("acme/widget")


def test_plausible_row_for_another_day_is_refused() -> None:
    page = plausible_page([("spring", "/", 3, 4)], 0, 10_000)
    page["results"][0]["dimensions"][0] = "2026-11-25"
    recorder = Recorder(lambda request: httpx.Response(200, json=page))

    with pytest.raises(ServiceError, match="2026-11-25"):
        plausible(recorder).campaign_stats(DAY, DAY)[DAY]


@pytest.mark.parametrize(
    ("api_key", "site_id", "reason"),
    [
        (None, None, "set PLAUSIBLE_API_KEY and PLAUSIBLE_SITE_ID"),
        (None, "example.com", "set PLAUSIBLE_API_KEY"),
        ("plausible-key", None, "set PLAUSIBLE_SITE_ID"),
        # An env var set to the empty string is as good as unset.
        ("", "example.com", "set PLAUSIBLE_API_KEY"),
    ],
)
def test_plausible_not_configured(api_key: str | None, site_id: str | None, reason: str) -> None:
    recorder = Recorder(lambda request: httpx.Response(200, json=plausible_page([], 0, 10_000)))
    client = plausible(recorder, api_key=api_key, site_id=site_id)

    assert not client.is_configured()
    assert client.not_configured_reason() == reason
    with pytest.raises(ImporterNotConfigured, match=reason):
        client.campaign_stats(DAY, DAY)[DAY]
    assert recorder.requests == []


def test_plausible_configured() -> None:
    client = plausible(Recorder(lambda request: httpx.Response(500)))
    assert client.is_configured()
    assert client.not_configured_reason() == ""


def test_github_follows_link_pagination_across_two_pages() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if str(request.url) == RELEASES_URL:
            link = f'<{PAGE_2_URL}>; rel="next", <{PAGE_2_URL}>; rel="last"'
            releases = [github_release(201, "v2.0.0", [github_asset(901, "widget-2.tar.gz", 15)])]
            return httpx.Response(200, json=releases, headers={"link": link, "etag": 'W/"page-one"'})
        if str(request.url) == PAGE_2_URL:
            releases = [
                github_release(
                    101,
                    "v1.0.0",
                    [github_asset(801, "widget-1.tar.gz", 300), github_asset(802, "widget-1.zip", 12)],
                )
            ]
            return httpx.Response(200, json=releases, headers={"etag": 'W/"page-two"'})
        return httpx.Response(500)

    recorder = Recorder(handler)
    result = github(recorder).list_release_assets("acme/widget")

    assert [str(r.url) for r in recorder.requests] == [RELEASES_URL, PAGE_2_URL]
    assert not result.not_modified
    # The first page's ETag cannot vouch for later pages, so a many-page listing is never revalidated.
    assert result.etag is None
    assert [(a.release_tag, a.asset_id, a.download_count) for a in result.assets] == [
        ("v2.0.0", 901, 15),
        ("v1.0.0", 801, 300),
        ("v1.0.0", 802, 12),
    ]
    assert result.assets[1] == ReleaseAssetSnapshot(
        repo="acme/widget",
        release_id=101,
        release_tag="v1.0.0",
        asset_id=801,
        asset_name="widget-1.tar.gz",
        download_count=300,
        asset_created_at=dt.datetime(2026, 11, 1, 8, 30, tzinfo=dt.UTC),
    )
    assert result.assets[1].asset_created_at.utcoffset() == dt.timedelta(0)


def test_github_single_page_returns_its_etag() -> None:
    releases = [github_release(201, "v2.0.0", [github_asset(901, "widget-2.tar.gz", 15)])]
    recorder = Recorder(lambda request: httpx.Response(200, json=releases, headers={"etag": '"abc123"'}))

    result = github(recorder).list_release_assets("acme/widget")

    assert result.etag == '"abc123"'
    assert len(result.assets) == 1


def test_github_sends_if_none_match_and_a_304_means_not_modified() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.headers.get("if-none-match") == '"abc123"':
            return httpx.Response(304, headers={"etag": '"abc123"'})
        return httpx.Response(200, json=[], headers={"etag": '"changed"'})

    recorder = Recorder(handler)
    result = github(recorder).list_release_assets("acme/widget", etag='"abc123"')

    assert result.not_modified
    assert result.etag == '"abc123"'
    assert result.assets == ()
    assert len(recorder.requests) == 1


def test_github_sends_accept_version_and_token_headers_and_the_etag_only_on_page_one() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if str(request.url) == RELEASES_URL:
            return httpx.Response(200, json=[], headers={"link": f'<{PAGE_2_URL}>; rel="next"'})
        return httpx.Response(200, json=[])

    recorder = Recorder(handler)
    github(recorder, api_version="2022-11-28").list_release_assets("acme/widget", etag='"abc123"')

    for request in recorder.requests:
        assert request.method == "GET"
        assert request.headers["accept"] == "application/vnd.github+json"
        assert request.headers["x-github-api-version"] == "2022-11-28"
        assert request.headers["authorization"] == "Bearer ghp_test"
    assert [r.headers.get("if-none-match") for r in recorder.requests] == ['"abc123"', None]


def test_github_without_a_token_sends_no_authorization_and_is_not_configured() -> None:
    recorder = Recorder(lambda request: httpx.Response(200, json=[]))
    client = github(recorder, token=None)

    client.list_release_assets("acme/widget")

    assert "authorization" not in recorder.requests[0].headers
    assert not client.is_configured()
    assert "set GITHUB_TOKEN" in client.not_configured_reason()
    assert github(recorder).is_configured()


def test_github_403_rate_limit_with_a_distant_reset_raises_rate_limited() -> None:
    reset = int(time.time()) + 3600
    headers = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset), "x-ratelimit-limit": "5000"}
    body = {"message": "API rate limit exceeded for user ID 9.", "documentation_url": "https://docs.github.com/rest"}
    recorder = Recorder(lambda request: httpx.Response(403, json=body, headers=headers))

    with pytest.raises(RateLimited) as raised:
        github(recorder).list_release_assets("acme/widget")

    assert raised.value.retry_after_s > 3000
    assert recorder.sleeps == []
    assert len(recorder.requests) == 1


def test_github_403_rate_limit_resetting_in_a_second_is_waited_out() -> None:
    reset = int(time.time()) + 1
    headers = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)}
    answers = iter(
        [
            httpx.Response(403, json={"message": "API rate limit exceeded"}, headers=headers),
            httpx.Response(200, json=[github_release(201, "v2.0.0", [github_asset(901, "widget-2.tar.gz", 15)])]),
        ]
    )
    recorder = Recorder(lambda request: next(answers))

    result = github(recorder).list_release_assets("acme/widget")

    assert [a.asset_id for a in result.assets] == [901]
    assert len(recorder.sleeps) == 1 and 0 <= recorder.sleeps[0] <= 1
    assert len(recorder.requests) == 2


SECONDARY_LIMIT_BODY = {
    "message": (
        "You have exceeded a secondary rate limit. Please wait a few minutes before you try again. If you reach "
        "out to GitHub Support for help, please include the request ID C8F2:3A4B:1F2E3D:2B3C4D:67890ABC."
    ),
    "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits",
    "status": "403",
}


def quota_headers(remaining: int, reset_in_s: int = 1800) -> dict[str, str]:
    """The primary-limit headers GitHub sends on every answer."""
    return {
        "x-ratelimit-limit": "5000",
        "x-ratelimit-remaining": str(remaining),
        "x-ratelimit-reset": str(int(time.time()) + reset_in_s),
        "x-ratelimit-used": str(5000 - remaining),
        "x-ratelimit-resource": "core",
        "x-github-request-id": "C8F2:3A4B:1F2E3D:2B3C4D:67890ABC",
    }


def test_github_403_secondary_limit_with_quota_left_is_rate_limited_for_a_minute() -> None:
    # No Retry-After and x-ratelimit-remaining not 0: GitHub says wait at least a minute (not until the reset).
    recorder = Recorder(lambda request: httpx.Response(403, json=SECONDARY_LIMIT_BODY, headers=quota_headers(4321)))

    with pytest.raises(RateLimited) as raised:
        github(recorder).list_release_assets("acme/widget")

    assert raised.value.retry_after_s == 60
    assert "GITHUB_TOKEN" not in str(raised.value)
    assert len(recorder.requests) == 1
    assert recorder.sleeps == []


def test_github_429_without_hints_is_rate_limited_for_a_minute() -> None:
    body = {**SECONDARY_LIMIT_BODY, "status": "429"}
    recorder = Recorder(lambda request: httpx.Response(429, json=body))

    with pytest.raises(RateLimited) as raised:
        github(recorder).list_release_assets("acme/widget")

    assert raised.value.retry_after_s >= 60
    assert len(recorder.requests) == 1
    assert recorder.sleeps == []


def test_github_secondary_limit_with_a_short_retry_after_is_waited_out() -> None:
    answers = iter(
        [
            httpx.Response(403, json=SECONDARY_LIMIT_BODY, headers={**quota_headers(4321), "retry-after": "5"}),
            httpx.Response(200, json=[github_release(201, "v2.0.0", [github_asset(901, "widget-2.tar.gz", 15)])]),
        ]
    )
    recorder = Recorder(lambda request: next(answers))

    result = github(recorder).list_release_assets("acme/widget")

    assert [a.asset_id for a in result.assets] == [901]
    assert recorder.sleeps == [5.0]


def test_github_403_without_rate_limit_signs_is_a_permission_error() -> None:
    body = {
        "message": "Resource not accessible by personal access token",
        "documentation_url": "https://docs.github.com/rest/releases/releases#list-releases",
        "status": "403",
    }
    recorder = Recorder(lambda request: httpx.Response(403, json=body, headers=quota_headers(4321)))

    with pytest.raises(ServiceError, match="GITHUB_TOKEN") as raised:
        github(recorder).list_release_assets("acme/widget")

    assert not isinstance(raised.value, RateLimited)
    assert raised.value.status == 403
    assert len(recorder.requests) == 1


def test_github_absurd_reset_is_capped_at_a_day() -> None:
    headers = {**quota_headers(0), "x-ratelimit-reset": "99999999999999"}
    recorder = Recorder(
        lambda request: httpx.Response(403, json={"message": "API rate limit exceeded"}, headers=headers)
    )

    with pytest.raises(RateLimited) as raised:
        github(recorder).list_release_assets("acme/widget")

    assert raised.value.retry_after_s == 24 * 3600
    assert recorder.sleeps == []


MOVED_URL = "https://api.github.com/repositories/4711/releases?per_page=100"


def moved_permanently(location: str) -> httpx.Response:
    body = {
        "message": "Moved Permanently",
        "url": location,
        "documentation_url": "https://docs.github.com/v3/#http-redirects",
    }
    return httpx.Response(301, json=body, headers={"location": location})


def test_github_follows_a_moved_repository_and_reports_where_it_went() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if str(request.url) == RELEASES_URL:
            return moved_permanently(MOVED_URL)
        if str(request.url) == MOVED_URL:
            releases = [github_release(201, "v2.0.0", [github_asset(901, "widget-2.tar.gz", 15)])]
            return httpx.Response(200, json=releases, headers={"etag": '"moved"'})
        return httpx.Response(404, json={"message": "Not Found"})

    recorder = Recorder(handler)
    result = github(recorder).list_release_assets("acme/widget")

    assert [str(r.url) for r in recorder.requests] == [RELEASES_URL, MOVED_URL]
    assert recorder.requests[1].headers["authorization"] == "Bearer ghp_test"
    assert result.moved_to == MOVED_URL
    assert result.etag == '"moved"'
    # Snapshots stay under the configured name, so the repository's download history continues.
    assert [(a.repo, a.asset_id, a.download_count) for a in result.assets] == [("acme/widget", 901, 15)]


def test_github_a_moved_repository_still_revalidates_its_etag() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if str(request.url) == RELEASES_URL:
            return moved_permanently(MOVED_URL)
        assert request.headers["if-none-match"] == '"abc123"'
        return httpx.Response(304, headers={"etag": '"abc123"'})

    recorder = Recorder(handler)
    result = github(recorder).list_release_assets("acme/widget", etag='"abc123"')

    assert result.not_modified and result.moved_to == MOVED_URL
    assert len(recorder.requests) == 2


def test_github_temporary_redirect_is_followed_but_not_reported_as_moved() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if str(request.url) == RELEASES_URL:
            return httpx.Response(307, headers={"location": MOVED_URL})
        return httpx.Response(200, json=[])

    result = github(Recorder(handler)).list_release_assets("acme/widget")

    assert result.moved_to is None


@pytest.mark.parametrize(
    "location",
    [
        "https://evil.example/repositories/4711/releases?per_page=100",
        "http://api.github.com/repositories/4711/releases?per_page=100",  # the token would go out in clear
        "https://api.github.com:8443/repositories/4711/releases?per_page=100",
    ],
)
def test_github_refuses_a_redirect_off_the_configured_api(location: str) -> None:
    recorder = Recorder(lambda request: moved_permanently(location))

    with pytest.raises(ServiceError, match=r"off the configured API .*not followed") as raised:
        github(recorder).list_release_assets("acme/widget")

    assert raised.value.status == 301
    assert len(recorder.requests) == 1


def test_github_enterprise_redirect_must_stay_under_the_api_path() -> None:
    recorder = Recorder(lambda request: moved_permanently("https://ghe.example.com/other/repositories/4711/releases"))

    with pytest.raises(ServiceError, match="not followed"):
        github(recorder, base_url="https://ghe.example.com/api/v3").list_release_assets("acme/widget")

    assert [str(r.url) for r in recorder.requests] == [
        "https://ghe.example.com/api/v3/repos/acme/widget/releases?per_page=100"
    ]


def test_github_gives_up_after_a_few_redirects() -> None:
    hops = iter(range(100))
    recorder = Recorder(lambda request: moved_permanently(f"/repositories/{next(hops)}/releases"))

    with pytest.raises(ServiceError, match="more than 3 redirects"):
        github(recorder).list_release_assets("acme/widget")

    assert len(recorder.requests) == 4


def test_github_401_names_the_token_env_var() -> None:
    body = {"message": "Bad credentials", "documentation_url": "https://docs.github.com/rest", "status": "401"}
    recorder = Recorder(lambda request: httpx.Response(401, json=body))

    with pytest.raises(ServiceError, match="GITHUB_TOKEN") as raised:
        github(recorder).list_release_assets("acme/widget")

    assert raised.value.status == 401


def test_github_404_says_the_repository_is_missing_or_hidden() -> None:
    body = {"message": "Not Found", "documentation_url": "https://docs.github.com/rest", "status": "404"}
    recorder = Recorder(lambda request: httpx.Response(404, json=body))

    with pytest.raises(ServiceError, match="'acme/secret' was not found, or GITHUB_TOKEN cannot see it"):
        github(recorder).list_release_assets("acme/secret")


def test_github_refuses_a_next_link_to_another_host() -> None:
    link = '<https://elsewhere.example/repos/acme/widget/releases?page=2>; rel="next"'
    recorder = Recorder(lambda request: httpx.Response(200, json=[], headers={"link": link}))

    with pytest.raises(ServiceError, match=r"elsewhere\.example"):
        github(recorder).list_release_assets("acme/widget")

    assert [r.url.host for r in recorder.requests] == ["api.github.com"]


@pytest.mark.parametrize("repo", ["widget", "acme/widget/extra", "acme/", "/widget", "acme/..", "acme widget/x", ""])
def test_github_rejects_a_repo_that_is_not_owner_slash_name(repo: str) -> None:
    recorder = Recorder(lambda request: httpx.Response(200, json=[]))

    with pytest.raises(ValueError) as raised:
        github(recorder).list_release_assets(repo)

    assert repr(repo) in str(raised.value)
    assert recorder.requests == []


def delta(
    asset_id: int,
    download_count: int,
    delta: int,
    raw_delta: int,
    baseline: bool = False,
    negative_clamped: bool = False,
) -> DownloadDelta:
    return DownloadDelta(
        repo="acme/widget",
        asset_id=asset_id,
        asset_name=f"widget-{asset_id}.tar.gz",
        release_tag="v1.0.0",
        download_count=download_count,
        delta=delta,
        raw_delta=raw_delta,
        baseline=baseline,
        negative_clamped=negative_clamped,
    )


@pytest.mark.parametrize(
    ("previous", "current", "repo_has_history", "expected"),
    [
        # First snapshot of a repo: every asset is a baseline, whatever it has accumulated.
        pytest.param({}, [snapshot(1, 500)], False, [delta(1, 500, 0, 0, baseline=True)], id="baseline"),
        # A known asset counts the difference.
        pytest.param({1: 500}, [snapshot(1, 530)], True, [delta(1, 530, 30, 30)], id="normal"),
        # An asset uploaded since the last snapshot counts all of its downloads.
        pytest.param(
            {1: 500}, [snapshot(1, 500), snapshot(2, 8)], True, [delta(1, 500, 0, 0), delta(2, 8, 8, 8)], id="new"
        ),
        # A re-upload gets a new id and restarts at 0; the old id simply disappears.
        pytest.param({1: 500}, [snapshot(3, 4)], True, [delta(3, 4, 4, 4)], id="reuploaded"),
        # A count that went down is clamped to 0 and flagged, keeping the raw value.
        pytest.param(
            {1: 500}, [snapshot(1, 490)], True, [delta(1, 490, 0, -10, negative_clamped=True)], id="negative-clamp"
        ),
        # No history wins even if stale previous counts are passed.
        pytest.param({1: 100}, [snapshot(1, 490)], False, [delta(1, 490, 0, 0, baseline=True)], id="no-history"),
    ],
)
def test_derive_download_deltas(
    previous: dict[int, int],
    current: list[ReleaseAssetSnapshot],
    repo_has_history: bool,
    expected: list[DownloadDelta],
) -> None:
    assert derive_download_deltas(previous, current, repo_has_history) == expected


def test_plausible_range_is_one_query_keyed_by_day_and_refuses_a_row_outside_it() -> None:
    first, last = DAY - dt.timedelta(days=2), DAY

    def rows_for(days: list[dt.date]) -> httpx.Response:
        results = [{"dimensions": [d.isoformat(), "spring", "/"], "metrics": [3, 4]} for d in days]
        return httpx.Response(200, json={"results": results, "meta": {}, "query": {}})

    recorder = Recorder(lambda request: rows_for([first, last]))
    by_day = plausible(recorder).campaign_stats(first, last)
    assert [json.loads(r.content)["date_range"] for r in recorder.requests] == [[first.isoformat(), last.isoformat()]]
    # Every asked day is present, so a day without visits is replaced by no rows rather than left alone.
    assert {d: len(rows) for d, rows in by_day.items()} == {first: 1, first + dt.timedelta(days=1): 0, last: 1}

    outside = Recorder(lambda request: rows_for([last + dt.timedelta(days=1)]))
    with pytest.raises(ServiceError, match=r"asked for 2026-11-24\.\.2026-11-26 but got a row for 2026-11-27"):
        plausible(outside).campaign_stats(first, last)
