"""``WebhookClient``: the HTTP client (a Dagster resource) that the ``webhook`` action posts with.

Apart from ``actions`` so that validating a payload when an execution is scheduled imports neither
Dagster nor httpx.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import dagster as dg
import httpx
from pydantic import Field, field_validator

from marketing_pipelines.egress import ALLOW_SETTING, EgressPolicy, parse_networks
from marketing_pipelines.http import redact_httpx_logs
from marketing_pipelines.sealing import KEY_SETTING
from marketing_pipelines.settings import Settings, env_var_if_set, read_key_file, setting_field, shown_in_ui

# httpx logs each request's whole URL (an endpoint's path is often its token): every webhook and alert
# POST goes through this client, so it installs the one redacting filter itself.
redact_httpx_logs()

# What a webhook response may cost us: enough of an error body to quote 200 characters.
MAX_RESPONSE_BYTES = 8 * 1024


@dataclass(frozen=True)
class WebhookResponse:
    status_code: int
    text: str  # at most MAX_RESPONSE_BYTES of the body, decoded leniently


@shown_in_ui
class WebhookClient(dg.ConfigurableResource):
    """HTTP client of the ``webhook`` action.

    ``timeout_s`` bounds the whole request (connect, send, headers and body), not each read: a
    receiver dripping one byte a second cannot hold a run. Only ``MAX_RESPONSE_BYTES`` of the
    response are read. Destinations follow the egress policy (``egress.py``);
    ``allow_networks`` are the CIDRs an operator allows beyond public addresses.
    """

    timeout_s: float = setting_field("webhook_timeout_seconds")
    allow_networks: list[str] = Field(
        default=[],
        description="CIDRs webhooks may reach beyond public addresses (loopback, private); never link-local. "
        f"Env var: {ALLOW_SETTING}.",
    )
    concurrency: int = setting_field("webhook_concurrency")
    secrets_key: str | None = Field(
        default=None,
        description="Fernet key(s) that open registered endpoints' URLs and signing secrets. "
        f"Env var: {KEY_SETTING} (shown here as the variable's name only).",
    )
    secrets_key_file: str | None = Field(
        default=None, description="A file holding the key instead (the embedded SQLite default's secrets.key)."
    )

    @field_validator("allow_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        return [str(network) for network in parse_networks(value)]

    @classmethod
    def from_settings(cls, settings: Settings) -> WebhookClient:
        key_file = settings.secrets_key_file()
        key = settings.secrets_key.get_secret_value() if settings.secrets_key else None
        # Without the env var, the SQLite database's key file (made by the demo).
        return cls(
            timeout_s=settings.webhook_timeout_seconds,
            allow_networks=list(settings.webhook_allow_networks),
            concurrency=settings.webhook_concurrency,
            # An EnvVar, so the launchpad and run config show the variable's name, never the key.
            secrets_key=env_var_if_set(KEY_SETTING) or key,
            # Read when a run sends, so a key file made after the code location loaded (a first demo while
            # `marketing-pipelines ui` is up) is found.
            secrets_key_file=str(key_file) if key is None and key_file else None,
        )

    def sealing_keys(self) -> str | None:
        if self.secrets_key:
            return self.secrets_key
        # Read when a run sends, as settings.sealing_keys reads it when a command runs.
        return read_key_file(self.secrets_key_file) if self.secrets_key_file else None

    def policy(self) -> EgressPolicy:
        return EgressPolicy(parse_networks(self.allow_networks))

    def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> WebhookResponse:
        """POST ``body`` (the exact bytes, as signed) to ``url``'s checked address."""
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
        address = self.policy().resolve(host, port)  # raises EgressRefused / OSError
        # Connect to the address that was checked; Host and the TLS server name keep the name.
        ip_host = f"[{address}]" if address.version == 6 else str(address)
        pinned = urlunsplit((parts.scheme, f"{ip_host}:{port}", parts.path or "/", parts.query, ""))
        named = f"[{host}]" if ":" in host else host  # an IPv6 literal keeps its brackets in Host
        host_header = named if parts.port is None else f"{named}:{parts.port}"
        extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
        request_headers = {**headers, "Host": host_header}
        return asyncio.run(self._post(pinned, body, request_headers, extensions))

    async def _post(
        self, url: str, body: bytes, headers: Mapping[str, str], extensions: dict[str, Any]
    ) -> WebhookResponse:
        async with (
            asyncio.timeout(self.timeout_s),
            # trust_env=False: HTTP(S)_PROXY / ALL_PROXY would send the request, query token and all, to a
            # proxy the egress policy never checked, and the pinned address would be the proxy's business.
            httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=False, trust_env=False) as client,
            client.stream("POST", url, content=body, headers=dict(headers), extensions=extensions) as response,
        ):
            received = bytearray()
            async for chunk in response.aiter_bytes():
                received += chunk[: MAX_RESPONSE_BYTES - len(received)]
                if len(received) >= MAX_RESPONSE_BYTES:
                    break  # closing the stream drops the rest unread
            return WebhookResponse(response.status_code, received.decode("utf-8", errors="replace"))
