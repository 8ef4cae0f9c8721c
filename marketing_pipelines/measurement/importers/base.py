"""The interface every measurement importer resource meets, its not-configured error, and shared JSON decoding."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import httpx

from marketing_pipelines.http import ServiceError
from marketing_pipelines.strict_json import MAX_ENVELOPE_DEPTH, check_text_depth


class ImporterNotConfigured(Exception):
    """An importer was asked for data before its credentials were set; the message names the env vars."""


@runtime_checkable
class Importer(Protocol):
    """What assets and sensors need to know about an importer before they call it.

    ``name`` is a read-only property so an implementation can declare it as a ``ClassVar``: on a
    Dagster resource an annotated instance attribute would become a config field.
    """

    @property
    def name(self) -> str: ...

    def is_configured(self) -> bool: ...

    def not_configured_reason(self) -> str:
        """One line naming the env vars to set, e.g. ``set PLAUSIBLE_API_KEY and PLAUSIBLE_SITE_ID``."""
        ...


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
