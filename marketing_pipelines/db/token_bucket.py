"""Model-call limits as token-bucket rows shared by every process: per provider, model and unit.

The measurement sources' request quotas are rows of the same table (provider ``source:<name>``, model ``*``,
unit ``requests``; measurement/quota.py), so ``limits show`` and ``limits set`` read and resize them too.

A provider limits calls, input tokens and output tokens per minute (Anthropic, per model class) or calls and all
tokens (OpenAI). Each limit is one row of ``model_rate_limit`` keyed by provider, model (``'*'``: every model of
the provider) and unit. A call is admitted against every row that applies to it at once: it reserves one
request, its prompt's estimate and its ``max_tokens`` (``reserve``), and gives back what the answer did not use
(``settle``), so the buckets never drift from what the provider counted.

Atomicity: on PostgreSQL the admission is one statement that locks the call's rows in a fixed order
(``FOR UPDATE`` in a CTE, so two admissions never deadlock and each sees what the last one left), decides for all
of them, and takes from all of them or none. On SQLite every write transaction holds the database's one write
lock from its BEGIN (``BEGIN IMMEDIATE``, db/engine.py), so a read-decide-write in one transaction is as strict.

Learned limits: an answer's headers may say a limit is lower than configured (``learn``); the bucket is lowered to
it, never raised above what was configured. A 429 pauses every row of the provider and model until its
Retry-After (``pause``), so every replica waits, not only the one that was told.

Time: PostgreSQL uses its own clock (``now()``), so replicas with drifting clocks still agree; elapsed time is
clamped at zero and ``updated_at`` never moves backwards, because a statement that waited for the row lock carries
a ``now()`` older than the holder's. SQLite (one machine) uses this process's clock.
"""

from __future__ import annotations

import functools
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from marketing_pipelines.db.engine import insert_ignoring_conflicts, is_postgres
from marketing_pipelines.db.schema import EVERY_MODEL, MODEL_LIMIT_UNITS
from marketing_pipelines.db.schema import model_rate_limit as limit_table
from marketing_pipelines.db.types import UTCDateTime
from marketing_pipelines.errors import InvalidInput

# Far above any provider's per-key limit, far below where float arithmetic on the bucket degrades.
MAX_CALLS_PER_MINUTE = 100_000.0
MAX_BURST = 1_000_000.0
# Tokens: Anthropic's and OpenAI's largest published tiers are tens of millions a minute.
MAX_TOKENS_PER_MINUTE = 1_000_000_000.0
MAX_MODEL_NAME = 100
# A 429's pause is bounded as every server wait hint is (http.MAX_WAIT_HINT_S is a day): an hour at most here,
# since a pause holds back every replica's calls to that model.
MAX_PAUSE_S = 3600.0


class ModelRateLimited(RuntimeError):
    """No admission within the caller's bound; retry after ``retry_after_s``."""

    def __init__(self, provider: str, retry_after_s: float, unit: str = "requests") -> None:
        what = "model calls" if unit == "requests" else f"{unit.replace('_', ' ')}"
        super().__init__(f"{what} to {provider} are rate limited; retry in {retry_after_s:.1f}s")
        self.provider = provider
        self.retry_after_s = retry_after_s
        self.unit = unit


@dataclass(frozen=True)
class BucketState:
    provider: str
    model: str
    unit: str
    capacity: float
    refill_per_second: float
    tokens: float
    configured_per_minute: float | None
    configured_capacity: float | None
    learned_per_minute: float | None
    paused_until: datetime | None
    updated_at: datetime

    @property
    def per_minute(self) -> float:
        return self.refill_per_second * 60

    @property
    def calls_per_minute(self) -> float:
        return self.per_minute

    def tokens_at(self, now: datetime) -> float:
        """What the bucket holds at ``now``: its stored tokens plus the refill since, up to its capacity."""
        elapsed = max(0.0, (now - self.updated_at).total_seconds())
        return min(self.capacity, self.tokens + elapsed * self.refill_per_second)

    def wait_for(self, need: float, now: datetime) -> float:
        """Seconds until ``need`` (at most the capacity) can be taken, a pause included."""
        paused = max(0.0, (self.paused_until - now).total_seconds()) if self.paused_until else 0.0
        short = min(need, self.capacity) - self.tokens_at(now)
        return max(paused, short / self.refill_per_second if short > 0 else 0.0)


