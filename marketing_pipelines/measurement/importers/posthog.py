"""PostHog importer: events and unique persons per UTC day and utm_campaign, one HogQL query per range of days.

PostHog's Query API (``POST /api/projects/{project_id}/query/``, posthog.com/docs/api/queries) runs a HogQL query
and answers ``{"results": [[...], ...], "columns": [...], "types": [...], "hasMore": bool, ...}`` (posthog/schema
``HogQLQueryResponse``). The campaign names and the range's bounds travel as the query's ``values`` (HogQL's
``{placeholder}`` constants), never inside the query text: a campaign's utm value is whatever a link carried.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import dagster as dg
import httpx
from pydantic import Field

from marketing_pipelines.egress import api_root_problem
from marketing_pipelines.http import HttpRetry, RateLimited, ServiceError, describe_error_response, send_with_retries
from marketing_pipelines.measurement.importers.base import (
    MAX_COUNT,
    ImporterNotConfigured,
    MetricRow,
    QuotaExhausted,
    RequestGate,
    error_field,
    every_day,
    hooks,
    is_count,
    response_json,
)
from marketing_pipelines.measurement.sources import POSTHOG, SourceContract
from marketing_pipelines.settings import env_name, setting_field, shown_in_ui

SERVICE = "posthog"
API_KEY_ENV, PROJECT_ID_ENV = env_name("posthog_api_key"), env_name("posthog_project_id")
HOST_ENV = env_name("posthog_host")
COLUMNS = ("day", "campaign", "events", "persons")
# Rows per page. PostHog returns 100 rows without a LIMIT and "up to 50k rows per query before we suggest
# paginating" with one (docs/api/queries); a range run's rows are its days times the campaigns, so a backfill
# run of 100 days and 100 campaigns fits one page.
PAGE_SIZE = 10_000
# A range never needs this many pages; more means the answer keeps saying hasMore (a loop), not data.
MAX_PAGES = 100
# One row per UTC day and campaign. ``toTimeZone(timestamp, 'UTC')``: HogQL shows ``timestamp`` in the project's
# time zone, so a bare toDate would bucket by the project's days; the partitions are UTC days. ``has`` of the
# campaigns' array rather than IN: a ``values`` list is an array constant. ``toString`` makes an event without
# utm_campaign (NULL) match nothing instead of a NULL group. Only LIMIT and OFFSET, integers of ours, are formatted
# in; every value that came from a campaign or a date is a placeholder.
HOGQL = (
    "SELECT toDate(toTimeZone(timestamp, 'UTC')) AS day, toString(properties.utm_campaign) AS campaign, "
    "count() AS events, count(DISTINCT person_id) AS persons "
    "FROM events "
    "WHERE timestamp >= toDateTime({start}, 'UTC') AND timestamp < toDateTime({end}, 'UTC') "
    "AND has({campaigns}, toString(properties.utm_campaign)) "
    "GROUP BY day, campaign "
    "ORDER BY day, campaign "
    "LIMIT %d OFFSET %d"
)
# Shown in PostHog's query_log table, so an admin there can tell these queries from the team's own.
QUERY_NAME = "marketing-pipelines posthog_daily"
# PostHog answers 429 with Retry-After (its API throttles); a wait up to 30 s is slept in the step, a longer one
# raises RateLimited and the asset hands the step back to Dagster. Without a hint, at least a minute: the quota
# is counted per hour.
POSTHOG_HTTP_RETRY = HttpRetry(max_wait_s=30.0, min_rate_limit_wait_s=60.0)


@shown_in_ui
class PostHogClient(dg.ConfigurableResource):
    """Counts campaign events and persons with PostHog's Query API (``POST /api/projects/{id}/query/``, HogQL)."""

    name: ClassVar[str] = "posthog"
    contract: ClassVar[SourceContract] = POSTHOG.contract

    api_key: str | None = setting_field("posthog_api_key")
    project_id: str | None = setting_field("posthog_project_id")
    host: str = setting_field("posthog_host")
    # A query runs for at most 10 s at PostHog and may wait up to 30 s for one of the project's 3 query slots.
    timeout_s: float = Field(default=60.0, gt=0, description="Timeout of each HTTP call, in seconds.")
    page_size: int = Field(default=PAGE_SIZE, ge=1, le=50_000, description="Rows requested per query (LIMIT).")

    def is_configured(self) -> bool:
        return bool(self.api_key) and bool(self.project_id)

    def not_configured_reason(self) -> str:
        missing = [env for env, value in ((API_KEY_ENV, self.api_key), (PROJECT_ID_ENV, self.project_id)) if not value]
        return f"set {' and '.join(missing)}" if missing else ""

    def daily_metrics(
        self, first: dt.date, last: dt.date, keys: Sequence[str], gate: RequestGate | None = None
    ) -> dict[dt.date, list[MetricRow]]:
        """``events`` and ``persons`` of every (UTC day, utm_campaign in ``keys``) of the days ``first`` to
        ``last``, keyed by day (every day present); ``gate`` is asked before each request (the shared quota).

        One query covers the range (grouped by day), paged by LIMIT/OFFSET while PostHog says ``hasMore``."""
        if not self.is_configured():
            raise ImporterNotConfigured(f"{SERVICE}: {self.not_configured_reason()}")
        problem = api_root_problem(self.host)
        if problem:
            raise ServiceError(SERVICE, f"{HOST_ENV} {problem}")
        project = str(self.project_id).strip()
        if not (project.isascii() and project.isdigit()):
            raise ServiceError(SERVICE, f"{PROJECT_ID_ENV} must be the project's number (digits only)")
        by_day: dict[dt.date, list[MetricRow]] = every_day(first, last)
        if not keys:
            return by_day
        seen: set[tuple[dt.date, str]] = set()
        with self._client(gate) as client:
            for page in range(MAX_PAGES):
                body = query_body(first, last, keys, self.page_size, page * self.page_size)
                payload = self._fetch(client, f"/api/projects/{project}/query/", body)
                problems = shape_problems(payload)
                if problems:
                    raise ServiceError(SERVICE, f"unexpected answer: {'; '.join(problems[:3])}")
                results = payload["results"]
                for row in results:
                    day, campaign, events, persons = parse_row(row, first, last)
                    if (day, campaign) in seen:
                        # OFFSET paging over an order that shifted between pages (events ingested meanwhile).
                        raise ServiceError(
                            SERVICE,
                            f"{day} {campaign!r} came twice across pages; the data moved, run again",
                            transient=True,
                        )
                    seen.add((day, campaign))
                    by_day[day] += [
                        MetricRow(day, campaign, "events", events),
                        MetricRow(day, campaign, "persons", persons),
                    ]
                has_more = payload.get("hasMore")
                # Older servers leave hasMore out: a full page may have a next one.
                if not (has_more is True or (has_more is None and len(results) >= self.page_size)):
                    return by_day
        raise ServiceError(SERVICE, f"still hasMore after {MAX_PAGES} pages of {self.page_size} rows; not imported")

    def _client(self, gate: RequestGate | None = None) -> httpx.Client:
        # trust_env=False: HTTP(S)_PROXY / ALL_PROXY in the environment must not route the API key elsewhere.
        return httpx.Client(base_url=self.host, timeout=self.timeout_s, trust_env=False, event_hooks=hooks(gate))

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def _fetch(self, client: httpx.Client, path: str, body: dict[str, Any]) -> Any:
        request = client.build_request("POST", path, json=body, headers={"Authorization": f"Bearer {self.api_key}"})
        try:
            response = send_with_retries(client, request, service=SERVICE, policy=POSTHOG_HTTP_RETRY, sleep=self._sleep)
        except QuotaExhausted:
            raise  # our own shared bucket: nothing was sent
        except RateLimited:
            raise  # PostHog's 429 with a wait longer than a step holds: the asset retries the step after it
        if response.status_code in (401, 403):
            raise describe_error_response(
                SERVICE,
                response,
                credential_hint=f"{API_KEY_ENV} (a personal API key with the Query Read scope on {PROJECT_ID_ENV})",
            )
        if response.status_code == 404:
            raise ServiceError(
                SERVICE,
                f"project not found (HTTP 404): check {PROJECT_ID_ENV} and {HOST_ENV} (US and EU Cloud are separate "
                "hosts): " + error_field(response, "detail"),
                404,
            )
        if response.status_code == 400:
            raise ServiceError(SERVICE, f"query rejected (HTTP 400): {error_field(response, 'detail')}", 400)
        if not response.is_success:
            raise describe_error_response(SERVICE, response)
        return response_json(SERVICE, response)


