"""``due_work_sensor`` (claims due work, launches runs) and the run-status sensors that reconcile.

The sensor's database work lives in small functions (``claim_execution_requests``,
``reconcile_execution_run``) that tests call on their own; the sensor only wires them up.
"""

import os
import socket
import uuid

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines.db.engine import DatabaseUnavailable
from marketing_pipelines.db.lease import CANCELLED, claim_batch, finish, recover_expired, retry_or_fail
from marketing_pipelines.db.migrate import SchemaNotReady
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.executions.jobs import OP_NAME, marketing_execution_job, retry_delay_seconds, run_owner
from marketing_pipelines.executions.queue import EXECUTIONS
from marketing_pipelines.settings import Settings

TAG_EXECUTION_ID = "marketing/execution_id"
TAG_CAMPAIGN_ID = "marketing/campaign_id"
TAG_STAGE = "marketing/stage"
TAG_ACTION = "marketing/action"
TAG_CLAIMED_BY = "marketing/claimed_by"
TAG_ATTEMPT = "marketing/attempt"


def new_claim_owner() -> str:
    """A lease owner unique to one sensor tick on one replica (host, pid, random suffix)."""
    return f"claim:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def execution_run_request(row: sa.RowMapping, claimed_by: str) -> dg.RunRequest:
    return dg.RunRequest(
        # Run keys are deduplicated forever, so the attempt is part of the key: a retry gets a
        # new run, while a repeated tick for the same claim cannot launch a second one.
        run_key=f"execution:{row['id']}:{row['attempts']}",
        job_name=marketing_execution_job.name,
        run_config={"ops": {OP_NAME: {"config": {"execution_id": row["id"], "claimed_by": claimed_by}}}},
        tags={
            TAG_EXECUTION_ID: str(row["id"]),
            TAG_CAMPAIGN_ID: row["campaign_id"],
            TAG_STAGE: row["stage"],
            TAG_ACTION: row["action"],
            TAG_ATTEMPT: str(row["attempts"]),
            TAG_CLAIMED_BY: claimed_by,
        },
    )


def claim_execution_requests(
    engine: sa.Engine, claimed_by: str, batch_size: int, lease_seconds: float
) -> tuple[list[dg.RunRequest], str]:
    """Recover expired execution leases, claim a batch; returns run requests and a summary line."""
    with engine.begin() as conn:
        recovery = recover_expired(conn, EXECUTIONS)
    with engine.begin() as conn:
        rows = claim_batch(conn, EXECUTIONS, claimed_by, batch_size, lease_seconds)
    summary = f"executions: claimed {len(rows)}"
    if recovery.requeued or recovery.failed:
        summary += f", expired leases requeued {list(recovery.requeued)} failed {list(recovery.failed)}"
    return [execution_run_request(row, claimed_by) for row in rows], summary


_settings = Settings.from_env()


@dg.sensor(
    name="due_work_sensor",
    jobs=[marketing_execution_job],
    minimum_interval_seconds=_settings.sensor_interval_seconds,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Recovers expired leases, claims due executions in the database (FOR UPDATE SKIP LOCKED on "
        "PostgreSQL) and launches one run per claimed row. Safe to evaluate on many replicas at once."
    ),
)
def due_work_sensor(context: dg.SensorEvaluationContext, app_db: AppDatabase) -> dg.SensorResult | dg.SkipReason:
    settings = Settings.from_env()
    try:
        engine = app_db.ready_engine()
    except (SchemaNotReady, DatabaseUnavailable) as exc:
        return dg.SkipReason(str(exc))
    claimed_by = new_claim_owner()
    requests, summary = claim_execution_requests(
        engine, claimed_by, settings.sensor_batch_size, settings.execution_lease_seconds
    )
    if not requests:
        return dg.SkipReason(f"Nothing due ({summary}).")
    context.log.info(summary)
    return dg.SensorResult(run_requests=requests)


def reconcile_execution_run(engine: sa.Engine, run: dg.DagsterRun, outcome: str, reason: str) -> str | None:
    """Record the outcome of an execution whose Dagster run ended without recording one.

    Fenced by the run's own lease owner (or the sensor's claim, when the run died before
    taking it over) and by run id, so a late event about an old attempt changes nothing.
    Returns the new status, or None when there was nothing to reconcile.
    """
    execution_id = run.tags.get(TAG_EXECUTION_ID)
    if execution_id is None:
        return None
    owners = [run_owner(run.run_id), run.tags.get(TAG_CLAIMED_BY, "")]
    settings = Settings.from_env()
    with engine.begin() as conn:
        if outcome == CANCELLED:
            done = finish(conn, EXECUTIONS, int(execution_id), owners, CANCELLED, {"last_error": reason})
            return CANCELLED if done else None
        attempt = int(run.tags.get(TAG_ATTEMPT, "1"))
        return retry_or_fail(
            conn,
            EXECUTIONS,
            int(execution_id),
            owners,
            reason,
            retry_delay_seconds(settings, attempt),
            run_id=run.run_id,
        )


@dg.run_failure_sensor(
    name="work_run_failure_sensor",
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Reschedules or fails executions and agent runs whose Dagster run failed before recording it.",
)
def work_run_failure_sensor(context: dg.RunFailureSensorContext, app_db: AppDatabase) -> None:
    message = context.failure_event.message or "run failed"
    status = reconcile_execution_run(
        app_db.engine(), context.dagster_run, "FAILED", f"Dagster run {context.dagster_run.run_id} failed: {message}"
    )
    if status:
        context.log.info(f"Run {context.dagster_run.run_id}: execution now {status}.")


@dg.run_status_sensor(
    name="work_run_canceled_sensor",
    run_status=dg.DagsterRunStatus.CANCELED,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Marks executions and agent runs CANCELLED when their Dagster run was canceled.",
)
def work_run_canceled_sensor(context: dg.RunStatusSensorContext, app_db: AppDatabase) -> None:
    status = reconcile_execution_run(
        app_db.engine(), context.dagster_run, CANCELLED, f"Dagster run {context.dagster_run.run_id} was canceled"
    )
    if status:
        context.log.info(f"Run {context.dagster_run.run_id}: execution now {status}.")
