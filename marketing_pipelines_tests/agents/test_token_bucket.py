"""The model-call token bucket: one atomic statement, never over-admits, across processes."""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import pytest
import sqlalchemy as sa

from marketing_pipelines.db import token_bucket as tb
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.errors import InvalidInput

CAPACITY = 5.0
PER_MINUTE = 600.0  # 10 tokens a second
RUN_SECONDS = 3.0
PROCESSES = 8


def test_drains_then_refills(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        tb.configure_bucket(conn, "offline", calls_per_minute=60, burst=3)
    with engine.begin() as conn:
        taken = [tb.try_acquire(conn, "offline") for _ in range(5)]
    assert taken == [True, True, True, False, False]
    with engine.connect() as conn:
        state = tb.get_bucket(conn, "offline")
    assert state is not None and 0 <= state.tokens < 1
    # A waiting caller is admitted once a token refills (one a second at 60/minute).
    waited = tb.acquire(engine, "offline", 60, max_wait_s=5)
    assert 0.2 < waited < 3


def test_waiting_caller_gives_up_with_retry_hint(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        tb.configure_bucket(conn, "openai", calls_per_minute=1, burst=1)
        assert tb.try_acquire(conn, "openai")
    with pytest.raises(tb.ModelRateLimited) as caught:
        tb.acquire(engine, "openai", 1, max_wait_s=0.5)
    assert caught.value.retry_after_s >= 1


@pytest.mark.parametrize(
    ("per_minute", "burst"),
    # NaN compares false with everything: on PostgreSQL a NaN rate admitted every call.
    [(0, None), (-5, None), (60, 0.5), (float("nan"), None), (float("inf"), None), (1e308, None), (60, float("nan"))],
)
def test_bad_limits_are_refused_and_nothing_written(engine: sa.Engine, per_minute: float, burst: Any) -> None:
    with pytest.raises(InvalidInput), engine.begin() as conn:
        tb.configure_bucket(conn, "anthropic", per_minute, burst)
    with engine.connect() as conn:
        assert tb.get_bucket(conn, "anthropic") is None


def _hammer(db_url: str, start: Any, stop_at: Any, out: Any) -> None:
    engine = get_engine(db_url)
    with engine.connect():
        pass  # connect before the window opens
    admitted: list[tuple[float, float]] = []
    start.wait()  # a barrier: the window opens when every process is ready
    while time.time() < stop_at.value:
        before = time.time()
        with engine.begin() as conn:
            if tb.try_acquire(conn, "anthropic"):
                # The bucket's own clock read for this admission lies between these two times.
                admitted.append((before, time.time()))
    out.put(admitted)


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_eight_processes_never_exceed_capacity_plus_refill(database: str, request: pytest.FixtureRequest) -> None:
    db_url = request.getfixturevalue("sqlite_url" if database == "sqlite" else "pg_url")
    engine = get_engine(db_url)
    with engine.begin() as conn:
        tb.configure_bucket(conn, "anthropic", PER_MINUTE, CAPACITY)
    ctx = mp.get_context("spawn")
    start, out, stop_at = ctx.Barrier(PROCESSES + 1, timeout=120), ctx.Queue(), ctx.Value("d", 0.0)
    procs = [ctx.Process(target=_hammer, args=(db_url, start, stop_at, out)) for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    stop_at.value = time.time() + 3600  # replaced below, before any process passes the barrier
    start.wait()
    began = time.time()
    stop_at.value = began + RUN_SECONDS
    pairs = [pair for _ in procs for pair in out.get(timeout=120)]
    admitted = sorted(after for _, after in pairs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    rate = PER_MINUTE / 60
    # The bucket holds at most CAPACITY at any moment t0, so admissions whose clock reading lies in
    # [t0, t] are at most CAPACITY + rate * (t - t0). Each reading is after its `before` and before
    # its `after`, so t0 = the earliest `before` and t = the admission's `after` bound them safely.
    # On SQLite the bucket's clock has millisecond resolution (it reads truncated times).
    began = min([began, *(before for before, _ in pairs)]) - (0.001 if database == "sqlite" else 0.0)
    # At every admission, the total so far is bounded by the burst plus what refilled since the start.
    over = [(i + 1, t - began) for i, t in enumerate(admitted) if i + 1 > CAPACITY + rate * (t - began) + 1e-6]
    assert over == []
    # Not vacuous: the bucket admitted beyond its burst, so refills were granted under contention.
    assert len(admitted) > CAPACITY + rate * 1.0
    with engine.connect() as conn:
        state = tb.get_bucket(conn, "anthropic")
    assert state is not None and state.tokens >= 0


FRESH_PROVIDERS = 20


def _first_acquirers(db_url: str, start: Any, out: Any) -> None:
    engine = get_engine(db_url)
    with engine.connect():
        pass
    errors = []
    for i in range(FRESH_PROVIDERS):
        start.wait()  # every process asks for the same provider's first token at once
        try:
            tb.acquire(engine, f"fresh-{i}", 600, max_wait_s=5)
        except sa.exc.IntegrityError as exc:
            errors.append(type(exc.orig).__name__)
    out.put(errors)


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_processes_creating_a_providers_first_bucket_at_once_all_get_a_token(
    database: str, request: pytest.FixtureRequest
) -> None:
    # Run workers that start together all create their provider's bucket on their first model
    # call; a read-then-insert let two of them insert, and the loser's agent run failed.
    db_url = request.getfixturevalue("sqlite_url" if database == "sqlite" else "pg_url")
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(PROCESSES, timeout=120), ctx.Queue()
    procs = [ctx.Process(target=_first_acquirers, args=(db_url, start, out)) for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    errors = [e for _ in procs for e in out.get(timeout=300)]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert errors == []
    with get_engine(db_url).connect() as conn:
        buckets = {b.provider: b for b in tb.list_buckets(conn)}
    # One bucket per provider, created at the default size; every process got its token (exit 0).
    assert {p: b.capacity for p, b in buckets.items()} == {f"fresh-{i}": 600 for i in range(FRESH_PROVIDERS)}
