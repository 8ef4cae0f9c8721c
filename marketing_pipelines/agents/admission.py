"""``LimitsGate``: what stands between an agent run and each model call, and what is written after it.

Before a call: every rate limit of the provider and model admits it at once (``token_bucket.admit``: one
request, the prompt's estimate, ``max_tokens``), waiting for its turn inside the run's deadline, then the
campaign's and requester's daily budgets reserve its worst-case cost (``budgets.reserve``). After it, in the
transaction that records the turn: the buckets get back what the answer did not use and learn any lower limit
its headers state, the turn's cost is priced and added to the run's totals, and the budgets' reservation becomes
what was spent. A call that failed gives back its tokens and its budget reservation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.agents import budgets, costs
from marketing_pipelines.agents.providers.types import ModelTurn
from marketing_pipelines.db import token_bucket
from marketing_pipelines.db.schema import EVERY_MODEL

# How long one model call may wait for its turn before the step is retried later instead (agents/jobs.py).
TOKEN_WAIT_S = 20.0


def used_by(usage: Mapping[str, int]) -> dict[str, float]:
    """What a turn's usage counts against each limit unit, as the providers count it.

    Anthropic's input-token limit counts uncached input and cache writes, not cache reads ("cached input does not
    count against the input limit"); OpenAI's token limit counts every token of the call.
    """
    fresh = usage.get("input_tokens", 0) + usage.get("cache_creation_input_tokens", 0)
    output = usage.get("output_tokens", 0)
    return {
        "requests": 1.0,
        "input_tokens": float(fresh),
        "output_tokens": float(output),
        "tokens": float(fresh + usage.get("cache_read_input_tokens", 0) + output),
    }


@dataclass(frozen=True)
class Admission:
    reservation: token_bucket.Reservation
    day: date
    reserved_nano_usd: int
    reserved_tokens: int
    price: costs.Price | None


@dataclass
class LimitsGate:
    """The run's gate (``runner.ModelGate``): rate limits, budgets and cost of each model call."""

    engine: sa.Engine
    provider: str
    model: str
    agent_run_id: int
    campaign_id: str
    requested_by: str
    # unit -> per minute, for every model of the provider (AgentSettings.default_limits): rows made on first use.
    default_limits: Mapping[str, float]
    prices: Mapping[str, Any]
    # The longest one admission may wait (the step is retried later past it), and how a wait is slept.
    max_wait_s: Callable[[], float] = field(default=lambda: TOKEN_WAIT_S)
    sleep: Callable[[float], None] | None = None
    log: Callable[[str], None] = lambda _: None
    _ready: bool = False

    def _ensure_limits(self) -> None:
        if self._ready:
            return
        with self.engine.begin() as conn:
            for unit, per_minute in sorted(self.default_limits.items()):
                token_bucket.ensure_limit(conn, self.provider, EVERY_MODEL, unit, per_minute)
        self._ready = True

    def admit(self, estimate: Mapping[str, int]) -> Admission:
        self._ensure_limits()
        kwargs = {"sleep": self.sleep} if self.sleep is not None else {}
        reservation, waited = token_bucket.admit(
            self.engine, self.provider, self.model, estimate, max_wait_s=max(0.0, self.max_wait_s()), **kwargs
        )
        if waited > 0.5:
            self.log(f"Waited {waited:.1f}s for the {self.provider} {self.model} rate limits to admit a model call.")
        price = costs.price_of(self.provider, self.model, self.prices)
        nano_usd = costs.max_call_cost_nano_usd(dict(estimate), price)
        tokens = int(estimate.get("input_tokens", 0)) + int(estimate.get("output_tokens", 0))
        day = datetime.now(UTC).date()
        with self.engine.begin() as conn:
            refusal = budgets.reserve(
                conn,
                campaign_id=self.campaign_id,
                requested_by=self.requested_by,
                day=day,
                nano_usd=nano_usd,
                tokens=tokens,
            )
        if refusal is not None:
            # In a transaction of its own: settle() takes the limit rows before the ledger's, and one transaction
            # taking them in the other order could deadlock with it on PostgreSQL.
            with self.engine.begin() as conn:
                token_bucket.settle(conn, reservation, None)
            raise budgets.BudgetExhausted(refusal)
        return Admission(reservation, day, nano_usd, tokens, price)

    def settle(self, conn: sa.Connection, admission: Admission, turn: ModelTurn | None) -> dict[str, Any]:
        """Called in the transaction that records the turn (``turn`` None: the call failed, nothing recorded)."""
        usage = turn.usage if turn is not None else {}
        used = used_by(usage) if turn is not None else None
        token_bucket.settle(conn, admission.reservation, used)
        cost = costs.turn_cost_nano_usd(usage, admission.price) if turn is not None else 0
        budgets.settle(
            conn,
            campaign_id=self.campaign_id,
            requested_by=self.requested_by,
            day=admission.day,
            reserved_nano_usd=admission.reserved_nano_usd,
            reserved_tokens=admission.reserved_tokens,
            spent_nano_usd=cost,
            spent_tokens=int(used["tokens"]) if used is not None else 0,
        )
        if turn is None:
            return {}
        # Learned under the model asked for: the limits are configured by that name, the answer may name a snapshot.
        for change in token_bucket.learn(conn, self.provider, self.model, turn.rate_limits):
            self.log(f"Model limit lowered: {change}.")
        costs.record_turn(conn, self.agent_run_id, usage, cost if admission.price is not None else None)
        return {"cost_nano_usd": cost if admission.price is not None else None}

    def throttled(self, retry_after_s: float, rate_limits: Mapping[str, float]) -> None:
        """A 429: every replica's calls to this model wait its Retry-After, and any limit it states is learned."""
        with self.engine.begin() as conn:
            token_bucket.pause(conn, self.provider, self.model, retry_after_s)
            token_bucket.learn(conn, self.provider, self.model, rate_limits)
