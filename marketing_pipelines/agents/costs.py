"""What model calls cost: prices per model, the cost of a turn and the worst case of a call, each agent run's totals,
and the daily cost per campaign, provider and model (the SQL of the asset ``agent_model_cost_daily``).

Costs are exact integers of nano-dollars (1e-9 USD), never floats: a run's cost is the sum of its turns' costs,
and a day's the sum of its turns', to the nano-dollar. A price (``MARKETING_MODEL_PRICES``, USD per million tokens
to at most 6 decimals) is held in pico-dollars per token, so a turn's cost is an integer sum rounded once.

A model without a price has an unknown cost, counted as such (``unknown_cost_turns``) and never as 0; the offline
provider costs 0. Shown costs are USD with 6 decimals (``usd_text``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from marketing_pipelines.db.schema import AGENT_RUN_COST_COLUMNS, agent_model_cost_daily, agent_run, agent_run_step
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.settings import PRICE_DECIMALS, PRICES_READ_ON

if TYPE_CHECKING:
    import dagster as dg

NANO_PER_USD = 10**9
PICO_PER_NANO = 1000
# Providers that bill nothing: their turns cost 0, a known cost.
FREE_PROVIDERS = frozenset({"offline"})
# A turn's token counts above this are not a real answer (the largest context windows hold about 1M tokens).
MAX_TURN_TOKENS = 100_000_000
# A dated snapshot or an alias of a priced model: claude-sonnet-4-5-20250929, gpt-4o-2024-08-06, claude-...-latest.
_SNAPSHOT_SUFFIX = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2}|latest)$")
# agent_run's totals by the usage key each sums (ModelTurn.usage speaks USAGE_KEYS).
_USAGE_COLUMNS = {
    "input_tokens": "input_tokens",
    "output_tokens": "output_tokens",
    "cache_read_input_tokens": "cache_read_tokens",
    "cache_creation_input_tokens": "cache_write_tokens",
}
TOKEN_COLUMNS = tuple(_USAGE_COLUMNS.values())
MAX_MODEL_NAME = 100
UNKNOWN_MODEL = "unknown"


@dataclass(frozen=True)
class Price:
    """One model's prices in pico-dollars (1e-12 USD) per token, which is USD per million tokens times 1e6."""

    model: str  # the price table's name it was found under
    input: int
    output: int
    cache_read: int
    cache_write: int

    @classmethod
    def from_usd_per_mtok(cls, model: str, prices: Mapping[str, float]) -> Price:
        """From a price table entry (settings validated it: finite, 0 to 10,000, at most 6 decimals)."""
        pico = {
            key: int(Decimal(repr(float(prices.get(key, prices["input"])))).scaleb(PRICE_DECIMALS))
            for key in ("input", "output", "cache_read", "cache_write")
        }
        return cls(model, **pico)


FREE = Price("offline", 0, 0, 0, 0)


def price_of(provider: str, model: str, prices: Mapping[str, Mapping[str, float]]) -> Price | None:
    """The price of ``model`` by its exact name, else by the name of the model it is a dated snapshot of; ``FREE``
    for a provider that bills nothing; None when the table has no price for it (its cost is unknown)."""
    if provider in FREE_PROVIDERS:
        return FREE
    for name in (model, _SNAPSHOT_SUFFIX.sub("", model)):
        entry = prices.get(name)
        if entry is not None:
            return Price.from_usd_per_mtok(name, entry)
    return None


def usage_counts(usage: Mapping[str, Any]) -> dict[str, int]:
    """``usage`` (``ModelTurn.usage``: the four ``USAGE_KEYS``, missing ones 0) as agent_run's token columns.

    Raises ValueError for a count that is not an integer from 0 to MAX_TURN_TOKENS: the provider parsers bound
    what an answer reports, so such a count is a bug to see, not a number to price.
    """
    counts = {}
    for key, column in _USAGE_COLUMNS.items():
        value = usage.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TURN_TOKENS:
            raise ValueError(f"usage {key} must be an integer from 0 to {MAX_TURN_TOKENS}, got {str(value)[:40]!r}")
        counts[column] = value
    return counts


def _pico_to_nano(pico: int) -> int:
    return int((Decimal(pico) / PICO_PER_NANO).to_integral_value(rounding=ROUND_HALF_UP))


def turn_cost_nano_usd(usage: Mapping[str, Any], price: Price | None) -> int:
    """What one answered call cost: each kind of token at its price, rounded once to the nano-dollar.

    0 without a price: the caller records such a turn's cost as unknown (``record_turn(..., None)``), not as 0.
    """
    counts = usage_counts(usage)
    if price is None:
        return 0
    return _pico_to_nano(
        counts["input_tokens"] * price.input
        + counts["output_tokens"] * price.output
        + counts["cache_read_tokens"] * price.cache_read
        + counts["cache_write_tokens"] * price.cache_write
    )


