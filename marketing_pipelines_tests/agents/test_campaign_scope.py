"""An agent run acts only on the campaign it was requested for, whatever else its requester may touch.

The model is the real Anthropic provider with its HTTP answered here, so it can ask what a model
steered by text injected through one campaign's data would ask: a write and reads on another campaign.
"""

from __future__ import annotations

import time
from typing import Any

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.agents.catalog import get_agent
from marketing_pipelines.agents.queue import (
    Transcript,
    cancel_agent_run,
    get_agent_run,
    request_agent_run,
    retry_agent_run,
    transcript,
)
from marketing_pipelines.agents.runner import CallsGate, RunLimits, run_agent_loop
from marketing_pipelines.db.schema import marketing_execution
from marketing_pipelines.egress import EgressPolicy
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines_tests.agents.fake_models import anthropic_models, text_turn, tool_turn
from marketing_pipelines_tests.agents.runs import output_metadata, run_one
from marketing_pipelines_tests.factories import add_campaign, settings_from

OURS, OTHER = "spring-launch", "secret-project"
ANALYST_NEEDS = ("campaign:read", "measurement:read", "execution:read", "execution:write")
KEY = {"ANTHROPIC_API_KEY": "k"}


@pytest.fixture
def people(engine: sa.Engine) -> sa.Engine:
    add_campaign(engine, OURS)
    add_campaign(engine, OTHER)
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        # ana may do everything on both campaigns: only the run's campaign may stop its agent.
        for permission in ANALYST_NEEDS:
            for campaign_id in (OURS, OTHER):
                users.grant(conn, "ana", permission, campaign_id)
        users.add_user(conn, "gus")
        # gus holds every permission globally (scope *).
        for permission in ANALYST_NEEDS:
            users.grant(conn, "gus", permission)
    return engine


def _request(engine: sa.Engine, requested_by: str = "ana", **kw: Any) -> int:
    with engine.begin() as conn:
        return request_agent_run(
            conn,
            agent="measurement_analyst",
            campaign_id=OURS,
            requested_by=requested_by,
            provider="anthropic",
            settings=settings_from(KEY),
            **kw,
        )


def _row(engine: sa.Engine, run_id: int) -> sa.RowMapping:
    with engine.connect() as conn:
        row = get_agent_run(conn, run_id)
    assert row is not None
    return row


def _executions(engine: sa.Engine, campaign_id: str) -> list[sa.Row]:
    t = marketing_execution
    with engine.connect() as conn:
        return list(conn.execute(sa.select(t.c.id, t.c.dedupe_key).where(t.c.campaign_id == campaign_id)).all())


def _schedule(campaign_id: str, **changes: Any) -> dict[str, Any]:
    arguments = {
        "campaign_id": campaign_id,
        "stage": "follow-up",
        "action": "log",
        "due": "2026-12-01T09:00:00+00:00",
        "payload": {"message": "hello"},
    }
    arguments.update(changes)
    return arguments


READ_RANGE = {"from": "2026-11-01", "to": "2026-11-30"}
# What a steered model asks, in order: every tool, each naming the other campaign.
HOSTILE_CALLS = [
    ("schedule_execution", _schedule(OTHER, payload={"message": "from spring-launch's data"})),
    ("read_campaign", {"campaign_id": OTHER}),
    ("read_measurement", {"campaign_id": OTHER, **READ_RANGE}),
    ("list_executions", {"campaign_id": OTHER}),
]


@pytest.mark.parametrize(
    "requester",
    [
        "ana",  # grants scoped to each campaign, the other one included
        "gus",  # global grants, which count on the run's campaign only
    ],
)
def test_a_run_on_one_campaign_cannot_read_or_write_another(
    people: sa.Engine, db_url: str, instance: dg.DagsterInstance, requester: str
) -> None:
    run_id = _request(people, requester)
    calls = [*HOSTILE_CALLS, ("read_campaign", {"campaign_id": OURS})]
    bodies: list[dict[str, Any]] = []

    def answer(call: int, body: dict[str, Any]) -> httpx.Response:
        bodies.append(body)
        if call <= len(calls):
            name, arguments = calls[call - 1]
            return tool_turn(f"turn {call}", name, arguments, call_id=f"toolu_{call}")
        return text_turn("Done.")

    result = run_one(db_url, instance, anthropic_models(answer))

    assert result.success and _row(people, run_id)["status"] == "SUCCEEDED"
    assert _executions(people, OTHER) == []
    with people.connect() as conn:
        steps = transcript(conn, run_id)
    denials = [s for s in steps if s["kind"] == "denial"]
    assert [d["name"] for d in denials] == [name for name, _ in HOSTILE_CALLS]
    for denial in denials:
        assert denial["content"]["reason"] == (
            f"campaign {OTHER!r} is outside this run: agent run {run_id} acts only on campaign {OURS!r}"
        )
    # The run went on after the refusals: its own campaign was read.
    [ok] = [s for s in steps if s["kind"] == "tool_result"]
    assert ok["name"] == "read_campaign" and ok["content"]["result"]["id"] == OURS
    # The model was answered each refusal as an error result.
    refused = [
        block
        for block in bodies[1]["messages"][-1]["content"]
        if block.get("type") == "tool_result" and block.get("is_error")
    ]
    assert len(refused) == 1 and "outside this run" in str(refused[0]["content"])
    metadata = output_metadata(result)
    assert metadata["denials"] == len(HOSTILE_CALLS)
    assert "outside this run" in metadata["transcript"]


