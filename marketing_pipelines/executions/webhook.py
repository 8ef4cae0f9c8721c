"""``WebhookClient``: the HTTP client (a Dagster resource) that the ``webhook`` action posts with.

Apart from ``actions`` so that validating a payload when an execution is scheduled imports neither
Dagster nor httpx.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import dagster as dg
import httpx
from pydantic import Field, PrivateAttr, field_validator

from marketing_pipelines.egress import EgressPolicy, parse_networks
from marketing_pipelines.http import redact_httpx_logs
from marketing_pipelines.sealing import KeySource, key_source
from marketing_pipelines.settings import Settings, resource_from_settings, setting_field, shown_in_ui

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
    allow_networks: list[str] = setting_field("webhook_allow_networks")
    concurrency: int = setting_field("webhook_concurrency")
    secrets_key: str | None = setting_field("secrets_key")
    secrets_key_file: str | None = Field(
        default=None,
        description=(
            "The SQLite database's key file (secrets.key), used when secrets_key is not set; the two may not differ."
        ),
    )
    _run_loop: RunLoop | None = PrivateAttr(default=None)

    @field_validator("allow_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        return [str(network) for network in parse_networks(value)]

    @classmethod
    def from_settings(cls, settings: Settings, **values: Any) -> WebhookClient:
        """The client of ``settings`` (``values`` replace fields), with the SQLite database's key file (made
        by the demo) as its key source when MARKETING_SECRETS_KEY is not set.

        The file is read when a run sends, so one made after the code location loaded (a first demo
        while `marketing-pipelines ui` is up) is found.
        """
        key_file = settings.secrets_key_file()
        return resource_from_settings(cls, settings, secrets_key_file=str(key_file) if key_file else None, **values)

    def sealing_keys(self) -> KeySource:
        """The keys this process opens endpoints with and their source, as ``Settings.sealing_keys`` finds them
        for a command: read when a run sends; SealingError when the variable and the key file differ."""
        return key_source(self.secrets_key, self.secrets_key_file)

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
        if self._run_loop is not None:
            return self._run_loop.send(self, (parts.scheme, host, port), pinned, body, request_headers, extensions)
        return asyncio.run(self._post_once(pinned, body, request_headers, extensions))

    @contextmanager
    def one_loop(self) -> Iterator[None]:
        """Send every ``post`` of the block over one event loop and one connection pool per destination.

        For a run's batch, instead of ``asyncio.run`` and a new client (a new TLS context: about 20 ms
        of CPU) per webhook (benchmarks/per_execution.py --action webhook). Outside such a block (an
        alert from a sensor) each ``post`` stands alone.
        """
        self._run_loop = RunLoop()
        try:
            yield
        finally:
            loop, self._run_loop = self._run_loop, None
            loop.close()

    def new_client(self) -> httpx.AsyncClient:
        # trust_env=False: HTTP(S)_PROXY / ALL_PROXY would send the request, query token and all, to a
        # proxy the egress policy never checked, and the pinned address would be the proxy's business.
        # As many connections kept open as requests in flight: httpx keeps 20 by default, so past 20 at
        # once a run's batch closed and reopened connections to the same receiver.
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        return httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=False, trust_env=False, limits=limits)

    async def _post_once(
        self, url: str, body: bytes, headers: Mapping[str, str], extensions: dict[str, Any]
    ) -> WebhookResponse:
        async with self.new_client() as client:
            return await self.post_with(client, url, body, headers, extensions)

    async def post_with(
        self, client: httpx.AsyncClient, url: str, body: bytes, headers: Mapping[str, str], extensions: dict[str, Any]
    ) -> WebhookResponse:
        async with (
            asyncio.timeout(self.timeout_s),
            client.stream("POST", url, content=body, headers=dict(headers), extensions=extensions) as response,
        ):
            received = bytearray()
            async for chunk in response.aiter_bytes():
                received += chunk[: MAX_RESPONSE_BYTES - len(received)]
                if len(received) >= MAX_RESPONSE_BYTES:
                    break  # closing the stream drops the rest unread
            return WebhookResponse(response.status_code, received.decode("utf-8", errors="replace"))


class RunLoop:
    """One asyncio event loop in its own thread for a run's webhooks, with one client per destination.

    The run's worker threads hand it requests and wait for the answer. A client (and its connection
    pool) per scheme, host name and port: connections are pinned to the checked address, and an
    HTTPS connection opened with one host's name (SNI, certificate) must never carry another host's
    request, which one pool keyed by address alone would allow for two names on one address.
    """

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._clients: dict[tuple[str, str, int], httpx.AsyncClient] = {}  # touched only in the loop's thread
        self._thread = threading.Thread(target=self._loop.run_forever, name="webhook-loop", daemon=True)
        self._thread.start()

    def send(
        self,
        webhook: WebhookClient,
        destination: tuple[str, str, int],
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        extensions: dict[str, Any],
    ) -> WebhookResponse:
        async def post() -> WebhookResponse:
            client = self._clients.get(destination)
            if client is None:
                client = self._clients[destination] = webhook.new_client()
            return await webhook.post_with(client, url, body, headers, extensions)

        # The request's own timeout (asyncio.timeout in post_with) ends it; nothing waits longer.
        return asyncio.run_coroutine_threadsafe(post(), self._loop).result()

    def close(self) -> None:
        async def close_clients() -> None:
            for client in self._clients.values():
                await client.aclose()

        try:
            asyncio.run_coroutine_threadsafe(close_clients(), self._loop).result(timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()
