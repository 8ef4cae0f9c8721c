"""GitHub traffic importer: views and clones of the campaigns' repositories per UTC day, with their uniques.

GitHub's traffic API (docs.github.com/rest/metrics/traffic) answers ``GET /repos/{owner}/{repo}/traffic/views``
and ``/traffic/clones`` with ``per=day`` as ``{"count", "uniques", "views" | "clones": [{"timestamp", "count",
"uniques"}, ...]}``: one entry per UTC day of the last 14 days, timestamps at UTC midnight, a day without traffic
left out (read here as 0). Nothing older is kept, so a day must be read within the window (the contract's
lookback and retention, sources.py). Both need push access to the repository.

Referrers and popular paths (``/traffic/popular/referrers``, ``/traffic/popular/paths``) are not imported: they
are totals of the whole 14 days with no day's number, so they cannot be a day's row.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, ClassVar

import dagster as dg
import httpx

from marketing_pipelines.http import ServiceError, describe_error_response
from marketing_pipelines.measurement.importers.base import (
    MAX_COUNT,
    ImporterNotConfigured,
    MetricRow,
    RequestGate,
    error_field,
    every_day,
    is_count,
    response_json,
)
from marketing_pipelines.measurement.importers.github import (
    SERVICE,
    TOKEN_ENV,
    GitHubRestClient,
    check_api_root,
    check_repo,
    github_headers,
    send_following_redirects,
)
from marketing_pipelines.measurement.sources import GITHUB_TRAFFIC, SourceContract
from marketing_pipelines.settings import env_name, setting_field, shown_in_ui

ENABLED_ENV = env_name("github_traffic_enabled")
KINDS = ("views", "clones")
# The metrics of one kind's answer: its day's count (summed) and its day's uniques (per day only).
METRICS = {"views": ("views", "view_uniques"), "clones": ("clones", "clone_uniques")}
# The API keeps the last 14 days. An answer's day older than that, or later than today, is not GitHub's
# window; one day past today is allowed for our clock trailing GitHub's at midnight.
WINDOW_DAYS = 14
CLOCK_SKEW_DAYS = 1
PERMISSION = (
    f"{TOKEN_ENV} needs push access to the repository (a classic token with the repo scope, or a fine-grained "
    f'token with the repository permission "Administration: read"), or unset {ENABLED_ENV}'
)


@shown_in_ui
class GitHubTrafficClient(GitHubRestClient):
    """Reads views and clones per day through the GitHub REST API (``GET /repos/{owner}/{repo}/traffic/views``
    and ``/traffic/clones``, ``per=day``); two requests per repository, whatever the run's range."""

    name: ClassVar[str] = "github_traffic"
    contract: ClassVar[SourceContract] = GITHUB_TRAFFIC.contract

    enabled: bool = setting_field("github_traffic_enabled")

    def is_configured(self) -> bool:
        return bool(self.token) and self.enabled

    def not_configured_reason(self) -> str:
        missing = [env for env, on in ((TOKEN_ENV, bool(self.token)), (f"{ENABLED_ENV}=true", self.enabled)) if not on]
        return f"set {' and '.join(missing)}" if missing else ""

    def daily_metrics(
        self, first: dt.date, last: dt.date, keys: Sequence[str], gate: RequestGate | None = None
    ) -> dict[dt.date, list[MetricRow]]:
        """``views``, ``clones``, ``view_uniques`` and ``clone_uniques`` of every repository in ``keys``
        (``owner/name``) for each day ``first`` to ``last`` (a day GitHub leaves out is 0), keyed by day (every
        day present); ``gate`` is asked before each request (the shared quota)."""
        if not self.is_configured():
            raise ImporterNotConfigured(f"{SERVICE}: {self.not_configured_reason()}")
        check_api_root(self.base_url)
        by_day: dict[dt.date, list[MetricRow]] = every_day(first, last)
        days = list(by_day)
        today = self._today()
        oldest = today - dt.timedelta(days=self.contract.lookback_days or 0)
        if first < oldest:
            # GitHub would answer without them, and the 0s read for them would replace what was stored.
            raise ServiceError(
                SERVICE, f"traffic is kept {WINDOW_DAYS} days: {first} is before {oldest}; nothing was requested"
            )
        repos = []
        for repo in sorted(set(keys)):
            try:
                check_repo(repo)
            except ValueError:
                dg.get_dagster_logger().warning(
                    f"GitHub traffic: {repo[:200]!r} is not owner/name; its traffic is not imported. Check the "
                    "campaign's github_repo."
                )
                continue
            repos.append(repo)
        with self._client(gate) as client:
            for repo in repos:
                counted = {kind: self._traffic(client, repo, kind, today) for kind in KINDS}
                for day in days:
                    for kind, (count_metric, uniques_metric) in METRICS.items():
                        count, uniques = counted[kind].get(day, (0, 0))
                        by_day[day] += [
                            MetricRow(day, repo, count_metric, count),
                            MetricRow(day, repo, uniques_metric, uniques),
                        ]
        return by_day

    def _traffic(self, client: httpx.Client, repo: str, kind: str, today: dt.date) -> dict[dt.date, tuple[int, int]]:
        request = client.build_request(
            "GET",
            f"/repos/{repo}/traffic/{kind}",
            params={"per": "day"},
            headers=github_headers(self.token, self.api_version),
        )
        response, _moved_to = send_following_redirects(client, request, repo, sleep=self._sleep)
        # Rate-limit 403s never get here (send_with_retries retries them or raises RateLimited): a 403 left here
        # is the missing push access.
        if response.status_code == 403:
            said = error_field(response, "message", limit=200)
            raise ServiceError(SERVICE, f"traffic of {repo} refused (HTTP 403: {said}): {PERMISSION}", 403)
        if response.status_code == 404:
            raise ServiceError(
                SERVICE,
                f"traffic of {repo} not found (HTTP 404): the repository does not exist, or {PERMISSION}",
                404,
            )
        if not response.is_success:
            raise describe_error_response(SERVICE, response, credential_hint=TOKEN_ENV)
        return parse_traffic(response_json(SERVICE, response), kind, repo, today)

    def _today(self) -> dt.date:
        return dt.datetime.now(dt.UTC).date()


