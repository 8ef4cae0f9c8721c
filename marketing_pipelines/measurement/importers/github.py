"""GitHub release-asset importer: cumulative download counts per asset, and the daily deltas derived from them."""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import dagster as dg
import httpx
from pydantic import Field

from marketing_pipelines.egress import api_root_problem
from marketing_pipelines.http import (
    HttpRetry,
    ServiceError,
    describe_error_response,
    is_rate_limited,
    send_with_retries,
)
from marketing_pipelines.measurement.importers.base import RequestGate, error_field, hooks, response_json
from marketing_pipelines.measurement.sources import GITHUB_RELEASES, SourceContract
from marketing_pipelines.redact import redact_url
from marketing_pipelines.settings import env_name, setting_field, shown_in_ui

SERVICE = "github"
TOKEN_ENV = env_name("github_token")
API_URL_ENV = env_name("github_api_url")
# GitHub's largest page for the releases list.
PER_PAGE = 100
_REPO_PATTERN = re.compile(r"[A-Za-z0-9-]+/[A-Za-z0-9._-]+")
# GitHub answers a renamed or transferred repository with 301 (update the name) and may use the other
# redirect codes temporarily. A few hops at most, and only within the configured API root.
PERMANENT_REDIRECTS = frozenset({301, 308})
REDIRECTS = PERMANENT_REDIRECTS | {302, 303, 307}
MAX_REDIRECTS = 3
# "You have exceeded a secondary rate limit" (older servers: "abuse detection mechanism").
_SECONDARY_LIMIT_MESSAGES = ("secondary rate limit", "abuse detection")


def is_github_rate_limited(response: httpx.Response) -> bool:
    """GitHub's rate-limit answers: 429, a 403 with rate-limit headers, or a 403 whose message names a secondary
    limit (it may come with quota left and no Retry-After, and is then no permission error)."""
    if is_rate_limited(response):
        return True
    if response.status_code != 403:
        return False
    return any(phrase in error_field(response, "message").lower() for phrase in _SECONDARY_LIMIT_MESSAGES)


# GitHub's rule: wait Retry-After seconds; else, with x-ratelimit-remaining 0, until x-ratelimit-reset; else at
# least a minute (ignoring it may get the integration banned). A minute is not slept in-process: anything over
# 30 s raises RateLimited, which the asset turns into a Dagster retry.
GITHUB_HTTP_RETRY = HttpRetry(max_wait_s=30.0, min_rate_limit_wait_s=60.0, is_rate_limited=is_github_rate_limited)


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
    """Every asset of a repository's releases, or ``not_modified`` when the ETag still matched.

    ``moved_to`` is the API URL GitHub permanently redirected the listing to (the repository was renamed or
    transferred), None when it was not moved; the assets are still reported under the configured ``repo``.
    """

    not_modified: bool
    etag: str | None
    assets: tuple[ReleaseAssetSnapshot, ...]
    moved_to: str | None = None


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


class GitHubRestClient(dg.ConfigurableResource):
    """What the GitHub importers share: the token, the API root, the timeout and API version, and the httpx client
    that ignores proxy variables."""

    token: str | None = setting_field("github_token")
    # Shown by name when set, as before it was a setting: an Enterprise API root may carry credentials.
    base_url: str = setting_field("github_api_url")
    timeout_s: float = Field(default=30.0, gt=0, description="Timeout of each HTTP call, in seconds.")
    api_version: str = Field(default="2022-11-28", description="Sent as X-GitHub-Api-Version.")

    def _client(self, gate: RequestGate | None = None) -> httpx.Client:
        # trust_env=False: HTTP(S)_PROXY / ALL_PROXY in the environment must not route the token elsewhere.
        return httpx.Client(base_url=self.base_url, timeout=self.timeout_s, trust_env=False, event_hooks=hooks(gate))

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@shown_in_ui
class GitHubReleasesClient(GitHubRestClient):
    """Lists release assets through the GitHub REST API (``GET /repos/{owner}/{repo}/releases``)."""

    name: ClassVar[str] = "github_releases"
    contract: ClassVar[SourceContract] = GITHUB_RELEASES.contract

    def is_configured(self) -> bool:
        # Unauthenticated calls get 60 requests an hour per IP, too few to run unattended.
        return bool(self.token)

    def not_configured_reason(self) -> str:
        return "" if self.is_configured() else f"set {TOKEN_ENV} (unauthenticated GitHub allows 60 requests an hour)"

    def list_release_assets(
        self, repo: str, etag: str | None = None, gate: RequestGate | None = None
    ) -> ReleaseAssetsResult:
        """Every asset of every release of ``repo`` (``owner/name``), following ``Link: rel="next"`` pages;
        ``gate`` is called before each request (the shared quota, measurement/quota.py).

        With ``etag``, a first page GitHub answers 304 returns ``not_modified=True`` and no assets. A renamed or
        transferred repository (301 to ``/repositories/{id}/...``) is followed and reported in ``moved_to``.
        """
        check_repo(repo)
        check_api_root(self.base_url)
        assets: list[ReleaseAssetSnapshot] = []
        first_etag: str | None = None
        moved_to: str | None = None
        pages = 0
        with self._client(gate) as client:
            request = client.build_request(
                "GET", f"/repos/{repo}/releases", params={"per_page": PER_PAGE}, headers=self._headers(etag)
            )
            seen_urls: set[str] = set()
            while True:
                response, moved = send_following_redirects(client, request, repo, sleep=self._sleep)
                if pages == 0:
                    moved_to = moved
                if response.status_code == 304 and pages == 0:
                    return ReleaseAssetsResult(not_modified=True, etag=etag, assets=(), moved_to=moved_to)
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
                if not _within_api(request.url, client.base_url):
                    # The next request carries the token; never send it to a host other than the configured API.
                    raise ServiceError(
                        SERVICE, f"pagination link for {repo} points off {client.base_url.host}: {redact_url(next_url)}"
                    )
                if str(request.url) in seen_urls:
                    raise ServiceError(SERVICE, f"pagination for {repo} loops back to {redact_url(next_url)}")
        # The ETag covers the first page only: an old release on a later page can gain downloads while page one
        # stays byte-identical, so a 304 for a many-page listing would hide those counts. Only a listing that fits
        # on one page is safe to revalidate.
        return ReleaseAssetsResult(
            not_modified=False, etag=first_etag if pages == 1 else None, assets=tuple(assets), moved_to=moved_to
        )

    def _headers(self, etag: str | None) -> dict[str, str]:
        return github_headers(self.token, self.api_version, etag)


