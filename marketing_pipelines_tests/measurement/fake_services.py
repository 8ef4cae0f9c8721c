"""Fakes of the measurement importers' HTTP services for tests: ``Api`` answers every request with a handler
through httpx.MockTransport and keeps the requests, ``mocked_plausible`` and ``mocked_github`` are the real
Plausible and GitHub clients sending to it (without sleeping between retries), and ``github_asset`` and
``github_release`` build GitHub's release payloads as its REST API returns them.
"""

from __future__ import annotations

from typing import Any

import httpx

from marketing_pipelines.measurement.importers.base import RequestGate, hooks
from marketing_pipelines.measurement.importers.github import GitHubReleasesClient
from marketing_pipelines.measurement.importers.plausible import PlausibleClient

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
