"""Fakes of the measurement importers' HTTP services for tests: ``Api`` answers every request with a handler
through httpx.MockTransport and keeps the requests, ``mocked_plausible``, ``mocked_github``, ``mocked_pypistats``
and ``mocked_npm`` are the real clients sending to it (without sleeping between retries), ``github_asset`` and
``github_release`` build GitHub's release payloads as its REST API returns them, and ``PyPIStatsFake`` and
``NpmDownloadsFake`` answer from a table of downloads as pypistats.org and api.npmjs.org do (recorded/).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import httpx

from marketing_pipelines.measurement.importers.base import RequestGate, hooks
from marketing_pipelines.measurement.importers.github import GitHubReleasesClient
from marketing_pipelines.measurement.importers.packages import NpmDownloadsClient, PyPIStatsClient
from marketing_pipelines.measurement.importers.plausible import PlausibleClient

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