@dataclass(frozen=True)
class Reservation:
    """What one admitted call took, row by row: ``settle`` gives back what its answer did not use."""

    provider: str
    model: str
    taken: tuple[tuple[str, str, float], ...]  # (model, unit, amount)

    def amount(self, unit: str) -> float:
        return max((amount for _, u, amount in self.taken if u == unit), default=0.0)


def _limit_bound(unit: str) -> float:
    return MAX_CALLS_PER_MINUTE if unit == "requests" else MAX_TOKENS_PER_MINUTE


def _check_key(provider: str, model: str, unit: str) -> None:
    if unit not in MODEL_LIMIT_UNITS:
        raise InvalidInput(f"unknown limit unit {unit!r}; known: {', '.join(MODEL_LIMIT_UNITS)}")
    if not model or len(model) > MAX_MODEL_NAME or not model.isprintable():
        raise InvalidInput(f"model name must be 1 to {MAX_MODEL_NAME} printable characters, got {model[:120]!r}")


def _check_rate(provider: str, per_minute: float, unit: str = "requests") -> None:
    bound = _limit_bound(unit)
    # `not 0 < x` also refuses NaN, which compares false with everything (and on PostgreSQL a NaN rate would
    # admit every call).
    if not (0 < per_minute <= bound and math.isfinite(per_minute)):
        what = "calls" if unit == "requests" else unit.replace("_", " ")
        raise InvalidInput(
            f"{what} per minute for {provider!r} must be a finite number above 0 and at most {bound:,.0f}, "
            f"got {per_minute}"
        )


def _key(provider: str, model: str, unit: str) -> sa.ColumnElement[bool]:
    return sa.and_(limit_table.c.provider == provider, limit_table.c.model == model, limit_table.c.unit == unit)


def configure_limit(
    conn: sa.Connection, provider: str, model: str, unit: str, per_minute: float, burst: float | None = None
) -> None:
    """Create or resize one limit. Capacity defaults to one minute's worth; a lower learned limit still holds."""
    _check_key(provider, model, unit)
    _check_rate(provider, per_minute, unit)
    capacity = burst if burst is not None else per_minute
    bound = MAX_BURST if unit == "requests" else MAX_TOKENS_PER_MINUTE
    if not (1 <= capacity <= bound and math.isfinite(capacity)):
        raise InvalidInput(f"burst for {provider!r} must be a finite number from 1 to {bound:,.0f}, got {capacity}")
    row = conn.execute(sa.select(limit_table.c.learned_per_minute).where(_key(provider, model, unit))).one_or_none()
    learned = row.learned_per_minute if row else None
    rate, cap = _effective(per_minute, capacity, learned)
    updated = _resize(
        conn, provider, model, unit, rate, cap, configured_per_minute=per_minute, configured_capacity=capacity
    )
    if not updated and not _create(conn, provider, model, unit, per_minute, capacity, None):
        # Another process created it between our UPDATE and INSERT; resize what it created.
        configure_limit(conn, provider, model, unit, per_minute, burst)


def clear_limit(conn: sa.Connection, provider: str, model: str, unit: str) -> bool:
    """Remove one limit (its unit is then unlimited until configured or learned again); True when there was one."""
    _check_key(provider, model, unit)
    return conn.execute(sa.delete(limit_table).where(_key(provider, model, unit))).rowcount == 1


