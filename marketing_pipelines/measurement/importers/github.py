"""GitHub release-asset importer: cumulative download counts per asset, and the daily deltas derived from them."""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import dagster as dg
import httpx
from pydantic import Field

from marketing_pipelines.http import ServiceError, describe_error_response, send_with_retries
from marketing_pipelines.measurement.importers.base import response_json

SERVICE = "github"
TOKEN_ENV = "GITHUB_TOKEN"
# GitHub's largest page for the releases list.
PER_PAGE = 100
_REPO_PATTERN = re.compile(r"[A-Za-z0-9-]+/[A-Za-z0-9._-]+")


@dataclass(frozen=True)
class ReleaseAssetSnapshot:
    """One release asset's cumulative download count as GitHub reported it when fetched."""

    repo: str
    release_id: int
    release_tag: str
    asset_id: int
    asset_name: str
    download_count: int
    asset_created_at: dt.datetime


@dataclass(frozen=True)
class ReleaseAssetsResult:
    """Every asset of a repository's releases, or ``not_modified`` when the ETag still matched."""

    not_modified: bool
    etag: str | None
    assets: tuple[ReleaseAssetSnapshot, ...]


@dataclass(frozen=True)
class DownloadDelta:
    """Downloads of one asset since the previous snapshot of its repository."""

    repo: str
    asset_id: int
    asset_name: str
    release_tag: str
    download_count: int
    delta: int
    raw_delta: int
    baseline: bool
    negative_clamped: bool


class GitHubReleasesClient(dg.ConfigurableResource):
    """Lists release assets through the GitHub REST API (``GET /repos/{owner}/{repo}/releases``)."""

    name: ClassVar[str] = "github_releases"

    token: str | None = Field(default=None, description=f"Token with read access to the repositories; {TOKEN_ENV}.")
    base_url: str = Field(default="https://api.github.com", description="API root; change for GitHub Enterprise.")
    timeout_s: float = Field(default=30.0, gt=0, description="Timeout of each HTTP call, in seconds.")
    api_version: str = Field(default="2022-11-28", description="Sent as X-GitHub-Api-Version.")

    def is_configured(self) -> bool:
        # Unauthenticated calls get 60 requests an hour per IP, too few to run unattended.
        return bool(self.token)

    def not_configured_reason(self) -> str:
        return "" if self.is_configured() else f"set {TOKEN_ENV} (unauthenticated GitHub allows 60 requests an hour)"

    def list_release_assets(self, repo: str, etag: str | None = None) -> ReleaseAssetsResult:
        """Every asset of every release of ``repo`` (``owner/name``), following ``Link: rel="next"`` pages.

        With ``etag``, a first page GitHub answers 304 returns ``not_modified=True`` and no assets.
        """
        if not _REPO_PATTERN.fullmatch(repo) or repo.split("/")[1] in (".", ".."):
            raise ValueError(f"repo must look like 'owner/name', got {repo!r}")
        assets: list[ReleaseAssetSnapshot] = []
        first_etag: str | None = None
        pages = 0
        with self._client() as client:
            request = client.build_request(
                "GET", f"/repos/{repo}/releases", params={"per_page": PER_PAGE}, headers=self._headers(etag)
            )
            seen_urls: set[str] = set()
            while True:
                response = send_with_retries(client, request, service=SERVICE, sleep=self._sleep)
                if response.status_code == 304 and pages == 0:
                    return ReleaseAssetsResult(not_modified=True, etag=etag, assets=())
                _raise_for_error(repo, response)
                if pages == 0:
                    first_etag = response.headers.get("etag")
                assets.extend(_parse_releases(repo, response_json(SERVICE, response)))
                pages += 1
                seen_urls.add(str(request.url))
                next_url = response.links.get("next", {}).get("url")
                if next_url is None:
                    break
                request = client.build_request("GET", next_url, headers=self._headers(None))
                if request.url.host != client.base_url.host:
                    # The next request carries the token; never send it to a host other than the configured API.
                    raise ServiceError(
                        SERVICE, f"pagination link for {repo} points off {client.base_url.host}: {next_url}"
                    )
                if str(request.url) in seen_urls:
                    raise ServiceError(SERVICE, f"pagination for {repo} loops back to {next_url}")
        # The ETag covers the first page only: an old release on a later page can gain downloads while page one
        # stays byte-identical, so a 304 for a many-page listing would hide those counts. Only a listing that fits
        # on one page is safe to revalidate.
        return ReleaseAssetsResult(not_modified=False, etag=first_etag if pages == 1 else None, assets=tuple(assets))

    def _client(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=self.timeout_s)

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def _headers(self, etag: str | None) -> dict[str, str]:
        headers = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": self.api_version}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if etag:
            headers["If-None-Match"] = etag
        return headers


