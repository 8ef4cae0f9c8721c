"""Fakes of the measurement importers' HTTP services for tests: ``Api`` answers every request with a handler
through httpx.MockTransport and keeps the requests, ``mocked_plausible``, ``mocked_github``, ``mocked_pypistats``,
``mocked_npm`` and ``mocked_ga4`` are the real clients sending to it (without sleeping between retries),
``github_asset`` and ``github_release`` build GitHub's release payloads as its REST API returns them,
``PyPIStatsFake`` and ``NpmDownloadsFake`` answer from a table of downloads as pypistats.org and api.npmjs.org do
(recorded/), and ``FakeGoogle`` is Google's token endpoint (it verifies each assertion's signature with the public
key of a key pair the test made, ``service_account_key``) and the GA4 Data API's runReport.
"""

from __future__ import annotations

import base64
import copy
import datetime as dt
import functools
import json
import re
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from marketing_pipelines.measurement.importers.base import RequestGate, hooks
from marketing_pipelines.measurement.importers.ga4 import GA4Client
from marketing_pipelines.measurement.importers.github import GitHubReleasesClient
from marketing_pipelines.measurement.importers.packages import NpmDownloadsClient, PyPIStatsClient
from marketing_pipelines.measurement.importers.plausible import PlausibleClient
from marketing_pipelines.service_account import GOOGLE_TOKEN_URL

RECORDED = Path(__file__).parent / "recorded"
# Downloads per package and day.
Downloads = Mapping[str, Mapping[date, int]]


def recorded(name: str) -> Any:
    """A recorded answer (recorded/README.md says where its shape was read)."""
    return json.loads((RECORDED / name).read_text())


Handler = Any


class Api:
    """A fake API: answers with ``self.handler`` and keeps every request."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[httpx.Request] = []

    def transport(self) -> httpx.MockTransport:
        def answer(request: httpx.Request) -> httpx.Response:
            self.requests.append(request)
            return self.handler(request)

        return httpx.MockTransport(answer)


def mocked_plausible(api: Api, **fields: Any) -> PlausibleClient:
    class MockedPlausible(PlausibleClient):
        def _client(self, gate: RequestGate | None = None) -> httpx.Client:
            return httpx.Client(
                base_url=self.base_url, timeout=self.timeout_s, event_hooks=hooks(gate), transport=api.transport()
            )

        def _sleep(self, seconds: float) -> None:
            pass

    return MockedPlausible(**{"api_key": "key", "site_id": "example.com", **fields})


def mocked_github(api: Api, **fields: Any) -> GitHubReleasesClient:
    class MockedGitHub(GitHubReleasesClient):
        def _client(self, gate: RequestGate | None = None) -> httpx.Client:
            return httpx.Client(
                base_url=self.base_url, timeout=self.timeout_s, event_hooks=hooks(gate), transport=api.transport()
            )

        def _sleep(self, seconds: float) -> None:
            pass

    return MockedGitHub(**{"token": "ghp_test", **fields})


def github_asset(asset_id: int, name: str, downloads: int) -> dict[str, Any]:
    return {
        "url": f"https://api.github.com/repos/acme/widget/releases/assets/{asset_id}",
        "id": asset_id,
        "node_id": f"RA_{asset_id}",
        "name": name,
        "label": "",
        "uploader": {"login": "release-bot", "id": 9, "type": "Bot"},
        "content_type": "application/gzip",
        "state": "uploaded",
        "size": 1024,
        "download_count": downloads,
        "created_at": "2026-11-01T08:30:00Z",
        "updated_at": "2026-11-01T08:31:00Z",
        "browser_download_url": f"https://github.com/acme/widget/releases/download/v1/{name}",
    }


def github_release(release_id: int, tag: str, assets: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "url": f"https://api.github.com/repos/acme/widget/releases/{release_id}",
        "html_url": f"https://github.com/acme/widget/releases/tag/{tag}",
        "assets_url": f"https://api.github.com/repos/acme/widget/releases/{release_id}/assets",
        "id": release_id,
        "node_id": f"RE_{release_id}",
        "tag_name": tag,
        "target_commitish": "main",
        "name": tag,
        "draft": False,
        "prerelease": False,
        "created_at": "2026-11-01T08:00:00Z",
        "published_at": "2026-11-01T08:35:00Z",
        "author": {"login": "release-bot", "id": 9, "type": "Bot"},
        "assets": assets,
        "body": "Release notes",
    }


def mocked_pypistats(api: Api, **fields: Any) -> PyPIStatsClient:
    class MockedPyPIStats(PyPIStatsClient):
        def _client(self, gate: RequestGate | None = None) -> httpx.Client:
            return httpx.Client(
                base_url=self.base_url, timeout=self.timeout_s, event_hooks=hooks(gate), transport=api.transport()
            )

        def _sleep(self, seconds: float) -> None:
            pass

    return MockedPyPIStats(**{"enabled": True, **fields})


def mocked_npm(api: Api, **fields: Any) -> NpmDownloadsClient:
    class MockedNpm(NpmDownloadsClient):
        def _client(self, gate: RequestGate | None = None) -> httpx.Client:
            return httpx.Client(
                base_url=self.base_url, timeout=self.timeout_s, event_hooks=hooks(gate), transport=api.transport()
            )

        def _sleep(self, seconds: float) -> None:
            pass

    return MockedNpm(**{"enabled": True, **fields})


class _Quota:
    """A fake's own rate limiter: 429 past ``requests`` in any ``period_s`` (a sliding window)."""

    def __init__(self, requests: int, period_s: float) -> None:
        self.requests, self.period_s, self.sent = requests, period_s, list[float]()
        self.refused = 0

    def over(self) -> bool:
        now = time.monotonic()
        self.sent = [t for t in self.sent if now - t < self.period_s] + [now]
        if len(self.sent) > self.requests:
            self.refused += 1
            return True
        return False


