"""A provider's registry record (``ProviderSpec``) and the HTTP plumbing two providers share.

Each provider translates the neutral records of ``types`` to and from one wire format. Every answer is
classified here, one way for both HTTP providers:

- 2xx: the payload, with the limits its headers state (``ProviderSpec.limit_headers``).
- 429: ``RateLimited`` at once, never retried in this process: the caller shares the wait (``retry_after_s``,
  5 s when the answer gave none) and the headers' limits (``rate_limits``) with every replica through the
  database. A 429 that says spend or quota is exhausted is ``SpendLimitReached`` instead.
- spend or credit exhausted (``ProviderSpec.is_spend_error``): ``SpendLimitReached``, no retry fixes it.
- 401/403: the credential hint; 400/404/413/422: ``RequestRejected``, no retry fixes them either.
- 5xx and Anthropic's 529 (overloaded): retried in process with jittered backoff
  (``marketing_pipelines.http``); when the tries run out, a transient ``ServiceError``.

Inside a run, the run's ``WaitLimit`` bounds every wait between tries (``HTTPModel.waits_bounded_by``), and
every answer is read up to ``MAX_ANSWER_BYTES`` at most. Numbers an answer carries (usage, limits) are
untrusted: ``token_count`` and ``header_limits`` keep only bounded, finite, non-negative values.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import dagster as dg
import httpx
from pydantic import ConfigDict, PrivateAttr, field_validator

from marketing_pipelines.agents.providers.types import ToolSpec
from marketing_pipelines.http import (
    HttpRetry,
    RateLimited,
    ServiceError,
    describe_error_response,
    send_with_retries,
    server_wait_hint,
)
from marketing_pipelines.redact import redact_text, redact_url
from marketing_pipelines.settings import Settings, api_key_problem, env_name, settings_of, shown_in_ui
from marketing_pipelines.strict_json import MAX_ENVELOPE_DEPTH, check_text_depth, without_lone_surrogates

# The most of one answer read, error answers included. An answer of max_tokens (1024 by default; 128k is the
# largest any model offers) is a few hundred kB of JSON even with every character escaped; a 40 MB answer read
# whole held 264 MB at its peak in a run worker. Larger answers are refused unread, as webhook answers are cut
# at MAX_RESPONSE_BYTES (executions/webhook.py).
MAX_ANSWER_BYTES = 4 * 1024 * 1024
# No single call counts a billion tokens, nor does any provider allow a billion of anything a minute: a larger
# (or negative, fractional, non-numeric) count or limit in an answer is not believed.
MAX_COUNT = 10**9
# The wait a 429 without a readable Retry-After asks for: long enough that replicas do not hammer the
# provider, short against a minute's window.
DEFAULT_RATE_LIMIT_WAIT_S = 5.0
# The input estimate is the request's JSON bytes / 3. Tokenizers average about 4 bytes of English or JSON a
# token (OpenAI's rule of thumb, about 3.5 characters for Claude); 3 stays at or above their count for text,
# and every non-ASCII character is counted as its \uXXXX escape (6 bytes: 2 tokens, where CJK is about 1).
ESTIMATE_BYTES_PER_TOKEN = 3
# 4xx answers no retry fixes: a malformed request, an unknown model, a body too large, unprocessable input.
REJECTED_STATUSES = frozenset({400, 404, 413, 422})
MAX_MODEL_NAME_CHARS = 100


class SpendLimitReached(ServiceError):
    """The provider refused the call because spend, credit or quota is exhausted: no retry fixes it until
    someone pays or raises the limit (Anthropic's billing and spend-limit errors, OpenAI's insufficient_quota)."""


class RequestRejected(ServiceError):
    """A 4xx that no retry fixes: an invalid request (400), an unknown model (404), a body too large (413),
    input the API cannot process (422). The same call fails the same way every time."""


def token_count(value: object) -> int:
    """A token count from an answer: a non-negative int below ``MAX_COUNT``, else 0 (bools, floats, NaN,
    strings, negatives and absurd counts are not counts)."""
    return value if type(value) is int and 0 <= value < MAX_COUNT else 0


def header_limits(headers: Mapping[str, str], names: Mapping[str, str]) -> dict[str, float]:
    """The limits the headers state, by ``LIMIT_UNITS`` name (``names`` maps a header to its unit): only finite
    positive numbers up to ``MAX_COUNT``; a header that is absent or says anything else costs only itself."""
    limits: dict[str, float] = {}
    for header, unit in names.items():
        raw = headers.get(header)
        if raw is None:
            continue
        try:
            value = float(raw.strip()[:40])
        except ValueError:
            continue
        if math.isfinite(value) and 0 < value <= MAX_COUNT:
            limits[unit] = value
    return limits


def model_name(answered: object, asked: str) -> str:
    """The model an answer says answered it (printable characters only, at most ``MAX_MODEL_NAME_CHARS``),
    else the one asked for."""
    if isinstance(answered, str):
        shown = "".join(char for char in answered if char.isprintable())[:MAX_MODEL_NAME_CHARS].strip()
        if shown:
            return shown
    return asked


def request_estimate(parts: Mapping[str, Any], max_output_tokens: int) -> dict[str, int]:
    """What one call takes at most of each ``LIMIT_UNITS``: 1 request, ``parts`` (the request body's system,
    messages and tools as sent) as ``ESTIMATE_BYTES_PER_TOKEN`` bytes a token, ``max_output_tokens`` of output."""
    # ensure_ascii: every non-ASCII character counts 6 bytes (its escape), never fewer than the provider's count.
    size = len(json.dumps(parts, ensure_ascii=True, separators=(",", ":"), default=str).encode())
    input_tokens = math.ceil(size / ESTIMATE_BYTES_PER_TOKEN)
    output_tokens = max(0, int(max_output_tokens))
    return {
        "requests": 1,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "tokens": input_tokens + output_tokens,
    }


def neutral_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in tools]


class WaitLimit(Protocol):
    """What bounds a provider's waits between tries inside a run (agents/jobs.py's ``RunClock``)."""

    def seconds_left(self) -> float:
        """Seconds until the run's deadline."""
        ...

    def wait(self, seconds: float, sleep: Callable[[float], None]) -> None:
        """Wait ``seconds`` with ``sleep``, or raise: when the wait would outlive the deadline, or the run ended."""
        ...


