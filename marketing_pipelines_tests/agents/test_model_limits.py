"""Model limits in the providers' units: every bucket of a call admits it at once or none does, settling keeps
the buckets true, headers lower limits (never above what was configured), a 429 holds back every process."""

from __future__ import annotations

import multiprocessing as mp
import random
import time
from typing import Any

import pytest
import sqlalchemy as sa

from marketing_pipelines.agents.admission import used_by
from marketing_pipelines.db import token_bucket as tb
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.errors import InvalidInput

MODEL = "claude-sonnet-4-5"


def _limits(engine: sa.Engine, requests: float = 600, input_tokens: float = 1000, output: float = 500) -> None:
    with engine.begin() as conn:
        tb.configure_limit(conn, "anthropic", "*", "requests", requests)
        tb.configure_limit(conn, "anthropic", "*", "input_tokens", input_tokens)
        tb.configure_limit(conn, "anthropic", MODEL, "output_tokens", output)


def _tokens(engine: sa.Engine, unit: str, model: str = "*") -> float:
    with engine.connect() as conn:
        state = tb.get_bucket(conn, "anthropic", model, unit)
    assert state is not None
    return state.tokens


def test_a_call_short_of_one_unit_takes_nothing_from_the_others(engine: sa.Engine) -> None:
    _limits(engine)
    with engine.begin() as conn:
        assert tb.reserve(conn, "anthropic", MODEL, {"requests": 1, "input_tokens": 900, "output_tokens": 100})
        # 100 input tokens are left: this call needs 200, so neither its request nor its output is taken.
        assert tb.reserve(conn, "anthropic", MODEL, {"requests": 1, "input_tokens": 200, "output_tokens": 100}) is None
    assert _tokens(engine, "requests") == pytest.approx(599, abs=0.5)
    assert _tokens(engine, "output_tokens", MODEL) == pytest.approx(400, abs=1)
    with engine.connect() as conn:
        wait, unit = tb.wait_needed(conn, "anthropic", MODEL, {"requests": 1, "input_tokens": 200})
    # 100 tokens short at 1000 a minute: about 6 s, bound by input tokens.
    assert unit == "input_tokens" and 5 < wait <= 6.1


def test_settling_gives_back_what_the_answer_did_not_use_and_owes_what_it_used_beyond(engine: sa.Engine) -> None:
    _limits(engine)
    with engine.begin() as conn:
        reservation = tb.reserve(conn, "anthropic", MODEL, {"requests": 1, "input_tokens": 800, "output_tokens": 400})
        assert reservation is not None
        tb.settle(conn, reservation, {"requests": 1, "input_tokens": 300, "output_tokens": 450})
    assert _tokens(engine, "input_tokens") == pytest.approx(700, abs=2)
    # 50 more output tokens than reserved: the bucket owes them.
    assert _tokens(engine, "output_tokens", MODEL) == pytest.approx(50, abs=2)
    with engine.begin() as conn:
        reservation = tb.reserve(conn, "anthropic", MODEL, {"requests": 1, "input_tokens": 600})
        assert reservation is not None
        tb.settle(conn, reservation, None)  # the call failed: its tokens come back
    assert _tokens(engine, "input_tokens") == pytest.approx(700, abs=3)


def test_a_call_larger_than_a_bucket_is_admitted_when_the_bucket_is_full(engine: sa.Engine) -> None:
    _limits(engine)
    with engine.begin() as conn:
        assert tb.reserve(conn, "anthropic", MODEL, {"requests": 1, "input_tokens": 5000}) is not None
    assert _tokens(engine, "input_tokens") == pytest.approx(0, abs=2)


def test_headers_lower_a_limit_never_above_the_configured_one(engine: sa.Engine) -> None:
    _limits(engine)
    with engine.begin() as conn:
        assert tb.learn(conn, "anthropic", MODEL, {"output_tokens": 2000}) == []  # above 500: kept at 500
        changes = tb.learn(conn, "anthropic", MODEL, {"output_tokens": 200})
    assert changes and "200" in changes[0]
    with engine.connect() as conn:
        state = tb.get_bucket(conn, "anthropic", MODEL, "output_tokens")
    assert state is not None and state.per_minute == pytest.approx(200) and state.capacity == 200
    assert state.tokens <= 200 and state.configured_per_minute == 500
    with engine.begin() as conn:
        tb.learn(conn, "anthropic", MODEL, {"output_tokens": 800})  # raised by the provider: back to 500, not 800
    with engine.connect() as conn:
        state = tb.get_bucket(conn, "anthropic", MODEL, "output_tokens")
    assert state is not None and state.per_minute == pytest.approx(500)


def test_a_limit_learned_for_one_model_starts_from_what_the_provider_bucket_holds(engine: sa.Engine) -> None:
    _limits(engine)
    with engine.begin() as conn:
        assert tb.reserve(conn, "anthropic", MODEL, {"input_tokens": 700})
        tb.learn(conn, "anthropic", MODEL, {"input_tokens": 400})
        # Unconfigured units are learned as the provider states them.
        tb.learn(conn, "anthropic", MODEL, {"requests": 50, "tokens": float("nan"), "bogus": 3})
    with engine.connect() as conn:
        own = tb.get_bucket(conn, "anthropic", MODEL, "input_tokens")
        requests = tb.get_bucket(conn, "anthropic", MODEL, "requests")
        assert tb.get_bucket(conn, "anthropic", MODEL, "tokens") is None
    assert own is not None and own.per_minute == pytest.approx(400) and own.tokens <= 310
    assert requests is not None and requests.per_minute == 50


