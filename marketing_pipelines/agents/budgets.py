"""Daily spend budgets per campaign and per requester, in money (nano-dollars) and tokens, strict across replicas.

A budget (``spend_budget``) caps one UTC day of model calls for a campaign or for the user who requested
the runs. The day's account is a ledger row per scope (``spend_ledger``): what answered calls cost
(``spent_*``) and what calls in flight may still cost at most (``reserved_*``). Every call is recorded,
whether or not a budget is set, so a budget set at noon counts the morning.

Before a model call the gate reserves its worst case (``reserve``): per ledger row, one conditional
``UPDATE ... WHERE reserved + spent + amount <= limit``, whose row count says whether it was taken. The
row lock (PostgreSQL) or the write lock (SQLite's ``BEGIN IMMEDIATE``) serialises the callers, and each
sees what the previous one left, so replicas never spend the same headroom twice. After the call,
``settle`` moves the reservation to spent with what the answer reported. Spend thus stays within the
budget plus what one answer used beyond its reservation (none when reservations are worst cases).

Lock order: the campaign's row, then the requester's, in every transaction that takes both, so two
processes never wait on each other's row (no deadlock on PostgreSQL).

A process that dies between ``reserve`` and ``settle`` leaves its reservation on that day's row: the
budget is under-used (never over-spent) until the day ends, and ``budgets show`` shows it as reserved.
"""

from __future__ import annotations

import operator
from datetime import UTC, date, datetime
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.agents.budget_reads import (
    NANO_PER_USD,
    Budget,
    budget_scopes,
    day_spend,
    get_budget,
    ledger_row,
    spent_reason,
    tokens_text,
    usd_text,
)
from marketing_pipelines.agents.runner import AgentStopped
from marketing_pipelines.agents.users import require_user
from marketing_pipelines.db.campaigns import require_campaign
from marketing_pipelines.db.engine import insert_ignoring_conflicts
from marketing_pipelines.db.schema import SPEND_SCOPES, spend_budget, spend_ledger
from marketing_pipelines.errors import InvalidInput

# A million dollars a day is far above any campaign's model spend and far below where the sums overflow.
MAX_DAILY_NANO_USD = 10**6 * NANO_PER_USD
MAX_DAILY_TOKENS = 10**12
# One call's amounts are bounded before they reach the ledger (settle's come from a provider's answer): at
# these, a day of calls stays far inside a 64-bit integer.
MAX_CALL_NANO_USD = 10**4 * NANO_PER_USD
MAX_CALL_TOKENS = 10**9


class BudgetExhausted(AgentStopped):
    """The campaign's or the requester's daily budget cannot pay for the next model call; the run ends FAILED."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _amount(value: Any, name: str, maximum: int) -> int:
    """A call's amount as an integer from 0 to ``maximum``: floats (NaN), bools and negatives are refused."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    number = operator.index(value)  # TypeError for a float or a string
    if number < 0:
        raise ValueError(f"{name} must not be negative, got {number}")
    return min(number, maximum)


def _ensure_day(conn: sa.Connection, scope: str, scope_id: str, day: date) -> None:
    # ON CONFLICT DO NOTHING: the first calls of a day from every replica all create its row.
    conn.execute(
        insert_ignoring_conflicts(
            conn, spend_ledger, spend_ledger.c.scope, spend_ledger.c.scope_id, spend_ledger.c.day
        ).values(
            scope=scope,
            scope_id=scope_id,
            day=day,
            reserved_nano_usd=0,
            spent_nano_usd=0,
            reserved_tokens=0,
            spent_tokens=0,
            updated_at=datetime.now(UTC),
        )
    )


def _limit(column: sa.Column[Any], scope: str, scope_id: str) -> sa.ScalarSelect[Any]:
    """The scope's limit read inside the statement that checks it: NULL when no budget (or no such limit) is set."""
    return sa.select(column).where(spend_budget.c.scope == scope, spend_budget.c.scope_id == scope_id).scalar_subquery()


def _within(
    reserved: sa.Column[int], spent: sa.Column[int], limit: sa.ScalarSelect[Any], amount: int
) -> sa.ColumnElement[bool]:
    return sa.or_(limit.is_(None), reserved + spent + amount <= limit)


def _take(conn: sa.Connection, scope: str, scope_id: str, day: date, nano_usd: int, tokens: int) -> bool:
    """Reserve on one ledger row in one statement; False (and nothing changed) when its budget has no room."""
    ledger = spend_ledger
    taken = conn.execute(
        sa.update(ledger)
        .where(
            ledger_row(scope, scope_id, day),
            _within(
                ledger.c.reserved_nano_usd,
                ledger.c.spent_nano_usd,
                _limit(spend_budget.c.daily_nano_usd, scope, scope_id),
                nano_usd,
            ),
            _within(
                ledger.c.reserved_tokens,
                ledger.c.spent_tokens,
                _limit(spend_budget.c.daily_tokens, scope, scope_id),
                tokens,
            ),
        )
        .values(
            reserved_nano_usd=ledger.c.reserved_nano_usd + nano_usd,
            reserved_tokens=ledger.c.reserved_tokens + tokens,
            updated_at=datetime.now(UTC),
        )
    ).rowcount
    return taken == 1


def _settle_row(
    conn: sa.Connection,
    scope: str,
    scope_id: str,
    day: date,
    reserved: tuple[int, int],
    spent: tuple[int, int],
) -> None:
    ledger = spend_ledger
    conn.execute(
        sa.update(ledger)
        .where(ledger_row(scope, scope_id, day))
        .values(
            # Never below zero: a reservation settled twice (a bug) must not fail the turn's transaction.
            reserved_nano_usd=sa.case(
                (ledger.c.reserved_nano_usd >= reserved[0], ledger.c.reserved_nano_usd - reserved[0]), else_=0
            ),
            reserved_tokens=sa.case(
                (ledger.c.reserved_tokens >= reserved[1], ledger.c.reserved_tokens - reserved[1]), else_=0
            ),
            spent_nano_usd=ledger.c.spent_nano_usd + spent[0],
            spent_tokens=ledger.c.spent_tokens + spent[1],
            updated_at=datetime.now(UTC),
        )
    )


