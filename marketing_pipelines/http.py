"""Retrying HTTP for every outside service (webhooks, importers, model providers).

One place decides what is retryable and how long to wait, so the GitHub importer, the
Plausible importer and the model providers all honour the same server hints:
``retry-after-ms`` (milliseconds; OpenAI and Anthropic), ``Retry-After`` (seconds or an HTTP
date) and ``X-RateLimit-Reset`` (epoch seconds, read only while ``X-RateLimit-Remaining`` is 0).
What a service means by "rate limited" beyond 429, and how long it wants to be left alone when
it gives no hint, is its ``HttpRetry``: the generic code knows no service by name.
"""

from __future__ import annotations

import datetime
import email.utils
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from marketing_pipelines.redact import error_text, redact_text, redact_url, remember_headers, shown_cell


class _RedactedRecords(logging.Filter):
    """httpx logs every request at INFO with its whole URL (``HTTP Request: POST https://hooks.slack.com/
    services/T0/B0/<token> ...``); a deployment that raises the log level would show the token."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact_text(record.getMessage()), None
        return True


_REDACTED_RECORDS = _RedactedRecords()


def redact_httpx_logs() -> None:
    """Install the redacting filter on the "httpx" logger, which every httpx client (sync or async) logs its
    requests to. Idempotent; called here for the clients that use this module (the providers, the importers)
    and by the webhook client, which does not."""
    logging.getLogger("httpx").addFilter(_REDACTED_RECORDS)  # a filter added twice is kept once


redact_httpx_logs()

# 529 is Anthropic's "overloaded".
RETRYABLE_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504, 529})
# No header can make us wait longer than this: a negative, NaN or absurd hint is clamped or ignored.
MAX_WAIT_HINT_S = 24 * 3600.0


class ServiceError(RuntimeError):
    """A call to an outside service failed for good; the message names the service and the fix.

    ``transient`` marks a failure that a later attempt may not meet: 5xx answers or transport errors
    that outlasted every in-process attempt. A Dagster step may retry those; a rejected credential or
    query fails the same way each time.
    """

    def __init__(self, service: str, message: str, status: int | None = None, *, transient: bool = False) -> None:
        # The message quotes what a service answered, which may echo a credential (whole, cut or re-encoded) and
        # hold control characters: it is made showable once, here, so every place that stores or shows it (a
        # Dagster failure's description, the event log, a CLI line) holds only the redacted line.
        super().__init__(shown_cell(f"{service}: {message}"))
        self.service = service
        self.status = status
        self.transient = transient


class RateLimited(ServiceError):
    """The service asked us to wait longer than the caller is willing to block.

    Callers inside Dagster turn this into ``dg.RetryRequested(seconds_to_wait=...)`` so a
    step does not hold a worker (or a pool slot) asleep for the whole window.
    ``detail`` is the service's own words (status and start of the body), when there were any.
    """

    def __init__(
        self, service: str, retry_after_s: float, detail: str = "", rate_limits: dict[str, float] | None = None
    ) -> None:
        retry_after_s = _clamp_wait(retry_after_s)
        if retry_after_s is None:
            retry_after_s = MAX_WAIT_HINT_S
        suffix = f" ({detail})" if detail else ""
        super().__init__(service, f"rate limited; retry in {retry_after_s:.0f}s{suffix}", status=429)
        self.retry_after_s = retry_after_s
        self.detail = detail
        # The limits per minute the answer's headers stated (a model provider's, by LIMIT_UNITS name), maybe none.
        self.rate_limits: dict[str, float] = dict(rate_limits or {})


def is_rate_limited(response: httpx.Response) -> bool:
    """429, or a 403 that carries rate-limit headers (exhausted quota, or a Retry-After).

    Any other 403 is a real permission error. A service whose rate-limit 403 says so only in its
    body (GitHub's secondary limit) passes its own check as ``HttpRetry.is_rate_limited``.
    """
    if response.status_code == 429:
        return True
    if response.status_code != 403:
        return False
    return response.headers.get("x-ratelimit-remaining") == "0" or "retry-after" in response.headers


@dataclass(frozen=True)
class HttpRetry:
    max_attempts: int = 5
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0
    # A hint longer than this is not slept through: RateLimited is raised instead.
    max_wait_s: float = 60.0
    # The least wait after a rate-limited answer that gave no hint (GitHub asks for a minute, Plausible's
    # window is an hour). 0 falls back to jittered backoff. Above max_wait_s it means "raise RateLimited now".
    min_rate_limit_wait_s: float = 0.0
    # Which answers are rate limits; None is is_rate_limited (429 and a 403 with rate-limit headers).
    is_rate_limited: Callable[[httpx.Response], bool] | None = None
    # False: a rate-limited answer is returned at once, unretried, for the caller to classify (the model
    # providers: their wait is shared through the database with every replica, not slept in one process).
    retry_rate_limits: bool = True

    def rate_limited(self, response: httpx.Response) -> bool:
        return (self.is_rate_limited or is_rate_limited)(response)


def _clamp_wait(seconds: float) -> float | None:
    """``seconds`` within [0, MAX_WAIT_HINT_S]; None for NaN, which is no hint at all."""
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), MAX_WAIT_HINT_S)


def _parse_seconds(value: str) -> float | None:
    try:
        return _clamp_wait(float(value))
    except ValueError:
        return None


def server_wait_hint(response: httpx.Response, now: float | None = None) -> float | None:
    """Seconds the server asked us to wait, from its headers, or None when it gave no (readable) hint.

    Order as in the OpenAI and Anthropic SDKs: ``retry-after-ms``, then ``retry-after`` (seconds or an
    HTTP date), then ``x-ratelimit-reset`` when ``x-ratelimit-remaining`` is 0 (or absent on a 429).
    Every result lies in [0, MAX_WAIT_HINT_S].
    """
    now = time.time() if now is None else now
    retry_after_ms = response.headers.get("retry-after-ms")
    if retry_after_ms:
        try:
            hint = _clamp_wait(float(retry_after_ms) / 1000.0)
        except ValueError:
            hint = None  # unreadable: try the other headers
        if hint is not None:
            return hint
    retry_after = response.headers.get("retry-after")
    if retry_after:
        hint = _parse_seconds(retry_after)
        if hint is not None:
            return hint
        try:
            parsed = email.utils.parsedate_to_datetime(retry_after)
        except (TypeError, ValueError, OverflowError):
            parsed = None  # a hint we cannot read is no hint; fall back to backoff
        if parsed is not None:
            if parsed.tzinfo is None:  # "-0000" parses naive; HTTP dates are GMT
                parsed = parsed.replace(tzinfo=datetime.UTC)
            return _clamp_wait(parsed.timestamp() - now)
    reset = response.headers.get("x-ratelimit-reset")
    remaining = response.headers.get("x-ratelimit-remaining")
    # The reset is when the quota refills; it says nothing about a limit hit with quota left (GitHub's
    # secondary limits answer with remaining > 0 and the primary window's reset, maybe an hour away).
    if reset and (remaining == "0" or (remaining is None and response.status_code == 429)):
        try:
            return _clamp_wait(float(reset) - now)
        except ValueError:
            return None
    return None


def send_with_retries(
    client: httpx.Client,
    request: httpx.Request,
    *,
    service: str,
    policy: HttpRetry = HttpRetry(),
    sleep: Callable[[float], None] = time.sleep,
) -> httpx.Response:
    """Send ``request``, retrying transport errors, 5xx and rate limits (429, and what the policy counts).

    Returns the first non-retryable response (the caller decides what a 4xx means) or raises
    ServiceError / RateLimited once the attempts are spent. A wait longer than ``policy.max_wait_s``
    is never slept: RateLimited is raised at once. A request the HTTP stack cannot even write (a
    header value with a newline) is not retried. Every message is redacted (``redact.error_text``):
    the stack's errors quote URLs and, for a refused header, its value, often an API key. The request's
    header values are remembered as secrets first (``redact.remember_headers``).
    """
    # Whatever the service answers may echo a credential we sent (OpenAI's 401 quotes the key): every later
    # redaction in this process hides these values, the token after an authorization scheme included.
    remember_headers(request.headers)
    last_problem = "no attempt made"
    last_hint: float | None = None
    rate_limited = False
    for attempt in range(1, policy.max_attempts + 1):
        try:
            response = client.send(request)
        except httpx.LocalProtocolError as exc:
            # Raised before anything is sent, the same way on every attempt: not transient.
            raise ServiceError(service, f"the request could not be sent ({error_text(exc)})") from None
        except httpx.TransportError as exc:
            last_problem = error_text(exc)
            hint = None
            rate_limited = False
        else:
            rate_limited = policy.rate_limited(response)
            if response.status_code not in RETRYABLE_STATUSES and not rate_limited:
                return response
            if rate_limited and not policy.retry_rate_limits:
                return response
            response.read()
            last_problem = redact_text(f"HTTP {response.status_code}: {response.text[:200].strip()}")
            hint = server_wait_hint(response)
            if hint is None and rate_limited and policy.min_rate_limit_wait_s > 0:
                hint = policy.min_rate_limit_wait_s
            last_hint = hint
            if hint is not None and hint > policy.max_wait_s:
                raise RateLimited(service, hint, last_problem)
        if attempt == policy.max_attempts:
            break
        if hint is None:
            # Full jitter: replicas that failed together do not retry together.
            hint = random.uniform(0, min(policy.max_delay_s, policy.base_delay_s * 2 ** (attempt - 1)))
        sleep(hint)
    if rate_limited:
        wait = last_hint if last_hint is not None else max(policy.max_delay_s, policy.min_rate_limit_wait_s)
        raise RateLimited(service, wait, last_problem)
    raise ServiceError(service, f"gave up after {policy.max_attempts} attempts ({last_problem})", transient=True)


def describe_error_response(service: str, response: httpx.Response, credential_hint: str = "") -> ServiceError:
    """One clear line for a non-retryable error response; the service's words and its URL redacted."""
    body = redact_text(response.text[:300].strip().replace("\n", " "))
    if response.status_code in (401, 403):
        # The service's words first: "check OPENAI_API_KEY: <words>" would read as a key and its value.
        said = f": {body}" if body else ""
        fix = f"; check {credential_hint}" if credential_hint else ""
        return ServiceError(
            service, f"credentials rejected (HTTP {response.status_code}){said}{fix}", response.status_code
        )
    return ServiceError(
        service,
        f"HTTP {response.status_code} from {redact_url(str(response.request.url))}: {body}",
        response.status_code,
    )