# ---- PostHog: the Query API ----------------------------------------------------------------------------------


def posthog_answer(results: list[list[Any]], has_more: bool = False, **changes: Any) -> dict[str, Any]:
    """The recorded answer with other rows: every other field as PostHog sends it."""
    payload = copy.deepcopy(recorded("posthog/query_hogql.json"))
    payload.update(results=results, hasMore=has_more, **changes)
    return payload


def body(request: httpx.Request) -> dict[str, Any]:
    return json.loads(request.content)


Event = tuple[datetime, str | None, str]  # timestamp (UTC), utm_campaign, person id


class FakePostHog:
    """Answers the importer's HogQL query from a list of events, as PostHog would: the range and the campaigns
    from the query's values, LIMIT and OFFSET from its text, hasMore when rows are left after the page."""

    def __init__(self, events: Sequence[Event]) -> None:
        self.events = list(events)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        query = body(request)["query"]
        values = query["values"]
        start, end = (datetime.fromisoformat(values[k]).replace(tzinfo=UTC) for k in ("start", "end"))
        limit, offset = (int(n) for n in re.search(r"LIMIT (\d+) OFFSET (\d+)$", query["query"]).groups())  # type: ignore[union-attr]
        groups: dict[tuple[str, str], list[str]] = defaultdict(list)
        for at, utm, person in self.events:
            if start <= at < end and utm in values["campaigns"]:
                groups[(at.date().isoformat(), utm)].append(person)
        rows = [[d, c, len(people), len(set(people))] for (d, c), people in sorted(groups.items())]
        page = rows[offset : offset + limit]
        return httpx.Response(
            200, json=posthog_answer(page, has_more=len(rows) > offset + limit, limit=limit, offset=offset)
        )


class PyPIStatsFake:
    """pypistats.org's ``/api/packages/{package}/overall``: every day of ``downloads`` with a count above 0 (as it
    stores only days with downloads), shaped as recorded/pypi_downloads/overall.json; 404 for a package it has not."""

    def __init__(self, downloads: Downloads, quota: tuple[int, float] = (30, 60.0)) -> None:
        self.downloads, self.quota = downloads, _Quota(*quota)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.quota.over():
            return httpx.Response(429, text="Too Many Requests")
        match = re.fullmatch(r"/api/packages/([^/]+)/overall", request.url.path)
        if not match or request.url.params.get("mirrors") != "false":
            return httpx.Response(404, text="<h1>Not Found</h1>")
        package = match.group(1)
        if package not in self.downloads:
            return httpx.Response(404, text="<h1>Not Found</h1>")
        data = [
            {"category": "without_mirrors", "date": day.isoformat(), "downloads": n}
            for day, n in sorted(self.downloads[package].items())
            if n > 0
        ]
        return httpx.Response(200, json={**recorded("pypi_downloads/overall.json"), "data": data, "package": package})


