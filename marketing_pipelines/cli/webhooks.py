"""``marketing-pipelines webhooks``: registered, signed webhook endpoints (add, list, rotate, remove, reseal).

A signing secret is printed once, when it is made (``add``, ``rotate``), on a line of its own; nothing
lists it again. URLs show as scheme and host only: their paths are often tokens.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import click

from marketing_pipelines.cli.common import (
    FriendlyGroup,
    cli_webhook_policy,
    emit_rows,
    json_option,
    ready_conn,
    settings,
)
from marketing_pipelines.executions.endpoints import (
    add_endpoint,
    list_endpoints,
    previous_signs_until,
    remove_endpoint,
    reseal_endpoints,
    rotate_endpoint,
)
from marketing_pipelines.redact import url_origin
from marketing_pipelines.sealing import SealingError, SecretBox, new_key


@click.group(cls=FriendlyGroup)
def webhooks() -> None:
    """Registered webhook endpoints: sealed URLs, Standard Webhooks signatures."""


def _box() -> SecretBox:
    try:
        return SecretBox.of(settings().sealing_keys())
    except SealingError as exc:
        raise click.ClickException(str(exc)) from None


def _echo_secret(name: str, url_shown: str, secret: str, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"name": name, "url": url_shown, "secret": secret}))
        return
    click.echo(f"endpoint {name} -> {url_shown}; its signing secret, shown this once:", err=True)
    click.echo(secret)


@webhooks.command("add")
@click.argument("name")
@click.option("--url", required=True, help="Where deliveries go; egress-checked now and at every send.")
@click.option("--campaign", "campaign_id", default=None, help="Only this campaign's executions may use it.")
@json_option
def webhooks_add(name: str, url: str, campaign_id: str | None, as_json: bool) -> None:
    """Register an endpoint and print its signing secret once.

    \b
    Example:
      marketing-pipelines webhooks add crm --url https://crm.example.com/hooks/marketing
      marketing-pipelines executions schedule --campaign spring-launch --stage launch --action webhook \\
        --due now --payload '{"endpoint": "crm", "body": {"event": "launched"}}'
    """
    box = _box()
    with ready_conn() as conn:
        # The policy of the runs that will send to it, as `executions schedule` checks a URL against.
        secret = add_endpoint(conn, box, name, url, cli_webhook_policy(), campaign_id)
    _echo_secret(name, url_origin(url), secret, as_json)


@webhooks.command("list")
@json_option
def webhooks_list(as_json: bool) -> None:
    """List endpoints (URL as scheme and host; never a secret).

    \b
    Example:
      marketing-pipelines webhooks list --json
    """
    with ready_conn() as conn:
        rows = [
            {
                "name": e.name,
                "url": e.origin,
                "campaign_id": e.campaign_id,
                "created_at": e.created_at,
                "rotated_at": e.rotated_at,
                "previous_secret_until": e.previous_secret_until,
            }
            for e in list_endpoints(conn)
        ]
    emit_rows(rows, ["name", "url", "campaign_id", "created_at", "rotated_at", "previous_secret_until"], as_json)


@webhooks.command("rotate")
@click.argument("name")
@click.option(
    "--void-previous",
    is_flag=True,
    help="Rotate again within the overlap: the secret before the last rotation stops signing now.",
)
@json_option
def webhooks_rotate(name: str, void_previous: bool, as_json: bool) -> None:
    """Give an endpoint a new signing secret, printed once.

    The previous secret keeps signing alongside the new one (two signatures per delivery) for
    MARKETING_WEBHOOK_ROTATION_HOURS (default 24), so receivers can switch without a gap. A second
    rotation within that overlap is refused: it would stop the secret before the first one while
    receivers may still check it. --void-previous does it anyway, and says so.

    \b
    Example:
      marketing-pipelines webhooks rotate crm
    """
    box, current = _box(), settings()
    now = datetime.now(UTC)
    with ready_conn() as conn:
        before = {e.name: e for e in list_endpoints(conn)}.get(name)
        secret = rotate_endpoint(
            conn, box, name, timedelta(hours=current.webhook_rotation_hours), now, void_previous=void_previous
        )
        origin = next(e.origin for e in list_endpoints(conn) if e.name == name)
    voided = previous_signs_until(before.previous_secret_until, now) if before is not None else None
    if voided is not None:
        click.echo(
            f"endpoint {name}: the secret before its last rotation no longer signs "
            f"(it was to sign until {voided:%Y-%m-%d %H:%M} UTC)",
            err=True,
        )
    _echo_secret(name, origin, secret, as_json)


@webhooks.command("remove")
@click.argument("name")
def webhooks_remove(name: str) -> None:
    """Remove an endpoint; executions still naming it fail (refused) when due.

    \b
    Example:
      marketing-pipelines webhooks remove crm
    """
    with ready_conn() as conn:
        if not remove_endpoint(conn, name):
            raise click.ClickException(f"no webhook endpoint named {name!r}")
    click.echo(f"removed endpoint {name}")


@webhooks.command("reseal")
def webhooks_reseal() -> None:
    """Seal every stored URL and secret again under the first key of MARKETING_SECRETS_KEY.

    Rotating the key: put a new key first (MARKETING_SECRETS_KEY=new,old), reseal, then drop the old one.

    \b
    Example:
      MARKETING_SECRETS_KEY=$NEW_KEY,$OLD_KEY marketing-pipelines webhooks reseal
    """
    box = _box()
    with ready_conn() as conn:
        count = reseal_endpoints(conn, box)
    click.echo(f"resealed {count} endpoint(s)")


@webhooks.command("new-key")
def webhooks_new_key() -> None:
    """Print a new Fernet key for MARKETING_SECRETS_KEY.

    \b
    Example:
      export MARKETING_SECRETS_KEY=$(marketing-pipelines webhooks new-key)
    """
    click.echo(new_key())