class AnswerRefused(ServiceError):
    """The provider's answer is longer than ``MAX_ANSWER_BYTES``, or compressed; what was read of it is dropped."""


def _identity_encoding(request: httpx.Request) -> None:
    # A compressed answer bounded in bytes received is not bounded in bytes decoded (a gzip bomb).
    request.headers["accept-encoding"] = "identity"


def _bounded_answer(service: str) -> Callable[[httpx.Response], None]:
    """A response hook (run before httpx reads the body) that caps what reading the body may take."""

    def bound(response: httpx.Response) -> None:
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise AnswerRefused(service, f"answered with Content-Encoding {encoding[:40]!r}, asked for identity")
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > MAX_ANSWER_BYTES:
            raise AnswerRefused(
                service, f"answer of {int(length):,} bytes refused unread (at most {MAX_ANSWER_BYTES:,})"
            )
        if isinstance(response.stream, httpx.SyncByteStream):
            response.stream = _BoundedStream(response.stream, service)

    return bound


class _BoundedStream(httpx.SyncByteStream):
    """The body's bytes as they arrive, up to ``MAX_ANSWER_BYTES``: past that, the rest is never read."""

    def __init__(self, stream: httpx.SyncByteStream, service: str) -> None:
        self._stream, self._service = stream, service

    def __iter__(self) -> Iterator[bytes]:
        received = 0
        for chunk in self._stream:
            received += len(chunk)
            if received > MAX_ANSWER_BYTES:
                raise AnswerRefused(self._service, f"answer longer than {MAX_ANSWER_BYTES:,} bytes; the rest unread")
            yield chunk

    def close(self) -> None:
        self._stream.close()


def _payment_required(status: int, error: Mapping[str, Any]) -> bool:
    return status == 402


@dataclass(frozen=True)
class ProviderSpec:
    """One provider: its name and its resource, and how its answers speak of limits and spend.

    Each provider module declares its own spec next to its resource class; ``registry.PROVIDERS``
    lists them. The settings that configure a provider (the service's own variables) are its
    resource's ``setting_field``s, so defaults live in ``Settings`` alone, ``resource_from_settings``
    builds it like every other resource, and the variables below are read off those fields.
    """

    name: str
    resource_class: type[dg.ConfigurableResource]
    # Answer header -> LIMIT_UNITS name, for the limits per minute the provider states on every answer.
    limit_headers: Mapping[str, str] = field(default_factory=dict)
    # Whether an error answer (its status and its "error" object, {} when none) says spend or credit ran out.
    is_spend_error: Callable[[int, Mapping[str, Any]], bool] = _payment_required

    @property
    def resource_key(self) -> str:
        """The provider resource's key in ``Definitions``, and the name of ``run_agent``'s parameter taking it."""
        return f"{self.name}_model"

    def variable(self, field: str) -> str | None:
        """The variable the resource's ``field`` (``api_key``, ``model``, ``base_url``) is read from, or None."""
        setting = settings_of(self.resource_class).get(field)
        return env_name(setting) if setting else None

    @property
    def api_key_env(self) -> str | None:
        return self.variable("api_key")

    def missing_key(self, settings: Settings) -> str | None:
        """The API-key variable this provider needs and ``settings`` lack, or None."""
        setting = settings_of(self.resource_class).get("api_key")
        return env_name(setting) if setting and getattr(settings, setting) is None else None