@pytest.mark.parametrize(
    "requester",
    [
        "ana",  # per-campaign grants on both campaigns: the other campaign's are left out
        "gus",  # global grants: each narrowed to the run's campaign
    ],
)
def test_captured_permissions_hold_the_runs_campaign_only(people: sa.Engine, requester: str) -> None:
    expected = [[permission, OURS] for permission in sorted(ANALYST_NEEDS)]
    run_id = _request(people, requester)
    assert _row(people, run_id)["permissions"] == expected
    # A retry captures the grants again, as narrowly.
    with people.begin() as conn:
        cancel_agent_run(conn, run_id, "not now")
        retry_agent_run(conn, run_id)
    assert _row(people, run_id)["permissions"] == expected


def test_a_proposal_cannot_name_another_campaign(people: sa.Engine) -> None:
    proposal = {"campaign_id": OTHER, "stage": "x", "action": "log", "due": "now"}
    with pytest.raises(InvalidInput, match="input field 'propose' does not take 'campaign_id'"):
        _request(people, input={"propose": proposal})


def _start_over(engine: sa.Engine, run_id: int, attempt: int) -> None:
    """Begin the run's conversation again in ``attempt``: a second task step, as a version that restarted runs wrote."""
    with engine.connect() as conn:
        task = next(s["content"] for s in transcript(conn, run_id) if s["kind"] == "task")
    Transcript(engine, run_id, attempt).add("task", None, task)


def _loop(engine: sa.Engine, run_id: int, attempt: int, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One attempt of the run whose model schedules ``calls`` in order; returns the tool results."""

    def answer(call: int, body: dict[str, Any]) -> httpx.Response:
        if call <= len(calls):
            return tool_turn("", "schedule_execution", calls[call - 1], call_id=f"toolu_{call}")
        return text_turn("Done.")

    with engine.connect() as conn:
        row = get_agent_run(conn, run_id)
    assert row is not None
    run_agent_loop(
        engine=engine,
        definition=get_agent("measurement_analyst"),
        run=row,
        provider=anthropic_models(answer)["anthropic_model"],
        transcript=Transcript(engine, run_id, attempt),
        limits=RunLimits(max_steps=len(calls) + 1, deadline=time.monotonic() + 60),
        gate=CallsGate(lambda: None),
        egress=EgressPolicy(),
    )
    with engine.connect() as conn:
        steps = transcript(conn, run_id, attempt)
    assert not [s for s in steps if s["kind"] in ("denial", "tool_error")], steps
    return [s["content"]["result"] for s in steps if s["kind"] == "tool_result"]


@pytest.mark.parametrize(
    ("second", "rows"),
    [
        # the same call again is the same execution
        (_schedule(OURS), 1),
        # the same instant spelled with Z is the same execution
        (_schedule(OURS, due="2026-12-01T09:00:00Z"), 1),
        # another payload is another execution
        (_schedule(OURS, payload={"message": "goodbye"}), 2),
        # another stage
        (_schedule(OURS, stage="launch"), 2),
        # another due time
        (_schedule(OURS, due="2026-12-02T09:00:00+00:00"), 2),
    ],
)
def test_an_agents_executions_dedupe_on_what_they_do(people: sa.Engine, second: dict[str, Any], rows: int) -> None:
    run_id = _request(people)
    results = _loop(people, run_id, 1, [_schedule(OURS), second])
    scheduled = _executions(people, OURS)
    assert len(scheduled) == rows
    assert len({r["scheduled_execution_id"] for r in results}) == rows
    assert all(s.dedupe_key.startswith(f"agent-run:{run_id}:{OURS}:") for s in scheduled)
    # A retried attempt resumes from the transcript and calls no tool again (test_resume.py). The key is what
    # holds when a conversation starts over anyway (a task step again, as versions before resuming wrote): the
    # same calls proposed again make no new row.
    _start_over(people, run_id, 2)
    assert _loop(people, run_id, 2, [_schedule(OURS), second]) == results
    assert _executions(people, OURS) == scheduled