def query_body(first: dt.date, last: dt.date, keys: Sequence[str], limit: int, offset: int) -> dict[str, Any]:
    """The request for one page: the HogQL text is the same for every range and campaign, the rest are values."""
    end = last + dt.timedelta(days=1)
    return {
        "query": {
            "kind": "HogQLQuery",
            "query": HOGQL % (int(limit), int(offset)),
            "values": {
                "start": f"{first.isoformat()} 00:00:00",
                "end": f"{end.isoformat()} 00:00:00",
                "campaigns": sorted(set(keys)),
            },
        },
        # A re-import exists to read events ingested late: never PostHog's cached answer to the same query.
        "refresh": "force_blocking",
        "name": QUERY_NAME,
    }


def shape_problems(payload: Any) -> list[str]:
    """What in ``payload`` is not a HogQLQueryResponse of ``COLUMNS`` (empty when it is one)."""
    if not isinstance(payload, dict):
        return [f"expected a JSON object, got {type(payload).__name__}"]
    problems = []
    status = payload.get("query_status")
    if isinstance(status, dict) and status.get("complete") is False:
        problems.append("the query is still running (an asynchronous answer)")
    if payload.get("error"):
        problems.append(f"error: {str(payload['error'])[:200]}")
    results = payload.get("results")
    if not isinstance(results, list):
        problems.append(f"'results' is not a list: {type(results).__name__}")
    elif any(not isinstance(row, list) or len(row) != len(COLUMNS) for row in results):
        problems.append(f"a row is not a list of {len(COLUMNS)} values")
    if "columns" in payload and payload["columns"] != list(COLUMNS):
        problems.append(f"columns are {str(payload['columns'])[:200]}, not {list(COLUMNS)}")
    if payload.get("hasMore") not in (None, True, False):
        problems.append(f"'hasMore' is not a boolean: {str(payload['hasMore'])[:50]}")
    return problems


def parse_row(row: list[Any], first: dt.date, last: dt.date) -> tuple[dt.date, str, int, int]:
    """One result row as (day, campaign, events, persons), or a ServiceError saying what is wrong with it."""
    day_text, campaign, events, persons = row
    try:
        day = dt.date.fromisoformat(day_text) if isinstance(day_text, str) else None
    except ValueError:
        day = None
    if day is None or not first <= day <= last:
        raise ServiceError(SERVICE, f"a row's day is not one of {first}..{last}: {str(day_text)[:40]!r}")
    if not isinstance(campaign, str):
        raise ServiceError(SERVICE, f"{day}: a row's campaign is not text: {str(campaign)[:40]!r}")
    for label, value in (("events", events), ("persons", persons)):
        if not is_count(value):
            raise ServiceError(SERVICE, f"{day}: {label} is not a count from 0 to {MAX_COUNT}: {str(value)[:40]!r}")
    if persons > events:
        raise ServiceError(SERVICE, f"{day}: {persons} persons in {events} events")
    return day, campaign, events, persons