class NpmDownloadsFake:
    """api.npmjs.org's ``/downloads/range/{start}:{end}/{packages}`` with its documented limits: at most 128
    packages and 365 days a bulk query, no scoped package in one (400 otherwise), every day of the range answered
    (0 when ``downloads`` has none); an unknown package is null in bulk, 404 alone."""

    def __init__(self, downloads: Downloads, quota: tuple[int, float] = (30, 60.0)) -> None:
        self.downloads, self.quota = downloads, _Quota(*quota)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.quota.over():
            return httpx.Response(429, text="Too Many Requests")
        match = re.fullmatch(r"/downloads/range/(\d{4}-\d{2}-\d{2}):(\d{4}-\d{2}-\d{2})/(.+)", request.url.path)
        if not match:
            return httpx.Response(404, json={"error": "not found"})
        start, end = date.fromisoformat(match.group(1)), date.fromisoformat(match.group(2))
        packages = match.group(3).split(",")
        if len(packages) == 1:
            if packages[0] not in self.downloads:
                return httpx.Response(404, json={"error": f"package {packages[0]} not found"})
            return httpx.Response(200, json=self.answer(packages[0], start, end))
        if len(packages) > 128 or (end - start).days + 1 > 365 or any(p.startswith("@") for p in packages):
            return httpx.Response(400, json={"error": "bulk queries take at most 128 unscoped packages, 365 days"})
        return httpx.Response(
            200,
            json={p: self.answer(p, start, end) if p in self.downloads else None for p in packages},
        )

    def answer(self, package: str, start: date, end: date) -> dict[str, Any]:
        days = [start + timedelta(days=n) for n in range((end - start).days + 1)]
        counts = self.downloads[package]
        return {
            **recorded("npm_downloads/range_single.json"),
            "downloads": [{"downloads": counts.get(day, 0), "day": day.isoformat()} for day in days],
            "start": start.isoformat(),
            "end": end.isoformat(),
            "package": package,
        }


# ---- Google: a service account, its token endpoint and the GA4 Data API -----------------------------------------

GA4_PROPERTY = "123456789"
GA4_REPORT_URL = f"https://analyticsdata.googleapis.com/v1beta/properties/{GA4_PROPERTY}:runReport"
CLIENT_EMAIL = "importer@marketing-test.iam.gserviceaccount.com"
GA4_SCOPE = "https://www.googleapis.com/auth/analytics.readonly"


@functools.cache
def rsa_key(name: str = "service account") -> rsa.RSAPrivateKey:
    """A 2048-bit RSA key pair per ``name``, made once per test process (a second name is a different key)."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def private_pem(key: rsa.RSAPrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode("ascii")


def service_account_key(
    key: rsa.RSAPrivateKey | None = None, token_uri: str = GOOGLE_TOKEN_URL, **fields: Any
) -> dict[str, Any]:
    """A service-account key as the Cloud console's JSON download holds it, for the test's own key pair."""
    return {
        "type": "service_account",
        "project_id": "marketing-test",
        "private_key_id": "0f3c5a7e9b1d2f4a6c8e0b2d4f6a8c0e2b4d6f8a",
        "private_key": private_pem(key or rsa_key()),
        "client_email": CLIENT_EMAIL,
        "client_id": "104217654321098765432",
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": token_uri,
        "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
        "client_x509_cert_url": f"https://www.googleapis.com/robot/v1/metadata/x509/{CLIENT_EMAIL}",
        "universe_domain": "googleapis.com",
        **fields,
    }


def _b64url_decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def verified_claims(assertion: str, public_key: rsa.RSAPublicKey) -> tuple[dict[str, Any], dict[str, Any]]:
    """The assertion's JWT header and claims, after its RS256 signature was verified; InvalidSignature otherwise."""
    header, claims, signature = assertion.split(".")
    public_key.verify(
        _b64url_decode(signature), f"{header}.{claims}".encode("ascii"), padding.PKCS1v15(), hashes.SHA256()
    )
    return json.loads(_b64url_decode(header)), json.loads(_b64url_decode(claims))


def google_error(code: int, status: str, message: str) -> httpx.Response:
    return httpx.Response(code, json={"error": {"code": code, "message": message, "status": status}})


