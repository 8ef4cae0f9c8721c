"""A throttled or interrupted agent run resumes from its transcript: no model turn asked twice, no recorded tool
call run twice, the budget and the step limit counted over every attempt.

Issue 46: with 3 calls a minute and two analyst runs, each rate-limit retry restarted the agent from its first
turn (17 restarts each, every call paid again, both killed at the time limit). The unit tests drive the loop with
the real Anthropic provider answered at the HTTP layer (``fake_models``); the scenario runs the user's path, the
sensor and ``agent_run_job`` in run-worker processes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.agents.catalog import AGENTS, get_agent
from marketing_pipelines.agents.queue import Transcript, get_agent_run, request_agent_run, transcript
from marketing_pipelines.agents.runner import (
    OUTCOMES,
    AgentResult,
    AgentStopped,
    CallsGate,
    LeaseLost,
    RunLimits,
    run_agent_loop,
)
from marketing_pipelines.db import token_bucket
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import agent_run_step, marketing_execution
from marketing_pipelines.egress import EgressPolicy
from marketing_pipelines_tests.agents.agent_processes import (
    join_all,
    sensor_agent_requests,
    start_run_worker,
    write_dagster_home,
)
from marketing_pipelines_tests.agents.fake_models import anthropic_message, anthropic_models, anthropic_ok, text_turn
from marketing_pipelines_tests.factories import add_campaign, request_offline_analysis, settings_from

OURS = "spring-launch"
ANALYST = AGENTS["measurement_analyst"].budget
READ = {"campaign_id": OURS}
LOG = {"campaign_id": OURS, "stage": "launch", "action": "log", "due": "2026-12-01T09:00:00+00:00", "payload": {}}


class Crash(BaseException):
    """The process dying at that point: nothing after it runs, no handler of Exception catches it."""


@pytest.fixture
def ana(engine: sa.Engine) -> sa.Engine:
    add_campaign(engine, OURS)
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        for permission in ("campaign:read", "measurement:read", "execution:read", "execution:write"):
            users.grant(conn, "ana", permission)
    return engine


def _request(engine: sa.Engine) -> int:
    with engine.begin() as conn:
        return request_agent_run(
            conn,
            agent="measurement_analyst",
            campaign_id=OURS,
            requested_by="ana",
            provider="anthropic",
            settings=settings_from({"ANTHROPIC_API_KEY": "k"}),
        )


def _calls(*calls: tuple[str, dict[str, Any]]) -> httpx.Response:
    """One model turn asking for ``calls`` (tool, arguments) at once, ids toolu_0001, toolu_0002, ..."""
    blocks = [
        {"type": "tool_use", "id": f"toolu_{i:04d}", "name": tool, "input": arguments}
        for i, (tool, arguments) in enumerate(calls, start=1)
    ]
    return anthropic_ok(anthropic_message([{"type": "text", "text": "On it."}, *blocks], "tool_use"))


def _outcomes(engine: sa.Engine, run_id: int) -> int:
    with engine.connect() as conn:
        return sum(1 for s in transcript(conn, run_id) if s["kind"] in OUTCOMES)


def _steps(engine: sa.Engine, run_id: int, attempt: int) -> list[tuple[str, str | None]]:
    with engine.connect() as conn:
        return [(s["kind"], s["name"]) for s in transcript(conn, run_id, attempt)]


def _attempt(
    engine: sa.Engine,
    run_id: int,
    attempt: int,
    turns: list[httpx.Response],
    bodies: list[dict[str, Any]],
    *,
    max_steps: int = 8,
    stop_after_outcomes: int | None = None,
    steps: Transcript | None = None,
) -> AgentResult:
    """One attempt of the run whose model answers ``turns`` in order; the request bodies go to ``bodies``.

    ``stop_after_outcomes``: the attempt ends (its lease lost) once that many tool outcomes are recorded.
    """

    def answer(call: int, body: dict[str, Any]) -> httpx.Response:
        bodies.append(body)
        return turns[call - 1]

    def lost() -> bool:
        return stop_after_outcomes is not None and _outcomes(engine, run_id) >= stop_after_outcomes

    with engine.connect() as conn:
        row = get_agent_run(conn, run_id)
    assert row is not None
    return run_agent_loop(
        engine=engine,
        definition=get_agent(row["agent"]),
        run=row,
        provider=anthropic_models(answer)["anthropic_model"],
        transcript=steps or Transcript(engine, run_id, attempt),
        limits=RunLimits(max_steps=max_steps, deadline=time.monotonic() + 120, is_cancelled=lost),
        gate=CallsGate(lambda: None),
        egress=EgressPolicy(),
    )


def _tool_results_sent(body: dict[str, Any]) -> list[str]:
    """The tool_use ids the request answers, in order (Anthropic: tool_result blocks in user messages)."""
    return [
        block["tool_use_id"]
        for message in body["messages"]
        if message["role"] == "user" and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]


def test_a_partly_answered_turn_resumes_by_answering_only_the_rest(ana: sa.Engine) -> None:
    run_id = _request(ana)
    first: list[dict[str, Any]] = []
    three_reads = _calls(("read_campaign", READ), ("list_executions", READ), ("read_campaign", READ))
    with pytest.raises(LeaseLost):
        _attempt(ana, run_id, 1, [three_reads], first, stop_after_outcomes=1)
    assert _steps(ana, run_id, 1) == [
        ("task", None),
        ("model_turn", "anthropic"),
        ("tool_call", "read_campaign"),
        ("tool_result", "read_campaign"),
    ]

    second: list[dict[str, Any]] = []
    result = _attempt(ana, run_id, 2, [text_turn("Done.")], second)

    # The turn is not asked again: the one model call of attempt 2 is the next turn, with all three answers.
    assert len(first) == 1 and len(second) == 1
    assert _tool_results_sent(second[0]) == ["toolu_0001", "toolu_0002", "toolu_0003"]
    task = [json.loads(body["messages"][0]["content"]) for body in (first[0], second[0])]
    assert task[1] == task[0]  # as recorded by attempt 1 (its keys in JSONB's order on PostgreSQL)
    assert _steps(ana, run_id, 2) == [
        ("tool_call", "list_executions"),
        ("tool_result", "list_executions"),
        ("tool_call", "read_campaign"),
        ("tool_result", "read_campaign"),
        ("model_turn", "anthropic"),
    ]
    assert (result.text, result.steps, result.tool_calls, result.denials) == ("Done.", 2, 3, 0)


def _executions(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(marketing_execution)).scalar_one()


class _CrashBeforeCommit(Transcript):
    """Dies while the tool's transaction is still open: after the tool's writes, before they commit."""

    def add(self, kind: str, name: str | None, content: Any, conn: sa.Connection | None = None) -> None:
        if kind == "tool_result" and name == "schedule_execution":
            raise Crash()
        super().add(kind, name, content, conn)


def test_a_tool_runs_once_its_result_is_recorded_and_again_only_if_it_never_committed(ana: sa.Engine) -> None:
    run_id = _request(ana)
    turn = _calls(("schedule_execution", LOG), ("read_campaign", READ))

    # Attempt 1 dies inside the schedule's transaction: the execution and its result are rolled back together.
    with pytest.raises(Crash):
        _attempt(ana, run_id, 1, [turn], [], steps=_CrashBeforeCommit(ana, run_id, 1))
    assert _executions(ana) == 0
    assert [kind for kind, _ in _steps(ana, run_id, 1)] == ["task", "model_turn", "tool_call"]

    # Attempt 2 runs the call that never committed, then ends before the read.
    with pytest.raises(LeaseLost):
        _attempt(ana, run_id, 2, [], [], stop_after_outcomes=1)
    assert _executions(ana) == 1
    assert _steps(ana, run_id, 2) == [("tool_call", "schedule_execution"), ("tool_result", "schedule_execution")]

    # Attempt 3 finds the schedule's result recorded: it never runs it again, only the read.
    bodies: list[dict[str, Any]] = []
    result = _attempt(ana, run_id, 3, [text_turn("Scheduled.")], bodies)
    assert _steps(ana, run_id, 3) == [
        ("tool_call", "read_campaign"),
        ("tool_result", "read_campaign"),
        ("model_turn", "anthropic"),
    ]
    assert _executions(ana) == 1
    assert len(bodies) == 1 and _tool_results_sent(bodies[0]) == ["toolu_0001", "toolu_0002"]
    assert (result.text, result.steps, result.tool_calls) == ("Scheduled.", 2, 2)


def test_the_step_limit_counts_the_turns_of_earlier_attempts(ana: sa.Engine) -> None:
    run_id = _request(ana)
    read = _calls(("read_campaign", READ))
    first: list[dict[str, Any]] = []
    with pytest.raises(LeaseLost):
        _attempt(ana, run_id, 1, [read, read], first, max_steps=3, stop_after_outcomes=2)
    assert len(first) == 2

    second: list[dict[str, Any]] = []
    with pytest.raises(AgentStopped, match=r"step limit \(3 model turns\)"):
        _attempt(ana, run_id, 2, [read, read, read], second, max_steps=3)
    assert len(second) == 1  # turns 1 and 2 were attempt 1's: one turn was left


def test_the_tool_call_budget_counts_the_calls_of_earlier_attempts(ana: sa.Engine) -> None:
    run_id = _request(ana)
    assert (ANALYST.tool_calls_per_turn, ANALYST.tool_calls_per_run) == (4, 12)
    six = _calls(*[("read_campaign", READ)] * 6)  # 4 made, 2 over the turn's budget
    four = _calls(*[("read_campaign", READ)] * 4)
    with pytest.raises(LeaseLost):
        _attempt(ana, run_id, 1, [six, four, four], [], stop_after_outcomes=14)

    # 12 calls made by attempt 1: the run's budget is spent, and attempt 2's next call is refused for it.
    result = _attempt(ana, run_id, 2, [_calls(("read_campaign", READ)), text_turn("Done.")], [])
    with ana.connect() as conn:
        [denial] = [s for s in transcript(conn, run_id, 2) if s["kind"] == "denial"]
    assert denial["content"]["reason"].startswith("over budget: at most 12 tool call(s) per run, all made")
    assert (result.steps, result.tool_calls, result.denials, result.over_budget) == (5, 15, 3, 3)


def test_a_run_whose_final_answer_is_recorded_returns_it_without_a_model_call(ana: sa.Engine) -> None:
    run_id = _request(ana)
    _attempt(ana, run_id, 1, [_calls(("read_campaign", READ)), text_turn("Done.")], [])
    # The attempt ended after its answer was recorded and before the run's outcome was (its lease lost).
    bodies: list[dict[str, Any]] = []
    result = _attempt(ana, run_id, 2, [], bodies)
    assert bodies == [] and _steps(ana, run_id, 2) == []
    assert (result.text, result.steps, result.tool_calls) == ("Done.", 2, 1)


def test_step_numbers_stay_in_order_when_a_step_is_retried_or_its_transaction_rolls_back(ana: sa.Engine) -> None:
    run_id = _request(ana)
    Transcript(ana, run_id, 1).add("task", None, {"task": "t"})
    with pytest.raises(Crash), ana.begin() as conn:
        Transcript(ana, run_id, 1).add("tool_result", "read_campaign", {"id": "a", "result": {}}, conn=conn)
        raise Crash()
    # A step Dagster retried within the attempt writes with a new Transcript of the same attempt.
    retried = Transcript(ana, run_id, 1)
    retried.add("model_turn", "anthropic", {"text": "", "tool_calls": []})
    Transcript(ana, run_id, 2).add("error", "anthropic", {"error": "x"})
    s = agent_run_step
    with ana.connect() as conn:
        rows = conn.execute(sa.select(s.c.attempt, s.c.seq, s.c.kind).order_by(s.c.id)).all()
    assert [tuple(r) for r in rows] == [(1, 1, "task"), (1, 2, "model_turn"), (2, 1, "error")]


# --- the user's scenario: two analyst runs at 3 model calls a minute, through Dagster ---------------------------


def _model_turns(engine: sa.Engine, agent_run_id: int) -> int:
    with engine.connect() as conn:
        return sum(1 for s in transcript(conn, agent_run_id) if s["kind"] == "model_turn")


def _status(engine: sa.Engine, agent_run_id: int) -> str:
    with engine.connect() as conn:
        row = get_agent_run(conn, agent_run_id)
    assert row is not None
    return row["status"]


def _run_claimed(instance: dg.DagsterInstance, db_url: str, env: dict[str, str], timeout_s: float) -> None:
    """Tick the claiming sensor once and run every agent run it requests, each in its own run-worker process."""
    requests = sensor_agent_requests(instance, db_url)
    assert requests, "the sensor claimed nothing"
    join_all([start_run_worker(r, env) for r in requests], timeout_s)


@pytest.mark.slow
def test_two_analyst_runs_at_3_calls_a_minute_succeed_with_the_turns_one_run_needs(db_url: str, tmp_path: Path) -> None:
    engine = get_engine(db_url)
    add_campaign(engine, OURS)
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        for permission in ("campaign:read", "measurement:read", "execution:read"):
            users.grant(conn, "ana", permission)
    home = write_dagster_home(tmp_path / "dagster_home")
    env = {"MARKETING_DATABASE_URL": db_url, "DAGSTER_HOME": str(home), "NO_PROXY": "127.0.0.1,localhost"}
    with dg.DagsterInstance.from_config(str(home)) as instance:
        alone = _request_offline(engine)
        _run_claimed(instance, db_url, env, timeout_s=90)
        assert _status(engine, alone) == "SUCCEEDED"
        needed = _model_turns(engine, alone)
        # More turns than the bucket holds: each run of the pair has to wait for tokens mid-run.
        assert needed > 3

        with engine.begin() as conn:
            token_bucket.configure_bucket(conn, "offline", 3)
        pair = [_request_offline(engine), _request_offline(engine)]
        # 2 x needed calls, 3 at once and then one every 20 s: about 100 s. The old loop restarted at each
        # wait and never finished (the workers are killed at the bound and the test fails naming them).
        _run_claimed(instance, db_url, env, timeout_s=170)
        assert [_status(engine, i) for i in pair] == ["SUCCEEDED", "SUCCEEDED"]
        assert [_model_turns(engine, i) for i in pair] == [needed, needed]


def _request_offline(engine: sa.Engine) -> int:
    with engine.begin() as conn:
        return request_offline_analysis(conn, "ana")
