"""The actions an execution can perform, as a small registry.

Each action validates its payload when the execution is *scheduled* (bad input is refused
before anything is accepted) and runs it when the execution is due.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlparse

import dagster as dg
import httpx


class InvalidPayload(ValueError):
    """The payload does not fit the action; the message names the field."""


class ActionFailed(RuntimeError):
    """One attempt of an action failed; the execution is retried or FAILED by its attempts."""


@dataclass(frozen=True)
class ActionContext:
    execution_id: int
    attempt: int
    campaign_id: str
    stage: str
    log: logging.Logger | dg.DagsterLogManager

    @property
    def idempotency_key(self) -> str:
        # The same attempt always sends the same key, so a receiver can drop a repeat delivery
        # (e.g. our run crashed after the POST but before recording SUCCEEDED).
        return f"marketing-execution-{self.execution_id}-attempt-{self.attempt}"


class WebhookClient(dg.ConfigurableResource):
    """HTTP client of the ``webhook`` action."""

    timeout_s: float = 10.0

    def _client(self) -> httpx.Client:
        return httpx.Client(timeout=self.timeout_s, follow_redirects=False)

    def post(self, url: str, body: Any, headers: Mapping[str, str]) -> httpx.Response:
        with self._client() as client:
            return client.post(url, json=body, headers=dict(headers))


class Action(Protocol):
    name: str

    def validate(self, payload: Mapping[str, Any]) -> None: ...

    def run(self, ctx: ActionContext, payload: Mapping[str, Any], webhook: WebhookClient) -> dict[str, Any]: ...


class LogAction:
    """Records the payload in the run's log; the demo's action.

    The run writes the returned message into the execution's own log line ("Execution N ...
    SUCCEEDED: message=..."): one log event per execution, not two, at hundreds per run.
    """

    name = "log"

    def validate(self, payload: Mapping[str, Any]) -> None:
        message = payload.get("message")
        if message is not None and not isinstance(message, str):
            raise InvalidPayload("log payload field 'message' must be a string")

    def run(self, ctx: ActionContext, payload: Mapping[str, Any], webhook: WebhookClient) -> dict[str, Any]:
        return {"message": f"[{ctx.campaign_id}/{ctx.stage}] {payload.get('message', '')} payload={dict(payload)}"}


class WebhookAction:
    """POSTs ``payload["body"]`` as JSON to ``payload["url"]`` with an Idempotency-Key header."""

    name = "webhook"

    def validate(self, payload: Mapping[str, Any]) -> None:
        url = payload.get("url")
        if not isinstance(url, str) or urlparse(url).scheme not in ("http", "https") or not urlparse(url).netloc:
            raise InvalidPayload(f"webhook payload needs 'url' as an http(s) URL, got {url!r}")
        headers = payload.get("headers", {})
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise InvalidPayload("webhook payload field 'headers' must be an object of strings")

    def run(self, ctx: ActionContext, payload: Mapping[str, Any], webhook: WebhookClient) -> dict[str, Any]:
        url = payload["url"]
        headers = {**payload.get("headers", {}), "Idempotency-Key": ctx.idempotency_key}
        try:
            response = webhook.post(url, payload.get("body", {}), headers)
        except httpx.TimeoutException:
            raise ActionFailed(f"webhook {url} timed out after {webhook.timeout_s}s") from None
        except httpx.TransportError as exc:
            raise ActionFailed(f"webhook {url} unreachable: {type(exc).__name__}: {exc}") from None
        if response.status_code >= 300:
            snippet = response.text[:200].replace("\n", " ")
            raise ActionFailed(f"webhook {url} answered HTTP {response.status_code}: {snippet}")
        # Reported in the execution's own log line by the run (one event per execution).
        return {"status_code": response.status_code, "idempotency_key": ctx.idempotency_key}


ACTIONS: dict[str, Action] = {action.name: action for action in (LogAction(), WebhookAction())}


def get_action(name: str) -> Action:
    try:
        return ACTIONS[name]
    except KeyError:
        raise InvalidPayload(f"unknown action {name!r}; known actions: {', '.join(sorted(ACTIONS))}") from None
