"""Google Analytics 4 importer: sessions, page views and users per day and campaign from the Data API's runReport.

It reads as a service account (OAuth 2.0 for server to server applications): a JWT assertion signed with the
key's private key (``service_account.signed_assertion``) is POSTed to the token endpoint, whose access token (an
hour) is kept by the client and sent as ``Authorization: Bearer`` until five minutes before it expires. The
assertion goes only to Google's token endpoint, or to one ``GA4_TOKEN_URL`` names: a key file's ``token_uri``
alone never decides where a signed assertion is sent.

One ``runReport`` reads a run's whole range of days for every campaign key at once (dimensions ``date`` and
``sessionCampaignName``, an ``inListFilter`` of the keys), paged by limit and offset; ``date`` comes as
``YYYYMMDD``, and days are the property's own (its reporting time zone). Each answer carries the property's
token quota (``returnPropertyQuota``), logged with each import.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import dagster as dg
import httpx
from pydantic import Field, PrivateAttr

from marketing_pipelines.egress import api_root_problem
from marketing_pipelines.http import HttpRetry, RateLimited, ServiceError, describe_error_response, send_with_retries
from marketing_pipelines.measurement.importers.base import (
    ImporterNotConfigured,
    MetricRow,
    RequestGate,
    every_day,
    hooks,
    response_json,
)
from marketing_pipelines.measurement.sources import GA4, SourceContract
from marketing_pipelines.redact import redact_url, remember_secrets
from marketing_pipelines.service_account import (
    GOOGLE_TOKEN_URL,
    ServiceAccountKey,
    ServiceAccountKeyError,
    read_service_account_key,
    secrets_of,
    signed_assertion,
)
from marketing_pipelines.settings import api_key_problem, env_name, setting_field, shown_in_ui
from marketing_pipelines.strict_json import MAX_ENVELOPE_DEPTH, check_text_depth

SERVICE = "ga4"
PROPERTY_ENV, KEY_ENV = env_name("ga4_property_id"), env_name("ga4_service_account_json")
API_URL_ENV, TOKEN_URL_ENV = env_name("ga4_api_url"), env_name("ga4_token_url")
SCOPE = "https://www.googleapis.com/auth/analytics.readonly"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
REPORT_PATH = "/v1beta/properties/{property}:runReport"
DATE, CAMPAIGN = "date", "sessionCampaignName"
# The Data API's metric -> the contract's (sources.GA4): what source_daily_metric stores.
METRICS = {"sessions": "sessions", "screenPageViews": "page_views", "totalUsers": "total_users"}
# GA4 folds rows past its cardinality limits into one "(other)" row (metadata.dataLossFromOtherRow).
OTHER_ROW = "(other)"
# "The API returns a maximum of 250,000 rows per request, no matter how many you ask for" (runReport's limit).
MAX_PAGE_SIZE = 250_000
# A kept token is not sent within this long of its expiry: a page may take a while, and clocks differ.
TOKEN_REFRESH_MARGIN_S = 300.0
DEFAULT_TOKEN_LIFETIME_S = 3600
_DAY = re.compile(r"\d{8}")
_COUNT = re.compile(r"\d{1,18}")
# A standard property has up to 10 server errors per project and hour (PropertyQuota.serverErrorsPerProjectPerHour):
# a 5xx is tried three times, not five, before the step's own retry policy takes over.
REPORT_HTTP_RETRY = HttpRetry(max_attempts=3, max_wait_s=30.0, retry_rate_limits=False)
TOKEN_HTTP_RETRY = HttpRetry(max_attempts=3, max_wait_s=30.0)
# GA4's 429 RESOURCE_EXHAUSTED names the quota it ran out of and carries no Retry-After. Concurrent requests free
# up in seconds; an hourly token quota within the hour: three step retries (assets.RATE_LIMIT_RETRIES) 20 minutes
# apart span it. A spent daily quota is not waited for at all (``_rate_limited``).
CONCURRENT_WAIT_S = 30.0
HOURLY_WAIT_S = 1200.0
# Below this share of a token quota left, the import's log line is a warning.
LOW_QUOTA_SHARE = 0.1


@dataclass(frozen=True)
class _AccessToken:
    value: str
    expires_at: float  # epoch seconds
    issued_for: tuple[str, str]  # (client_email, token endpoint)


@shown_in_ui
class GA4Client(dg.ConfigurableResource):
    """Reads campaign sessions, page views and users from the Google Analytics Data API v1beta
    (``POST /v1beta/properties/{id}:runReport``), signed in as a service account that is a user of the property."""

    name: ClassVar[str] = "ga4"
    contract: ClassVar[SourceContract] = GA4.contract

    property_id: str | None = setting_field("ga4_property_id")
    service_account_json: str | None = setting_field("ga4_service_account_json")
    api_url: str = setting_field("ga4_api_url")
    token_url: str | None = setting_field("ga4_token_url")
    timeout_s: float = Field(default=30.0, gt=0, description="Timeout of each HTTP call, in seconds.")
    page_size: int = Field(default=MAX_PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE, description="Rows requested per page.")

    # The access token, kept for this client's runs until shortly before it expires.
    _token: _AccessToken | None = PrivateAttr(default=None)

    def is_configured(self) -> bool:
        return bool((self.property_id or "").strip()) and bool((self.service_account_json or "").strip())

    def not_configured_reason(self) -> str:
        missing = [
            env
            for env, value in ((PROPERTY_ENV, self.property_id), (KEY_ENV, self.service_account_json))
            if not (value or "").strip()
        ]
        return f"set {' and '.join(missing)}" if missing else ""

    def daily_metrics(
        self, first: dt.date, last: dt.date, keys: Sequence[str], gate: RequestGate | None = None
    ) -> dict[dt.date, list[MetricRow]]:
        """Every (day, campaign) row's sessions, page views and users of the days ``first`` to ``last`` (each day
        present), for the utm_campaign values ``keys``; ``gate`` is called before each report request (the shared
        quota, measurement/quota.py). The token endpoint is not the Data API and is not counted against it."""
        if not self.is_configured():
            raise ImporterNotConfigured(f"{SERVICE}: {self.not_configured_reason()}")
        by_day: dict[dt.date, list[MetricRow]] = every_day(first, last)
        property_number = self._property_number()
        problem = api_root_problem(self.api_url)
        if problem:
            raise ServiceError(SERVICE, f"{API_URL_ENV} {problem}")
        key = self._key()
        token_url = self._token_url(key)
        if not keys:
            return by_day
        seen: set[tuple[dt.date, str]] = set()
        offset = 0
        path = REPORT_PATH.format(property=property_number)
        with self._client() as token_client, self._client(gate) as client:
            while True:
                body = report_body(first, last, keys, offset, self.page_size)
                answer = self._report(client, token_client, key, token_url, path, body)
                rows, row_count = parse_report(answer, first, last)
                for day, campaign, values in rows:
                    if (day, campaign) in seen:
                        # Offset paging over a report GA4 changed between pages (its last 48 hours do).
                        changed = f"the report changed while it was read page by page ({day}); try again"
                        raise ServiceError(SERVICE, changed, transient=True)
                    seen.add((day, campaign))
                    by_day[day].extend(MetricRow(day, campaign, metric, value) for metric, value in values.items())
                offset += len(rows)
                if offset >= row_count:
                    break
                if not rows:
                    raise ServiceError(SERVICE, f"rowCount is {row_count} but the page at offset {offset} is empty")
        log_report_notes(answer)
        return by_day

    def _property_number(self) -> str:
        text = (self.property_id or "").strip().removeprefix("properties/")
        if not (text.isascii() and text.isdigit() and len(text) <= 20):
            raise ServiceError(SERVICE, f"{PROPERTY_ENV} must be the property's number (Admin > Property details)")
        return text

    def _key(self) -> ServiceAccountKey:
        try:
            key = read_service_account_key(self.service_account_json or "")
        except ServiceAccountKeyError as exc:
            raise ServiceError(SERVICE, f"{KEY_ENV} {exc}") from None
        # Hidden from whatever this process shows from now on, should anything echo it.
        remember_secrets(*secrets_of(key))
        return key

    def _token_url(self, key: ServiceAccountKey) -> str:
        """The key's token endpoint, if a signed assertion may go there: Google's, or the one GA4_TOKEN_URL names."""
        allowed = {GOOGLE_TOKEN_URL, *([self.token_url.strip()] if self.token_url and self.token_url.strip() else [])}
        if key.token_uri not in allowed:
            raise ServiceError(
                SERVICE,
                f"the key's token_uri ({redact_url(key.token_uri)}) is not Google's token endpoint "
                f"({GOOGLE_TOKEN_URL}) nor the one {TOKEN_URL_ENV} names; no signed assertion is sent to it. Set "
                f"{TOKEN_URL_ENV} to it if it is yours",
            )
        problem = api_root_problem(key.token_uri)
        if problem:
            raise ServiceError(SERVICE, f"the key's token_uri {problem}")
        return key.token_uri

    def _client(self, gate: RequestGate | None = None) -> httpx.Client:
        # trust_env=False: HTTP(S)_PROXY / ALL_PROXY in the environment must not route the assertion or the token
        # elsewhere. httpx follows no redirect: a token endpoint's 3xx is an error, never a second destination.
        return httpx.Client(base_url=self.api_url, timeout=self.timeout_s, trust_env=False, event_hooks=hooks(gate))

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def _now(self) -> float:
        return time.time()

    def _access_token(self, client: httpx.Client, key: ServiceAccountKey, token_url: str) -> str:
        """The kept token while it has more than TOKEN_REFRESH_MARGIN_S left, else a new one from ``token_url``."""
        now = self._now()
        kept = self._token
        fresh = kept is not None and kept.expires_at - TOKEN_REFRESH_MARGIN_S > now
        if kept is not None and fresh and kept.issued_for == (key.client_email, token_url):
            return kept.value
        assertion = signed_assertion(key, scope=SCOPE, audience=token_url, issued_at=int(now))
        # The assertion buys tokens for an hour: as secret as the key while it lives.
        remember_secrets(assertion)
        request = client.build_request("POST", token_url, data={"grant_type": JWT_BEARER, "assertion": assertion})
        response = send_with_retries(client, request, service=SERVICE, policy=TOKEN_HTTP_RETRY, sleep=self._sleep)
        if not response.is_success:
            raise _token_error(response)
        payload = response_json(SERVICE, response)
        token = payload.get("access_token") if isinstance(payload, dict) else None
        token_type = payload.get("token_type", "Bearer") if isinstance(payload, dict) else None
        lifetime = payload.get("expires_in", DEFAULT_TOKEN_LIFETIME_S) if isinstance(payload, dict) else None
        if not isinstance(token, str) or api_key_problem(token) is not None:
            raise ServiceError(SERVICE, "the token endpoint answered without a usable access_token")
        remember_secrets(token)
        if not isinstance(token_type, str) or token_type.lower() != "bearer":
            raise ServiceError(SERVICE, "the token endpoint answered a token that is not a Bearer token")
        if isinstance(lifetime, bool) or not isinstance(lifetime, int | float) or not 0 < lifetime <= 86_400:
            raise ServiceError(SERVICE, "the token endpoint answered an expires_in that is not 1 to 86400 seconds")
        self._token = _AccessToken(token, now + float(lifetime), (key.client_email, token_url))
        return token

    def _report(
        self,
        client: httpx.Client,
        token_client: httpx.Client,
        key: ServiceAccountKey,
        token_url: str,
        path: str,
        body: Mapping[str, Any],
    ) -> Mapping[str, Any]:
        """One page of the report. A 401 (a token revoked or expired early) gets one new token and one more try."""
        for attempt in (1, 2):
            token = self._access_token(token_client, key, token_url)
            request = client.build_request("POST", path, json=body, headers={"Authorization": f"Bearer {token}"})
            response = send_with_retries(client, request, service=SERVICE, policy=REPORT_HTTP_RETRY, sleep=self._sleep)
            if response.status_code == 401 and attempt == 1:
                self._token = None
                continue
            break
        if response.status_code == 429 or (
            not response.is_success and _google_error(response)[0] == "RESOURCE_EXHAUSTED"
        ):
            raise _rate_limited(response)
        if response.status_code in (401, 403):
            status, message = _google_error(response)
            raise ServiceError(
                SERVICE,
                f"access refused (HTTP {response.status_code} {status}): {message}; check {KEY_ENV} and "
                f"{PROPERTY_ENV}: the service account ({key.client_email}) must be added to the property as a user "
                "(Viewer; GA4 Admin > Property access management), and the Google Analytics Data API enabled in its "
                "Cloud project",
                response.status_code,
            )
        if response.status_code == 400:
            status, message = _google_error(response)
            raise ServiceError(SERVICE, f"report rejected (HTTP 400 {status}): {message}", 400)
        if not response.is_success:
            raise describe_error_response(SERVICE, response)
        answer = response_json(SERVICE, response)
        if not isinstance(answer, dict):
            raise ServiceError(SERVICE, f"the report is not a JSON object: {response.text[:300]}", response.status_code)
        return answer


def report_body(first: dt.date, last: dt.date, keys: Sequence[str], offset: int, limit: int) -> dict[str, Any]:
    """The runReport request of one page: the days ``first`` to ``last`` by date and campaign, for ``keys`` only."""
    return {
        "dateRanges": [{"startDate": first.isoformat(), "endDate": last.isoformat()}],
        "dimensions": [{"name": DATE}, {"name": CAMPAIGN}],
        "metrics": [{"name": metric} for metric in METRICS],
        # Case-sensitive: the rollup joins a campaign's utm_campaign exactly, and a row of another spelling would
        # be a key not asked for.
        "dimensionFilter": {
            "filter": {"fieldName": CAMPAIGN, "inListFilter": {"values": list(keys), "caseSensitive": True}}
        },
        # Offset paging needs a total order: both dimensions, which make a row unique.
        "orderBys": [{"dimension": {"dimensionName": DATE}}, {"dimension": {"dimensionName": CAMPAIGN}}],
        "limit": limit,
        "offset": offset,
        "returnPropertyQuota": True,
    }


def parse_report(
    answer: Mapping[str, Any], first: dt.date, last: dt.date
) -> tuple[list[tuple[dt.date, str, dict[str, int]]], int]:
    """The page's rows as (day, campaign, {metric: count}) and the report's rowCount. proto3 JSON leaves out
    empty and zero fields: no ``rows`` is no row, no ``rowCount`` is 0."""
    rows, row_count = answer.get("rows", []), answer.get("rowCount", 0)
    if not isinstance(rows, list) or isinstance(row_count, bool) or not isinstance(row_count, int) or row_count < 0:
        raise ServiceError(SERVICE, "the report's rows or rowCount are not what runReport answers")
    if not rows:
        return [], row_count
    dimensions = _header_names(answer, "dimensionHeaders")
    metrics = _header_names(answer, "metricHeaders")
    if sorted(dimensions) != sorted((DATE, CAMPAIGN)) or sorted(metrics) != sorted(METRICS):
        raise ServiceError(SERVICE, f"the report's columns are {dimensions + metrics}, not the ones asked for")
    day_at, campaign_at = dimensions.index(DATE), dimensions.index(CAMPAIGN)
    parsed = []
    for row in rows:
        try:
            values = [item["value"] for item in row["dimensionValues"]]
            counts = [item["value"] for item in row["metricValues"]]
            if len(values) != len(dimensions) or len(counts) != len(metrics):
                raise ValueError("a row's values do not match its headers")
            day_text, campaign = values[day_at], values[campaign_at]
            if not (isinstance(day_text, str) and _DAY.fullmatch(day_text)):
                raise ValueError("date is not YYYYMMDD")
            day = dt.datetime.strptime(day_text, "%Y%m%d").date()
            if not isinstance(campaign, str):
                raise ValueError("sessionCampaignName is not text")
            numbers = {}
            for name, count in zip(metrics, counts, strict=True):
                if not (isinstance(count, str) and _COUNT.fullmatch(count)):
                    raise ValueError(f"{name} is not a whole count")
                numbers[METRICS[name]] = int(count)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            # from None: the row is quoted (cut), and Dagster stores a failure's whole cause chain.
            raise ServiceError(SERVICE, f"unexpected report row {str(row)[:300]}: {exc}") from None
        if campaign == OTHER_ROW:
            raise ServiceError(
                SERVICE, 'GA4 folded some rows into "(other)" (dataLossFromOtherRow): import fewer days per run'
            )
        if not first <= day <= last:
            raise ServiceError(SERVICE, f"asked for {first}..{last} but got a row for {day}")
        parsed.append((day, campaign, numbers))
    return parsed, row_count


def _header_names(answer: Mapping[str, Any], field: str) -> list[str]:
    headers = answer.get(field)
    if not isinstance(headers, list) or not all(
        isinstance(h, dict) and isinstance(h.get("name"), str) for h in headers
    ):
        raise ServiceError(SERVICE, f"the report has rows but no {field}")
    return [h["name"] for h in headers]


def log_report_notes(answer: Mapping[str, Any]) -> None:
    """The property's token quota after the import, and what GA4 said of the report's completeness, in the run log."""
    log = dg.get_dagster_logger()
    quota = answer.get("propertyQuota")
    if isinstance(quota, dict):
        shown, low = [], False
        for name in ("tokensPerDay", "tokensPerHour"):
            status = quota.get(name)
            if not isinstance(status, dict):
                continue
            consumed, remaining = status.get("consumed", 0), status.get("remaining", 0)
            if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (consumed, remaining)):
                continue
            shown.append(f"{name} {consumed} consumed, {remaining} remaining")
            low = low or (consumed + remaining > 0 and remaining < LOW_QUOTA_SHARE * (consumed + remaining))
        if shown:
            line = "GA4 property quota: " + "; ".join(shown)
            (log.warning if low else log.info)(line + (" (under a tenth left)" if low else ""))
    metadata = answer.get("metadata")
    if isinstance(metadata, dict):
        if metadata.get("subjectToThresholding") is True:
            log.warning("GA4 may have withheld rows below its thresholds (subjectToThresholding): counts may be low.")
        if metadata.get("samplingMetadatas"):
            log.warning("GA4 sampled this report (samplingMetadatas): its counts are estimates.")


def _google_error(response: httpx.Response) -> tuple[str, str]:
    """Google's ``{"error": {"code", "message", "status"}}`` as (status, message); the body's start otherwise."""
    try:
        check_text_depth(response.text, MAX_ENVELOPE_DEPTH)  # response.json() would recurse past the stack
        payload = response.json()
    except ValueError:
        return "", response.text[:300].strip()
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        status, message = error.get("status"), error.get("message")
        return (status if isinstance(status, str) else ""), (message if isinstance(message, str) else "")[:500]
    return "", response.text[:300].strip()


def _rate_limited(response: httpx.Response) -> ServiceError:
    """GA4's 429 RESOURCE_EXHAUSTED: RateLimited (the asset retries the step after the wait) for concurrent requests
    and hourly tokens; a spent daily quota fails the partition at once (a day's wait would hold a run slot all day):
    the schedule reads the day again with its revision days, or re-run it tomorrow."""
    status, message = _google_error(response)
    said = f"HTTP {response.status_code} {status}: {message}"
    hint = response.headers.get("retry-after", "")
    if hint.isdigit():
        return RateLimited(SERVICE, float(hint), said)
    lowered = message.lower()
    if "per day" in lowered or "daily" in lowered:
        return ServiceError(
            SERVICE, f"the property's daily token quota is spent ({said}); the import is not retried today", 429
        )
    if "concurrent" in lowered:
        return RateLimited(SERVICE, CONCURRENT_WAIT_S, said)
    return RateLimited(SERVICE, HOURLY_WAIT_S, said)


def _token_error(response: httpx.Response) -> ServiceError:
    """The token endpoint's refusal (``{"error", "error_description"}``) in one line naming the key's variable."""
    try:
        check_text_depth(response.text, MAX_ENVELOPE_DEPTH)
        payload = response.json()
    except ValueError:
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("error"), str):
        described = payload.get("error_description")
        said = payload["error"] + (f": {described[:300]}" if isinstance(described, str) and described else "")
    else:
        said = response.text[:300].strip()
    return ServiceError(
        SERVICE,
        f"the token endpoint refused the service account's assertion (HTTP {response.status_code}: {said}); check "
        f"{KEY_ENV} (a deleted or disabled key or service account), and this machine's clock",
        response.status_code,
        transient=response.status_code >= 500,
    )
