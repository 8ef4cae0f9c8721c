"""``marketing-pipelines budgets``: daily model-spend budgets per campaign or requester, and today's spend."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

import click

from marketing_pipelines.cli.common import FriendlyGroup, emit_rows, json_option, ready_conn

# agents/budgets.py's bounds (MAX_DAILY_NANO_USD, MAX_DAILY_TOKENS), here so that parsing loads no database module.
NANO_PER_USD = 10**9
MAX_DAILY_USD = 10**6
MAX_DAILY_TOKENS = 10**12


class UsdAmount(click.ParamType):
    """US dollars as exact nano-dollars (an int): ``5``, ``5.00``, ``0.000000001``; from 0 to $1,000,000.

    Read as a decimal, never a float, so ``0.1`` is 100,000,000 nano-dollars exactly; ``nan``, ``inf``,
    negatives, text and amounts finer than a nano-dollar are refused in one line.
    """

    name = "usd"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            amount = Decimal(str(value).strip())
        except InvalidOperation:
            self.fail(f"{value!r} is not an amount of US dollars (e.g. 5.00)", param, ctx)
        if not amount.is_finite() or not 0 <= amount <= MAX_DAILY_USD:
            self.fail(f"{value!r} must be a finite amount of US dollars from 0 to {MAX_DAILY_USD:,}", param, ctx)
        nano = amount * NANO_PER_USD
        if nano != nano.to_integral_value():
            self.fail(f"{value!r} is finer than a nano-dollar (9 decimal places at most)", param, ctx)
        return int(nano)


def _scope(campaign_id: str | None, requester: str | None) -> tuple[str, str]:
    if (campaign_id is None) == (requester is None):
        raise click.UsageError("give one of --campaign ID or --requester USER")
    return ("campaign", campaign_id) if campaign_id is not None else ("requester", requester or "")


def _scope_options(command: Any) -> Any:
    command = click.option("--requester", default=None, metavar="USER", help="A requesting user's budget.")(command)
    return click.option("--campaign", "campaign_id", default=None, metavar="ID", help="A campaign's budget.")(command)


@click.group(cls=FriendlyGroup)
def budgets() -> None:
    """Daily model-spend budgets per campaign or requester, and today's spend against them."""


@budgets.command("set")
@_scope_options
@click.option("--daily-usd", "daily_nano_usd", type=UsdAmount(), default=None, help="Money a UTC day may cost.")
@click.option(
    "--daily-tokens", type=click.IntRange(0, MAX_DAILY_TOKENS), default=None, help="Tokens a UTC day may use."
)
def budgets_set(
    campaign_id: str | None, requester: str | None, daily_nano_usd: int | None, daily_tokens: int | None
) -> None:
    """Set a campaign's or a requester's daily limits (a limit not given stays as it is).

    Runs are refused when requested while a budget that applies is used up, and stopped before a model
    call it cannot pay for; a day is a UTC day. Every replica checks its next call against the new limits.

    \b
    Examples:
      marketing-pipelines budgets set --campaign spring-launch --daily-usd 5.00
      marketing-pipelines budgets set --campaign spring-launch --daily-tokens 2000000
    """
    from marketing_pipelines.agents.budget_reads import tokens_text, usd_text
    from marketing_pipelines.agents.budgets import set_budget

    scope, scope_id = _scope(campaign_id, requester)
    if daily_nano_usd is None and daily_tokens is None:
        raise click.UsageError("give --daily-usd, --daily-tokens or both")
    with ready_conn() as conn:
        budget = set_budget(conn, scope, scope_id, daily_nano_usd=daily_nano_usd, daily_tokens=daily_tokens)
    limits = [
        usd_text(budget.daily_nano_usd) if budget.daily_nano_usd is not None else None,
        tokens_text(budget.daily_tokens) if budget.daily_tokens is not None else None,
    ]
    click.echo(f"{scope} {scope_id}: daily budget {' and '.join(x for x in limits if x)} (UTC days)")


@budgets.command("clear")
@_scope_options
def budgets_clear(campaign_id: str | None, requester: str | None) -> None:
    """Remove a campaign's or a requester's budget; what it spent stays recorded.

    \b
    Example:
      marketing-pipelines budgets clear --campaign spring-launch
    """
    from marketing_pipelines.agents.budgets import clear_budget

    scope, scope_id = _scope(campaign_id, requester)
    with ready_conn() as conn:
        removed = clear_budget(conn, scope, scope_id)
    click.echo(f"{scope} {scope_id}: {'budget removed' if removed else 'had no budget'}")


@budgets.command("show")
@json_option
def budgets_show(as_json: bool) -> None:
    """Each budget next to today's (UTC) spend and what calls in flight have reserved.

    \b
    Example:
      marketing-pipelines budgets show
    """
    from marketing_pipelines.agents.budget_reads import list_budget_days, usd_text, utc_today

    with ready_conn() as conn:
        days = list_budget_days(conn, utc_today())
    rows = []
    for entry in days:
        budget, spend = entry.budget, entry.spend
        limit = budget.daily_nano_usd
        rows.append(
            {
                "scope": budget.scope,
                "id": budget.scope_id,
                "day": entry.day.isoformat(),
                "daily_usd": usd_text(limit) if limit is not None else None,
                "spent_usd": usd_text(spend.spent_nano_usd),
                "reserved_usd": usd_text(spend.reserved_nano_usd),
                "daily_tokens": budget.daily_tokens,
                "spent_tokens": spend.spent_tokens,
                "reserved_tokens": spend.reserved_tokens,
                **(
                    {
                        "daily_nano_usd": limit,
                        "spent_nano_usd": spend.spent_nano_usd,
                        "reserved_nano_usd": spend.reserved_nano_usd,
                        "updated_at": budget.updated_at,
                    }
                    if as_json
                    else {}
                ),
            }
        )
    columns = ["scope", "id", "daily_usd", "spent_usd", "reserved_usd", "daily_tokens", "spent_tokens"]
    emit_rows(rows, [*columns, "reserved_tokens"], as_json)