def reserve(
    conn: sa.Connection, *, campaign_id: str, requested_by: str, day: date, nano_usd: int, tokens: int
) -> str | None:
    """Reserve a call's worst case against the campaign's and the requester's budgets for ``day``: both or neither.

    Returns None when reserved (settle it with ``settle`` and the same arguments), else the one-line reason
    the call may not be made, with nothing reserved. Runs in the caller's transaction, which holds the
    ledger rows' locks until it commits: keep it short (the gate commits before it calls the model).
    """
    nano_usd = _amount(nano_usd, "nano_usd", MAX_CALL_NANO_USD)
    tokens = _amount(tokens, "tokens", MAX_CALL_TOKENS)
    taken: list[tuple[str, str]] = []
    for scope, scope_id in budget_scopes(campaign_id, requested_by):
        _ensure_day(conn, scope, scope_id, day)
        if not _take(conn, scope, scope_id, day, nano_usd, tokens):
            # Both or neither: what the earlier row took is given back in the same transaction, whose lock on
            # that row no other process has waited past.
            for done_scope, done_id in taken:
                _settle_row(conn, done_scope, done_id, day, (nano_usd, tokens), (0, 0))
            return _refusal(conn, scope, scope_id, day, needs=(nano_usd, tokens))
        taken.append((scope, scope_id))
    return None


def settle(
    conn: sa.Connection,
    *,
    campaign_id: str,
    requested_by: str,
    day: date,
    reserved_nano_usd: int,
    reserved_tokens: int,
    spent_nano_usd: int,
    spent_tokens: int,
) -> None:
    """Give back a call's reservation and record what it cost (0 for a call that failed unanswered).

    ``day`` is the day it was reserved on. What was spent may exceed what was reserved (an estimate that
    was low): spent records it all the same, bounded per call.
    """
    reserved = (
        _amount(reserved_nano_usd, "reserved_nano_usd", MAX_CALL_NANO_USD),
        _amount(reserved_tokens, "reserved_tokens", MAX_CALL_TOKENS),
    )
    spent = (
        _amount(spent_nano_usd, "spent_nano_usd", MAX_CALL_NANO_USD),
        _amount(spent_tokens, "spent_tokens", MAX_CALL_TOKENS),
    )
    for scope, scope_id in budget_scopes(campaign_id, requested_by):
        _ensure_day(conn, scope, scope_id, day)
        _settle_row(conn, scope, scope_id, day, reserved, spent)


def _refusal(conn: sa.Connection, scope: str, scope_id: str, day: date, needs: tuple[int, int]) -> str:
    budget = get_budget(conn, scope, scope_id)
    if budget is None:  # the UPDATE refused, then `budgets clear` removed the budget
        return f"{scope} {scope_id}'s daily budget changed while this call was admitted; try again"
    spend = day_spend(conn, scope, scope_id, day)
    reason = spent_reason(budget, day, spend, needs) or spent_reason(budget, day, spend, needs, first_limit=True)
    assert reason is not None, "a budget holds at least one limit (ck_spend_budget_limit)"
    return reason


# --- budgets as the command line sets them ----------------------------------------------------


def _require_scope(conn: sa.Connection, scope: str, scope_id: str) -> None:
    if scope not in SPEND_SCOPES:
        raise InvalidInput(f"budget scope {scope!r} is not one of {', '.join(SPEND_SCOPES)}")
    if scope == "campaign":
        require_campaign(conn, scope_id)
    else:
        require_user(conn, scope_id)


def set_budget(
    conn: sa.Connection, scope: str, scope_id: str, *, daily_nano_usd: int | None, daily_tokens: int | None
) -> Budget:
    """Set the limits given (None: keep what is set); every replica checks its next call against them."""
    _require_scope(conn, scope, scope_id)
    if daily_nano_usd is None and daily_tokens is None:
        raise InvalidInput("give a daily limit: --daily-usd, --daily-tokens or both")
    values: dict[str, int] = {}
    if daily_nano_usd is not None:
        values["daily_nano_usd"] = _limit_value(daily_nano_usd, MAX_DAILY_NANO_USD, usd_text)
    if daily_tokens is not None:
        values["daily_tokens"] = _limit_value(daily_tokens, MAX_DAILY_TOKENS, tokens_text)
    now = datetime.now(UTC)
    conn.execute(
        insert_ignoring_conflicts(conn, spend_budget, spend_budget.c.scope, spend_budget.c.scope_id).values(
            scope=scope, scope_id=scope_id, updated_at=now, **values
        )
    )
    conn.execute(
        sa.update(spend_budget)
        .where(spend_budget.c.scope == scope, spend_budget.c.scope_id == scope_id)
        .values(updated_at=now, **values)
    )
    budget = get_budget(conn, scope, scope_id)
    assert budget is not None
    return budget


def _limit_value(value: int, maximum: int, text: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise InvalidInput(f"a daily limit must be from 0 to {text(maximum)}, got {value!r}")
    return value


def clear_budget(conn: sa.Connection, scope: str, scope_id: str) -> bool:
    """Remove a scope's budget (its spend stays recorded); False when it had none."""
    _require_scope(conn, scope, scope_id)
    removed = conn.execute(
        sa.delete(spend_budget).where(spend_budget.c.scope == scope, spend_budget.c.scope_id == scope_id)
    ).rowcount
    return removed == 1
