"""Plausible Stats API v2 importer: visitors and pageviews per day, UTM campaign and page, for a range of days."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import dagster as dg
import httpx
from pydantic import Field

from marketing_pipelines.egress import api_root_problem
from marketing_pipelines.http import (
    HttpRetry,
    RateLimited,
    ServiceError,
    describe_error_response,
    send_with_retries,
)
from marketing_pipelines.measurement.importers.base import (
    ImporterNotConfigured,
    QuotaExhausted,
    RequestGate,
    error_field,
    every_day,
    hooks,
    response_json,
)
from marketing_pipelines.measurement.sources import SITE_ANALYTICS, SourceContract
from marketing_pipelines.settings import env_name, setting_field, shown_in_ui

SERVICE = "plausible"
API_KEY_ENV, SITE_ID_ENV = env_name("plausible_api_key"), env_name("plausible_site_id")
QUERY_PATH = "/api/v2/query"
METRICS = ("visitors", "pageviews")
DIMENSIONS = ("time:day", "visit:utm_campaign", "event:page")
# Plausible labels an empty UTM value "(not set)" in results and maps that label back to the empty value in
# filters; "(none)" is only special for custom properties, so filtering on it would keep untagged visits.
NO_CAMPAIGN = "(not set)"
# The API's own ceiling for pagination.limit.
MAX_PAGE_SIZE = 10_000
# Plausible limits each API key to N requests per hour (600 by default) and answers 429 with no Retry-After and
# no rate-limit headers, only {"error": "Too many API requests. Your API key is limited to 600 requests per hour."}.
# A retry within the hour only spends more of the same window, so a 429 is never retried in-process: the one
# request fails the partition at once (5xx and transport errors are still retried with backoff).
RATE_LIMIT_WINDOW_S = SITE_ANALYTICS.contract.quota.period_s
PLAUSIBLE_HTTP_RETRY = HttpRetry(min_rate_limit_wait_s=RATE_LIMIT_WINDOW_S)


@dataclass(frozen=True)
class SiteAnalyticsRow:
    """Visitors and pageviews of one page on one day (in the site's Plausible time zone) from one campaign's visits."""

    day: dt.date
    utm_campaign: str
    page: str
    visitors: int
    pageviews: int


@shown_in_ui
class PlausibleClient(dg.ConfigurableResource):
    """Reads campaign traffic from the Plausible Stats API v2 (``POST /api/v2/query``)."""

    name: ClassVar[str] = "plausible"
    contract: ClassVar[SourceContract] = SITE_ANALYTICS.contract

    api_key: str | None = setting_field("plausible_api_key")
    site_id: str | None = setting_field("plausible_site_id")
    # Shown by name when set, as before it was a setting: a self-hosted origin may carry credentials.
    base_url: str = setting_field("plausible_base_url")
    timeout_s: float = Field(default=30.0, gt=0, description="Timeout of each HTTP call, in seconds.")
    page_size: int = Field(default=MAX_PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE, description="Rows requested per page.")

    def is_configured(self) -> bool:
        return bool(self.api_key) and bool(self.site_id)

    def not_configured_reason(self) -> str:
        missing = [env for env, value in ((API_KEY_ENV, self.api_key), (SITE_ID_ENV, self.site_id)) if not value]
        return f"set {' and '.join(missing)}" if missing else ""

    def campaign_stats(
        self, first: dt.date, last: dt.date, gate: RequestGate | None = None
    ) -> dict[dt.date, list[SiteAnalyticsRow]]:
        """Every (day, campaign, page) row of the days ``first`` to ``last``, keyed by day (every day present).
        ``gate`` is called before each request (the shared quota, measurement/quota.py).

        One query covers the whole range, since the results are already broken down by ``time:day``: a
        backfill of a year spends as many requests as it has pages of rows, not one per day, against
        Plausible's hourly request limit.
        """
        if not self.is_configured():
            raise ImporterNotConfigured(f"{SERVICE}: {self.not_configured_reason()}")
        problem = api_root_problem(self.base_url)
        if problem:
            raise ServiceError(SERVICE, f"{env_name('plausible_base_url')} {problem}")
        by_day: dict[dt.date, list[SiteAnalyticsRow]] = every_day(first, last)
        offset = 0
        with self._client(gate) as client:
            while True:
                page = self._fetch_page(client, self._query_body(first, last, offset))
                for item in page:
                    row = _parse_row(item, first, last)
                    by_day[row.day].append(row)
                if len(page) < self.page_size:
                    return by_day
                offset += self.page_size

    def _query_body(self, first: dt.date, last: dt.date, offset: int) -> dict[str, Any]:
        """The JSON query for one page of the days ``first`` to ``last``."""
        return {
            "site_id": self.site_id,
            "metrics": list(METRICS),
            "date_range": [first.isoformat(), last.isoformat()],
            "dimensions": list(DIMENSIONS),
            "filters": [["is_not", "visit:utm_campaign", [NO_CAMPAIGN]]],
            # The default order (time, then visitors desc) ties between rows, and offset pagination over a
            # non-total order can repeat or skip rows; ordering by every dimension makes each row's position fixed.
            "order_by": [[dimension, "asc"] for dimension in DIMENSIONS],
            "pagination": {"limit": self.page_size, "offset": offset},
        }

    def _client(self, gate: RequestGate | None = None) -> httpx.Client:
        # trust_env=False: HTTP(S)_PROXY / ALL_PROXY in the environment must not route the API key elsewhere.
        return httpx.Client(base_url=self.base_url, timeout=self.timeout_s, trust_env=False, event_hooks=hooks(gate))

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def _fetch_page(self, client: httpx.Client, body: dict[str, Any]) -> list[Any]:
        request = client.build_request(
            "POST", QUERY_PATH, json=body, headers={"Authorization": f"Bearer {self.api_key}"}
        )
        try:
            response = send_with_retries(
                client, request, service=SERVICE, policy=PLAUSIBLE_HTTP_RETRY, sleep=self._sleep
            )
        except QuotaExhausted:
            raise  # our own shared bucket, not Plausible's answer: nothing was spent, the step retries later
        except RateLimited as exc:
            # A ServiceError, not RateLimited: the asset fails the partition instead of turning it into a Dagster
            # retry that would hold the run for the rest of the hour (or hammer a window that has not reset).
            when = "after the hour" if exc.retry_after_s >= RATE_LIMIT_WINDOW_S else f"in {exc.retry_after_s:.0f}s"
            raise ServiceError(
                SERVICE, f"rate limited by Plausible (hourly request limit); retry {when}: {exc.detail}", 429
            ) from exc
        if response.status_code in (401, 403):
            # Plausible answers a wrong site_id with the same 401 as a wrong key.
            raise describe_error_response(
                SERVICE, response, credential_hint=f"{API_KEY_ENV} (a Stats API key that can read {SITE_ID_ENV})"
            )
        if response.status_code == 400:
            raise ServiceError(SERVICE, f"query rejected (HTTP 400): {error_field(response, 'error')}", 400)
        if not response.is_success:
            raise describe_error_response(SERVICE, response)
        payload = response_json(SERVICE, response)
        results = payload.get("results") if isinstance(payload, dict) else None
        if not isinstance(results, list):
            raise ServiceError(SERVICE, f"response has no 'results' list: {response.text[:300]}", response.status_code)
        return results


def _parse_row(item: Any, first: dt.date, last: dt.date) -> SiteAnalyticsRow:
    try:
        (row_day, campaign, page), (visitors, pageviews) = item["dimensions"], item["metrics"]
        row = SiteAnalyticsRow(
            day=dt.date.fromisoformat(row_day),
            utm_campaign=str(campaign),
            page=str(page),
            visitors=int(visitors),
            pageviews=int(pageviews),
        )
    except (KeyError, TypeError, ValueError) as exc:
        # from None: the parser's own error quotes the row, and Dagster stores a failure's whole cause chain.
        raise ServiceError(SERVICE, f"unexpected result row {item!r}: {exc}") from None
    if not first <= row.day <= last:
        # Callers replace exactly the asked days' partitions with these rows; a row from another day would land in one.
        asked = first.isoformat() if first == last else f"{first.isoformat()}..{last.isoformat()}"
        raise ServiceError(SERVICE, f"asked for {asked} but got a row for {row.day.isoformat()}")
    return row