def _resize(
    conn: sa.Connection, provider: str, model: str, unit: str, rate: float, capacity: float, **values: float | None
) -> int:
    """Give one row the rate and capacity it now enforces (tokens above the new capacity are dropped) and
    ``values``, what was configured or learned; the rows updated (0: there is no such row yet)."""
    t = limit_table
    return conn.execute(
        sa.update(t)
        .where(_key(provider, model, unit))
        .values(
            capacity=capacity,
            refill_per_second=rate / 60.0,
            tokens=sa.case((t.c.tokens > capacity, capacity), else_=t.c.tokens),
            **values,
        )
    ).rowcount


def _effective(
    configured: float | None, configured_capacity: float | None, learned: float | None
) -> tuple[float, float]:
    """The rate and capacity a row enforces: what was configured, lowered (never raised) by what was learned."""
    rate = min(x for x in (configured, learned) if x is not None)
    capacity = min(x for x in (configured_capacity, learned) if x is not None)
    return rate, capacity


def _create(
    conn: sa.Connection,
    provider: str,
    model: str,
    unit: str,
    configured: float | None,
    configured_capacity: float | None,
    learned: float | None,
    tokens: float | None = None,
) -> bool:
    """Insert a new bucket (full unless ``tokens``) unless one exists; True when this call created it.

    ``ON CONFLICT DO NOTHING``: run workers starting at once all create a provider's first bucket,
    and a read-then-insert lets two of them insert (seen: UniqueViolation failing an agent run).
    """
    rate, capacity = _effective(configured, configured_capacity, learned)
    stmt = insert_ignoring_conflicts(
        conn, limit_table, limit_table.c.provider, limit_table.c.model, limit_table.c.unit
    ).values(
        provider=provider,
        model=model,
        unit=unit,
        capacity=capacity,
        refill_per_second=rate / 60.0,
        tokens=capacity if tokens is None else min(tokens, capacity),
        configured_per_minute=configured,
        configured_capacity=configured_capacity,
        learned_per_minute=learned,
        updated_at=datetime.now(UTC),
    )
    return conn.execute(stmt).rowcount == 1


def configure_bucket(conn: sa.Connection, provider: str, calls_per_minute: float, burst: float | None = None) -> None:
    """Create or resize a provider's bucket of calls (every model). Capacity defaults to one minute of calls."""
    configure_limit(conn, provider, EVERY_MODEL, "requests", calls_per_minute, burst)


def ensure_limit(
    conn: sa.Connection, provider: str, model: str, unit: str, per_minute: float, burst: float | None = None
) -> None:
    """Create the limit (capacity ``burst``, default one minute's worth) if it does not exist; never resize an
    existing one: what an operator set with ``limits set`` stays."""
    _check_key(provider, model, unit)
    _check_rate(provider, per_minute, unit)
    _create(conn, provider, model, unit, per_minute, per_minute if burst is None else burst, None)


def ensure_bucket(conn: sa.Connection, provider: str, calls_per_minute: float) -> None:
    """Create the provider's bucket of calls with the default size if it does not exist; never resize it."""
    ensure_limit(conn, provider, EVERY_MODEL, "requests", calls_per_minute)


def get_bucket(
    conn: sa.Connection, provider: str, model: str = EVERY_MODEL, unit: str = "requests"
) -> BucketState | None:
    row = conn.execute(sa.select(limit_table).where(_key(provider, model, unit))).mappings().one_or_none()
    return BucketState(**row) if row else None


def list_buckets(conn: sa.Connection) -> list[BucketState]:
    t = limit_table
    query = sa.select(t).order_by(t.c.provider, t.c.model, t.c.unit)
    return [BucketState(**row) for row in conn.execute(query).mappings()]


def database_now(conn: sa.Connection) -> datetime:
    """The clock the buckets run on: PostgreSQL's (every replica agrees), else this process's."""
    if is_postgres(conn):
        return conn.execute(sa.select(sa.func.now())).scalar_one().astimezone(UTC)
    return datetime.now(UTC)


