"""A provider's registry record (``ProviderSpec``) and the HTTP plumbing two providers share.

Each provider translates the neutral records of ``types`` to and from one wire format. Retries
(429/5xx, ``Retry-After``) live in ``marketing_pipelines.http``; rate limiting is the caller's job. Inside
a run, the run's ``WaitLimit`` bounds every wait between tries (``HTTPModel.waits_bounded_by``), and every
answer is read up to ``MAX_ANSWER_BYTES`` at most.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import dagster as dg
import httpx
from pydantic import ConfigDict, PrivateAttr, field_validator

from marketing_pipelines.http import HttpRetry, ServiceError, describe_error_response, send_with_retries
from marketing_pipelines.redact import redact_text
from marketing_pipelines.settings import Settings, api_key_problem, env_name, settings_of, shown_in_ui
from marketing_pipelines.strict_json import MAX_ENVELOPE_DEPTH, check_text_depth, without_lone_surrogates

# The most of one answer read, error answers included. An answer of max_tokens (1024 by default; 128k is the
# largest any model offers) is a few hundred kB of JSON even with every character escaped; a 40 MB answer read
# whole held 264 MB at its peak in a run worker. Larger answers are refused unread, as webhook answers are cut
# at MAX_RESPONSE_BYTES (executions/webhook.py).
MAX_ANSWER_BYTES = 4 * 1024 * 1024


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


@dataclass(frozen=True)
class ProviderSpec:
    """One provider: its name and its resource.

    Each provider module declares its own spec next to its resource class; ``registry.PROVIDERS``
    lists them. The settings that configure a provider (the service's own variables) are its
    resource's ``setting_field``s, so defaults live in ``Settings`` alone, ``resource_from_settings``
    builds it like every other resource, and the variables below are read off those fields.
    """

    name: str
    resource_class: type[dg.ConfigurableResource]

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

    def _post(self, spec: ProviderSpec, url: str, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        key_env = spec.api_key_env or "the API key"
        if not self.is_configured():
            raise ServiceError(spec.name, f"no API key; set {key_env}")
        limit, policy, sleep = self._wait_limit, HttpRetry(), self._sleep
        if limit is not None:
            # A hint past the deadline raises RateLimited at once (the caller hands the work back); every
            # other wait (a shorter hint, a backoff) is the limit's: it ends first, or stops with the run.
            policy = HttpRetry(max_wait_s=max(0.0, min(policy.max_wait_s, limit.seconds_left())))
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
        )


def api_error_message(response: httpx.Response) -> str | None:
    # Both APIs answer errors with {"error": {"message": ...}} (Anthropic adds a top-level "type"). A lone
    # surrogate (\ud800 in the JSON) becomes U+FFFD: the message is stored as the run's error.
    try:
        check_text_depth(response.text, MAX_ENVELOPE_DEPTH)  # response.json() would recurse past the stack
        payload = response.json()
    except ValueError:
        return None
    error = payload.get("error") if isinstance(payload, dict) else None
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
    policy: HttpRetry = HttpRetry(),
) -> dict[str, Any]:
    request = client.build_request("POST", url, headers=headers, json=body)
    response = send_with_retries(client, request, service=service, policy=policy, sleep=sleep)
    if response.status_code in (401, 403):
        raise describe_error_response(service, response, credential_hint=credential_env_var)
    if response.status_code >= 400:
        message = api_error_message(response)
        if message is None:
            raise describe_error_response(service, response)
        raise ServiceError(
            service, f"API error (HTTP {response.status_code}): {redact_text(message)}", response.status_code
        )
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
    return payload


def int_or_zero(value: object) -> int:
    return value if isinstance(value, int) else 0
