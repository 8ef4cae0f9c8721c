"""Standard Webhooks signatures (https://www.standardwebhooks.com) for registered endpoints.

A receiver verifies ``webhook-signature`` against ``webhook-id``, ``webhook-timestamp`` and the
exact body bytes with the endpoint's secret, e.g. with the reference ``standardwebhooks`` package,
so it can tell our deliveries from anyone else's and refuse a replay older than its tolerance.
The signature itself is the reference library's (``standardwebhooks.Webhook.sign``), the same code
a receiver verifies with; this module decides what is signed and under which secrets.
Pure functions: no database, no HTTP.
"""

from __future__ import annotations

import base64
import json
import secrets
from datetime import UTC, datetime
from typing import Any

from standardwebhooks.webhooks import Webhook

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32


def new_signing_secret() -> str:
    """``whsec_`` + base64 of 32 random bytes, the form the spec and its libraries read."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def body_bytes(body: Any) -> bytes:
    """The exact bytes a webhook sends (and signs): compact JSON, UTF-8, NaN refused."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of "id.timestamp.body">`` under one ``whsec_`` secret: the body's exact bytes."""
    return Webhook(secret).sign(message_id, datetime.fromtimestamp(timestamp, UTC), body)


def signature_header(secrets_in_force: list[str], message_id: str, timestamp: int, body: bytes) -> str:
    """Space-separated signatures, one per secret in force (two while a rotation overlaps)."""
    return " ".join(signature(secret, message_id, timestamp, body) for secret in secrets_in_force)
