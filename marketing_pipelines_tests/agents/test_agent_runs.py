"""Agent runs end to end: request -> queued_agent_runs_sensor -> agent_run_job, acting as the requester."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.agents.jobs import agent_run_job
from marketing_pipelines.agents.providers.registry import ProviderResource
from marketing_pipelines.agents.queue import get_agent_run, request_agent_run, transcript
from marketing_pipelines.agents.resources import AgentSettings
from marketing_pipelines.agents.sensors import BACKLOG_FACTOR, claim_agent_run_requests
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import agent_run, marketing_execution
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines_tests.agents.fake_models import anthropic_message, anthropic_models, unconfigured_models
from marketing_pipelines_tests.built import queued_agent_runs_sensor
from marketing_pipelines_tests.factories import add_campaign, settings_from

ALL_READ = ("campaign:read", "measurement:read", "execution:read")


@pytest.fixture
def people(engine: sa.Engine) -> sa.Engine:
    add_campaign(engine, "spring-launch")
    add_campaign(engine, "secret-project")
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        users.add_user(conn, "ben")
        for permission in (*ALL_READ, "execution:write"):
            users.grant(conn, "ana", permission)
        # ben may only read, and only spring-launch.
        for permission in ALL_READ:
            users.grant(conn, "ben", permission, "spring-launch")
    return engine


def _request(engine: sa.Engine, **kw: Any) -> int:
    args: dict[str, Any] = {
        "agent": "measurement_analyst",
        "campaign_id": "spring-launch",
        "requested_by": "ana",
        "settings": settings_from({}),
    }
    args.update(kw)
    with engine.begin() as conn:
        return request_agent_run(conn, **args)


def _sensor_context(
    db_url: str, instance: dg.DagsterInstance, cursor: str | None = None, **settings: Any
) -> dg.SensorEvaluationContext:
    return dg.build_sensor_context(
        instance=instance,
        cursor=cursor,
        resources={"app_db": AppDatabase(url=db_url), "agent_settings": AgentSettings(**settings)},
    )


def _run_all(db_url: str, instance: dg.DagsterInstance, models: dict[str, ProviderResource] | None = None) -> list[Any]:
    context = _sensor_context(db_url, instance)
    result = queued_agent_runs_sensor(context)
    requests = list(result.run_requests or []) if isinstance(result, dg.SensorResult) else []
    return [
        agent_run_job.execute_in_process(
            run_config=r.run_config,
            tags=r.tags,
            instance=instance,
            resources={
                "app_db": AppDatabase(url=db_url),
                **(models or unconfigured_models()),
                "webhook": WebhookClient(),
                "agent_settings": AgentSettings(),
            },
            raise_on_error=False,
        )
        for r in requests
    ]


def _steps(engine: sa.Engine, run_id: int) -> list[tuple[str, str | None]]:
    with engine.connect() as conn:
        return [(s["kind"], s["name"]) for s in transcript(conn, run_id)]


def _row(engine: sa.Engine, run_id: int) -> sa.RowMapping:
    with engine.connect() as conn:
        row = get_agent_run(conn, run_id)
    assert row is not None
    return row


def test_request_queues_and_never_runs_inline(people: sa.Engine) -> None:
    run_id = _request(people, input={"propose": {"stage": "launch", "action": "log", "due": "now"}})
    row = _row(people, run_id)
    assert row["status"] == "QUEUED" and row["attempts"] == 0
    # ana's global grants are captured narrowed to the run's campaign (test_campaign_scope.py has the cases).
    assert sorted(map(tuple, row["permissions"])) == sorted(
        [(p, "spring-launch") for p in (*ALL_READ, "execution:write")]
    )
    assert _steps(people, run_id) == []


def test_sensor_claims_with_tags_and_runtime_limit(people: sa.Engine, db_url: str, instance: dg.DagsterInstance):
    run_id = _request(people, max_run_seconds=42)
    context = _sensor_context(db_url, instance)
    result = queued_agent_runs_sensor(context)
    [request] = result.run_requests
    assert request.run_key == f"agent_run:{run_id}:1"
    assert request.tags["marketing/agent_run_id"] == str(run_id)
    assert request.tags["marketing/requested_by"] == "ana"
    assert int(request.tags["dagster/max_runtime"]) >= 42
    # The pool limit was applied to the instance without any manual step.
    assert instance.event_log_storage.get_concurrency_info("agent_runs").slot_count == 2


SUMMARY = re.compile(
    r"agent runs: claimed (?P<claimed>\d+) into (?P<runs>\d+) run\(s\) \(room (?P<room>\d+) = "
    r"pool limit (?P<limit>\d+) x backlog factor (?P<factor>\d+) minus (?P<running>\d+) running, "
    r"at most (?P<batch>\d+) a tick(?P<floor>, not below 0)?\)"
)


@pytest.mark.parametrize(
    ("pool_limit", "running", "batch_size"),
    [
        (2, 0, 100),  # the pool's 2 and as many again
        (2, 1, 100),  # one running takes one off
        (3, 0, 4),  # the batch bounds it first
        (1, 3, 100),  # the limit was lowered below what runs: no room, not a negative one
    ],
)
def test_the_claim_summary_states_its_room_as_the_sum_that_gives_it(
    people: sa.Engine, pool_limit: int, running: int, batch_size: int
) -> None:
    ids = [_request(people) for _ in range(running + 8)]
    with people.begin() as conn:
        conn.execute(sa.update(agent_run).where(agent_run.c.id.in_(ids[:running])).values(status="RUNNING"))
    requests, summary = claim_agent_run_requests(people, "claimer", batch_size, pool_limit, grace_seconds=60)
    found = SUMMARY.fullmatch(summary)
    assert found, summary
    n = {k: int(v) for k, v in found.groupdict().items() if k != "floor"}
    assert (n["limit"], n["factor"], n["running"], n["batch"]) == (pool_limit, BACKLOG_FACTOR, running, batch_size)
    backlog = n["limit"] * n["factor"] - n["running"]
    assert n["room"] == max(0, min(n["batch"], backlog)) and (found["floor"] is not None) == (backlog < 0)
    assert n["claimed"] == n["runs"] == len(requests) == n["room"]  # 8 queued: more than any room here


def test_sensor_claims_what_the_pool_can_start_and_as_many_again(
    people: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    # Two with a long time limit: each claimed row's lease covers the run ahead of it in Dagster's queue.
    ids = [_request(people, max_run_seconds=3600 if i < 2 else 60) for i in range(7)]
    context = _sensor_context(db_url, instance, max_concurrent_agent_runs=2, lease_grace_seconds=100)
    first = queued_agent_runs_sensor(context)
    # The pool's 2, and 2 more that wait in Dagster's run queue to start the moment one ends.
    assert [r.tags["marketing/agent_run_id"] for r in first.run_requests] == [str(i) for i in ids[:4]]
    second = queued_agent_runs_sensor(context)
    assert isinstance(second, dg.SkipReason)  # nothing more until those runs finish
    with people.connect() as conn:
        rows = conn.execute(
            sa.select(agent_run.c.status, agent_run.c.lease_expires_at, agent_run.c.updated_at).order_by(agent_run.c.id)
        ).all()
    assert [r.status for r in rows] == ["RUNNING"] * 4 + ["QUEUED"] * 3
    leases = [round((r.lease_expires_at - r.updated_at).total_seconds()) for r in rows[:4]]
    assert leases == [3700, 3700, 160, 160]


def test_run_succeeds_calls_tools_and_writes_as_the_requester(
    people: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    run_id = _request(people, input={"propose": {"stage": "follow-up", "action": "log", "due": "now"}})
    [result] = _run_all(db_url, instance)
    assert result.success
    row = _row(people, run_id)
    assert row["status"] == "SUCCEEDED" and row["output"]["denials"] == 0
    kinds = _steps(people, run_id)
    assert [n for k, n in kinds if k == "tool_result"] == [
        "read_campaign",
        "read_measurement",
        "list_executions",
        "schedule_execution",
    ]
    with people.connect() as conn:
        scheduled = conn.execute(sa.select(marketing_execution.c.stage, marketing_execution.c.dedupe_key)).all()
    assert [s.stage for s in scheduled] == ["follow-up"]
    assert scheduled[0].dedupe_key.startswith(f"agent-run:{run_id}:")


def test_denied_write_is_a_refusal_in_the_transcript_not_a_crash(
    people: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    run_id = _request(people, requested_by="ben", input={"propose": {"stage": "x", "action": "log", "due": "now"}})
    [result] = _run_all(db_url, instance)
    assert result.success
    row = _row(people, run_id)
    assert row["status"] == "SUCCEEDED" and row["output"]["denials"] == 1
    with people.connect() as conn:
        steps = transcript(conn, run_id)
        assert conn.execute(sa.select(sa.func.count()).select_from(marketing_execution)).scalar_one() == 0
    [denial] = [s for s in steps if s["kind"] == "denial"]
    assert denial["name"] == "schedule_execution"
    assert "execution:write" in denial["content"]["reason"]
    assert "schedule_execution was refused" in row["output"]["text"]


def test_reads_are_scoped_to_campaigns_the_user_may_see(
    people: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    # ben's run is for secret-project, where he holds nothing: every read is refused.
    with people.begin() as conn:
        users.grant(conn, "ben", "campaign:read", "secret-project")
    run_id = _request(people, requested_by="ben", campaign_id="secret-project")
    [result] = _run_all(db_url, instance)
    assert result.success
    steps = _steps(people, run_id)
    assert ("tool_result", "read_campaign") in steps
    assert ("denial", "read_measurement") in steps and ("denial", "list_executions") in steps


def test_revocation_after_the_request_takes_effect(people: sa.Engine, db_url: str, instance: dg.DagsterInstance):
    run_id = _request(people, input={"propose": {"stage": "x", "action": "log", "due": "now"}})
    with people.begin() as conn:
        assert users.revoke(conn, "ana", "execution:write")
    [result] = _run_all(db_url, instance)
    assert result.success
    with people.connect() as conn:
        [denial] = [s for s in transcript(conn, run_id) if s["kind"] == "denial"]
    assert "no longer holds execution:write" in denial["content"]["reason"]


def test_inactive_user_run_fails_with_a_clear_reason(people: sa.Engine, db_url: str, instance: dg.DagsterInstance):
    run_id = _request(people, requested_by="ben")
    with people.begin() as conn:
        users.set_active(conn, "ben", False)
    [result] = _run_all(db_url, instance)
    assert not result.success
    row = _row(people, run_id)
    assert row["status"] == "FAILED" and "ben is not active" in row["error"]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"agent": "poet"}, "unknown agent 'poet'"),
        ({"requested_by": "zoe"}, "unknown user 'zoe'"),
        ({"campaign_id": "nope"}, "unknown campaign 'nope'"),
        ({"agent": "campaign_brief", "input": {}}, "needs input field 'stage'"),
        ({"input": {"colour": "red"}}, "does not take input field(s) colour"),
        ({"input": {"from": "yesterday"}}, "from 'yesterday' is not a date"),
        (
            {"provider": "anthropic", "settings": settings_from({})},
            "'anthropic' is not configured: set ANTHROPIC_API_KEY",
        ),
        ({"provider": "llama"}, "unknown model provider 'llama'"),
        ({"max_run_seconds": 0}, "max_run_seconds must be from 1 to 86400"),
    ],
)
def test_bad_requests_are_named_and_nothing_is_written(people: sa.Engine, kw: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput, match=None) as caught:
        _request(people, **kw)
    assert message in str(caught.value)
    with people.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(agent_run)).scalar_one() == 0


def test_inactive_user_cannot_request(people: sa.Engine) -> None:
    with people.begin() as conn:
        users.set_active(conn, "ben", False)
    with pytest.raises(InvalidInput, match="not active"):
        _request(people, requested_by="ben")


def _read_campaign_then_answer(call: int, body: dict[str, Any]) -> httpx.Response:
    """Anthropic's API as the agent meets it: a read_campaign tool call, then the answer after its result."""
    if call == 1:
        content = [
            {"type": "text", "text": "Let me look at the campaign."},
            {"type": "tool_use", "id": "toolu_01", "name": "read_campaign", "input": {"campaign_id": "spring-launch"}},
        ]
        return httpx.Response(200, json=anthropic_message(content, "tool_use", output_tokens=30))
    tool_result = body["messages"][-1]["content"][0]
    assert tool_result["type"] == "tool_result" and tool_result["tool_use_id"] == "toolu_01"
    return httpx.Response(
        200, json=anthropic_message([{"type": "text", "text": "Spring launch: ship it."}], output_tokens=30)
    )