def max_call_cost_nano_usd(estimate: Mapping[str, int], price: Price | None) -> int:
    """The most a call can cost, from its ``ModelProvider.estimate``: every input token at the dearest input price
    (the full input price, or the cache write's when that is dearer, as Anthropic's is) and ``max_tokens`` of
    output, rounded up. 0 without a price."""
    if price is None:
        return 0
    tokens = {}
    for key in ("input_tokens", "output_tokens"):
        value = estimate.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TURN_TOKENS:
            raise ValueError(f"estimate {key} must be an integer from 0 to {MAX_TURN_TOKENS}, got {str(value)[:40]!r}")
        tokens[key] = value
    dearest_input = max(price.input, price.cache_write, price.cache_read)
    pico = tokens["input_tokens"] * dearest_input + tokens["output_tokens"] * price.output
    return -(-pico // PICO_PER_NANO)


def record_turn(conn: sa.Connection, agent_run_id: int, usage: Mapping[str, Any], cost_nano_usd: int | None) -> None:
    """Add one answered turn to its run's totals in one UPDATE, in the caller's transaction (the one that records
    the turn in the transcript, so the totals and the transcript agree). ``cost_nano_usd`` None: the model has no
    price, and the turn counts in ``unknown_cost_turns`` instead of the cost."""
    if cost_nano_usd is not None and (
        isinstance(cost_nano_usd, bool) or not isinstance(cost_nano_usd, int) or cost_nano_usd < 0
    ):
        raise ValueError(f"cost_nano_usd must be a non-negative integer or None, got {cost_nano_usd!r}")
    counts = usage_counts(usage)
    t = agent_run
    added = conn.execute(
        sa.update(t)
        .where(t.c.id == agent_run_id)
        .values(
            model_turns=t.c.model_turns + 1,
            cost_nano_usd=t.c.cost_nano_usd + (cost_nano_usd or 0),
            unknown_cost_turns=t.c.unknown_cost_turns + int(cost_nano_usd is None),
            **{column: t.c[column] + counts[column] for column in TOKEN_COLUMNS},
        )
    ).rowcount
    if added != 1:
        raise LookupError(f"agent run {agent_run_id} does not exist; its turn was not recorded")


def usd_text(nano_usd: int) -> str:
    """Nano-dollars as USD with 6 decimals ("0.012346"), rounded half up: how a cost is shown."""
    return str((Decimal(nano_usd) / NANO_PER_USD).quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP))


def summary_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """An agent_run row's totals, as ``agents show`` and ``agents list --json`` show them."""
    totals = {name: int(row[name] or 0) for name in AGENT_RUN_COST_COLUMNS}
    return {
        **totals,
        "cost_usd": usd_text(totals["cost_nano_usd"]),
        # False when some turn's model had no price: cost_usd is then what the priced turns cost.
        "cost_complete": totals["unknown_cost_turns"] == 0,
        "prices_read_on": PRICES_READ_ON,
    }


def cost_summary(conn: sa.Connection, agent_run_id: int) -> dict[str, Any]:
    """The run's tokens (in, out, cache read, cache write), turns and cost: ``cost_nano_usd`` exact, ``cost_usd``
    its text, ``cost_complete`` whether every turn had a price."""
    columns = [agent_run.c[name] for name in AGENT_RUN_COST_COLUMNS]
    row = conn.execute(sa.select(*columns).where(agent_run.c.id == agent_run_id)).mappings().one_or_none()
    if row is None:
        raise InvalidInput(f"unknown agent run {agent_run_id}")
    return summary_of(row)


def cost_text(summary: Mapping[str, Any]) -> str:
    """One line of a run's cost: "0.012346 USD", and what it leaves out when some turn had no price."""
    text = f"{summary['cost_usd']} USD"
    if not summary["cost_complete"]:
        text += f" and {summary['unknown_cost_turns']} turn(s) of unknown cost (no price for their model)"
    return text


def cost_metadata(conn: sa.Connection, agent_run_id: int) -> dict[str, dg.MetadataValue]:
    """The run's tokens and cost as Dagster metadata: ints for tokens, a float USD for plotting (the exact cost is
    ``cost_nano_usd``), and the date the default prices were read."""
    import dagster as dg  # here: the command line imports this module and starts without Dagster

    summary = cost_summary(conn, agent_run_id)
    return {
        **{name: dg.MetadataValue.int(summary[name]) for name in AGENT_RUN_COST_COLUMNS},
        "cost_usd": dg.MetadataValue.float(summary["cost_nano_usd"] / NANO_PER_USD),
        "cost": dg.MetadataValue.text(cost_text(summary)),
        "prices_read_on": dg.MetadataValue.text(PRICES_READ_ON),
    }