def check_repo(repo: str) -> None:
    """A ValueError unless ``repo`` is ``owner/name`` as GitHub spells one: it is a path of every request."""
    if not _REPO_PATTERN.fullmatch(repo) or repo.split("/")[1] in (".", ".."):
        raise ValueError(f"repo must look like 'owner/name', got {repo!r}")


def check_api_root(base_url: str) -> None:
    """A ServiceError naming GITHUB_API_URL unless it is an API root the egress policy allows."""
    problem = api_root_problem(base_url)
    if problem:
        raise ServiceError(SERVICE, f"{API_URL_ENV} {problem}")


def github_headers(token: str | None, api_version: str, etag: str | None = None) -> dict[str, str]:
    """The REST API's headers: its media type and version, the token as Bearer, and ``If-None-Match``."""
    headers = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": api_version}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if etag:
        headers["If-None-Match"] = etag
    return headers


def send_following_redirects(
    client: httpx.Client, request: httpx.Request, repo: str, *, sleep: Callable[[float], None]
) -> tuple[httpx.Response, str | None]:
    """The response to ``request`` after following GitHub's redirects, and where a permanent one led.

    A redirect is repeated with the same headers (token, ETag) only to a URL under the configured API root.
    """
    moved_to: str | None = None
    for _hop in range(MAX_REDIRECTS + 1):
        response = send_with_retries(client, request, service=SERVICE, policy=GITHUB_HTTP_RETRY, sleep=sleep)
        if response.status_code not in REDIRECTS:
            return response, moved_to
        location = response.headers.get("location")
        if not location:
            raise ServiceError(
                SERVICE, f"HTTP {response.status_code} for {repo} without a Location header", response.status_code
            )
        target = request.url.join(location)
        if not _within_api(target, client.base_url):
            raise ServiceError(
                SERVICE,
                f"{repo} redirects (HTTP {response.status_code}) off the configured API "
                f"{redact_url(str(client.base_url))}: {redact_url(str(target))}; not followed",
                response.status_code,
            )
        if response.status_code in PERMANENT_REDIRECTS:
            moved_to = str(target)
            dg.get_dagster_logger().warning(
                f"GitHub repository {repo} moved permanently to {target}; update the campaign's github_repo."
            )
        headers = {name: value for name, value in request.headers.items() if name.lower() != "host"}
        request = client.build_request("GET", target, headers=headers)
    last = redact_url(str(request.url))
    raise ServiceError(SERVICE, f"{repo}: more than {MAX_REDIRECTS} redirects; last to {last}")


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
    # Rate-limit 403s (headers or a secondary-limit message) never get here: send_with_retries retries them or
    # raises RateLimited, so a 403 left here is a permission problem.
    raise describe_error_response(SERVICE, response, credential_hint=TOKEN_ENV)


def _within_api(url: httpx.URL, base_url: httpx.URL) -> bool:
    """Same scheme, host and port as the configured API root, and under its path (GitHub Enterprise: /api/v3/)."""
    base_path = base_url.path if base_url.path.endswith("/") else base_url.path + "/"
    return (
        (url.scheme, url.host, url.port) == (base_url.scheme, base_url.host, base_url.port)
        and (url.path + "/").startswith(base_path)
        and "/../" not in url.path + "/"
    )


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
            # from None: the parser's own error quotes the entry, and Dagster stores a failure's whole cause chain.
            raise ServiceError(SERVICE, f"unexpected release entry in {repo}: {exc!r}") from None
    return snapshots


def _parse_utc(value: str) -> dt.datetime:
    parsed = dt.datetime.fromisoformat(value)
    # GitHub always sends a "Z" suffix; a bare timestamp would still be UTC by its API convention.
    return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed.astimezone(dt.UTC)