@pytest.mark.parametrize(
    "limits",
    # Hostile header values cost only themselves.
    [{"input_tokens": -5}, {"input_tokens": float("inf")}, {"input_tokens": True}, {"input_tokens": 1e12}, {}],
)
def test_hostile_learned_values_are_ignored(engine: sa.Engine, limits: dict[str, Any]) -> None:
    _limits(engine)
    with engine.begin() as conn:
        assert tb.learn(conn, "anthropic", MODEL, limits) == []
    with engine.connect() as conn:
        assert tb.get_bucket(conn, "anthropic", MODEL, "input_tokens") is None


def test_a_pause_holds_back_every_call_to_the_model_until_it_ends(engine: sa.Engine) -> None:
    _limits(engine)
    with engine.begin() as conn:
        tb.pause(conn, "anthropic", MODEL, 2.0)
    with engine.begin() as conn:
        assert tb.reserve(conn, "anthropic", MODEL, {"requests": 1}) is None
        wait, _ = tb.wait_needed(conn, "anthropic", MODEL, {"requests": 1})
    assert 1.0 < wait <= 2.0
    reservation, waited = tb.admit(engine, "anthropic", MODEL, {"requests": 1}, max_wait_s=10)
    assert reservation.taken and 1.0 < waited < 5


@pytest.mark.parametrize(
    ("unit", "per_minute"), [("input_tokens", 0), ("input_tokens", float("nan")), ("seconds", 10), ("tokens", 2e9)]
)
def test_bad_limits_are_refused(engine: sa.Engine, unit: str, per_minute: float) -> None:
    with pytest.raises(InvalidInput), engine.begin() as conn:
        tb.configure_limit(conn, "anthropic", "*", unit, per_minute)


def test_what_a_turn_counts_against_each_unit() -> None:
    usage = {"input_tokens": 100, "cache_creation_input_tokens": 20, "cache_read_input_tokens": 900, "output_tokens": 7}
    # Cache reads do not count against Anthropic's input limit; OpenAI's token limit counts every token.
    assert used_by(usage) == {"requests": 1.0, "input_tokens": 120.0, "output_tokens": 7.0, "tokens": 1027.0}


INPUT_PER_MINUTE = 6000.0  # 100 a second
INPUT_CAPACITY = 300.0
RUN_SECONDS = 3.0
PROCESSES = 8


def _reserve_loop(db_url: str, start: Any, stop_at: Any, out: Any, seed: int) -> None:
    engine = get_engine(db_url)
    rng = random.Random(seed)
    with engine.connect():
        pass
    admitted: list[tuple[float, float, float]] = []
    start.wait()
    while time.time() < stop_at.value:
        need = {"requests": 1, "input_tokens": rng.randint(5, 60), "output_tokens": rng.randint(1, 20)}
        before = time.time()
        with engine.begin() as conn:
            reservation = tb.reserve(conn, "anthropic", MODEL, need)
        if reservation is not None:
            admitted.append((before, time.time(), reservation.amount("input_tokens")))
    out.put(admitted)


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_eight_processes_never_take_more_input_tokens_than_capacity_plus_refill(
    database: str, request: pytest.FixtureRequest
) -> None:
    db_url = request.getfixturevalue("sqlite_url" if database == "sqlite" else "pg_url")
    engine = get_engine(db_url)
    with engine.begin() as conn:
        # Requests never bind (a large burst) and barely refill, so the bucket counts the admissions.
        tb.configure_limit(conn, "anthropic", "*", "requests", 1, 100_000)
        tb.configure_limit(conn, "anthropic", "*", "input_tokens", INPUT_PER_MINUTE, INPUT_CAPACITY)
        tb.configure_limit(conn, "anthropic", MODEL, "output_tokens", 100_000)
    ctx = mp.get_context("spawn")
    start, out, stop_at = ctx.Barrier(PROCESSES + 1, timeout=120), ctx.Queue(), ctx.Value("d", 0.0)
    procs = [ctx.Process(target=_reserve_loop, args=(db_url, start, stop_at, out, i)) for i in range(PROCESSES)]
    for p in procs:
        p.start()
    stop_at.value = time.time() + 3600
    start.wait()
    began = time.time()
    stop_at.value = began + RUN_SECONDS
    taken = [entry for _ in procs for entry in out.get(timeout=120)]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    rate = INPUT_PER_MINUTE / 60
    began = min([began, *(before for before, _, _ in taken)]) - (0.001 if database == "sqlite" else 0.0)
    # As in test_token_bucket: the bucket held at most its capacity at `began`, so what was admitted by any
    # admission's `after` is at most the capacity plus the refill since; every unit was taken in the same step.
    total, over = 0.0, []
    for _, after, amount in sorted(taken, key=lambda e: e[1]):
        total += amount
        if total > INPUT_CAPACITY + rate * (after - began) + 1e-6:
            over.append(total)
    assert over == []
    with engine.connect() as conn:
        requests = tb.get_bucket(conn, "anthropic", "*", "requests")
    # All or none: each admission took its request exactly when it took its input tokens.
    assert requests is not None and requests.capacity - requests.tokens >= len(taken) - 0.5
    assert _tokens(engine, "input_tokens") >= -1e-6
    assert len(taken) > 10  # not vacuous: admissions kept coming under contention