@shown_in_ui
class HTTPModel(dg.ConfigurableResource):
    """Shared by the HTTP providers: the API key, limits, and one ``httpx.Client`` per resource instance.

    The client is built on the first call and reused by every later call, so a run's model turns
    share its connection pool (and its TLS sessions). Dagster calls ``teardown_after_execution`` on
    the instance it initialised for a run, which closes the client; outside a run, ``close()`` does.
    """

    # A key that fails validation must not be quoted in the error (pydantic quotes the input by default).
    model_config = ConfigDict(hide_input_in_errors=True)

    api_key: str | None = None
    timeout_s: float = 60.0
    max_tokens: int = 1024

    _http_client: httpx.Client | None = PrivateAttr(default=None)
    _wait_limit: WaitLimit | None = PrivateAttr(default=None)

    @field_validator("api_key")
    @classmethod
    def _api_key(cls, value: str | None) -> str | None:
        # Runs when the resource is built: at load with the env var's name (an EnvVar), in the run with
        # its value. A trailing newline is stripped rather than sent ("Illegal header value").
        if value is None or not value.strip():
            return None
        problem = api_key_problem(value.strip())
        if problem:
            raise ValueError(f"api_key {problem}")
        return value.strip()

    def is_configured(self) -> bool:
        return bool(self.api_key)

    def http_client(self) -> httpx.Client:
        """This instance's client, built on first use (again after ``close()``), its answers bounded in size."""
        if self._http_client is None or self._http_client.is_closed:
            client = self._client()
            hooks = client.event_hooks
            client.event_hooks = {
                "request": [*hooks["request"], _identity_encoding],
                "response": [*hooks["response"], _bounded_answer(self.name)],
            }
            self._http_client = client
        return self._http_client

    @property
    def name(self) -> str:
        raise NotImplementedError

    @contextmanager
    def waits_bounded_by(self, limit: WaitLimit) -> Iterator[None]:
        """Within the block, every wait between tries is ``limit``'s: a server's hint longer than the time left
        raises ``RateLimited`` at once instead of being slept, and each sleep goes through ``limit.wait``."""
        self._wait_limit = limit
        try:
            yield
        finally:
            self._wait_limit = None

    def close(self) -> None:
        if self._http_client is not None:
            self._http_client.close()
            self._http_client = None

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        self.close()

    def _client(self) -> httpx.Client:
        """Build the client; called once per instance. Tests override it to swap the transport."""
        # trust_env=False: HTTP(S)_PROXY / ALL_PROXY in the environment must not route the API key elsewhere.
        return httpx.Client(timeout=self.timeout_s, trust_env=False)

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def estimate(self, system: str, messages: list[dict], tools: list[ToolSpec]) -> dict[str, int]:
        """What the call would take at most (``types.ModelProvider.estimate``), from the body it would send."""
        return request_estimate(self._estimated_parts(system, messages, tools), self.max_tokens)

    def _estimated_parts(self, system: str, messages: list[dict], tools: list[ToolSpec]) -> dict[str, Any]:
        """The parts of the request body that are the prompt (system, messages, tools), as sent."""
        raise NotImplementedError

    def _post(self, spec: ProviderSpec, url: str, headers: dict[str, str], body: dict[str, Any]) -> ProviderAnswer:
        key_env = spec.api_key_env or "the API key"
        if not self.is_configured():
            raise ServiceError(spec.name, f"no API key; set {key_env}")
        limit, policy, sleep = self._wait_limit, MODEL_HTTP_RETRY, self._sleep
        if limit is not None:
            # A hint past the deadline raises RateLimited at once (the caller hands the work back); every
            # other wait (a shorter hint, a backoff) is the limit's: it ends first, or stops with the run.
            max_wait_s = max(0.0, min(policy.max_wait_s, limit.seconds_left()))
            policy = dataclasses.replace(policy, max_wait_s=max_wait_s)
            sleep = functools.partial(limit.wait, sleep=self._sleep)

        return post_json(
            self.http_client(),
            url,
            headers,
            body,
            service=spec.name,
            credential_env_var=key_env,
            sleep=sleep,
            policy=policy,
            limit_headers=spec.limit_headers,
            is_spend_error=spec.is_spend_error,
        )


