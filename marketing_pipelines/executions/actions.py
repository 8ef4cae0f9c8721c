"""The actions an execution can perform, as a small registry.

Each action validates its payload when the execution is *scheduled* (bad input is refused
before anything is accepted) and runs it when the execution is due. Validating imports neither
Dagster nor httpx (``executions schedule`` answers in a fraction of a second); running a webhook
uses ``webhook.WebhookClient``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from marketing_pipelines.egress import EgressPolicy, EgressRefused, parse_networks
from marketing_pipelines.redact import redact_url, redact_urls
from marketing_pipelines.settings import Settings, current_settings

if TYPE_CHECKING:
    import dagster as dg

    from marketing_pipelines.executions.webhook import WebhookClient

# Headers the action sets itself; a payload may not replace them (Host would also undo the
# pinning of the checked address).
RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "idempotency-key", "marketing-attempt"})
MAX_HEADERS = 20
ATTEMPT_HEADER = "Marketing-Attempt"


class InvalidPayload(ValueError):
    """The payload does not fit the action; the message names the field."""


class ActionFailed(RuntimeError):
    """One attempt of an action failed; the execution is retried or FAILED by its attempts."""


class ActionRefused(ActionFailed):
    """The action may not run at all (e.g. its destination is not allowed): FAILED, not retried."""


@dataclass(frozen=True)
class ActionContext:
    execution_id: int
    attempt: int
    campaign_id: str
    stage: str
    log: logging.Logger | dg.DagsterLogManager

    @property
    def idempotency_key(self) -> str:
        # One key for the execution's whole life, whatever the attempt: a receiver that sees it
        # twice knows it is a redelivery of the same effect (e.g. a run killed after the POST and
        # before recording SUCCEEDED, then a second attempt after lease expiry). The attempt
        # travels in its own header.
        return f"marketing-execution-{self.execution_id}"


class Action(Protocol):
    name: str

    def validate(self, payload: Mapping[str, Any], egress: EgressPolicy) -> None: ...

    def run(self, ctx: ActionContext, payload: Mapping[str, Any], webhook: WebhookClient) -> dict[str, Any]: ...


class LogAction:
    """Records the payload in the run's log; the demo's action.

    The run writes the returned message into the execution's own log line ("Execution N ...
    SUCCEEDED: message=..."): one log event per execution, not two, at hundreds per run.
    """

    name = "log"

    def validate(self, payload: Mapping[str, Any], egress: EgressPolicy) -> None:
        message = payload.get("message")
        if message is not None and not isinstance(message, str):
            raise InvalidPayload("log payload field 'message' must be a string")

    def run(self, ctx: ActionContext, payload: Mapping[str, Any], webhook: WebhookClient) -> dict[str, Any]:
        return {"message": f"[{ctx.campaign_id}/{ctx.stage}] {payload.get('message', '')} payload={dict(payload)}"}


class WebhookAction:
    """POSTs ``payload["body"]`` as JSON to ``payload["url"]``, with an Idempotency-Key per execution."""

    name = "webhook"

    def validate(self, payload: Mapping[str, Any], egress: EgressPolicy) -> None:
        url = payload.get("url")
        if not isinstance(url, str) or len(url) > 2048:
            raise InvalidPayload("webhook payload needs 'url' as an http(s) URL of at most 2048 characters")
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - parses the port, raising on a bad one
        except ValueError:
            raise InvalidPayload(f"webhook payload 'url' is not a URL: {redact_url(url)}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidPayload(f"webhook payload needs 'url' as an http(s) URL, got {redact_url(url)}")
        try:
            egress.check_url(url)
        except EgressRefused as exc:
            raise InvalidPayload(str(exc)) from None
        headers = payload.get("headers", {})
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise InvalidPayload("webhook payload field 'headers' must be an object of strings")
        if len(headers) > MAX_HEADERS:
            raise InvalidPayload(f"webhook payload has {len(headers)} headers; at most {MAX_HEADERS}")
        reserved = sorted(k for k in headers if k.lower() in RESERVED_HEADERS)
        if reserved:
            raise InvalidPayload(f"webhook payload may not set the header(s) {', '.join(reserved)}")

    def run(self, ctx: ActionContext, payload: Mapping[str, Any], webhook: WebhookClient) -> dict[str, Any]:
        url = payload["url"]
        shown = redact_url(url)
        headers = {
            **payload.get("headers", {}),
            "Idempotency-Key": ctx.idempotency_key,
            ATTEMPT_HEADER: str(ctx.attempt),
        }
        # Deferred: httpx takes 0.2 s to import, which scheduling (validate) should not pay; a run that
        # gets here holds a WebhookClient, which has imported it already.
        import httpx

        try:
            response = webhook.post(url, payload.get("body", {}), headers)
        except EgressRefused as exc:
            raise ActionRefused(f"webhook {shown} refused: {exc}") from None
        except TimeoutError:
            raise ActionFailed(f"webhook {shown} timed out after {webhook.timeout_s}s") from None
        except httpx.TimeoutException:
            raise ActionFailed(f"webhook {shown} timed out after {webhook.timeout_s}s") from None
        except (httpx.TransportError, OSError) as exc:
            reason = redact_urls(f"{type(exc).__name__}: {exc}")
            raise ActionFailed(f"webhook {shown} unreachable: {reason}") from None
        if response.status_code >= 300:
            snippet = redact_urls(response.text[:200].replace("\n", " "))
            raise ActionFailed(f"webhook {shown} answered HTTP {response.status_code}: {snippet}")
        # Reported in the execution's own log line by the run (one event per execution).
        return {"status_code": response.status_code, "idempotency_key": ctx.idempotency_key}


def webhook_policy(settings: Settings | None = None) -> EgressPolicy:
    """The egress policy ``settings`` give (default: this process's), for schedule-time checks."""
    return EgressPolicy(parse_networks((settings or current_settings()).webhook_allow_networks))


ACTIONS: dict[str, Action] = {action.name: action for action in (LogAction(), WebhookAction())}


def get_action(name: str) -> Action:
    try:
        return ACTIONS[name]
    except KeyError:
        raise InvalidPayload(f"unknown action {name!r}; known actions: {', '.join(sorted(ACTIONS))}") from None