def ga4_report(
    rows: Sequence[tuple[dt.date, str, int, int, int]], row_count: int | None = None, **extra: Any
) -> dict[str, Any]:
    """A runReport answer: rows of (day, campaign, sessions, screenPageViews, totalUsers), as the Data API writes
    them (every value a string, the date YYYYMMDD, a zero rowCount and no rows left out as proto3 JSON does)."""
    answer: dict[str, Any] = {
        "dimensionHeaders": [{"name": "date"}, {"name": "sessionCampaignName"}],
        "metricHeaders": [
            {"name": "sessions", "type": "TYPE_INTEGER"},
            {"name": "screenPageViews", "type": "TYPE_INTEGER"},
            {"name": "totalUsers", "type": "TYPE_INTEGER"},
        ],
        "metadata": {"currencyCode": "USD", "timeZone": "Etc/UTC"},
        "propertyQuota": {
            "tokensPerDay": {"consumed": 12, "remaining": 199_988},
            "tokensPerHour": {"consumed": 12, "remaining": 39_988},
            "concurrentRequests": {"remaining": 10},
            "serverErrorsPerProjectPerHour": {"remaining": 10},
            "potentiallyThresholdedRequestsPerHour": {"remaining": 120},
            "tokensPerProjectPerHour": {"consumed": 12, "remaining": 13_988},
        },
        "kind": "analyticsData#runReport",
        **extra,
    }
    if rows:
        answer["rows"] = [
            {
                "dimensionValues": [{"value": day.strftime("%Y%m%d")}, {"value": campaign}],
                "metricValues": [{"value": str(sessions)}, {"value": str(views)}, {"value": str(users)}],
            }
            for day, campaign, sessions, views, users in rows
        ]
    count = len(rows) if row_count is None else row_count
    if count:
        answer["rowCount"] = count
    return answer


class FakeGoogle:
    """Google's token endpoint and the GA4 Data API's runReport, as one MockTransport handler.

    The token endpoint checks the form (grant type, one assertion), verifies the assertion's RS256 signature with
    ``public_key`` and its claims (issuer, scope, audience, an hour's life) and answers a new access token each
    time. runReport accepts only a token it issued and answers ``report(body)`` (a handler's own Response as is).
    """

    def __init__(
        self,
        report: Callable[[dict[str, Any]], dict[str, Any] | httpx.Response],
        *,
        public_key: rsa.RSAPublicKey | None = None,
        token_url: str = GOOGLE_TOKEN_URL,
        token: Callable[[int], httpx.Response] | None = None,
        expires_in: int = 3599,
    ) -> None:
        self.report, self.token = report, token
        self.public_key = public_key or rsa_key().public_key()
        self.token_url, self.expires_in = token_url, expires_in
        self.issued: list[str] = []
        self.assertions: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.reports: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if str(request.url) == self.token_url:
            return self.token_answer(request)
        if request.url.path.endswith(":runReport"):
            bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
            if bearer not in self.issued:
                return google_error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials.")
            body = json.loads(request.content)
            self.reports.append(body)
            answer = self.report(body)
            return answer if isinstance(answer, httpx.Response) else httpx.Response(200, json=answer)
        return httpx.Response(404, text="not found")

    def token_answer(self, request: httpx.Request) -> httpx.Response:
        assert request.headers["content-type"] == "application/x-www-form-urlencoded"
        form = parse_qs(request.content.decode("ascii"), strict_parsing=True)
        assert form["grant_type"] == ["urn:ietf:params:oauth:grant-type:jwt-bearer"], form
        [assertion] = form["assertion"]
        try:
            header, claims = verified_claims(assertion, self.public_key)
        except InvalidSignature:
            return httpx.Response(400, json={"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
        self.assertions.append((header, claims))
        assert header["alg"] == "RS256" and header["typ"] == "JWT"
        assert claims["iss"] == CLIENT_EMAIL and claims["scope"] == GA4_SCOPE, claims
        assert claims["aud"] == self.token_url and claims["exp"] - claims["iat"] == 3600, claims
        if self.token is not None:
            return self.token(len(self.assertions))
        issued = f"ya29.test-access-token-{len(self.issued) + 1:04d}-AbCdEfGhIjKlMnOpQrStUvWxYz"
        self.issued.append(issued)
        return httpx.Response(200, json={"access_token": issued, "expires_in": self.expires_in, "token_type": "Bearer"})


def mocked_ga4(api: Api, now: Callable[[], float] | None = None, **fields: Any) -> GA4Client:
    """The GA4 client sending to ``api``, its key the test's (``service_account_key``), its clock ``now`` if given."""

    class MockedGA4(GA4Client):
        def _client(self, gate: RequestGate | None = None) -> httpx.Client:
            return httpx.Client(
                base_url=self.api_url, timeout=self.timeout_s, event_hooks=hooks(gate), transport=api.transport()
            )

        def _sleep(self, seconds: float) -> None:
            pass

        def _now(self) -> float:
            return now() if now is not None else super()._now()

    return MockedGA4(
        **{"property_id": GA4_PROPERTY, "service_account_json": json.dumps(service_account_key()), **fields}
    )