def _is_429(response: httpx.Response) -> bool:
    return response.status_code == 429


# A model's 429 is not slept through here: the caller shares its wait with every replica (module docstring).
MODEL_HTTP_RETRY = HttpRetry(is_rate_limited=_is_429, retry_rate_limits=False)


@dataclass(frozen=True)
class ProviderAnswer:
    """A provider's successful answer: its JSON object and the limits per minute its headers stated."""

    payload: dict[str, Any]
    rate_limits: dict[str, float]


def _error_field(response: httpx.Response) -> object:
    """The answer's "error" member, or None when the body is no JSON object."""
    try:
        check_text_depth(response.text, MAX_ENVELOPE_DEPTH)  # response.json() would recurse past the stack
        payload = response.json()
    except ValueError:
        return None
    return payload.get("error") if isinstance(payload, dict) else None


def api_error_object(response: httpx.Response) -> dict[str, Any]:
    """The answer's "error" object (both APIs: ``{"error": {"type", "message", ...}}``), {} when it has none."""
    error = _error_field(response)
    return error if isinstance(error, dict) else {}


def api_error_message(response: httpx.Response) -> str | None:
    # Both APIs answer errors with {"error": {"message": ...}} (Anthropic adds a top-level "type"). A lone
    # surrogate (\ud800 in the JSON) becomes U+FFFD: the message is stored as the run's error.
    error = _error_field(response)
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return without_lone_surrogates(error["message"])
    if isinstance(error, str):
        return without_lone_surrogates(error)
    return None


def post_json(
    client: httpx.Client,
    url: str,
    headers: dict[str, str],
    body: dict[str, Any],
    *,
    service: str,
    credential_env_var: str,
    sleep: Callable[[float], None],
    policy: HttpRetry = MODEL_HTTP_RETRY,
    limit_headers: Mapping[str, str] | None = None,
    is_spend_error: Callable[[int, Mapping[str, Any]], bool] = _payment_required,
) -> ProviderAnswer:
    request = client.build_request("POST", url, headers=headers, json=body)
    response = send_with_retries(client, request, service=service, policy=policy, sleep=sleep)
    status = response.status_code
    if status in (401, 403):
        raise describe_error_response(service, response, credential_hint=credential_env_var)
    if status >= 400:
        raise _classified(service, response, header_limits(response.headers, limit_headers or {}), is_spend_error)
    try:
        # Depth first: response.json() recurses per level and raises RecursionError on "[" * 10**5.
        check_text_depth(response.text, MAX_ENVELOPE_DEPTH)
        # A lone surrogate (\ud800: valid JSON, not valid text) becomes U+FFFD: a model's reply is kept, and
        # stored as it came it would fail the transcript's INSERT on PostgreSQL (DataError), and the run with it.
        payload = without_lone_surrogates(response.json())
    except ValueError as exc:
        raise ServiceError(service, f"response was not valid JSON ({exc}): {response.text[:200]!r}") from exc
    if not isinstance(payload, dict):
        raise ServiceError(service, f"expected a JSON object, got {type(payload).__name__}")
    return ProviderAnswer(payload, header_limits(response.headers, limit_headers or {}))


def _classified(
    service: str,
    response: httpx.Response,
    rate_limits: dict[str, float],
    is_spend_error: Callable[[int, Mapping[str, Any]], bool],
) -> ServiceError:
    """The error an answer of 400 or more (not 401/403) is: module docstring. The service's words, redacted."""
    status = response.status_code
    message = api_error_message(response)
    body = response.text[:300].strip().replace("\n", " ")
    said = redact_text(message if message is not None else body)
    if is_spend_error(status, api_error_object(response)):
        return SpendLimitReached(service, f"spend or credit limit reached (HTTP {status}): {said}", status)
    if status == 429:
        hint = server_wait_hint(response)
        wait = DEFAULT_RATE_LIMIT_WAIT_S if hint is None else hint
        return RateLimited(service, wait, redact_text(f"HTTP 429: {said[:200]}"), rate_limits)
    if message is None:
        text = f"HTTP {status} from {redact_url(str(response.request.url))}: {said}"
    else:
        text = f"API error (HTTP {status}): {said}"
    return (
        RequestRejected(service, text, status) if status in REJECTED_STATUSES else ServiceError(service, text, status)
    )