def derive_download_deltas(
    previous: Mapping[int, int], current: Sequence[ReleaseAssetSnapshot], repo_has_history: bool
) -> list[DownloadDelta]:
    """Downloads since the last snapshot, per asset, from cumulative counts.

    ``previous`` maps asset id to its last known download_count in the same repository.
    """
    deltas: list[DownloadDelta] = []
    for asset in current:
        if not repo_has_history:
            # A first snapshot has nothing to subtract from; its totals would put years of downloads on one day.
            raw_delta, baseline = 0, True
        elif asset.asset_id not in previous:
            # An unseen id in a known repo was uploaded (or re-uploaded, which restarts the count at 0) since the
            # last snapshot, so all of its downloads happened in between.
            raw_delta, baseline = asset.download_count, False
        else:
            raw_delta, baseline = asset.download_count - previous[asset.asset_id], False
        deltas.append(
            DownloadDelta(
                repo=asset.repo,
                asset_id=asset.asset_id,
                asset_name=asset.asset_name,
                release_tag=asset.release_tag,
                download_count=asset.download_count,
                delta=max(raw_delta, 0),
                raw_delta=raw_delta,
                baseline=baseline,
                negative_clamped=raw_delta < 0,
            )
        )
    return deltas


def _raise_for_error(repo: str, response: httpx.Response) -> None:
    if response.is_success:
        return
    if response.status_code == 404:
        raise ServiceError(
            SERVICE,
            f"repository {repo!r} was not found, or {TOKEN_ENV} cannot see it (private repos need read access)",
            404,
        )
    # Rate-limit 403s never get here: send_with_retries retries them or raises RateLimited.
    raise describe_error_response(SERVICE, response, credential_hint=TOKEN_ENV)


def _parse_releases(repo: str, payload: Any) -> list[ReleaseAssetSnapshot]:
    if not isinstance(payload, list):
        raise ServiceError(SERVICE, f"expected a list of releases for {repo}, got {type(payload).__name__}")
    snapshots: list[ReleaseAssetSnapshot] = []
    for release in payload:
        try:
            release_id, release_tag = int(release["id"]), str(release["tag_name"])
            for asset in release["assets"]:
                snapshots.append(
                    ReleaseAssetSnapshot(
                        repo=repo,
                        release_id=release_id,
                        release_tag=release_tag,
                        asset_id=int(asset["id"]),
                        asset_name=str(asset["name"]),
                        download_count=int(asset["download_count"]),
                        asset_created_at=_parse_utc(asset["created_at"]),
                    )
                )
        except (KeyError, TypeError, ValueError) as exc:
            raise ServiceError(SERVICE, f"unexpected release entry in {repo}: {exc!r}") from exc
    return snapshots


def _parse_utc(value: str) -> dt.datetime:
    parsed = dt.datetime.fromisoformat(value)
    # GitHub always sends a "Z" suffix; a bare timestamp would still be UTC by its API convention.
    return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed.astimezone(dt.UTC)
