"""Cancellation, end to end: the CLI commands, the lease module, the canceled-run sensors and the
agent-run failure reconciliation, on both databases."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from marketing_pipelines.agents import users
from marketing_pipelines.agents.jobs import agent_run_job
from marketing_pipelines.agents.queue import get_agent_run, request_agent_run
from marketing_pipelines.agents.sensors import agent_run_canceled_sensor, agent_run_failure_sensor
from marketing_pipelines.cli import main
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.egress import EgressPolicy, parse_networks
from marketing_pipelines.executions.queue import get_execution, list_attempts, schedule_execution
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines_tests.agents.fake_models import unconfigured_models
from marketing_pipelines_tests.agents.runs import AGENT_RESOURCES
from marketing_pipelines_tests.built import due_executions_sensor, queued_agent_runs_sensor
from marketing_pipelines_tests.executions.runs import LOCAL, outcomes, perform, sensor_requests
from marketing_pipelines_tests.factories import add_campaign, settings_from
from marketing_pipelines_tests.webserver import Received, webhook_server

Cli = Callable[..., tuple[int, str]]


def invoke(db_url: str, *args: str) -> tuple[int, str]:
    result = CliRunner(env={"MARKETING_DATABASE_URL": db_url}).invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output.strip()


@pytest.fixture
def cli(db_url: str) -> Cli:
    return functools.partial(invoke, db_url)


def _execution(engine: sa.Engine, url: str = "https://hooks.example.com/x", action: str = "webhook") -> int:
    add_campaign(engine)
    with engine.begin() as conn:
        return schedule_execution(
            conn,
            campaign_id="spring-launch",
            stage="launch",
            action=action,
            due_at=datetime.now(UTC) - timedelta(seconds=1),
            payload={"url": url} if action == "webhook" else {"message": "hi"},
            egress=EgressPolicy(parse_networks(LOCAL)),
        )


def test_executions_cancel_of_a_scheduled_execution(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, cli: Cli
):
    execution_id = _execution(engine, action="log")
    assert cli("executions", "cancel", str(execution_id)) == (0, f"execution {execution_id} cancelled (was SCHEDULED)")
    assert sensor_requests(due_executions_sensor, db_url, instance) == []  # nothing left to claim
    with engine.connect() as conn:
        row = get_execution(conn, execution_id)
    assert row is not None and (row["status"], row["last_error"]) == (
        "CANCELLED",
        "cancelled by marketing-pipelines executions cancel",
    )
    code, output = cli("executions", "cancel", str(execution_id))
    assert code == 1
    assert output == (
        f"Error: execution {execution_id} is already CANCELLED; only SCHEDULED or RUNNING executions can be cancelled"
    )
    assert cli("executions", "cancel", "999")[1] == (
        "Error: execution 999 does not exist; see marketing-pipelines executions list"
    )


def test_cancelling_a_running_execution_leaves_its_batch_running_and_records_nothing(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, cli: Cli
) -> None:
    with webhook_server() as hook:
        first = _execution(engine, f"{hook.url}/first")
        second = _execution(engine, f"{hook.url}/second")

        def cancel_first(received: Received) -> None:
            # While the first webhook is in flight, an operator cancels it.
            if received.path == "/hook/first":
                assert cli("executions", "cancel", str(first))[0] == 0

        hook.on_request = cancel_first
        [request] = sensor_requests(due_executions_sensor, db_url, instance)
        one_at_a_time = WebhookClient(timeout_s=5, allow_networks=LOCAL, concurrency=1)
        result = perform(request, db_url, instance, webhook=one_at_a_time)
    assert result.success
    assert outcomes(result) == {first: "LEASE_LOST", second: "SUCCEEDED"}
    with engine.connect() as conn:
        assert get_execution(conn, first)["status"] == "CANCELLED"  # type: ignore[index]
        assert get_execution(conn, second)["status"] == "SUCCEEDED"  # type: ignore[index]
        assert [(a["attempt"], a["outcome"]) for a in list_attempts(conn, first)] == [(1, "CANCELLED")]


@pytest.fixture
def agent_request(engine: sa.Engine) -> int:
    add_campaign(engine)
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        users.grant(conn, "ana", "campaign:read")
        return request_agent_run(
            conn,
            agent="campaign_brief",
            campaign_id="spring-launch",
            requested_by="ana",
            input={"stage": "launch"},
            settings=settings_from({}),
        )


def _agent_row(engine: sa.Engine, agent_run_id: int) -> sa.RowMapping:
    with engine.connect() as conn:
        row = get_agent_run(conn, agent_run_id)
    assert row is not None
    return row


def test_agents_cancel_of_a_queued_run(
    db_url: str, engine: sa.Engine, agent_request: int, instance: dg.DagsterInstance, cli: Cli
):
    assert cli("agents", "cancel", str(agent_request)) == (0, f"agent run {agent_request} cancelled (was QUEUED)")
    assert _agent_row(engine, agent_request)["status"] == "CANCELLED"
    assert sensor_requests(queued_agent_runs_sensor, db_url, instance) == []
    code, output = cli("agents", "cancel", str(agent_request))
    assert code == 1 and "is already CANCELLED" in output


def test_a_canceled_agent_dagster_run_cancels_its_agent_run(
    db_url: str, engine: sa.Engine, agent_request: int, instance: dg.DagsterInstance
) -> None:
    [request] = sensor_requests(queued_agent_runs_sensor, db_url, instance)
    run = instance.create_run_for_job(job_def=agent_run_job, run_config=request.run_config, tags=request.tags)
    instance.report_run_canceled(run)
    canceled = instance.get_run_by_id(run.run_id)
    assert canceled is not None
    context = dg.build_run_status_sensor_context(
        sensor_name="agent_run_canceled_sensor",
        dagster_instance=instance,
        dagster_run=canceled,
        dagster_event=instance.all_logs(run.run_id)[-1].dagster_event,
        resources={"app_db": AppDatabase(url=db_url)},
    )
    agent_run_canceled_sensor(context)
    row = _agent_row(engine, agent_request)
    assert row["status"] == "CANCELLED" and run.run_id in row["error"]


class BrokenDatabase(AppDatabase):
    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        raise RuntimeError("database resource failed to start")


def test_a_failed_agent_dagster_run_requeues_its_agent_run_once(
    db_url: str, engine: sa.Engine, agent_request: int, instance: dg.DagsterInstance
) -> None:
    [request] = sensor_requests(queued_agent_runs_sensor, db_url, instance)
    result = agent_run_job.execute_in_process(
        run_config=request.run_config,
        tags=request.tags,
        instance=instance,
        resources={"app_db": BrokenDatabase(url=db_url), **unconfigured_models(), **AGENT_RESOURCES},
        raise_on_error=False,
    )
    assert not result.success and _agent_row(engine, agent_request)["status"] == "RUNNING"
    context = dg.build_run_status_sensor_context(
        sensor_name="agent_run_failure_sensor",
        dagster_instance=instance,
        dagster_run=result.dagster_run,
        dagster_event=result.get_run_failure_event(),
        resources={"app_db": AppDatabase(url=db_url)},
    ).for_run_failure()
    agent_run_failure_sensor(context)
    row = _agent_row(engine, agent_request)
    assert (row["status"], row["attempts"], row["lease_owner"]) == ("QUEUED", 1, None)
    assert result.run_id in row["error"]
    agent_run_failure_sensor(context)  # the same event again changes nothing
    assert _agent_row(engine, agent_request)["status"] == "QUEUED"
    # ... and the requeued run is claimed again as its second attempt.
    [retry] = sensor_requests(queued_agent_runs_sensor, db_url, instance)
    assert retry.run_key == f"agent_run:{agent_request}:2"
