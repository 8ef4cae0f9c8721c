"""Daily spend budgets as read: the limits, each scope's account for a UTC day, the reasons a full budget gives,
and the check at a run's request (``admission_refusal``).

Apart from ``budgets.py`` (reserve and settle, which the model gate calls) because the queue imports this at
every request, and ``budgets.py`` imports the runner (``BudgetExhausted`` is an ``AgentStopped``), which
imports the queue: one module would close that circle.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.db.schema import spend_budget, spend_ledger

NANO_PER_USD = 10**9


@dataclass(frozen=True)
class Budget:
    scope: str
    scope_id: str
    daily_nano_usd: int | None
    daily_tokens: int | None
    updated_at: datetime


@dataclass(frozen=True)
class DaySpend:
    """One scope's account for one UTC day; all zero before its first call."""

    reserved_nano_usd: int = 0
    spent_nano_usd: int = 0
    reserved_tokens: int = 0
    spent_tokens: int = 0


@dataclass(frozen=True)
class BudgetDay:
    budget: Budget
    day: date
    spend: DaySpend


def utc_today() -> date:
    return datetime.now(UTC).date()


def usd_text(nano_usd: int) -> str:
    """``$4.998`` for 4,998,000,000 nano-dollars: exact, at least cents, no trailing zeros beyond them."""
    sign = "-" if nano_usd < 0 else ""
    whole, fraction = divmod(abs(nano_usd), NANO_PER_USD)
    return f"{sign}${whole:,}.{f'{fraction:09d}'.rstrip('0').ljust(2, '0')}"


def tokens_text(tokens: int) -> str:
    return f"{tokens:,} tokens"


def budget_scopes(campaign_id: str, requested_by: str) -> Iterator[tuple[str, str]]:
    """The budgets a call of ``requested_by``'s run on ``campaign_id`` answers to, in the one order every
    transaction locks their ledger rows (so two processes never deadlock on PostgreSQL)."""
    yield "campaign", campaign_id
    yield "requester", requested_by


def ledger_row(scope: str, scope_id: str, day: date) -> sa.ColumnElement[bool]:
    ledger = spend_ledger
    return sa.and_(ledger.c.scope == scope, ledger.c.scope_id == scope_id, ledger.c.day == day)


def _budget(row: Any) -> Budget:
    return Budget(row.scope, row.scope_id, row.daily_nano_usd, row.daily_tokens, row.updated_at)


def get_budget(conn: sa.Connection, scope: str, scope_id: str) -> Budget | None:
    row = conn.execute(
        sa.select(spend_budget).where(spend_budget.c.scope == scope, spend_budget.c.scope_id == scope_id)
    ).one_or_none()
    return _budget(row) if row else None


def day_spend(conn: sa.Connection, scope: str, scope_id: str, day: date) -> DaySpend:
    ledger = spend_ledger
    row = conn.execute(
        sa.select(
            ledger.c.reserved_nano_usd, ledger.c.spent_nano_usd, ledger.c.reserved_tokens, ledger.c.spent_tokens
        ).where(ledger_row(scope, scope_id, day))
    ).one_or_none()
    return DaySpend(**row._mapping) if row else DaySpend()


def list_budget_days(conn: sa.Connection, day: date) -> list[BudgetDay]:
    """Every budget with its scope's account for ``day``, campaigns first."""
    ledger = spend_ledger
    rows = conn.execute(
        sa.select(
            spend_budget,
            ledger.c.reserved_nano_usd,
            ledger.c.spent_nano_usd,
            ledger.c.reserved_tokens,
            ledger.c.spent_tokens,
        )
        .select_from(
            spend_budget.outerjoin(
                ledger,
                sa.and_(
                    ledger.c.scope == spend_budget.c.scope,
                    ledger.c.scope_id == spend_budget.c.scope_id,
                    ledger.c.day == day,
                ),
            )
        )
        .order_by(spend_budget.c.scope, spend_budget.c.scope_id)
    ).all()
    return [
        BudgetDay(
            _budget(row),
            day,
            DaySpend(
                row.reserved_nano_usd or 0, row.spent_nano_usd or 0, row.reserved_tokens or 0, row.spent_tokens or 0
            ),
        )
        for row in rows
    ]


def admission_refusal(conn: sa.Connection, *, campaign_id: str, requested_by: str, day: date) -> str | None:
    """Why a run may not be admitted now: a budget that applies is used up for ``day`` (spent + reserved >= limit).

    None when every budget has room left; a run that meets a full budget later is stopped before its next call.
    """
    for scope, scope_id in budget_scopes(campaign_id, requested_by):
        budget = get_budget(conn, scope, scope_id)
        if budget is None:
            continue
        reason = spent_reason(budget, day, day_spend(conn, scope, scope_id, day), needs=None)
        if reason is not None:
            return reason
    return None


def spent_reason(
    budget: Budget, day: date, spend: DaySpend, needs: tuple[int, int] | None, *, first_limit: bool = False
) -> str | None:
    """The reason naming the first limit of ``budget`` without room for ``needs`` (nano-dollars, tokens), or
    with none left at all when ``needs`` is None; None when each has room. ``first_limit`` names the first
    limit set whatever its room (a call settled since the refusal may have made some)."""
    units = (
        (budget.daily_nano_usd, spend.spent_nano_usd, spend.reserved_nano_usd, usd_text, "--daily-usd"),
        (budget.daily_tokens, spend.spent_tokens, spend.reserved_tokens, tokens_text, "--daily-tokens"),
    )
    for index, (limit, spent, reserved, text, option) in enumerate(units):
        if limit is None:
            continue
        amount = 0 if needs is None else needs[index]
        full = spent + reserved >= limit if needs is None else spent + reserved + amount > limit
        if not (full or first_limit):
            continue
        owner = f"{budget.scope} {budget.scope_id}'s daily budget of {text(limit)} for {day.isoformat()} (UTC)"
        account = f"{text(spent)} spent, {text(reserved)} reserved"
        if needs is not None:
            return f"{owner} is spent: {account}; this call needs up to {text(amount)}"
        flag = "--campaign" if budget.scope == "campaign" else "--requester"
        return (
            f"{owner} is used up: {account}; it renews at 00:00 UTC, or raise it with "
            f"`marketing-pipelines budgets set {flag} {budget.scope_id} {option} N`"
        )
    return None
