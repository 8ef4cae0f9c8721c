"""How an agent run meets the provider's answers through the gate (agents/admission.py), run by Dagster: a spend
limit ends it unretried, a 529 is retried, a 429's wait holds back every replica, a lower limit in the headers
is learned, the run's cost is the sum of its turns, and a spent budget stops it before it calls."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import budgets, costs, users
from marketing_pipelines.agents.queue import get_agent_run, transcript
from marketing_pipelines.db import token_bucket as tb
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.monitoring.alerts import agent_runs_of_runs
from marketing_pipelines.settings import DEFAULT_MODEL_PRICES
from marketing_pipelines_tests.agents.fake_models import (
    anthropic_message,
    anthropic_models,
    anthropic_ok,
    anthropic_overloaded,
    anthropic_rate_limited,
    anthropic_spend_limit,
)
from marketing_pipelines_tests.agents.runs import run_one
from marketing_pipelines_tests.factories import add_campaign, request_brief

MODEL = "claude-sonnet-4-5"  # the anthropic provider's default model


@pytest.fixture
def ana(engine: sa.Engine) -> sa.Engine:
    add_campaign(engine, "spring-launch")
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        users.grant(conn, "ana", "campaign:read")
    return engine


def _request(engine: sa.Engine, **kw: Any) -> int:
    with engine.begin() as conn:
        return request_brief(conn, **kw)


def _row(engine: sa.Engine, agent_run_id: int) -> sa.RowMapping:
    with engine.connect() as conn:
        row = get_agent_run(conn, agent_run_id)
    assert row is not None
    return row


def _text(usage: dict[str, int] | None = None, **limits: object) -> httpx.Response:
    usage = usage or {"input_tokens": 1200, "output_tokens": 300}
    return anthropic_ok(anthropic_message([{"type": "text", "text": "The brief."}], "end_turn", **usage), **limits)


def test_a_spend_limit_is_not_retried_and_fails_the_run_saying_so(
    ana: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    agent_run_id = _request(ana, max_attempts=3)
    calls: list[int] = []

    def answer(call: int, body: dict[str, Any]) -> httpx.Response:
        calls.append(call)
        return anthropic_spend_limit("credit")

    result = run_one(db_url, instance, anthropic_models(answer))
    assert not result.success  # where Dagster users look: the run FAILED
    assert calls == [1]  # one request: no retry in the run, no attempt after it
    row = _row(ana, agent_run_id)
    assert row["status"] == "FAILED" and row["attempts"] == 1
    assert "spend limit" in row["error"] and "credit balance is too low" in row["error"]
    [failure] = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert "spend limit" in str(failure.step_failure_data.error)
    # The alert about the failed run quotes its agent run's error: it names the spend limit.
    with ana.connect() as conn:
        [info] = agent_runs_of_runs(conn, [result.run_id]).values()
    assert info.status == "FAILED" and "spend limit" in (info.error or "")


def test_an_overloaded_answer_is_retried(ana: sa.Engine, db_url: str, instance: dg.DagsterInstance) -> None:
    agent_run_id = _request(ana)

    def answer(call: int, body: dict[str, Any]) -> httpx.Response:
        return anthropic_overloaded() if call == 1 else _text()

    result = run_one(db_url, instance, anthropic_models(answer))
    assert result.success
    assert _row(ana, agent_run_id)["status"] == "SUCCEEDED"


def _other_replica_waits(db_url: str, out: Any) -> None:
    engine = get_engine(db_url)
    with engine.begin() as conn:
        admitted = tb.reserve(conn, "anthropic", MODEL, {"requests": 1, "input_tokens": 10}) is not None
        wait, _ = tb.wait_needed(conn, "anthropic", MODEL, {"requests": 1, "input_tokens": 10})
    out.put((admitted, wait))


def test_a_429s_wait_is_seen_by_every_replica(ana: sa.Engine, db_url: str, instance: dg.DagsterInstance) -> None:
    agent_run_id = _request(ana, max_run_seconds=60)
    calls: list[int] = []

    def answer(call: int, body: dict[str, Any]) -> httpx.Response:
        calls.append(call)
        return anthropic_rate_limited(retry_after="900", input_tokens=20_000)

    result = run_one(db_url, instance, anthropic_models(answer))
    # Past this run's deadline: handed back, the run green; asked once, never again in this run.
    assert result.success and calls == [1]
    assert _row(ana, agent_run_id)["status"] == "QUEUED"
    # Another process (another replica) is held back by the pause the 429 wrote, for about its Retry-After.
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    process = ctx.Process(target=_other_replica_waits, args=(db_url, out))
    process.start()
    admitted, wait = out.get(timeout=120)
    process.join(timeout=30)
    assert not admitted and 800 < wait <= 900
    # And the limit the 429's headers stated is learned for the model.
    with ana.connect() as conn:
        learned = tb.get_bucket(conn, "anthropic", MODEL, "input_tokens")
    assert learned is not None and learned.per_minute == pytest.approx(20_000)


def test_a_lower_limit_in_the_headers_is_learned_and_never_raised_above_the_configured(
    ana: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    with ana.begin() as conn:
        tb.configure_limit(conn, "anthropic", MODEL, "output_tokens", 8000)
        tb.configure_limit(conn, "anthropic", MODEL, "input_tokens", 30_000)
    _request(ana)
    result = run_one(db_url, instance, anthropic_models(lambda c, b: _text(output_tokens=4000, input_tokens=90_000)))
    assert result.success
    with ana.connect() as conn:
        output = tb.get_bucket(conn, "anthropic", MODEL, "output_tokens")
        input_ = tb.get_bucket(conn, "anthropic", MODEL, "input_tokens")
    assert output is not None and output.per_minute == pytest.approx(4000) and output.configured_per_minute == 8000
    assert input_ is not None and input_.per_minute == pytest.approx(30_000)  # 90,000 said: kept at 30,000


def test_the_runs_cost_is_the_sum_of_its_turns_at_the_price_table(
    ana: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    agent_run_id = _request(ana)
    turns = [
        {"input_tokens": 2000, "output_tokens": 150, "cache_creation_input_tokens": 1500},
        {"input_tokens": 300, "output_tokens": 420, "cache_read_input_tokens": 1500},
    ]

    def answer(call: int, body: dict[str, Any]) -> httpx.Response:
        if call == 1:
            blocks = [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "read_campaign",
                    "input": {"campaign_id": "spring-launch"},
                }
            ]
            return anthropic_ok(anthropic_message(blocks, "tool_use", **turns[0]))
        return _text(turns[1])

    result = run_one(db_url, instance, anthropic_models(answer))
    assert result.success
    price = costs.price_of("anthropic", MODEL, DEFAULT_MODEL_PRICES)
    assert price is not None
    expected = sum(costs.turn_cost_nano_usd(t, price) for t in turns)
    with ana.connect() as conn:
        summary = costs.cost_summary(conn, agent_run_id)
        steps = [s for s in transcript(conn, agent_run_id) if s["kind"] == "model_turn"]
    assert expected > 0 and summary["cost_nano_usd"] == expected
    assert sum(s["content"]["cost_nano_usd"] for s in steps) == expected
    assert summary["cache_read_tokens"] == 1500 and summary["cache_write_tokens"] == 1500
    [output] = [e for e in result.events_for_node("run_agent") if e.is_successful_output]
    assert output.step_output_data.metadata["cost_usd"].value == pytest.approx(expected / 1e9)


def test_a_spent_campaign_budget_stops_the_run_before_it_calls(
    ana: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    agent_run_id = _request(ana, max_attempts=3)
    with ana.begin() as conn:
        # One nano-dollar a day: no call's worst case fits.
        budgets.set_budget(conn, "campaign", "spring-launch", daily_nano_usd=1, daily_tokens=None)
    calls: list[int] = []

    def answer(call: int, body: dict[str, Any]) -> httpx.Response:
        calls.append(call)
        return _text()

    result = run_one(db_url, instance, anthropic_models(answer))
    assert not result.success and calls == []
    row = _row(ana, agent_run_id)
    assert row["status"] == "FAILED" and "spring-launch" in row["error"] and "budget" in row["error"]
