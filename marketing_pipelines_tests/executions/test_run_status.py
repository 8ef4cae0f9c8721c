"""A batch run's Dagster status tells the truth: green only when every execution in it ended well.

The run's status is what the Runs page's "Failed" filter, run-failure sensors and alerts read, so
an execution that FAILED for good must fail its run, after every outcome of the batch is recorded,
and the run-failure reconciliation that follows must change none of those outcomes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import marketing_execution as t
from marketing_pipelines.db.schema import marketing_execution_attempt as attempts_table
from marketing_pipelines.egress import EgressPolicy, parse_networks
from marketing_pipelines.executions.queue import schedule_execution
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.executions.sensors import execution_run_failure_sensor
from marketing_pipelines_tests.built import due_executions_sensor
from marketing_pipelines_tests.executions.runs import LOCAL, outcome_metadata, outcomes, perform, sensor_requests
from marketing_pipelines_tests.factories import add_campaign
from marketing_pipelines_tests.webserver import Recorder, webhook_server

SECRET = "s3cr3t-token"
BACKING_OFF = ExecutionSettings(retry_backoff_seconds=600)


@pytest.fixture
def hook() -> Iterator[Recorder]:
    with webhook_server() as recorder:
        # Path /hook/0 answers 500; every other path 200.
        recorder.status_for = lambda received: 500 if received.path.startswith("/hook/0") else 200
        yield recorder


def _schedule(engine: sa.Engine, url: str, n: int, max_attempts: int = 1) -> list[int]:
    add_campaign(engine)
    with engine.begin() as conn:
        return [
            schedule_execution(
                conn,
                campaign_id="spring-launch",
                stage="launch",
                action="webhook",
                due_at=datetime.now(UTC) - timedelta(seconds=n - i),
                # A token in the query string: the failure message must not show it.
                payload={"url": f"{url}/{i}?token={SECRET}", "body": {"n": i}},
                max_attempts=max_attempts,
                egress=EgressPolicy(parse_networks(LOCAL)),
            )
            for i in range(n)
        ]


def _tick(db_url: str, instance: dg.DagsterInstance) -> list[dg.RunRequest]:
    return sensor_requests(due_executions_sensor, db_url, instance)


def _snapshot(engine: sa.Engine) -> tuple[list[dict], list[dict]]:
    with engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(sa.select(t).order_by(t.c.id)).mappings()]
        attempts = [
            dict(r)
            for r in conn.execute(
                sa.select(attempts_table).order_by(attempts_table.c.execution_id, attempts_table.c.attempt)
            ).mappings()
        ]
    return rows, attempts


def _messages(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [e.message for e in instance.all_logs(run_id) if e.message]


def test_a_batch_with_a_failed_execution_fails_its_run_and_the_reconciliation_changes_nothing(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    ids = _schedule(engine, hook.url, n=6)
    failing = ids[0]
    [request] = _tick(db_url, instance)
    result = perform(request, db_url, instance)

    # The run is a failure where Dagster shows it: its status, so the Runs page's "Failed" filter.
    assert not result.success
    run = instance.get_run_by_id(result.run_id)
    assert run is not None and run.status == dg.DagsterRunStatus.FAILURE
    failed_runs = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
    assert [r.run_id for r in failed_runs] == [result.run_id]
    # ... after every outcome was recorded: 5 SUCCEEDED, 1 FAILED, each effect once.
    assert outcomes(result) == {i: ("FAILED" if i == failing else "SUCCEEDED") for i in ids}
    assert outcome_metadata(result)["failed"] == dg.MetadataValue.int(1)
    assert Counter(r.headers["idempotency-key"] for r in hook.received) == {f"marketing-execution-{i}": 1 for i in ids}
    # The failure message names the failed execution, its campaign and why, with the URL redacted.
    [step_failure] = [e for e in result.all_node_events if e.event_type_value == "STEP_FAILURE"]
    message = step_failure.step_failure_data.user_failure_data.description
    assert f"{failing} (spring-launch/launch, webhook, attempt 1)" in message
    assert "HTTP 500" in message and "1 of 6 execution(s) FAILED" in message
    assert SECRET not in message
    run_failure = result.get_run_failure_event()
    assert SECRET not in str(run_failure.job_failure_data.error)
    assert str(failing) in str(run_failure.job_failure_data.error)

    # The run-failure sensor then reconciles the failed run: fenced, it touches no finished row.
    before = _snapshot(engine)
    context = dg.build_run_status_sensor_context(
        sensor_name="execution_run_failure_sensor",
        dagster_instance=instance,
        dagster_run=run,
        dagster_event=run_failure,
        resources={"app_db": AppDatabase(url=db_url), "execution_settings": ExecutionSettings()},
    ).for_run_failure()
    execution_run_failure_sensor(context)
    assert _snapshot(engine) == before
    with engine.connect() as conn:
        statuses = dict(conn.execute(sa.select(t.c.id, t.c.status)).all())
    assert statuses == {i: ("FAILED" if i == failing else "SUCCEEDED") for i in ids}
    assert len(hook.received) == 6
    assert _tick(db_url, instance) == []


def test_the_failure_message_writes_a_receivers_control_characters_visibly(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    # A hostile receiver answers with a terminal clipboard write (OSC 52) and a right-to-left override.
    hook.body = "\x1b]52;c;aGk=\x07 \u202egnp.exe".encode()
    [execution_id] = _schedule(engine, hook.url, n=1)
    [request] = _tick(db_url, instance)
    result = perform(request, db_url, instance)
    assert not result.success
    [step_failure] = [e for e in result.all_node_events if e.event_type_value == "STEP_FAILURE"]
    message = step_failure.step_failure_data.user_failure_data.description
    assert f"{execution_id} (spring-launch/launch" in message
    assert "\\x1b]52;c;aGk=\\x07 \\u202egnp.exe" in message
    assert not any(c in message for c in "\x1b\x07\u202e")
    [row] = outcome_metadata(result)["executions"].records
    assert "\\x1b]52" in row.data["detail"] and "\x1b" not in row.data["detail"]


def test_a_refused_action_fails_its_run(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    [execution_id] = _schedule(engine, hook.url, n=1, max_attempts=3)
    [request] = _tick(db_url, instance)
    # Loopback was allowed when it was scheduled, not where the run executes: refused, not retried.
    from marketing_pipelines.executions.webhook import WebhookClient

    result = perform(request, db_url, instance, webhook=WebhookClient(timeout_s=5, allow_networks=[]))
    assert not result.success
    assert outcomes(result) == {execution_id: "FAILED"}
    assert hook.received == []


def test_a_run_whose_executions_were_only_rescheduled_succeeds_with_a_warning(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    ids = _schedule(engine, hook.url, n=3, max_attempts=3)
    [request] = _tick(db_url, instance)
    result = perform(request, db_url, instance, settings=BACKING_OFF)
    assert result.success
    assert outcomes(result) == {ids[0]: "RESCHEDULED", ids[1]: "SUCCEEDED", ids[2]: "SUCCEEDED"}
    assert outcome_metadata(result)["rescheduled"] == dg.MetadataValue.int(1)
    warnings = [
        e.message
        for e in instance.all_logs(result.run_id)
        if e.level == "WARNING" or (e.dagster_event is None and e.level == 30)
    ]
    assert any("1 execution(s) failed an attempt and are rescheduled" in m for m in warnings)


def test_reexecution_of_a_failed_run_does_nothing_and_says_so(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    ids = _schedule(engine, hook.url, n=2)
    [request] = _tick(db_url, instance)
    assert not perform(request, db_url, instance).success
    before = _snapshot(engine)
    again = perform(request, db_url, instance)  # "Re-execute" in the UI: the same config and tags
    assert again.success
    assert outcomes(again) == dict.fromkeys(ids, "SKIPPED")
    assert _snapshot(engine) == before
    assert len(hook.received) == 2
    messages = _messages(instance, again.run_id)
    assert sum("does nothing" in m for m in messages) == 2
    assert any("owns none of its 2 execution(s)" in m and "executions retry" in m for m in messages)


def test_runs_carry_a_fixed_set_of_tag_keys_however_many_executions_they_hold(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance
) -> None:
    with webhook_server() as ok:
        ids = _schedule(engine, ok.url, n=7, max_attempts=3)
        requests = sensor_requests(due_executions_sensor, db_url, instance, ExecutionSettings(executions_per_run=3))
        assert len(requests) == 3
        for request in requests:
            assert perform(request, db_url, instance).success
    keys = {k for k in instance.get_run_tag_keys() if k.startswith("marketing/")}
    fixed = {
        "marketing/kind",
        "marketing/executions",
        "marketing/campaigns",
        "marketing/campaign_id",
        "marketing/claimed_by",
    }
    assert keys == fixed
    assert not any(str(i) in k for k in instance.get_run_tag_keys() for i in ids)
