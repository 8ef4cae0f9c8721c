"""The actions an execution can perform, as a small registry.

Each action validates its payload when the execution is *scheduled* (bad input is refused
before anything is accepted) and runs it when the execution is due. Validating imports neither
Dagster nor httpx (``executions schedule`` answers in a fraction of a second); running a webhook
uses ``webhook.WebhookClient``. A webhook's header values are stored sealed (``seal_headers``) and
opened only to be sent (``open_headers``).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from marketing_pipelines.egress import EgressPolicy, EgressRefused
from marketing_pipelines.executions.signing import body_bytes, signature_header
from marketing_pipelines.redact import (
    CONTROL_CHARACTERS,
    error_text,
    hide_values,
    redact_text,
    redact_value,
    remember_headers,
    remember_url_secrets,
    secret_parts,
    shown_text,
    url_origin,
)
from marketing_pipelines.sealing import KeySource, SealingError, SecretBox

if TYPE_CHECKING:
    import dagster as dg

    from marketing_pipelines.executions.webhook import WebhookClient

# Headers the action sets itself; a payload may not replace them (Host would also undo the
# pinning of the checked address).
# The webhook-* headers are the Standard Webhooks signature's (signing.py); Content-Type says the body is JSON.
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "transfer-encoding",
        "idempotency-key",
        "marketing-attempt",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
    }
)
MAX_HEADERS = 20
MAX_HEADER_VALUE = 4096
# RFC 9110 section 5.6.2: token = 1*tchar.
HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,128}")
ENDPOINT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
ATTEMPT_HEADER = "Marketing-Attempt"


class InvalidPayload(ValueError):
    """The payload does not fit the action; the message names the field."""


class ActionFailed(RuntimeError):
    """One attempt of an action failed; the execution is retried or FAILED by its attempts."""


class ActionRefused(ActionFailed):
    """The action may not run at all (e.g. its destination is not allowed): FAILED, not retried."""


@dataclass(frozen=True)
class Endpoint:
    """A registered endpoint opened for sending (``endpoints.open_endpoints``): its URL and its signing secrets."""

    name: str
    campaign_id: str | None
    url: str
    secret: str
    previous_secret: str | None
    previous_secret_until: datetime | None

    def secrets_at(self, when: datetime) -> list[str]:
        """The current secret, and the previous one while its overlap lasts."""
        if self.previous_secret and self.previous_secret_until and when < self.previous_secret_until:
            return [self.secret, self.previous_secret]
        return [self.secret]

    def __repr__(self) -> str:  # a stray log of the object must not print the URL or a secret
        return f"Endpoint(name={self.name!r}, origin={url_origin(self.url)!r})"


@dataclass(frozen=True)
class ActionContext:
    execution_id: int
    attempt: int
    campaign_id: str
    stage: str
    log: logging.Logger | dg.DagsterLogManager
    # Registered endpoints the batch's payloads name, opened by the run; a string says why one cannot be used.
    endpoints: Mapping[str, Endpoint | str] = field(default_factory=dict)
    # What opens the batch's sealed header values (``headers_box``); a string says why nothing can.
    headers_box: SecretBox | str | None = None

    @property
    def idempotency_key(self) -> str:
        # One key for the execution's whole life, whatever the attempt: a receiver that sees it
        # twice knows it is a redelivery of the same effect (e.g. a run killed after the POST and
        # before recording SUCCEEDED, then a second attempt after lease expiry). The attempt
        # travels in its own header.
        return f"marketing-execution-{self.execution_id}"


class Action(Protocol):
    name: str
    waits: bool  # spends its time waiting (network): performed concurrently in worker threads

    def validate(self, payload: Mapping[str, Any], egress: EgressPolicy) -> None: ...

    def run(self, ctx: ActionContext, payload: Mapping[str, Any], webhook: WebhookClient) -> dict[str, Any]: ...


class LogAction:
    """Records the payload in the run's output; the demo's action.

    The run writes the returned message into the execution's own line of its captured stdout
    ("Execution N ... SUCCEEDED: message=...") and into its outcome table: no event-log write per
    execution, at hundreds per run.
    """

    name = "log"
    waits = False  # pure computation: the run performs it in its own thread, no worker needed

    def validate(self, payload: Mapping[str, Any], egress: EgressPolicy) -> None:
        message = payload.get("message")
        if message is not None and not isinstance(message, str):
            raise InvalidPayload("log payload field 'message' must be a string")

    def run(self, ctx: ActionContext, payload: Mapping[str, Any], webhook: WebhookClient) -> dict[str, Any]:
        # The payload is the scheduler's text and goes into the run log: shown redacted, as any payload is.
        shown = redact_value(dict(payload))
        return {"message": f"[{ctx.campaign_id}/{ctx.stage}] {payload.get('message', '')} payload={shown}"}


class WebhookAction:
    """POSTs ``payload["body"]`` as JSON to a registered endpoint (signed) or a raw ``url`` (unsigned).

    ``{"endpoint": "NAME", "body": {...}, "headers": {...}}`` sends to the endpoint's sealed URL with
    Standard Webhooks headers (``webhook-id``, ``webhook-timestamp``, ``webhook-signature``);
    ``{"url": ...}`` stays for compatibility and carries no signature. Both carry an Idempotency-Key
    per execution.
    """

    name = "webhook"
    waits = True  # on the network: the run performs many at once in worker threads

    def validate(self, payload: Mapping[str, Any], egress: EgressPolicy) -> None:
        unknown = sorted(set(payload) - {"url", "endpoint", "body", "headers"})
        if unknown:
            raise InvalidPayload(f"webhook payload has unknown field(s) {', '.join(map(repr, unknown))}")
        if ("url" in payload) == ("endpoint" in payload):
            raise InvalidPayload("webhook payload needs one of 'endpoint' (a registered, signed endpoint) or 'url'")
        if "endpoint" in payload:
            check_endpoint_name(payload["endpoint"])
        else:
            check_webhook_url(payload["url"], egress)
        check_headers(payload.get("headers", {}))

    def run(self, ctx: ActionContext, payload: Mapping[str, Any], webhook: WebhookClient) -> dict[str, Any]:
        opened = open_headers(payload.get("headers", {}), ctx.headers_box)
        # A payload's header may carry any credential (X-Custom: <token>): hidden from every text this
        # process redacts from now on, a receiver's answer quoting it included.
        remember_headers(opened)
        # The run redacts its errors with the stored payload's pieces (jobs._redacted), which hold only tokens.
        hidden_headers = secret_parts({"headers": opened})
        headers = {
            **opened,
            "Idempotency-Key": ctx.idempotency_key,
            ATTEMPT_HEADER: str(ctx.attempt),
            "Content-Type": "application/json",
        }
        try:
            body = body_bytes(payload.get("body", {}))
        except (TypeError, ValueError) as exc:
            raise ActionRefused(f"webhook body is not JSON: {exc}") from None
        if "endpoint" in payload:
            name = payload["endpoint"]
            endpoint = ctx.endpoints.get(name)
            if isinstance(endpoint, str) or endpoint is None:
                raise ActionRefused(f"webhook endpoint {name!r}: {endpoint or 'not registered (removed?)'}")
            if endpoint.campaign_id not in (None, ctx.campaign_id):
                raise ActionRefused(f"webhook endpoint {name!r} serves campaign {endpoint.campaign_id!r} only")
            url = endpoint.url
            shown = f"endpoint {name} ({url_origin(url)})"
            # A receiver that quotes its request ("no hook /services/T0/B0/<token>") quotes the sealed URL's
            # parts without the URL around them; the run's redaction of errors cannot know them.
            hidden = secret_parts({"url": url}) | hidden_headers
            # Signed at send time over the exact bytes sent; a redelivery keeps webhook-id and gets a
            # new timestamp, so a receiver's replay window is measured from this attempt.
            timestamp = int(time.time())
            in_force = endpoint.secrets_at(datetime.fromtimestamp(timestamp, UTC))
            headers |= {
                "webhook-id": ctx.idempotency_key,
                "webhook-timestamp": str(timestamp),
                "webhook-signature": signature_header(in_force, ctx.idempotency_key, timestamp, body),
            }
        else:
            url = payload["url"]
            shown = url_origin(url)
            hidden = hidden_headers
            remember_url_secrets(url, path_is_secret=True)
        # Deferred: httpx takes 0.2 s to import, which scheduling (validate) should not pay; a run that
        # gets here holds a WebhookClient, which has imported it already.
        import httpx

        try:
            response = webhook.post(url, body, headers)
        except EgressRefused as exc:
            raise ActionRefused(f"webhook {shown} refused: {exc}") from None
        except TimeoutError:
            raise ActionFailed(f"webhook {shown} timed out after {webhook.timeout_s}s") from None
        except httpx.TimeoutException:
            raise ActionFailed(f"webhook {shown} timed out after {webhook.timeout_s}s") from None
        except (httpx.LocalProtocolError, UnicodeEncodeError):
            # The request could not be built (a header value the HTTP stack refuses, stored before
            # scheduling checked headers). Its message quotes the value, which may be a secret, so it
            # is not shown, and no later attempt would build it either.
            raise ActionRefused(f"webhook {shown}: a header name or value is not valid HTTP (not shown)") from None
        except (httpx.TransportError, OSError) as exc:
            raise ActionFailed(f"webhook {shown} unreachable: {hide_values(error_text(exc), hidden)}") from None
        if response.status_code >= 300:
            snippet = hide_values(redact_text(response.text[:200].replace("\n", " ")), hidden)
            raise ActionFailed(f"webhook {shown} answered HTTP {response.status_code}: {snippet}")
        # Reported in the execution's own log line by the run (one event per execution).
        return {"status_code": response.status_code, "idempotency_key": ctx.idempotency_key}


def check_webhook_url(url: Any, egress: EgressPolicy) -> None:
    """An http(s) URL of at most 2048 characters that the egress policy allows; else InvalidPayload."""
    if not isinstance(url, str) or len(url) > 2048:
        raise InvalidPayload("webhook payload needs 'url' as an http(s) URL of at most 2048 characters")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parses the port, raising on a bad one
    except ValueError:
        raise InvalidPayload(f"webhook 'url' is not a URL: {url_origin(url)}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidPayload(f"webhook needs 'url' as an http(s) URL, got {url_origin(url)}")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise InvalidPayload(f"webhook 'url' holds white space or a control character: {url_origin(url)}")
    try:
        egress.check_url(url)
    except EgressRefused as exc:
        raise InvalidPayload(str(exc)) from None


def check_endpoint_name(name: Any) -> None:
    if not isinstance(name, str) or not ENDPOINT_NAME.fullmatch(name):
        raise InvalidPayload(
            "webhook 'endpoint' must be a registered endpoint's name: 1-64 of a-z, 0-9, '-' and '_', "
            "starting with a letter or digit"
        )


def check_headers(headers: Any) -> None:
    """Names are RFC 9110 tokens; values latin-1 text without control characters or surrounding white space.

    Checked when scheduled, so the HTTP stack never meets a value it refuses: its error quotes the
    value ("Illegal header value b'Bearer sk-...'"), and a value is often a credential. No message
    here quotes a value.
    """
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise InvalidPayload("webhook payload field 'headers' must be an object of strings")
    if len(headers) > MAX_HEADERS:
        raise InvalidPayload(f"webhook payload has {len(headers)} headers; at most {MAX_HEADERS}")
    for name, value in headers.items():
        if not HEADER_NAME.fullmatch(name):
            raise InvalidPayload(f"webhook header name {shown_text(name)[:80]!r} is not an HTTP token")
        if name.lower() in RESERVED_HEADERS:
            raise InvalidPayload(f"webhook payload may not set the header {name} (the action sets it)")
        problem = _header_value_problem(value)
        if problem:
            raise InvalidPayload(f"webhook header {name}: its value {problem} (the value is not shown)")


def _header_value_problem(value: str) -> str | None:
    if len(value) > MAX_HEADER_VALUE:
        return f"is longer than {MAX_HEADER_VALUE} characters"
    if value != value.strip(" \t\r\n"):
        return "starts or ends with white space (a trailing newline?)"
    if CONTROL_CHARACTERS.search(value) or any(c in value for c in "\t\n\r"):
        return "holds a control character"
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return "holds a character outside latin-1, which HTTP headers cannot carry"
    return None


# A stored header value is this object, never a string: a scheduler's values are strings (check_headers),
# so neither can be taken for the other, and ``redact_value`` shows it as any header value, ``***``.
SEALED = "sealed"


def seal_headers(headers: Mapping[str, str], box: SecretBox) -> dict[str, dict[str, str]]:
    """Each value as stored: ``{"Authorization": {"sealed": "<Fernet token>"}}``.

    A token seals the header's name with its value: moved to another header, or taken from an endpoint's
    row (sealed under the same key), it opens as nothing (``open_headers`` refuses it).
    """
    return {name: {SEALED: box.seal(json.dumps([name, value]))} for name, value in headers.items()}


def is_sealed(value: Any) -> bool:
    return isinstance(value, Mapping) and set(value) == {SEALED} and isinstance(value[SEALED], str)


def reseal_headers(headers: Mapping[str, Any], box: SecretBox) -> dict[str, Any]:
    """``headers`` sealed under ``box``'s first key: tokens sealed again, plain values (stored by versions
    before header values were sealed) sealed. SealingError when a token opens with none of its keys."""
    resealed: dict[str, Any] = {}
    for name, value in headers.items():
        if is_sealed(value):
            resealed[name] = {SEALED: box.reseal(value[SEALED])}
        else:  # a string; anything else is left for open_headers to refuse
            resealed[name] = seal_headers({name: value}, box)[name] if isinstance(value, str) else value
    return resealed


def sealed_headers_box(keys: Callable[[], KeySource], payloads: Iterable[Any]) -> SecretBox | str | None:
    """What opens these webhook payloads' sealed header values, made once per batch: None when none holds
    one; the one-line reason (no key, a malformed key) when no box can be made."""
    if not any(
        isinstance(p, Mapping) and isinstance(p.get("headers"), Mapping) and any(map(is_sealed, p["headers"].values()))
        for p in payloads
    ):
        return None
    try:
        return SecretBox.of(keys())
    except SealingError as exc:
        return str(exc)


def open_headers(headers: Mapping[str, Any], box: SecretBox | str | None) -> dict[str, str]:
    """The header values to send. A sealed value is opened with ``box``; a plain string is one stored before
    header values were sealed and is sent as it is (``executions reseal`` seals those). ActionRefused (the
    execution FAILED, not retried: no later attempt would open it either) names the header, never a value."""
    opened: dict[str, str] = {}
    for name, value in headers.items():
        if isinstance(value, str):
            opened[name] = value
            continue
        # Never "<name>: ...": the run's redaction would take the text after a header's name for its value.
        shown = f"webhook header {shown_text(str(name))[:80]}"
        if not is_sealed(value):
            raise ActionRefused(f"{shown} cannot be sent: its stored value is neither text nor sealed")
        if not isinstance(box, SecretBox):
            raise ActionRefused(f"{shown} cannot be opened: {box}")
        try:
            sealed_name, sealed_value = json.loads(box.open(value[SEALED]))
        except SealingError as exc:
            raise ActionRefused(f"{shown} cannot be opened: {exc}") from None
        except (ValueError, TypeError):  # opens, but to no [name, value] pair
            sealed_name = sealed_value = None
        if sealed_name != name or not isinstance(sealed_value, str):
            raise ActionRefused(f"{shown} cannot be opened: its token was not sealed for this header")
        opened[name] = sealed_value
    return opened


ACTIONS: dict[str, Action] = {action.name: action for action in (LogAction(), WebhookAction())}


def get_action(name: str) -> Action:
    try:
        return ACTIONS[name]
    except KeyError:
        raise InvalidPayload(f"unknown action {name!r}; known actions: {', '.join(sorted(ACTIONS))}") from None