# --- admission ---------------------------------------------------------------------------------

_NEEDS = {unit: f"n_{unit}" for unit in MODEL_LIMIT_UNITS}

# One statement: lock the call's rows in key order, decide for all of them, take from all or none.
_RESERVE_POSTGRES = sa.text(
    """
WITH locked AS (
    SELECT model, unit, paused_until,
           LEAST(capacity, tokens
                 + GREATEST(0.0, EXTRACT(EPOCH FROM now() - updated_at)) * refill_per_second) AS refilled,
           LEAST(capacity, CASE unit WHEN 'requests' THEN CAST(:n_requests AS double precision)
                                     WHEN 'input_tokens' THEN CAST(:n_input_tokens AS double precision)
                                     WHEN 'output_tokens' THEN CAST(:n_output_tokens AS double precision)
                                     ELSE CAST(:n_tokens AS double precision) END) AS need
    FROM model_rate_limit
    WHERE provider = :provider AND model IN (:model, '*')
    ORDER BY model, unit
    FOR UPDATE
), verdict AS (
    SELECT bool_and(refilled >= need AND (paused_until IS NULL OR paused_until <= now())) AS ok FROM locked
)
UPDATE model_rate_limit AS r
SET tokens = l.refilled - l.need, updated_at = GREATEST(r.updated_at, now())
FROM locked AS l, verdict AS v
WHERE v.ok AND r.provider = :provider AND r.model = l.model AND r.unit = l.unit
RETURNING r.model, r.unit, l.need
"""
)


def _needs(needs: Mapping[str, float]) -> dict[str, float]:
    amounts = {}
    for unit in MODEL_LIMIT_UNITS:
        value = float(needs.get(unit, 0))
        if not (math.isfinite(value) and value >= 0):
            raise InvalidInput(f"a model call's {unit} must be a finite number of at least 0, got {value}")
        amounts[unit] = value
    return amounts


def _rows(conn: sa.Connection, provider: str, model: str) -> list[BucketState]:
    t = limit_table
    query = (
        sa.select(t).where(t.c.provider == provider, t.c.model.in_({model, EVERY_MODEL})).order_by(t.c.model, t.c.unit)
    )
    return [BucketState(**row) for row in conn.execute(query).mappings()]


def reserve(conn: sa.Connection, provider: str, model: str, needs: Mapping[str, float]) -> Reservation | None:
    """Take what the call needs from every limit of ``provider`` and ``model`` at once; None (nothing taken) when
    any of them is short or paused. A need above a bucket's capacity takes the full bucket (it could never be
    admitted otherwise; the provider decides about such a call)."""
    amounts = _needs(needs)
    if is_postgres(conn):
        params = {"provider": provider, "model": model, **{_NEEDS[u]: amounts[u] for u in MODEL_LIMIT_UNITS}}
        taken = [(r.model, r.unit, r.need) for r in conn.execute(_RESERVE_POSTGRES, params)]
        if taken or not conn.execute(sa.select(sa.literal(1)).where(_exists(provider, model))).first():
            return Reservation(provider, model, tuple(taken))
        return None
    # SQLite: this transaction holds the database's write lock (BEGIN IMMEDIATE), so one UPDATE takes from every
    # row and a savepoint undoes it when any row came out short or paused. One statement either way; a read,
    # then a write per row, took 4x longer per call.
    now = datetime.now(UTC)
    params = {"provider_name": provider, "model_name": model, "now": now, **{_NEEDS[u]: amounts[u] for u in amounts}}
    savepoint = conn.begin_nested()
    rows = conn.execute(_reserve_sqlite(), params).all()
    if any(row.tokens < 0 or (row.paused_until is not None and row.paused_until > now) for row in rows):
        savepoint.rollback()
        return None
    savepoint.commit()
    return Reservation(provider, model, tuple((row.model, row.unit, row.need) for row in rows))


