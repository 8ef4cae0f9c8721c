"""Where both work queues meet Dagster: ``due_work_sensor`` and the run-status sensors.

Each domain keeps its own half as plain functions (``executions/sensors.py``,
``agents/sensors.py``); this module only evaluates them in one tick and routes run events.
"""

import dagster as dg

from marketing_pipelines.agents.jobs import agent_run_job
from marketing_pipelines.agents.sensors import claim_agent_run_requests, ensure_pool_limit, reconcile_agent_run
from marketing_pipelines.db.engine import DatabaseUnavailable
from marketing_pipelines.db.lease import CANCELLED, new_claim_owner
from marketing_pipelines.db.migrate import SchemaNotReady
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.executions.jobs import marketing_execution_job
from marketing_pipelines.executions.sensors import claim_execution_requests, reconcile_execution_run
from marketing_pipelines.settings import Settings

_settings = Settings.from_env()


@dg.sensor(
    name="due_work_sensor",
    jobs=[marketing_execution_job, agent_run_job],
    minimum_interval_seconds=_settings.sensor_interval_seconds,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Recovers expired leases, claims due executions and queued agent runs in the database "
        "(FOR UPDATE SKIP LOCKED on PostgreSQL) and launches one run per claimed row. Safe to "
        "evaluate on many replicas at once."
    ),
)
def due_work_sensor(context: dg.SensorEvaluationContext, app_db: AppDatabase) -> dg.SensorResult | dg.SkipReason:
    settings = Settings.from_env()
    try:
        engine = app_db.ready_engine()
    except (SchemaNotReady, DatabaseUnavailable) as exc:
        return dg.SkipReason(str(exc))
    if context.instance is not None and ensure_pool_limit(context.instance, settings.max_concurrent_agent_runs):
        context.log.info(f"Set the agent_runs pool limit to {settings.max_concurrent_agent_runs}.")
    claimed_by = new_claim_owner()
    executions, execution_summary = claim_execution_requests(
        engine, claimed_by, settings.sensor_batch_size, settings.execution_lease_seconds
    )
    agent_runs, agent_summary = claim_agent_run_requests(
        engine,
        claimed_by,
        settings.sensor_batch_size,
        settings.max_concurrent_agent_runs,
        settings.agent_lease_grace_seconds,
    )
    summary = f"{execution_summary}; {agent_summary}"
    if not executions and not agent_runs:
        return dg.SkipReason(f"Nothing due ({summary}).")
    context.log.info(summary)
    return dg.SensorResult(run_requests=[*executions, *agent_runs])


def _reconcile(app_db: AppDatabase, run: dg.DagsterRun, outcome: str, reason: str) -> str | None:
    engine = app_db.engine()
    return reconcile_execution_run(engine, run, outcome, reason) or reconcile_agent_run(engine, run, outcome, reason)


@dg.run_failure_sensor(
    name="work_run_failure_sensor",
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Retries or fails executions and agent runs whose Dagster run failed before recording it.",
)
def work_run_failure_sensor(context: dg.RunFailureSensorContext, app_db: AppDatabase) -> None:
    run = context.dagster_run
    message = context.failure_event.message or "run failed"
    status = _reconcile(app_db, run, "FAILED", f"Dagster run {run.run_id} failed: {message}")
    if status:
        context.log.info(f"Run {run.run_id}: work item now {status}.")


@dg.run_status_sensor(
    name="work_run_canceled_sensor",
    run_status=dg.DagsterRunStatus.CANCELED,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Marks executions and agent runs CANCELLED when their Dagster run was canceled.",
)
def work_run_canceled_sensor(context: dg.RunStatusSensorContext, app_db: AppDatabase) -> None:
    run = context.dagster_run
    status = _reconcile(app_db, run, CANCELLED, f"Dagster run {run.run_id} was canceled")
    if status:
        context.log.info(f"Run {run.run_id}: work item now {status}.")