def parse_traffic(payload: Any, kind: str, repo: str, today: dt.date) -> dict[dt.date, tuple[int, int]]:
    """Each day of a ``views`` or ``clones`` answer as (count, uniques), or a ServiceError in one line saying what
    keeps it from being GitHub's answer for the 14 days up to ``today``."""

    def refuse(problem: str) -> ServiceError:
        return ServiceError(SERVICE, f"unexpected {kind} answer for {repo}: {problem}")

    if not isinstance(payload, dict):
        raise refuse(f"expected a JSON object, got {type(payload).__name__}")
    for total in ("count", "uniques"):
        if total in payload and not is_count(payload[total]):
            raise refuse(f"{total} is not a count from 0 to {MAX_COUNT}: {str(payload[total])[:40]!r}")
    entries = payload.get(kind)
    if not isinstance(entries, list):
        raise refuse(f"{kind!r} is not a list: {type(entries).__name__}")
    oldest, newest = today - dt.timedelta(days=WINDOW_DAYS), today + dt.timedelta(days=CLOCK_SKEW_DAYS)
    counts: dict[dt.date, tuple[int, int]] = {}
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict) or not {"timestamp", "count", "uniques"} <= set(entry):
            raise refuse(f"{kind}[{n}] is not an object of timestamp, count and uniques")
        day = _utc_midnight(entry["timestamp"])
        if day is None:
            raise refuse(f"{kind}[{n}].timestamp is not a UTC midnight: {str(entry['timestamp'])[:40]!r}")
        if not oldest <= day <= newest:
            raise refuse(f"{day} is outside the {WINDOW_DAYS} days up to {today}")
        count, uniques = entry["count"], entry["uniques"]
        for label, value in (("count", count), ("uniques", uniques)):
            if not is_count(value):
                raise refuse(f"{day}: {label} is not a count from 0 to {MAX_COUNT}: {str(value)[:40]!r}")
        if uniques > count:
            raise refuse(f"{day}: {uniques} uniques of {count}")
        if day in counts:
            raise refuse(f"{day} came twice")
        counts[day] = (count, uniques)
    return counts


def _utc_midnight(value: Any) -> dt.date | None:
    """The day of an ISO 8601 timestamp at 00:00:00 UTC (``2016-10-10T00:00:00Z``), else None."""
    if not isinstance(value, str) or len(value) > 40:
        return None
    try:
        at = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    if at.utcoffset() != dt.timedelta(0) or at.time() != dt.time(0):
        return None
    return at.date()