@functools.cache
def _reserve_sqlite() -> sa.Update:
    """The SQLite admission: refill and take in one UPDATE over the call's rows, returning what each holds after.

    Parameters: ``provider_name``, ``model_name``, ``now`` and ``n_<unit>`` for each unit. A row that could not
    cover its need comes back below zero (its refill was at most the capacity, its need at most the capacity).
    """
    t = limit_table
    now = sa.bindparam("now", type_=UTCDateTime())
    elapsed = sa.func.max(0.0, (sa.func.julianday(now) - sa.func.julianday(t.c.updated_at)) * 86400.0)
    refilled = sa.func.min(t.c.capacity, t.c.tokens + elapsed * t.c.refill_per_second)
    need = sa.func.min(
        t.c.capacity,
        sa.case(
            *((t.c.unit == unit, sa.bindparam(_NEEDS[unit], type_=sa.Float())) for unit in MODEL_LIMIT_UNITS[:-1]),
            else_=sa.bindparam(_NEEDS[MODEL_LIMIT_UNITS[-1]], type_=sa.Float()),
        ),
    )
    return (
        sa.update(t)
        # Not "provider"/"model": SQLAlchemy reserves a column's name for its SET parameter in an UPDATE.
        .where(t.c.provider == sa.bindparam("provider_name"))
        .where(sa.or_(t.c.model == sa.bindparam("model_name"), t.c.model == EVERY_MODEL))
        .values(tokens=refilled - need, updated_at=sa.func.max(t.c.updated_at, now))
        .returning(t.c.model, t.c.unit, t.c.tokens, t.c.paused_until, need.label("need"))
    )


def _exists(provider: str, model: str) -> sa.Exists:
    t = limit_table
    return sa.exists().where(t.c.provider == provider, t.c.model.in_({model, EVERY_MODEL}))


def wait_needed(conn: sa.Connection, provider: str, model: str, needs: Mapping[str, float]) -> tuple[float, str]:
    """Seconds until the call could be admitted as the buckets stand, and the unit that binds."""
    amounts, now = _needs(needs), database_now(conn)
    waits = [(row.wait_for(amounts[row.unit], now), row.unit) for row in _rows(conn, provider, model)]
    return max(waits, default=(0.0, "requests"))


def admit(
    engine: sa.Engine,
    provider: str,
    model: str,
    needs: Mapping[str, float],
    max_wait_s: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Reservation, float]:
    """Block until the call is admitted (the reservation and the seconds waited) or raise ModelRateLimited.

    Sleeps until the binding bucket would hold enough (plus a little jitter, so that waiters do not all retry at
    the same instant), then tries again: another process may have taken it first.
    """
    started = time.monotonic()
    while True:
        with engine.begin() as conn:
            reservation = reserve(conn, provider, model, needs)
            wait, unit = (0.0, "") if reservation else wait_needed(conn, provider, model, needs)
        if reservation is not None:
            return reservation, time.monotonic() - started
        waited = time.monotonic() - started
        pause = max(wait, 0.01) + random.uniform(0, 0.05)
        if waited + pause > max_wait_s:
            raise ModelRateLimited(provider, retry_after_s=max(wait, 0.5), unit=unit)
        sleep(pause)


def try_acquire(conn: sa.Connection, provider: str, n: float = 1.0) -> bool:
    """Take ``n`` calls of the provider's own bucket in one statement; False (and nothing changed) when too few."""
    return reserve(conn, provider, EVERY_MODEL, {"requests": n}) is not None


