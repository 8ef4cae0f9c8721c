"""marketing_execution_job end to end on a real Dagster instance and a real HTTP server."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import marketing_execution as t
from marketing_pipelines.executions.actions import WebhookClient
from marketing_pipelines.executions.jobs import marketing_execution_job
from marketing_pipelines.executions.queue import get_execution, schedule_execution
from marketing_pipelines.work import due_work_sensor, work_run_failure_sensor
from marketing_pipelines_tests.factories import add_campaign
from marketing_pipelines_tests.webserver import Recorder, webhook_server


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as inst:
        yield inst


@pytest.fixture
def hook() -> Iterator[Recorder]:
    with webhook_server() as recorder:
        yield recorder


def _schedule(engine: sa.Engine, url: str, max_attempts: int = 3) -> int:
    add_campaign(engine)
    with engine.begin() as conn:
        return schedule_execution(
            conn,
            campaign_id="spring-launch",
            stage="launch",
            action="webhook",
            due_at=datetime.now(UTC) - timedelta(seconds=1),
            payload={"url": url, "body": {"text": "we launched"}},
            max_attempts=max_attempts,
        )


def _tick(db_url: str, instance: dg.DagsterInstance) -> list[dg.RunRequest]:
    result = due_work_sensor(build_context(db_url, instance))
    return list(result.run_requests or []) if isinstance(result, dg.SensorResult) else []


def build_context(db_url: str, instance: dg.DagsterInstance) -> dg.SensorEvaluationContext:
    return dg.build_sensor_context(instance=instance, resources={"app_db": AppDatabase(url=db_url)})


def _run(request: dg.RunRequest, db_url: str, instance: dg.DagsterInstance, webhook: WebhookClient | None = None):
    return marketing_execution_job.execute_in_process(
        run_config=request.run_config,
        tags=request.tags,
        instance=instance,
        resources={"app_db": AppDatabase(url=db_url), "webhook": webhook or WebhookClient(timeout_s=5)},
        raise_on_error=False,
    )


def _row(engine: sa.Engine, execution_id: int) -> sa.RowMapping:
    with engine.connect() as conn:
        row = get_execution(conn, execution_id)
    assert row is not None
    return row


def test_webhook_succeeds_once_with_idempotency_key(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    execution_id = _schedule(engine, hook.url)
    [request] = _tick(db_url, instance)
    assert request.tags["marketing/execution_id"] == str(execution_id)
    assert request.run_key == f"execution:{execution_id}:1"
    result = _run(request, db_url, instance)
    assert result.success
    assert [r.headers["idempotency-key"] for r in hook.received] == [f"marketing-execution-{execution_id}-attempt-1"]
    assert hook.received[0].body == {"text": "we launched"}
    row = _row(engine, execution_id)
    assert (row["status"], row["attempts"], row["run_id"]) == ("SUCCEEDED", 1, result.run_id)
    assert row["lease_owner"] is None and row["finished_at"] is not None
    assert _tick(db_url, instance) == []


def test_http_500_reschedules_with_backoff_then_fails_at_max_attempts(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MARKETING_RETRY_BACKOFF_SECONDS", "600")
    hook.status = 500
    execution_id = _schedule(engine, hook.url, max_attempts=2)
    [request] = _tick(db_url, instance)
    assert not _run(request, db_url, instance).success
    row = _row(engine, execution_id)
    assert row["status"] == "SCHEDULED" and row["attempts"] == 1
    assert "HTTP 500" in row["last_error"]
    assert row["due_at"] > datetime.now(UTC) + timedelta(seconds=500)
    assert _tick(db_url, instance) == []  # backing off: not due yet
    with engine.begin() as conn:
        conn.execute(sa.update(t).values(due_at=datetime.now(UTC) - timedelta(seconds=1)))
    [retry] = _tick(db_url, instance)
    assert retry.run_key == f"execution:{execution_id}:2"
    assert not _run(retry, db_url, instance).success
    assert _row(engine, execution_id)["status"] == "FAILED"
    assert [r.headers["idempotency-key"] for r in hook.received] == [
        f"marketing-execution-{execution_id}-attempt-1",
        f"marketing-execution-{execution_id}-attempt-2",
    ]


def test_run_that_lost_its_lease_mid_action_cannot_complete(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    execution_id = _schedule(engine, hook.url)

    def steal(_: object) -> None:
        # While the POST is in flight the lease expires and another attempt takes the row.
        with engine.begin() as conn:
            conn.execute(sa.update(t).where(t.c.id == execution_id).values(lease_owner="claim:other", attempts=2))

    hook.on_request = steal
    [request] = _tick(db_url, instance)
    result = _run(request, db_url, instance)
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error
    assert failure is not None and "lost its lease" in failure.message
    row = _row(engine, execution_id)
    assert (row["status"], row["lease_owner"]) == ("RUNNING", "claim:other")


def test_run_started_after_its_claim_was_reclaimed_does_nothing(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    execution_id = _schedule(engine, hook.url)
    [stale] = _tick(db_url, instance)
    with engine.begin() as conn:  # the claim's lease runs out before its run starts
        conn.execute(sa.update(t).values(lease_expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    [fresh] = _tick(db_url, instance)
    assert fresh.run_key == f"execution:{execution_id}:2"
    stale_result = _run(stale, db_url, instance)
    assert stale_result.success and stale_result.output_for_node("run_marketing_execution")["outcome"] == "skipped"
    assert hook.received == []
    assert _run(fresh, db_url, instance).success
    assert len(hook.received) == 1 and _row(engine, execution_id)["status"] == "SUCCEEDED"


def test_reexecution_of_a_succeeded_execution_does_nothing(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    _schedule(engine, hook.url)
    [request] = _tick(db_url, instance)
    assert _run(request, db_url, instance).success
    again = _run(request, db_url, instance)  # what "Re-execute" in the UI does: same config
    assert again.success
    assert again.output_for_node("run_marketing_execution")["outcome"] == "skipped"
    assert len(hook.received) == 1
    logs = [e.message for e in instance.all_logs(again.run_id) if e.message]
    assert any("is SUCCEEDED" in m and "does nothing" in m for m in logs)


class ExplodingWebhook(WebhookClient):
    def post(self, url, body, headers):  # type: ignore[no-untyped-def]
        raise RuntimeError("bug in the action")


def test_run_failure_sensor_reschedules_a_run_that_crashed_before_recording(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    execution_id = _schedule(engine, hook.url)
    [request] = _tick(db_url, instance)
    result = _run(request, db_url, instance, webhook=ExplodingWebhook())
    assert not result.success
    assert _row(engine, execution_id)["status"] == "RUNNING"  # the crash recorded nothing
    context = dg.build_run_status_sensor_context(
        sensor_name="work_run_failure_sensor",
        dagster_instance=instance,
        dagster_run=result.dagster_run,
        dagster_event=result.get_run_failure_event(),
        resources={"app_db": AppDatabase(url=db_url)},
    ).for_run_failure()
    work_run_failure_sensor(context)
    row = _row(engine, execution_id)
    assert row["status"] == "SCHEDULED" and row["lease_owner"] is None
    assert result.run_id in row["last_error"]
    work_run_failure_sensor(context)  # a repeated event changes nothing: the row is not held any more
    assert _row(engine, execution_id)["status"] == "SCHEDULED"