def test_anthropic_provider_drives_the_loop_with_tool_use(
    people: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    run_id = _request(
        people,
        agent="campaign_brief",
        input={"stage": "launch"},
        provider="anthropic",
        settings=settings_from({"ANTHROPIC_API_KEY": "k"}),
    )
    [result] = _run_all(db_url, instance, models=anthropic_models(_read_campaign_then_answer))
    assert result.success
    row = _row(people, run_id)
    assert row["output"]["text"] == "Spring launch: ship it."
    assert ("tool_result", "read_campaign") in _steps(people, run_id)


def test_a_pool_limit_edited_in_the_ui_stands_until_the_setting_changes(
    people: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    ids = [_request(people) for _ in range(12)]
    context = _sensor_context(db_url, instance, max_concurrent_agent_runs=2)
    storage = instance.event_log_storage
    first = queued_agent_runs_sensor(context)
    assert isinstance(first, dg.SensorResult) and len(first.run_requests) == 4  # 2 x the limit of 2
    assert storage.get_concurrency_info("agent_runs").slot_count == 2  # the setting, applied once
    # An operator raises the limit in the UI (Deployment > Concurrency > Edit limit).
    storage.set_concurrency_slots("agent_runs", 5)
    second = queued_agent_runs_sensor(context)
    assert storage.get_concurrency_info("agent_runs").slot_count == 5  # not set back to 2
    # ... and the sensor claims by the limit in force: 2 x 5 - 4 RUNNING = 6 more.
    assert [r.tags["marketing/agent_run_id"] for r in second.run_requests] == [str(i) for i in ids[4:10]]
    # Changing the setting itself is a new decision: applied at the next tick.
    changed = _sensor_context(db_url, instance, cursor=context.cursor, max_concurrent_agent_runs=3)
    queued_agent_runs_sensor(changed)
    assert storage.get_concurrency_info("agent_runs").slot_count == 3


def test_an_agent_run_whose_worker_died_before_taking_it_over_is_failed_and_requeued(
    people: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    # The agent queue goes through the same recovery as executions: the row names the tick's claim (the
    # run died between starting and its take-over), its lease runs out, the row is claimed again and the
    # dead run is marked FAILURE, where the Runs page and alerts show it.
    agent_run_id = _request(people)
    result = queued_agent_runs_sensor(_sensor_context(db_url, instance))
    [request] = list(result.run_requests or []) if isinstance(result, dg.SensorResult) else []
    run = instance.create_run_for_job(
        job_def=agent_run_job, run_config=request.run_config, tags=request.tags, status=dg.DagsterRunStatus.STARTED
    )
    with people.begin() as conn:
        conn.execute(
            sa.update(agent_run)
            .where(agent_run.c.id == agent_run_id)
            .values(lease_expires_at=datetime.now(UTC) - timedelta(seconds=1))
        )
    again = queued_agent_runs_sensor(_sensor_context(db_url, instance))
    [retry] = list(again.run_requests or []) if isinstance(again, dg.SensorResult) else []
    assert retry.tags["marketing/agent_run_id"] == str(agent_run_id)
    failed = instance.get_run_by_id(run.run_id)
    assert failed is not None and failed.status == dg.DagsterRunStatus.FAILURE
