"""Registered webhook endpoints: a name, a sealed URL and Standard Webhooks signing secrets.

``marketing-pipelines webhooks add NAME --url URL`` registers one and prints its secret once; an
execution then names it (``{"endpoint": "NAME", "body": ...}``) instead of carrying a URL, so the URL
(whose path is often a token) and the secret live sealed in one row (``sealing.py``), never in a
payload, a log line or a run's config. ``rotate`` issues a new secret; the previous one keeps
signing alongside it until ``previous_secret_until`` so receivers can switch without a gap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import sqlalchemy as sa

from marketing_pipelines.db.campaigns import require_campaign
from marketing_pipelines.db.schema import webhook_endpoint
from marketing_pipelines.egress import EgressPolicy
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.executions.actions import Endpoint, InvalidPayload, check_endpoint_name, check_webhook_url
from marketing_pipelines.executions.signing import new_signing_secret
from marketing_pipelines.redact import remember_secrets, remember_url_secrets, url_origin
from marketing_pipelines.sealing import KeySource, SealingError, SecretBox


@dataclass(frozen=True)
class EndpointInfo:
    """What may be shown of an endpoint: never its URL's path or query, never a secret."""

    name: str
    campaign_id: str | None
    origin: str
    created_at: datetime
    rotated_at: datetime | None
    previous_secret_until: datetime | None


def _checked_name(name: str) -> str:
    try:
        check_endpoint_name(name)
    except InvalidPayload as exc:
        raise InvalidInput(str(exc).replace("webhook 'endpoint'", "endpoint name")) from None
    return name


def refuse_user_info(url: str, named: str, credential_place: str) -> None:
    """InvalidInput when ``url`` holds ``user:password@``, naming it as ``named``. A send connects to the checked
    address and never carries user info (webhook.WebhookClient.post): accepted, the credential would be dropped
    silently at every delivery. A URL that does not split is left to the URL checks, which name that."""
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return
    if "@" in netloc:
        raise InvalidInput(
            f"{named} {url_origin(url)} holds user info (user:password@), which deliveries never send; "
            f"put the credential in the URL's path or query, or in a header of {credential_place}"
        )


def add_endpoint(
    conn: sa.Connection,
    box: SecretBox,
    name: str,
    url: str,
    egress: EgressPolicy,
    campaign_id: str | None = None,
    now: datetime | None = None,
) -> str:
    """Register ``name`` -> ``url`` (egress-checked now and again at every send); returns the new secret."""
    _checked_name(name)
    try:
        check_webhook_url(url, egress)
    except InvalidPayload as exc:
        raise InvalidInput(str(exc)) from None
    refuse_user_info(url, "webhook URL", "the execution's payload")
    if campaign_id is not None:
        require_campaign(conn, campaign_id)
    if conn.execute(sa.select(webhook_endpoint.c.name).where(webhook_endpoint.c.name == name)).first():
        raise InvalidInput(f"webhook endpoint {name!r} exists; `webhooks rotate` renews its secret")
    secret = new_signing_secret()
    conn.execute(
        sa.insert(webhook_endpoint).values(
            name=name,
            campaign_id=campaign_id,
            origin=url_origin(url),
            url_sealed=box.seal(url),
            secret_sealed=box.seal(secret),
            created_at=now or datetime.now(UTC),
        )
    )
    return secret


def list_endpoints(conn: sa.Connection) -> list[EndpointInfo]:
    t = webhook_endpoint
    rows = conn.execute(
        sa.select(
            t.c.name, t.c.campaign_id, t.c.origin, t.c.created_at, t.c.rotated_at, t.c.previous_secret_until
        ).order_by(t.c.name)
    ).all()
    return [EndpointInfo(*row) for row in rows]


def rotate_endpoint(
    conn: sa.Connection,
    box: SecretBox,
    name: str,
    overlap: timedelta,
    now: datetime | None = None,
    *,
    void_previous: bool = False,
) -> str:
    """A new secret for ``name``; the current one keeps signing alongside it for ``overlap``. Returns it.

    An endpoint holds two secrets at most. Rotating again while the previous secret still signs would drop
    that one before its overlap ends, and receivers still checking it would refuse every delivery: that is
    refused unless ``void_previous`` says the caller means it. ``overlap`` 0 means "only the new secret from
    now", which drops both old ones by definition.
    """
    t = webhook_endpoint
    now = now or datetime.now(UTC)
    row = conn.execute(
        sa.select(t.c.secret_sealed, t.c.previous_secret_until).where(t.c.name == _checked_name(name)).with_for_update()
    ).first()
    if row is None:
        raise InvalidInput(f"no webhook endpoint named {name!r}")
    if overlap > timedelta(0) and not void_previous and (until := previous_signs_until(row.previous_secret_until, now)):
        raise InvalidInput(
            f"webhook endpoint {name!r}: the secret before its last rotation still signs until {until:%Y-%m-%d %H:%M} "
            "UTC, and rotating again would stop it now, before receivers still checking it switch; rotate after "
            "then, or pass --void-previous to stop it now; nothing was changed"
        )
    try:
        box.open(row.secret_sealed)  # refuse before writing when the key cannot open what is stored
    except SealingError as exc:
        raise SealingError(f"webhook endpoint {name!r}: {exc}; nothing was changed") from None
    secret = new_signing_secret()
    rotated = conn.execute(
        sa.update(t)
        # The secret read above: a rotation that committed since (SQLite takes no row lock) is not overwritten.
        .where(t.c.name == name, t.c.secret_sealed == row.secret_sealed)
        .values(
            secret_sealed=box.seal(secret),
            previous_secret_sealed=row.secret_sealed if overlap > timedelta(0) else None,
            previous_secret_until=now + overlap if overlap > timedelta(0) else None,
            rotated_at=now,
        )
    ).rowcount
    if rotated != 1:
        raise InvalidInput(f"webhook endpoint {name!r} was rotated or removed meanwhile; nothing was changed")
    return secret