# --- the daily cost per campaign, provider and model -------------------------------------------------------------


@dataclass
class CostRow:
    """One row of ``agent_model_cost_daily`` being counted."""

    runs: set[int]
    model_turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_nano_usd: int = 0
    unknown_cost_turns: int = 0


CostKey = tuple[str, str, str]  # campaign_id, provider, model


def _day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time.min, tzinfo=UTC)
    return start, start + timedelta(days=1)


def _model_name(value: Any) -> str:
    # The answer's own "model": whatever the provider said, kept to the column's width.
    return value[:MAX_MODEL_NAME] if isinstance(value, str) and value else UNKNOWN_MODEL


def count_turns(turns: Iterable[tuple[Any, ...]]) -> dict[CostKey, CostRow]:
    """(campaign_id, provider, agent_run_id, usage, model, cost_nano_usd) of model turns, summed per key.

    A stored turn is read as untrusted (it is what a provider answered): a usage that is not four bounded
    integers counts no tokens, and a cost that is not a non-negative integer (none recorded: no price) counts
    the turn as of unknown cost; either costs only that turn.
    """
    rows: dict[CostKey, CostRow] = {}
    for campaign_id, provider, run_id, usage, model, cost in turns:
        row = rows.setdefault((campaign_id, provider, _model_name(model)), CostRow(set()))
        row.runs.add(run_id)
        row.model_turns += 1
        try:
            counts = usage_counts(usage) if isinstance(usage, Mapping) else None
        except ValueError:
            counts = None
        if counts is None:
            row.unknown_cost_turns += 1
            continue
        for column in TOKEN_COLUMNS:
            setattr(row, column, getattr(row, column) + counts[column])
        if isinstance(cost, int) and not isinstance(cost, bool) and cost >= 0:
            row.cost_nano_usd += cost
        else:
            row.unknown_cost_turns += 1
    return rows


def model_turns_of_day(conn: sa.Connection, day: date) -> list[tuple[Any, ...]]:
    """The day's model turns (by their ``created_at``, UTC) with their run's campaign and provider, each as
    (campaign_id, provider, agent_run_id, usage, model, cost_nano_usd): only those parts of each step's content,
    not the answer's text."""
    s, r = agent_run_step, agent_run
    start, end = _day_bounds(day)
    query = (
        sa.select(
            r.c.campaign_id,
            r.c.model_provider,
            s.c.agent_run_id,
            s.c.content["usage"],
            s.c.content["model"],
            s.c.content["cost_nano_usd"],
        )
        .join(r, r.c.id == s.c.agent_run_id)
        .where(s.c.kind == "model_turn", s.c.created_at >= start, s.c.created_at < end)
    )
    return [tuple(row) for row in conn.execute(query)]


@dataclass(frozen=True)
class CostDaySummary:
    day: date
    rows: int
    campaigns: int
    agent_runs: int
    model_turns: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cost_nano_usd: int
    unknown_cost_turns: int


def replace_model_cost_day(engine: sa.Engine, day: date) -> CostDaySummary:
    """Rebuild ``day``'s rows of agent_model_cost_daily from the transcripts, in one transaction: the day's rows
    are deleted and written again, so a re-run or a backfill replaces rather than adds, and a reader sees the
    day before or after, never half of it."""
    now = datetime.now(UTC)
    with engine.begin() as conn:
        counted = count_turns(model_turns_of_day(conn, day))
        conn.execute(sa.delete(agent_model_cost_daily).where(agent_model_cost_daily.c.day == day))
        values = [
            {
                "day": day,
                "campaign_id": campaign_id,
                "provider": provider,
                "model": model,
                "agent_runs": len(row.runs),
                "model_turns": row.model_turns,
                **{column: getattr(row, column) for column in TOKEN_COLUMNS},
                "cost_nano_usd": row.cost_nano_usd,
                "unknown_cost_turns": row.unknown_cost_turns,
                "computed_at": now,
            }
            for (campaign_id, provider, model), row in sorted(counted.items())
        ]
        if values:
            conn.execute(sa.insert(agent_model_cost_daily), values)
    rows = counted.values()
    return CostDaySummary(
        day=day,
        rows=len(values),
        campaigns=len({key[0] for key in counted}),
        agent_runs=len(set().union(*(row.runs for row in rows))),
        model_turns=sum(row.model_turns for row in rows),
        input_tokens=sum(row.input_tokens for row in rows),
        output_tokens=sum(row.output_tokens for row in rows),
        cache_read_tokens=sum(row.cache_read_tokens for row in rows),
        cache_write_tokens=sum(row.cache_write_tokens for row in rows),
        cost_nano_usd=sum(row.cost_nano_usd for row in rows),
        unknown_cost_turns=sum(row.unknown_cost_turns for row in rows),
    )