def acquire(
    engine: sa.Engine,
    provider: str,
    default_calls_per_minute: float,
    max_wait_s: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Block until one call is admitted by the provider's bucket of calls (returns seconds waited), or raise."""
    with engine.begin() as conn:
        ensure_bucket(conn, provider, default_calls_per_minute)
    return admit(engine, provider, EVERY_MODEL, {"requests": 1}, max_wait_s=max_wait_s, sleep=sleep)[1]


def settle(conn: sa.Connection, reservation: Reservation, used: Mapping[str, float] | None) -> None:
    """Give back what the call reserved and did not use (or take what it used beyond that: the bucket owes it).

    ``used`` None: the call failed before the provider counted its tokens; they are all given back, the
    request is not (a provider counts a request it refused).
    """
    for model, unit, amount in reservation.taken:
        if unit == "requests":
            continue
        actual = 0.0 if used is None else float(used.get(unit, 0.0))
        delta = amount - actual if math.isfinite(actual) and actual >= 0 else 0.0
        if delta == 0:
            continue
        t = limit_table
        conn.execute(
            sa.update(t)
            .where(_key(reservation.provider, model, unit))
            .values(tokens=sa.case((t.c.tokens + delta > t.c.capacity, t.c.capacity), else_=t.c.tokens + delta))
        )


def pause(conn: sa.Connection, provider: str, model: str, seconds: float) -> None:
    """Hold back every call to ``provider``'s ``model`` for ``seconds`` (a 429's Retry-After), on every replica."""
    if not math.isfinite(seconds) or seconds <= 0:
        return
    until = database_now(conn) + timedelta(seconds=min(seconds, MAX_PAUSE_S))
    t = limit_table
    conn.execute(
        sa.update(t)
        .where(t.c.provider == provider, t.c.model.in_({model, EVERY_MODEL}))
        .where(sa.or_(t.c.paused_until.is_(None), t.c.paused_until < until))
        .values(paused_until=until)
    )


def learn(conn: sa.Connection, provider: str, model: str, limits: Mapping[str, float]) -> list[str]:
    """Lower the buckets of ``provider``'s ``model`` to what the answer's headers say its limits are.

    Never raised above what was configured; a unit with no configured limit takes the learned one (the provider
    enforces it anyway). Returns a line per change, for the run's log. Values that are not finite positive numbers
    within the unit's bound are ignored. An answer that says what the last one said costs one read.
    """
    wanted = {}
    for unit, value in limits.items():
        if unit not in MODEL_LIMIT_UNITS or not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if 0 < float(value) <= _limit_bound(unit) and math.isfinite(value):
            wanted[unit] = float(value)
    if not wanted:
        return []
    _check_key(provider, model, "requests")
    rows = _rows(conn, provider, model)
    changes = []
    for unit, learned in wanted.items():
        own = next((r for r in rows if r.model == model and r.unit == unit), None)
        every = next((r for r in rows if r.model == EVERY_MODEL and r.unit == unit), None)
        change = _learn_one(conn, provider, model, unit, learned, own, every)
        if change:
            changes.append(change)
    return changes


def _learn_one(
    conn: sa.Connection,
    provider: str,
    model: str,
    unit: str,
    learned: float,
    own: BucketState | None,
    every: BucketState | None,
) -> str | None:
    what = f"{provider} {model} {unit.replace('_', ' ')} per minute"
    if own is not None:
        if own.learned_per_minute == learned:
            return None
        rate, capacity = _effective(own.configured_per_minute, own.configured_capacity, learned)
        _resize(conn, provider, model, unit, rate, capacity, learned_per_minute=learned)
        return (
            f"{what}: {rate:,.0f} (the provider says {learned:,.0f})"
            if not math.isclose(rate, own.per_minute)
            else None
        )
    if every is not None and learned >= every.per_minute:
        return None  # the provider allows more than the limit every model of it keeps: nothing to lower
    # A limit of this model's own, starting from what the provider-wide bucket holds (it has been spending it).
    start = every.tokens_at(database_now(conn)) if every is not None else None
    if not _create(conn, provider, model, unit, None, None, learned, tokens=start):
        return None  # another replica learned it first
    return f"{what}: {learned:,.0f}, learned from the provider's answer"