def previous_signs_until(until: datetime | None, now: datetime) -> datetime | None:
    """``until`` when a previous secret still signs at ``now`` (its overlap not over), else None."""
    return until if until is not None and until > now else None


def remove_endpoint(conn: sa.Connection, name: str) -> bool:
    t = webhook_endpoint
    return conn.execute(sa.delete(t).where(t.c.name == _checked_name(name))).rowcount == 1


def reseal_endpoints(conn: sa.Connection, box: SecretBox) -> int:
    """Seal every stored value again under the first key of MARKETING_SECRETS_KEY; returns rows resealed."""
    t = webhook_endpoint
    rows = conn.execute(
        sa.select(t.c.name, t.c.url_sealed, t.c.secret_sealed, t.c.previous_secret_sealed)
        .order_by(t.c.name)
        .with_for_update()
    ).all()
    for row in rows:
        try:
            values = {
                "url_sealed": box.reseal(row.url_sealed),
                "secret_sealed": box.reseal(row.secret_sealed),
                "previous_secret_sealed": box.reseal(row.previous_secret_sealed)
                if row.previous_secret_sealed
                else None,
            }
        except SealingError as exc:
            # The caller's transaction rolls back the endpoints resealed before this one: all or nothing.
            raise SealingError(
                f"webhook endpoint {row.name!r}: {exc}; give the key it was sealed with after the new one "
                "(new,old) to reseal; nothing was changed"
            ) from None
        conn.execute(sa.update(t).where(t.c.name == row.name).values(**values))
    return len(rows)


def require_endpoint(conn: sa.Connection, name: str, campaign_id: str) -> None:
    """Schedule-time check (no key needed): ``name`` is registered and may serve ``campaign_id``."""
    t = webhook_endpoint
    row = conn.execute(sa.select(t.c.campaign_id).where(t.c.name == name)).first()
    if row is None:
        raise InvalidInput(f"no webhook endpoint named {name!r}; register it with `marketing-pipelines webhooks add`")
    if row.campaign_id is not None and row.campaign_id != campaign_id:
        raise InvalidInput(f"webhook endpoint {name!r} serves campaign {row.campaign_id!r}, not {campaign_id!r}")


def endpoint_names(payloads: Iterable[Mapping[str, Any]]) -> set[str]:
    return {p["endpoint"] for p in payloads if isinstance(p, Mapping) and isinstance(p.get("endpoint"), str)}


def open_endpoints(conn: sa.Connection, keys: Callable[[], KeySource], names: set[str]) -> dict[str, Endpoint | str]:
    """The named endpoints opened for sending; a name that cannot be used maps to the one-line reason.

    ``keys`` is called here, so that no key source (or two that disagree) fails each named endpoint.
    """
    if not names:
        return {}
    t = webhook_endpoint
    rows = {row.name: row for row in conn.execute(sa.select(t).where(t.c.name.in_(sorted(names))))}
    opened: dict[str, Endpoint | str] = {}
    try:
        box = SecretBox.of(keys())
    except SealingError as exc:
        return {name: str(exc) for name in names}
    for name in names:
        row = rows.get(name)
        if row is None:
            opened[name] = "not registered (removed?)"
            continue
        try:
            endpoint = Endpoint(
                name,
                row.campaign_id,
                box.open(row.url_sealed),
                box.open(row.secret_sealed),
                box.open(row.previous_secret_sealed) if row.previous_secret_sealed else None,
                row.previous_secret_until,
            )
        except SealingError as exc:
            opened[name] = str(exc)
            continue
        # Opened, they are in this process's memory: a receiver quoting its URL's path, or a stray log of a
        # secret, is redacted wherever this process shows, stores or sends text.
        remember_url_secrets(endpoint.url, path_is_secret=True)
        remember_secrets(endpoint.secret, endpoint.previous_secret)
        opened[name] = endpoint
    return opened
