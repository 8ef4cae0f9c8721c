"""marketing_execution_job end to end on a real Dagster instance and a real HTTP server.

Runs are batches: each test launches what ``due_executions_sensor`` requested, and checks every
execution of the batch on its own (its row, its attempt history, the POSTs its receiver got).
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines import run_tags
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import marketing_execution as t
from marketing_pipelines.egress import EgressPolicy, parse_networks
from marketing_pipelines.executions.jobs import marketing_execution_job
from marketing_pipelines.executions.queue import get_execution, list_attempts, schedule_execution
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.executions.sensors import (
    execution_run_canceled_sensor,
    execution_run_failure_sensor,
    executions_of_run,
)
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.leasing.claims import UNLAUNCHED_CLAIM_SECONDS
from marketing_pipelines_tests.built import due_executions_sensor
from marketing_pipelines_tests.executions.runs import LOCAL, outcomes, perform, sensor_requests
from marketing_pipelines_tests.factories import add_campaign, bulk_due_executions
from marketing_pipelines_tests.webserver import Received, Recorder, webhook_server


def _schedule(engine: sa.Engine, url: str, max_attempts: int = 3, n: int = 1) -> list[int]:
    add_campaign(engine)
    with engine.begin() as conn:
        return [
            schedule_execution(
                conn,
                campaign_id="spring-launch",
                stage="launch",
                action="webhook",
                due_at=datetime.now(UTC) - timedelta(seconds=n - i),
                payload={"url": f"{url}/{i}", "body": {"text": "we launched", "n": i}},
                max_attempts=max_attempts,
                egress=EgressPolicy(parse_networks(LOCAL)),
            )
            for i in range(n)
        ]


def _tick(db_url: str, instance: dg.DagsterInstance, settings: ExecutionSettings | None = None) -> list[dg.RunRequest]:
    return sensor_requests(due_executions_sensor, db_url, instance, settings)


def _run_of(
    instance: dg.DagsterInstance, request: dg.RunRequest, status: dg.DagsterRunStatus | None = None
) -> dg.DagsterRun:
    """The run Dagster would create for ``request`` (NOT_STARTED unless ``status`` says otherwise)."""
    return instance.create_run_for_job(
        job_def=marketing_execution_job,
        run_config=request.run_config,
        tags=request.tags,
        **({"status": status} if status is not None else {}),
    )


BACKING_OFF = ExecutionSettings(retry_backoff_seconds=600)


def _row(engine: sa.Engine, execution_id: int) -> sa.RowMapping:
    with engine.connect() as conn:
        row = get_execution(conn, execution_id)
    assert row is not None
    return row


def _keys(hook: Recorder) -> list[str]:
    return [r.headers["idempotency-key"] for r in hook.received]


def test_webhook_succeeds_once_with_idempotency_key(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    [execution_id] = _schedule(engine, hook.url)
    [request] = _tick(db_url, instance)
    assert executions_of_run(request.run_config) == [execution_id]
    assert request.tags["marketing/campaign_id"] == "spring-launch"
    result = perform(request, db_url, instance)
    assert result.success
    assert outcomes(result) == {execution_id: "SUCCEEDED"}
    assert _keys(hook) == [f"marketing-execution-{execution_id}"]
    assert hook.received[0].headers["marketing-attempt"] == "1"
    assert hook.received[0].body == {"text": "we launched", "n": 0}
    row = _row(engine, execution_id)
    assert (row["status"], row["attempts"], row["run_id"]) == ("SUCCEEDED", 1, result.run_id)
    assert row["lease_owner"] is None and row["finished_at"] is not None
    with engine.connect() as conn:
        [attempt] = list_attempts(conn, execution_id)
    assert (attempt["attempt"], attempt["run_id"], attempt["outcome"]) == (1, result.run_id, "SUCCEEDED")
    assert _tick(db_url, instance) == []


def test_sensor_groups_a_tick_into_runs_of_executions_per_run(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    ids = _schedule(engine, hook.url, n=10)
    requests = _tick(db_url, instance, ExecutionSettings(executions_per_run=4))
    # Due order is kept: the longest-waiting executions go first, in runs of at most 4.
    assert [executions_of_run(r.run_config) for r in requests] == [ids[0:4], ids[4:8], ids[8:10]]
    assert [r.tags["marketing/executions"] for r in requests] == ["4", "4", "2"]
    assert len({r.run_key for r in requests}) == 3
    assert all(r.tags["marketing/campaigns"] == "spring-launch" for r in requests)
    results = [perform(r, db_url, instance) for r in requests]
    assert all(r.success for r in results)
    assert Counter(r.headers["idempotency-key"] for r in hook.received) == {f"marketing-execution-{i}": 1 for i in ids}
    assert {_row(engine, i)["run_id"] for i in ids} == {r.run_id for r in results}
    # An execution's run is found through its attempt history, not a run tag per execution.
    with engine.connect() as conn:
        assert [a["run_id"] for a in list_attempts(conn, ids[5])] == [results[1].run_id]


def test_a_tick_claims_only_what_tops_up_the_claims_still_waiting_for_runs(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    """Runs waiting in Dagster's queue hold their claims: the next tick claims only the difference to
    batch_size, so a backlog never outgrows the leases that must cover its wait."""
    ids = _schedule(engine, hook.url, n=7)
    settings = ExecutionSettings(batch_size=3, executions_per_run=2)
    first = _tick(db_url, instance, settings)
    assert [executions_of_run(r.run_config) for r in first] == [ids[0:2], ids[2:3]]
    # Three claimed rows wait for their runs; the tick says so rather than "Nothing due".
    context = dg.build_sensor_context(
        instance=instance, resources={"app_db": AppDatabase(url=db_url), "execution_settings": settings}
    )
    skipped = due_executions_sensor(context)
    assert isinstance(skipped, dg.SkipReason)
    assert (skipped.skip_message or "").startswith("Nothing claimed: executions claimed earlier fill the batch (3,")
    # The room is stated as the sum that gives it.
    assert "claimed 0 into 0 run(s) (room 0 = batch size 3 minus 3 claimed and waiting for their runs)" in (
        skipped.skip_message or ""
    )
    assert perform(first[0], db_url, instance, settings=settings).success  # one run took its two over
    [second] = _tick(db_url, instance, settings)
    assert executions_of_run(second.run_config) == ids[3:5]
    assert _tick(db_url, instance, settings) == []


def test_a_run_of_the_default_size_performs_and_records_every_execution(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance
) -> None:
    """The default batch (MARKETING_EXECUTIONS_PER_RUN, 1,000) in one run, on the embedded SQLite
    default as on PostgreSQL: each statement over the batch stays within what the database takes."""
    add_campaign(engine)
    bulk_due_executions(engine, ExecutionSettings().executions_per_run + 1)
    first, second = _tick(db_url, instance)
    assert (len(executions_of_run(first.run_config)), len(executions_of_run(second.run_config))) == (1000, 1)
    result = perform(first, db_url, instance)
    assert result.success
    assert Counter(outcomes(result).values()) == {"SUCCEEDED": 1000}
    with engine.connect() as conn:
        statuses = Counter(conn.execute(sa.select(t.c.status)).scalars())
    assert statuses == {"SUCCEEDED": 1000, "RUNNING": 1}  # the second run's one, claimed and waiting


def test_one_failing_webhook_costs_the_others_nothing(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    ids = _schedule(engine, hook.url, n=5)
    failing = ids[2]

    def status(received: Received) -> int:
        return 500 if received.path == "/hook/2" else 200

    hook.status_for = status
    [request] = _tick(db_url, instance)
    result = perform(request, db_url, instance, settings=BACKING_OFF)
    # The run did its job: every outcome is recorded, the failure as that execution's own.
    assert result.success
    assert outcomes(result) == {i: ("RESCHEDULED" if i == failing else "SUCCEEDED") for i in ids}
    assert Counter(_keys(hook)) == {f"marketing-execution-{i}": 1 for i in ids}
    for i in ids:
        row = _row(engine, i)
        if i == failing:
            assert (row["status"], row["attempts"]) == ("SCHEDULED", 1)
            assert "HTTP 500" in row["last_error"]
            assert row["due_at"] > datetime.now(UTC) + timedelta(seconds=500)
        else:
            assert (row["status"], row["attempts"], row["last_error"]) == ("SUCCEEDED", 1, None)
    assert _tick(db_url, instance) == []  # the failing one backs off; nothing else is due
    logs = [e.message for e in instance.all_logs(result.run_id) if e.message]
    assert any(f"Execution {failing}" in m and "HTTP 500" in m for m in logs)


def test_http_500_reschedules_with_backoff_then_fails_at_max_attempts(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    hook.status = 500
    [execution_id] = _schedule(engine, hook.url, max_attempts=2)
    [request] = _tick(db_url, instance)
    assert outcomes(perform(request, db_url, instance, settings=BACKING_OFF)) == {execution_id: "RESCHEDULED"}
    row = _row(engine, execution_id)
    assert row["status"] == "SCHEDULED" and row["attempts"] == 1
    assert "HTTP 500" in row["last_error"]
    assert _tick(db_url, instance) == []  # backing off: not due yet
    with engine.begin() as conn:
        conn.execute(sa.update(t).values(due_at=datetime.now(UTC) - timedelta(seconds=1)))
    [retry] = _tick(db_url, instance)
    assert executions_of_run(retry.run_config) == [execution_id]
    assert _row(engine, execution_id)["attempts"] == 2
    assert retry.run_key != request.run_key
    assert outcomes(perform(retry, db_url, instance, settings=BACKING_OFF)) == {execution_id: "FAILED"}
    assert _row(engine, execution_id)["status"] == "FAILED"
    # One effect, two deliveries: the same key, the attempt in its own header.
    assert _keys(hook) == [f"marketing-execution-{execution_id}"] * 2
    assert [r.headers["marketing-attempt"] for r in hook.received] == ["1", "2"]
    with engine.connect() as conn:
        attempts = [(a["attempt"], a["outcome"]) for a in list_attempts(conn, execution_id)]
    assert attempts == [(1, "RESCHEDULED"), (2, "FAILED")]


def test_run_that_lost_a_lease_mid_action_cannot_complete_that_execution(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    ids = _schedule(engine, hook.url, n=3)
    stolen = ids[1]

    def steal(received: Received) -> None:
        # While this POST is in flight its lease expires and another attempt takes the row.
        if received.path == "/hook/1":
            with engine.begin() as conn:
                conn.execute(sa.update(t).where(t.c.id == stolen).values(lease_owner="claim:other", attempts=2))

    hook.on_request = steal
    [request] = _tick(db_url, instance)
    one_at_a_time = WebhookClient(timeout_s=5, allow_networks=LOCAL, concurrency=1)
    result = perform(request, db_url, instance, webhook=one_at_a_time)
    assert result.success
    assert outcomes(result) == {ids[0]: "SUCCEEDED", stolen: "LEASE_LOST", ids[2]: "SUCCEEDED"}
    row = _row(engine, stolen)
    assert (row["status"], row["lease_owner"]) == ("RUNNING", "claim:other")
    logs = [e.message for e in instance.all_logs(result.run_id) if e.message]
    assert any(f"Execution {stolen}" in m and "lost its lease" in m for m in logs)


def test_run_started_after_its_claim_was_reclaimed_does_nothing(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    [execution_id] = _schedule(engine, hook.url)
    [stale] = _tick(db_url, instance)
    with engine.begin() as conn:  # the claim's lease runs out before its run starts
        conn.execute(sa.update(t).values(lease_expires_at=datetime.now(UTC) - timedelta(seconds=1)))
    [fresh] = _tick(db_url, instance)
    assert executions_of_run(fresh.run_config) == [execution_id]
    # No run began the first claim's attempt: given back, and claimed again as the same attempt by another
    # claim, whose run request has a key of its own (Dagster skips a request whose run key it has seen).
    assert _row(engine, execution_id)["attempts"] == 1 and fresh.run_key != stale.run_key
    stale_result = perform(stale, db_url, instance)
    assert stale_result.success and outcomes(stale_result) == {execution_id: "SKIPPED"}
    assert hook.received == []
    assert perform(fresh, db_url, instance).success
    assert len(hook.received) == 1 and _row(engine, execution_id)["status"] == "SUCCEEDED"
    with engine.connect() as conn:
        attempts = [(a["attempt"], a["outcome"]) for a in list_attempts(conn, execution_id)]
    assert attempts == [(1, "SUCCEEDED")]


def test_reexecution_of_a_succeeded_batch_does_nothing(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    ids = _schedule(engine, hook.url, n=3)
    [request] = _tick(db_url, instance)
    assert perform(request, db_url, instance).success
    again = perform(request, db_url, instance)  # what "Re-execute" in the UI does: same config
    assert again.success
    assert outcomes(again) == dict.fromkeys(ids, "SKIPPED")
    assert len(hook.received) == 3
    logs = [e.message for e in instance.all_logs(again.run_id) if e.message]
    assert sum("is SUCCEEDED" in m and "does nothing" in m for m in logs) == 3


class ExplodingWebhook(WebhookClient):
    def post(self, url, body, headers):  # type: ignore[no-untyped-def]
        raise RuntimeError("bug in the action")


def test_a_bug_in_one_action_is_recorded_as_that_executions_failure(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    [execution_id] = _schedule(engine, hook.url)
    [request] = _tick(db_url, instance)
    result = perform(request, db_url, instance, webhook=ExplodingWebhook())
    assert result.success and outcomes(result) == {execution_id: "RESCHEDULED"}
    row = _row(engine, execution_id)
    assert row["status"] == "SCHEDULED" and row["lease_owner"] is None
    assert row["last_error"] == "internal error: RuntimeError: bug in the action"


class BrokenDatabase(AppDatabase):
    """The run dies before its op starts (its resource cannot be built): it records nothing."""

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        raise RuntimeError("database resource failed to start")


def _run_status_context(result: dg.ExecuteInProcessResult, instance: dg.DagsterInstance, db_url: str, name: str):
    event = result.get_run_failure_event() if not result.success else None
    return dg.build_run_status_sensor_context(
        sensor_name=name,
        dagster_instance=instance,
        dagster_run=result.dagster_run,
        dagster_event=event,
        resources={"app_db": AppDatabase(url=db_url), "execution_settings": ExecutionSettings()},
    )


def test_run_failure_sensor_reschedules_every_execution_a_dead_run_held(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    ids = _schedule(engine, hook.url, n=3)
    [request] = _tick(db_url, instance)
    # One execution of the batch already finished elsewhere (e.g. this run's first pass).
    with engine.begin() as conn:
        conn.execute(
            sa.update(t).where(t.c.id == ids[0]).values(status="SUCCEEDED", lease_owner=None, lease_expires_at=None)
        )
    result = perform(request, db_url, instance, app_db=BrokenDatabase(url=db_url))
    assert not result.success
    assert [_row(engine, i)["status"] for i in ids] == ["SUCCEEDED", "RUNNING", "RUNNING"]
    context = _run_status_context(result, instance, db_url, "execution_run_failure_sensor").for_run_failure()
    execution_run_failure_sensor(context)
    assert [_row(engine, i)["status"] for i in ids] == ["SUCCEEDED", "SCHEDULED", "SCHEDULED"]
    # The worker started and failed before taking the rows over (its resource could not start: a database
    # refusing connections, say). Nothing reached a receiver, so the attempts are given back, and the first
    # such hand-back is due again at once; a run that keeps failing so delays the row more each time.
    for i in ids[1:]:
        row = _row(engine, i)
        assert f"run {result.run_id} ended before it took this execution over" in row["last_error"]
        assert row["last_error"].endswith("; not an attempt") and row["due_at"] <= datetime.now(UTC)
        assert (row["attempts"], row["lost_attempts"], row["unstarted_runs"], row["handed_back"]) == (0, 0, 1, 1)
    execution_run_failure_sensor(context)  # a repeated event changes nothing: the rows are not held any more
    assert [_row(engine, i)["status"] for i in ids] == ["SUCCEEDED", "SCHEDULED", "SCHEDULED"]
    assert hook.received == []


def test_claims_of_a_run_whose_worker_never_started_are_due_again_at_once(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    # A launch that could not be delivered, or a run left STARTING when its code server's machine went
    # away: Dagster fails the run before any worker started. Nothing was tried, so nothing backs off; a dead
    # replica costs a sensor tick, not a backoff (or, before this, a lease), nor any of the row's attempts.
    ids = _schedule(engine, hook.url, max_attempts=1, n=2)
    [request] = _tick(db_url, instance)
    run = _run_of(instance, request)
    instance.report_run_failed(run, "Run timed out due to taking longer than 60 seconds to start.")
    failed = instance.get_run_by_id(run.run_id)
    assert failed is not None and failed.status == dg.DagsterRunStatus.FAILURE
    [failure] = [e for e in instance.all_logs(run.run_id) if e.dagster_event and e.dagster_event.is_run_failure]
    context = dg.build_run_status_sensor_context(
        sensor_name="execution_run_failure_sensor",
        dagster_instance=instance,
        dagster_run=failed,
        dagster_event=failure.dagster_event,
        resources={"app_db": AppDatabase(url=db_url), "execution_settings": ExecutionSettings()},
    ).for_run_failure()
    execution_run_failure_sensor(context)
    rows = [_row(engine, i) for i in ids]
    assert [r["status"] for r in rows] == ["SCHEDULED", "SCHEDULED"]
    assert all(r["due_at"] <= datetime.now(UTC) for r in rows)
    assert all(
        r["last_error"]
        == f"run {run.run_id} never started (Run timed out due to taking longer than 60 seconds to start.); "
        "not an attempt"
        for r in rows
    )
    # The attempt was given back, not lost nor spent: each row's only attempt (max_attempts 1) is still to come.
    # A launch that always fails delays the row more at each hand-back (UNSTARTED_DELAYS_SECONDS).
    assert [(r["attempts"], r["lost_attempts"], r["max_attempts"], r["handed_back"]) for r in rows] == [
        (0, 0, 1, 1)
    ] * 2
    # ... and the next tick claims them again, and that run delivers each once.
    [again] = _tick(db_url, instance)
    assert sorted(executions_of_run(again.run_config)) == sorted(ids)
    assert perform(again, db_url, instance).success
    assert [_row(engine, i)["status"] for i in ids] == ["SUCCEEDED", "SUCCEEDED"]
    assert len(hook.received) == 2


def test_canceled_run_cancels_the_executions_it_held(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    ids = _schedule(engine, hook.url, n=2)
    [request] = _tick(db_url, instance)
    run = _run_of(instance, request)
    instance.report_run_canceled(run)
    canceled = instance.get_run_by_id(run.run_id)
    assert canceled is not None and canceled.status == dg.DagsterRunStatus.CANCELED
    context = dg.build_run_status_sensor_context(
        sensor_name="execution_run_canceled_sensor",
        dagster_instance=instance,
        dagster_run=canceled,
        dagster_event=instance.all_logs(run.run_id)[-1].dagster_event,
        resources={"app_db": AppDatabase(url=db_url)},
    )
    execution_run_canceled_sensor(context)
    assert [_row(engine, i)["status"] for i in ids] == ["CANCELLED", "CANCELLED"]


def test_a_run_whose_worker_stopped_renewing_its_leases_is_failed_not_left_started(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    # A run worker that vanished with its machine: Dagster shows its run STARTED, and with the default run
    # launcher nothing in Dagster would ever end it. Its leases run out; the next claiming tick requeues the
    # work and marks the run FAILURE, where the Runs page and run-failure alerts see it.
    ids = _schedule(engine, hook.url, n=2)
    [request] = _tick(db_url, instance)
    run = _run_of(instance, request, dg.DagsterRunStatus.STARTED)
    alive = instance.create_run_for_job(
        job_def=marketing_execution_job, run_config=request.run_config, status=dg.DagsterRunStatus.STARTED
    )
    past = datetime.now(UTC) - timedelta(seconds=1)
    with engine.begin() as conn:  # what the worker's take-over wrote, and then its lease ran out
        conn.execute(
            sa.update(t)
            .where(t.c.id.in_(ids))
            .values(lease_owner=f"run:{run.run_id}", run_id=run.run_id, lease_expires_at=past)
        )
    assert _tick(db_url, instance) != []  # the requeued work is claimed again at once
    failed = instance.get_run_by_id(run.run_id)
    assert failed is not None and failed.status == dg.DagsterRunStatus.FAILURE
    [failure] = [
        e
        for e in instance.all_logs(run.run_id)
        if e.dagster_event and e.dagster_event.event_type_value == "PIPELINE_FAILURE"
    ]
    assert "stopped renewing the leases of the executions it held" in (failure.message or "")
    # A run holding no expired lease is left alone, and a second tick changes nothing.
    assert instance.get_run_by_id(alive.run_id).status == dg.DagsterRunStatus.STARTED  # type: ignore[union-attr]
    _tick(db_url, instance)
    assert (
        sum(
            1
            for e in instance.all_logs(run.run_id)
            if e.dagster_event and e.dagster_event.event_type_value == "PIPELINE_FAILURE"
        )
        == 1
    )


def _age_claim(engine: sa.Engine, ids: list[int], seconds: float) -> None:
    """As if the tick that claimed ``ids`` committed ``seconds`` ago."""
    with engine.begin() as conn:
        conn.execute(
            sa.update(t).where(t.c.id.in_(ids)).values(updated_at=datetime.now(UTC) - timedelta(seconds=seconds))
        )


def test_a_claim_no_run_was_created_for_is_claimed_again_without_waiting_out_its_lease(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    # The daemon (or the replica evaluating the tick) died after the claim committed and before Dagster
    # created the tick's runs: no run will ever take these rows over. They used to wait out the whole lease
    # (300 s); now the first tick past UNLAUNCHED_CLAIM_SECONDS hands them to a new run.
    ids = _schedule(engine, hook.url, n=2)
    [lost] = _tick(db_url, instance)  # its run is never created
    _age_claim(engine, ids, UNLAUNCHED_CLAIM_SECONDS - 5)
    assert _tick(db_url, instance) == []  # not yet: a slow daemon may still be creating it
    _age_claim(engine, ids, UNLAUNCHED_CLAIM_SECONDS + 5)
    [again] = _tick(db_url, instance)
    assert sorted(executions_of_run(again.run_config)) == sorted(ids)
    assert again.tags[run_tags.CLAIMED_BY] != lost.tags[run_tags.CLAIMED_BY]
    rows = [_row(engine, i) for i in ids]
    assert [(r["status"], r["attempts"], r["lease_owner"]) for r in rows] == [
        ("RUNNING", 1, again.tags[run_tags.CLAIMED_BY])  # the unlaunched claim gave its attempt back
    ] * 2
    # Had its run been created after all, it would find the rows owned by another claim and do nothing.
    perform(lost, db_url, instance)
    assert hook.received == []
    assert {_row(engine, i)["lease_owner"] for i in ids} == {again.tags[run_tags.CLAIMED_BY]}


def test_a_claim_whose_run_waits_in_dagsters_queue_is_left_alone(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    ids = _schedule(engine, hook.url, n=2)
    [request] = _tick(db_url, instance)
    # Created and not started, as a run waiting behind max_concurrent_runs is (Dagster creates a QUEUED
    # run only with its code location's origin, which a test instance has not).
    waiting = _run_of(instance, request)
    _age_claim(engine, ids, UNLAUNCHED_CLAIM_SECONDS * 2)  # waiting for minutes
    assert _tick(db_url, instance) == []
    assert {_row(engine, i)["lease_owner"] for i in ids} == {request.tags[run_tags.CLAIMED_BY]}
    assert instance.get_run_by_id(waiting.run_id).status == dg.DagsterRunStatus.NOT_STARTED  # type: ignore[union-attr]


def test_a_claim_whose_run_waits_longer_than_its_lease_keeps_its_rows(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    # Found by benchmarks/soak.py --overload (two stacks, load 30): runs waited in Dagster's queue longer than
    # their claims' leases. Each expiry handed the rows to another claim and another run, which waited as
    # long; the first started to find nothing to do, and after 10 minutes 146 of 150 executions were still
    # SCHEDULED. A claim whose run waits keeps its rows, its lease running from each tick.
    ids = _schedule(engine, hook.url, n=2)
    [request] = _tick(db_url, instance)
    _run_of(instance, request)  # NOT_STARTED, as a run waiting behind max_concurrent_runs is
    _age_claim(engine, ids, UNLAUNCHED_CLAIM_SECONDS * 2)
    with engine.begin() as conn:  # and the lease ran out while it waited
        conn.execute(sa.update(t).where(t.c.id.in_(ids)).values(lease_expires_at=datetime.now(UTC) - timedelta(1)))
    assert _tick(db_url, instance) == []
    rows = [_row(engine, i) for i in ids]
    assert {r["lease_owner"] for r in rows} == {request.tags[run_tags.CLAIMED_BY]}
    assert all(r["lease_expires_at"] > datetime.now(UTC) + timedelta(seconds=60) for r in rows)
    assert all(r["attempts"] == 1 for r in rows)
    # When its run starts, it takes them over and sends each once.
    assert perform(request, db_url, instance).success
    assert sorted(received.path for received in hook.received) == sorted(f"/hook/{i}" for i in range(2))


def test_a_run_that_died_before_taking_its_claim_over_is_failed_not_left_started(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    # Found by benchmarks/soak.py: a run worker SIGKILLed after its run started and before its op took
    # the rows over. The rows, still owned by the tick's claim, came back when that lease ran out, but
    # the run showed STARTED for ever: nothing pointed from the rows to it.
    ids = _schedule(engine, hook.url, n=2)
    [request] = _tick(db_url, instance)
    run = _run_of(instance, request, dg.DagsterRunStatus.STARTED)
    with engine.begin() as conn:  # the claim's lease ran out; no take-over ever happened
        conn.execute(sa.update(t).where(t.c.id.in_(ids)).values(lease_expires_at=datetime.now(UTC) - timedelta(1)))
    [again] = _tick(db_url, instance)
    assert sorted(executions_of_run(again.run_config)) == sorted(ids)
    failed = instance.get_run_by_id(run.run_id)
    assert failed is not None and failed.status == dg.DagsterRunStatus.FAILURE
    # A run of an expired claim that has not started (waiting in Dagster's queue) is left to start and find
    # its rows taken: it is not dead.
    waiting = _run_of(instance, again)
    with engine.begin() as conn:
        conn.execute(sa.update(t).where(t.c.id.in_(ids)).values(lease_expires_at=datetime.now(UTC) - timedelta(1)))
    _tick(db_url, instance)
    assert instance.get_run_by_id(waiting.run_id).status == dg.DagsterRunStatus.NOT_STARTED  # type: ignore[union-attr]


def test_a_live_run_of_the_same_claim_is_left_alone_when_its_sibling_died_before_its_take_over(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    # One tick claims rows for several runs under one claim. Run A took its row over and renews it; run B
    # died before its take-over. Only B is dead: failing A would hand its row to another run while A still
    # works on it.
    ids = _schedule(engine, hook.url, n=2)
    first, second = _tick(db_url, instance, ExecutionSettings(executions_per_run=1))
    assert first.tags[run_tags.CLAIMED_BY] == second.tags[run_tags.CLAIMED_BY]
    alive, dead = (_run_of(instance, r, dg.DagsterRunStatus.STARTED) for r in (first, second))
    [alive_row] = executions_of_run(first.run_config)
    [dead_row] = executions_of_run(second.run_config)
    with engine.begin() as conn:  # A took its row over (and renews it); B's row still names the claim
        conn.execute(
            sa.update(t)
            .where(t.c.id == alive_row)
            .values(
                lease_owner=f"run:{alive.run_id}",
                run_id=alive.run_id,
                lease_expires_at=datetime.now(UTC) + timedelta(300),
            )
        )
        conn.execute(sa.update(t).where(t.c.id == dead_row).values(lease_expires_at=datetime.now(UTC) - timedelta(1)))
    [again] = _tick(db_url, instance)
    assert executions_of_run(again.run_config) == [dead_row]
    assert instance.get_run_by_id(dead.run_id).status == dg.DagsterRunStatus.FAILURE  # type: ignore[union-attr]
    assert instance.get_run_by_id(alive.run_id).status == dg.DagsterRunStatus.STARTED  # type: ignore[union-attr]
    assert _row(engine, alive_row)["lease_owner"] == f"run:{alive.run_id}"
    assert sorted(ids) == sorted([alive_row, dead_row])


def test_unlaunched_and_launched_claims_looked_up_together(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    # Two ticks' claims past UNLAUNCHED_CLAIM_SECONDS in one lookup: only the one without a run is recovered.
    [first_id] = _schedule(engine, hook.url, n=1)
    [launched] = _tick(db_url, instance)
    _run_of(instance, launched)
    with engine.begin() as conn:
        second_id = schedule_execution(
            conn,
            campaign_id="spring-launch",
            stage="launch",
            action="webhook",
            due_at=datetime.now(UTC) - timedelta(seconds=1),
            payload={"url": f"{hook.url}/second", "body": {}},
            egress=EgressPolicy(parse_networks(LOCAL)),
        )
    [lost] = _tick(db_url, instance)
    assert executions_of_run(lost.run_config) == [second_id]
    _age_claim(engine, [first_id, second_id], UNLAUNCHED_CLAIM_SECONDS + 5)
    [again] = _tick(db_url, instance)
    assert executions_of_run(again.run_config) == [second_id]
    assert _row(engine, first_id)["lease_owner"] == launched.tags[run_tags.CLAIMED_BY]


def test_a_receivers_nul_byte_is_stored_visibly_and_costs_the_others_nothing(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    # PostgreSQL text cannot hold U+0000: quoted bare in last_error, it made the whole record fail.
    ids = _schedule(engine, hook.url, n=3)
    hook.status_for = lambda received: 500 if received.path == "/hook/1" else 200
    hook.body = b"bad\x00byte"
    [request] = _tick(db_url, instance)
    result = perform(request, db_url, instance, settings=BACKING_OFF)
    assert result.success
    assert outcomes(result) == {i: ("RESCHEDULED" if i == ids[1] else "SUCCEEDED") for i in ids}
    error = _row(engine, ids[1])["last_error"]
    assert "\x00" not in error and "bad\\x00byte" in error
    with engine.connect() as conn:
        assert [(a["outcome"], a["error"]) for a in list_attempts(conn, ids[1])] == [("RESCHEDULED", error)]


def test_a_batchs_webhooks_share_connections_to_one_receiver(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance
) -> None:
    # One event loop and connection pool for the run's batch: 120 POSTs to a receiver that keeps
    # connections open arrive over at most as many connections as are in flight at once
    # (MARKETING_WEBHOOK_CONCURRENCY, 32), where a new client per webhook opened one connection each.
    with webhook_server(keep_alive=True) as receiver:
        # Answers take a moment, so the run has all its requests in flight at once, wave after wave.
        receiver.on_request = lambda _: time.sleep(0.05)
        ids = _schedule(engine, receiver.url, n=120)
        [request] = _tick(db_url, instance)
        result = perform(request, db_url, instance)
        assert result.success and set(outcomes(result).values()) == {"SUCCEEDED"}
        assert Counter(_keys(receiver)) == {f"marketing-execution-{i}": 1 for i in ids}
        connections = {r.peer for r in receiver.received}
        assert len(connections) <= WebhookClient(timeout_s=5).concurrency < len(ids)
