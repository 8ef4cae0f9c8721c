"""The interface every measurement importer resource meets, its not-configured error, and shared JSON decoding."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import httpx

from marketing_pipelines.http import RateLimited, ServiceError
from marketing_pipelines.measurement.sources import SourceContract
from marketing_pipelines.strict_json import MAX_ENVELOPE_DEPTH, check_text_depth


class ImporterNotConfigured(Exception):
    """An importer was asked for data before its credentials were set; the message names the env vars."""


# Called with every request a client is about to send (an httpx request hook, so the HTTP client's own retries
# count too): measurement/quota.py's gate takes one request from the source's shared bucket or raises
# QuotaExhausted. The clients know nothing of the database that holds the bucket.
RequestGate = Callable[[httpx.Request], None]


class QuotaExhausted(RateLimited):
    """The source's request quota, shared by every replica, has no request left within the wait a step may hold.

    Raised before the request is sent: nothing was spent at the source. The asset hands the step back to Dagster
    to retry after ``retry_after_s`` rather than meet the source's 429.
    """


# A count no source reaches for one key, day and metric; larger is a corrupt or hostile answer. The importers refuse
# an answer past it, and the asset checks every importer's rows against it again (assets.checked_metric_rows).
MAX_COUNT = 10**12


def is_count(value: Any) -> bool:
    """A whole count from 0 to MAX_COUNT: JSON true is a Python int, and a float (1.5, 1e300, NaN) is no count."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def every_day(first: dt.date, last: dt.date) -> dict[dt.date, list[Any]]:
    """Each day ``first`` to ``last`` with no rows yet, as an importer answers every day of its range; a ValueError
    when the range ends before it starts."""
    if last < first:
        raise ValueError(f"range ends ({last}) before it starts ({first})")
    return {first + dt.timedelta(days=n): [] for n in range((last - first).days + 1)}


def hooks(gate: RequestGate | None) -> dict[str, list[Callable[..., Any]]]:
    """The ``event_hooks`` of an importer's httpx client: the quota gate on every request, when there is one."""
    return {"request": [gate]} if gate is not None else {}


@runtime_checkable
class Importer(Protocol):
    """What assets and sensors need to know about an importer before they call it.

    ``name`` and ``contract`` are read-only properties so an implementation can declare them as ``ClassVar``s:
    on a Dagster resource an annotated instance attribute would become a config field.
    """

    @property
    def name(self) -> str: ...

    @property
    def contract(self) -> SourceContract:
        """What the source promises (sources.py): lookback, revisions, count kind, uniques, quota, retention."""
        ...

    def is_configured(self) -> bool: ...

    def not_configured_reason(self) -> str:
        """One line naming the env vars to set, e.g. ``set PLAUSIBLE_API_KEY and PLAUSIBLE_SITE_ID``."""
        ...


@dataclass(frozen=True)
class MetricRow:
    """One number of a source for one day and one campaign key (source_daily_metric), split by ``dimension``
    (a page, a referrer) where the source has one, else ``""``."""

    day: dt.date
    key: str
    metric: str
    value: int
    dimension: str = ""


@runtime_checkable
class MetricImporter(Importer, Protocol):
    """An importer built on the source contract: its asset, store and rollup rows are the generic ones."""

    def daily_metrics(
        self, first: dt.date, last: dt.date, keys: Sequence[str], gate: RequestGate | None = None
    ) -> dict[dt.date, list[MetricRow]]:
        """Every row of the days ``first`` to ``last`` (each day present, maybe empty) for the campaign ``keys``
        (values of the campaign column its contract matches), asking ``gate`` before each request."""
        ...


def error_field(response: httpx.Response, field: str, limit: int = 300) -> str:
    """The service's own words for an error: its JSON body's ``field`` when that is text (Plausible's and npm's
    ``error``, GitHub's ``message``, PostHog's ``detail``), else the start of the body (a proxy's HTML page)."""
    try:
        check_text_depth(response.text, MAX_ENVELOPE_DEPTH)  # response.json() would recurse past the stack
        payload = response.json()
    except ValueError:
        return response.text[:limit].strip()
    if isinstance(payload, dict) and isinstance(payload.get(field), str):
        return payload[field][:limit]
    return response.text[:limit].strip()


def response_json(service: str, response: httpx.Response) -> Any:
    """The response body as JSON, or a ServiceError saying it was not valid JSON (never a bare JSONDecodeError)."""
    try:
        # Depth first: response.json() recurses per level and raises RecursionError on "[" * 10**5.
        check_text_depth(response.text, MAX_ENVELOPE_DEPTH)
        return response.json()
    except ValueError as exc:
        # A body cut off mid-transfer, or an HTML error page from a proxy, lands here.
        raise ServiceError(
            service,
            f"response was not valid JSON (HTTP {response.status_code} from {response.request.url}, "
            f"{len(response.content)} bytes): {exc}",
            response.status_code,
        ) from exc
