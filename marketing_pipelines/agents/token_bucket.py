"""Model-call rate limits as a token bucket row per provider, shared by every process.

Acquiring is one ``UPDATE`` whose refill is computed from the row's own columns inside the
statement: the row lock serialises concurrent acquirers, and each sees the tokens the previous
one left. A separate read followed by a write would let two processes spend the same token.

Time: PostgreSQL uses its own clock (``now()``), so replicas with drifting clocks still agree;
elapsed time is clamped at zero and ``updated_at`` never moves backwards, because a statement
that waited for the row lock carries a ``now()`` older than the holder's. SQLite (one machine)
uses this process's clock.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa

from marketing_pipelines.db.engine import insert_ignoring_conflicts
from marketing_pipelines.db.schema import model_token_bucket as bucket
from marketing_pipelines.db.types import UTCDateTime
from marketing_pipelines.errors import InvalidInput

# Far above any provider's per-key limit, far below where float arithmetic on the bucket degrades.
MAX_CALLS_PER_MINUTE = 100_000.0
MAX_BURST = 1_000_000.0


class ModelRateLimited(RuntimeError):
    """No token became free within the caller's bound; retry after ``retry_after_s``."""

    def __init__(self, provider: str, retry_after_s: float) -> None:
        super().__init__(f"model calls to {provider} are rate limited; retry in {retry_after_s:.1f}s")
        self.provider = provider
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class BucketState:
    provider: str
    capacity: float
    refill_per_second: float
    tokens: float
    updated_at: datetime

    @property
    def calls_per_minute(self) -> float:
        return self.refill_per_second * 60


@functools.cache
def _acquire_statement(dialect: str) -> sa.Update:
    """The acquire UPDATE for one dialect, built once: it runs on every model call.

    Parameters: ``provider_name``, ``n`` and, on SQLite, ``now``. The refill (tokens plus elapsed
    time times rate, capped at capacity) is computed from the row's own columns in the statement.
    """
    if dialect == "postgresql":
        now: sa.ColumnElement[datetime] = sa.func.now()
        elapsed = sa.func.greatest(0.0, sa.extract("epoch", now - bucket.c.updated_at))
        tokens = sa.func.least(bucket.c.capacity, bucket.c.tokens + elapsed * bucket.c.refill_per_second)
        updated_at = sa.func.greatest(bucket.c.updated_at, now)
    else:
        now = sa.bindparam("now", type_=UTCDateTime())
        elapsed = sa.func.max(0.0, (sa.func.julianday(now) - sa.func.julianday(bucket.c.updated_at)) * 86400.0)
        tokens = sa.func.min(bucket.c.capacity, bucket.c.tokens + elapsed * bucket.c.refill_per_second)
        updated_at = sa.func.max(bucket.c.updated_at, now)
    n = sa.bindparam("n", type_=sa.Float())
    return (
        sa.update(bucket)
        # Not "provider": SQLAlchemy reserves a column's name for its SET parameter in an UPDATE.
        .where(bucket.c.provider == sa.bindparam("provider_name"), tokens >= n)
        .values(tokens=tokens - n, updated_at=updated_at)
    )


def configure_bucket(conn: sa.Connection, provider: str, calls_per_minute: float, burst: float | None = None) -> None:
    """Create or resize a provider's bucket. Capacity defaults to one minute's worth of calls."""
    _check_rate(provider, calls_per_minute)
    capacity = burst if burst is not None else calls_per_minute
    # `not 1 <= x` also refuses NaN, which compares false with everything (and on PostgreSQL
    # a NaN rate would admit every call).
    if not (1 <= capacity <= MAX_BURST and math.isfinite(capacity)):
        raise InvalidInput(f"burst for {provider!r} must be a finite number from 1 to {MAX_BURST:,.0f}, got {capacity}")
    now = datetime.now(UTC)
    updated = conn.execute(
        sa.update(bucket)
        .where(bucket.c.provider == provider)
        .values(
            capacity=capacity,
            refill_per_second=calls_per_minute / 60.0,
            tokens=sa.case((bucket.c.tokens > capacity, capacity), else_=bucket.c.tokens),
        )
    ).rowcount
    if not updated and not _create_bucket(conn, provider, capacity, calls_per_minute / 60.0, now):
        # Another process created it between our UPDATE and INSERT; resize what it created.
        configure_bucket(conn, provider, calls_per_minute, burst)


def _create_bucket(
    conn: sa.Connection, provider: str, capacity: float, refill_per_second: float, now: datetime
) -> bool:
    """Insert a new, full bucket unless one exists; True when this call created it.

    ``ON CONFLICT DO NOTHING``: run workers starting at once all create a provider's first bucket,
    and a read-then-insert lets two of them insert (seen: UniqueViolation failing an agent run).
    """
    stmt = insert_ignoring_conflicts(conn, bucket, bucket.c.provider).values(
        provider=provider, capacity=capacity, refill_per_second=refill_per_second, tokens=capacity, updated_at=now
    )
    return conn.execute(stmt).rowcount == 1


def _check_rate(provider: str, calls_per_minute: float) -> None:
    if not (0 < calls_per_minute <= MAX_CALLS_PER_MINUTE and math.isfinite(calls_per_minute)):
        raise InvalidInput(
            f"calls per minute for {provider!r} must be a finite number above 0 and at most "
            f"{MAX_CALLS_PER_MINUTE:,.0f}, got {calls_per_minute}"
        )


def ensure_bucket(conn: sa.Connection, provider: str, calls_per_minute: float) -> None:
    """Create the bucket with the default size if it does not exist; never resize an existing one."""
    _check_rate(provider, calls_per_minute)
    _create_bucket(conn, provider, calls_per_minute, calls_per_minute / 60.0, datetime.now(UTC))


def try_acquire(conn: sa.Connection, provider: str, n: float = 1.0) -> bool:
    """Take ``n`` tokens in one statement; False (and nothing changed) when too few are left."""
    params: dict[str, object] = {"provider_name": provider, "n": n}
    if conn.dialect.name != "postgresql":
        params["now"] = datetime.now(UTC)
    return conn.execute(_acquire_statement(conn.dialect.name), params).rowcount == 1


def get_bucket(conn: sa.Connection, provider: str) -> BucketState | None:
    row = conn.execute(sa.select(bucket).where(bucket.c.provider == provider)).mappings().one_or_none()
    return BucketState(**row) if row else None


def list_buckets(conn: sa.Connection) -> list[BucketState]:
    return [BucketState(**row) for row in conn.execute(sa.select(bucket).order_by(bucket.c.provider)).mappings()]


def acquire(
    engine: sa.Engine,
    provider: str,
    default_calls_per_minute: float,
    max_wait_s: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Block until a token is taken (returns seconds waited) or raise ModelRateLimited.

    Polls at the refill interval: with one token arriving every 1/rate seconds, polling faster
    only adds statements, polling slower only adds latency.
    """
    with engine.begin() as conn:
        ensure_bucket(conn, provider, default_calls_per_minute)
        state = get_bucket(conn, provider)
    assert state is not None
    interval = min(1.0, max(0.01, 1.0 / state.refill_per_second))
    started = time.monotonic()
    while True:
        with engine.begin() as conn:
            if try_acquire(conn, provider):
                return time.monotonic() - started
        waited = time.monotonic() - started
        if waited + interval > max_wait_s:
            raise ModelRateLimited(provider, retry_after_s=max(interval, 1.0 / state.refill_per_second))
        sleep(interval)
