"""Retrying HTTP for every outside service (webhooks, importers, model providers).

One place decides what is retryable and how long to wait, so the GitHub importer, the
Plausible importer and the model providers all honour the same server hints:
``Retry-After`` (seconds or an HTTP date), ``X-RateLimit-Reset`` (epoch seconds, GitHub) and
GitHub's 403 with ``X-RateLimit-Remaining: 0``.
"""

from __future__ import annotations

import datetime
import email.utils
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

# 529 is Anthropic's "overloaded".
RETRYABLE_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504, 529})


class ServiceError(RuntimeError):
    """A call to an outside service failed for good; the message names the service and the fix."""

    def __init__(self, service: str, message: str, status: int | None = None) -> None:
        super().__init__(f"{service}: {message}")
        self.service = service
        self.status = status


class RateLimited(ServiceError):
    """The service asked us to wait longer than the caller is willing to block.

    Callers inside Dagster turn this into ``dg.RetryRequested(seconds_to_wait=...)`` so a
    step does not hold a worker (or a pool slot) asleep for the whole window.
    """

    def __init__(self, service: str, retry_after_s: float) -> None:
        super().__init__(service, f"rate limited; retry in {retry_after_s:.0f}s", status=429)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0
    # A hint longer than this is not slept through: RateLimited is raised instead.
    max_wait_s: float = 60.0


def _is_rate_limited_403(response: httpx.Response) -> bool:
    # GitHub answers an exhausted primary limit with 403 + remaining 0, and a secondary
    # limit with 403 + Retry-After; any other 403 is a real permission error.
    if response.status_code != 403:
        return False
    return response.headers.get("x-ratelimit-remaining") == "0" or "retry-after" in response.headers


def server_wait_hint(response: httpx.Response, now: float | None = None) -> float | None:
    """Seconds the server asked us to wait, from its headers, or None when it gave no hint."""
    now = time.time() if now is None else now
    retry_after = response.headers.get("retry-after")
    if retry_after:
        try:
            return max(0.0, float(retry_after))
        except ValueError:
            pass
        try:
            parsed = email.utils.parsedate_to_datetime(retry_after)
        except (TypeError, ValueError):
            parsed = None  # a hint we cannot read is no hint; fall back to backoff
        if parsed is not None:
            if parsed.tzinfo is None:  # "-0000" parses naive; HTTP dates are GMT
                parsed = parsed.replace(tzinfo=datetime.UTC)
            return max(0.0, parsed.timestamp() - now)
    reset = response.headers.get("x-ratelimit-reset")
    if reset and (response.status_code == 429 or _is_rate_limited_403(response)):
        try:
            return max(0.0, float(reset) - now)
        except ValueError:
            return None
    return None


def is_retryable(response: httpx.Response) -> bool:
    return response.status_code in RETRYABLE_STATUSES or _is_rate_limited_403(response)


def send_with_retries(
    client: httpx.Client,
    request: httpx.Request,
    *,
    service: str,
    policy: RetryPolicy = RetryPolicy(),
    sleep: Callable[[float], None] = time.sleep,
) -> httpx.Response:
    """Send ``request``, retrying transport errors, 429, 5xx and rate-limit 403s.

    Returns the first non-retryable response (the caller decides what a 4xx means) or raises
    ServiceError / RateLimited once the attempts are spent.
    """
    last_problem = "no attempt made"
    last_hint: float | None = None
    for attempt in range(1, policy.max_attempts + 1):
        try:
            response = client.send(request)
        except httpx.TransportError as exc:
            last_problem = f"{type(exc).__name__}: {exc}"
            hint = None
        else:
            if not is_retryable(response):
                return response
            response.read()
            last_problem = f"HTTP {response.status_code}: {response.text[:200].strip()}"
            hint = last_hint = server_wait_hint(response)
            if hint is not None and hint > policy.max_wait_s:
                raise RateLimited(service, hint)
        if attempt == policy.max_attempts:
            break
        if hint is None:
            # Full jitter: replicas that failed together do not retry together.
            hint = random.uniform(0, min(policy.max_delay_s, policy.base_delay_s * 2 ** (attempt - 1)))
        sleep(hint)
    if last_problem.startswith("HTTP 429") or last_problem.startswith("HTTP 403"):
        raise RateLimited(service, last_hint if last_hint is not None else policy.max_delay_s)
    raise ServiceError(service, f"gave up after {policy.max_attempts} attempts ({last_problem})")


def describe_error_response(service: str, response: httpx.Response, credential_hint: str = "") -> ServiceError:
    """One clear line for a non-retryable error response."""
    body = response.text[:300].strip().replace("\n", " ")
    if response.status_code in (401, 403):
        fix = f"; check {credential_hint}" if credential_hint else ""
        return ServiceError(
            service, f"credentials rejected (HTTP {response.status_code}){fix}: {body}", response.status_code
        )
    return ServiceError(
        service, f"HTTP {response.status_code} from {response.request.url}: {body}", response.status_code
    )
