"""The executions domain's sensors: claim due executions and launch batched runs; reconcile runs that died.

``due_executions_sensor`` is this domain's only claiming sensor: nothing the agent-run sensor does
(or fails to do) can leave a claimed execution without a run, and the other way round.
"""

import hashlib
from collections import Counter
from collections.abc import Mapping, Sequence

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines.db.engine import DatabaseUnavailable
from marketing_pipelines.db.lease import (
    CANCELLED,
    LEASE_EXPIRED_ERROR,
    claim_batch,
    finish,
    new_claim_owner,
    recover_expired,
    retry_or_fail,
)
from marketing_pipelines.db.migrate import SchemaNotReady
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.executions.jobs import OP_NAME, marketing_execution_job, retry_delay_seconds, run_owner
from marketing_pipelines.executions.queue import EXECUTIONS, attempt_outcome, end_attempt, end_open_attempts
from marketing_pipelines.redact import redact_urls
from marketing_pipelines.settings import Settings

# One tag per execution, `marketing/execution_id.<id>` = attempt: a run holds many executions and a
# tag key holds one value, so the id goes in the key (after a dot: Dagster allows one "/" in a key).
# Filter the runs list by that key to find the run(s) of an execution; the value tells the attempt.
TAG_EXECUTION_PREFIX = "marketing/execution_id."
# Runs of a single execution (MARKETING_EXECUTIONS_PER_RUN=1, or a lone due row) also carry the
# plain tag, as every run did before batching.
TAG_EXECUTION_ID = "marketing/execution_id"
TAG_CAMPAIGN_ID = "marketing/campaign_id"  # when every execution of the run is of one campaign
TAG_CAMPAIGNS = "marketing/campaigns"  # every campaign of the run, comma-separated
TAG_EXECUTIONS = "marketing/executions"  # how many executions the run performs
TAG_CLAIMED_BY = "marketing/claimed_by"

_settings = Settings.from_env()


def execution_tag(execution_id: int) -> str:
    return f"{TAG_EXECUTION_PREFIX}{execution_id}"


def executions_of_run(tags: Mapping[str, str]) -> dict[int, int]:
    """The executions a run was launched for, as ``{execution_id: attempt}``, from its tags."""
    found = {
        int(key[len(TAG_EXECUTION_PREFIX) :]): int(value)
        for key, value in tags.items()
        if key.startswith(TAG_EXECUTION_PREFIX) and key[len(TAG_EXECUTION_PREFIX) :].isdigit() and value.isdigit()
    }
    # Runs launched before batching carried one execution as marketing/execution_id + marketing/attempt.
    if not found and tags.get(TAG_EXECUTION_ID, "").isdigit():
        found[int(tags[TAG_EXECUTION_ID])] = int(tags.get("marketing/attempt", "1") or 1)
    return found


def batch_run_request(rows: Sequence[sa.RowMapping], claimed_by: str) -> dg.RunRequest:
    """One run for a batch of claimed rows (each with id, campaign_id, attempts)."""
    pairs = [(row["id"], row["attempts"]) for row in rows]
    # Run keys are deduplicated forever. A repeated submission of the same tick's requests must
    # not launch twice, while a later claim of the same rows (a retry: new attempts) must.
    digest = hashlib.sha1(",".join(f"{i}:{a}" for i, a in pairs).encode()).hexdigest()[:16]
    campaigns = {row["campaign_id"] for row in rows}
    tags = {
        TAG_EXECUTIONS: str(len(rows)),
        TAG_CLAIMED_BY: claimed_by,
        **{execution_tag(i): str(a) for i, a in pairs},
        TAG_CAMPAIGNS: ",".join(sorted(campaigns)),
    }
    if len(campaigns) == 1:
        # Campaign slugs are up to 64 characters, longer than a tag key's section may be: values only.
        tags[TAG_CAMPAIGN_ID] = rows[0]["campaign_id"]
    if len(rows) == 1:
        tags[TAG_EXECUTION_ID] = str(rows[0]["id"])
    return dg.RunRequest(
        run_key=f"executions:{pairs[0][0]}:{pairs[0][1]}:{len(pairs)}:{digest}",
        job_name=marketing_execution_job.name,
        run_config={"ops": {OP_NAME: {"config": {"execution_ids": [i for i, _ in pairs], "claimed_by": claimed_by}}}},
        tags=tags,
    )


def claim_execution_requests(
    engine: sa.Engine, claimed_by: str, batch_size: int, lease_seconds: float, executions_per_run: int
) -> tuple[list[dg.RunRequest], str]:
    """Recover expired leases, claim up to ``batch_size`` due rows and group them into runs.

    Rows stay in due order: the first run holds the longest-waiting executions.
    """
    with engine.begin() as conn:
        recovery = recover_expired(conn, EXECUTIONS)
        end_open_attempts(conn, [*recovery.requeued, *recovery.failed], "LEASE_EXPIRED", LEASE_EXPIRED_ERROR)
    with engine.begin() as conn:
        rows = claim_batch(conn, EXECUTIONS, claimed_by, batch_size, lease_seconds)
    requests = [
        batch_run_request(rows[start : start + executions_per_run], claimed_by)
        for start in range(0, len(rows), executions_per_run)
    ]
    summary = f"executions: claimed {len(rows)} into {len(requests)} run(s)"
    if recovery.requeued or recovery.failed:
        summary += f", expired leases requeued {list(recovery.requeued)} failed {list(recovery.failed)}"
    return requests, summary


@dg.sensor(
    name="due_executions_sensor",
    jobs=[marketing_execution_job],
    minimum_interval_seconds=_settings.sensor_interval_seconds,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Recovers expired execution leases, claims due executions in the database (FOR UPDATE SKIP LOCKED on "
        "PostgreSQL) and launches runs of up to MARKETING_EXECUTIONS_PER_RUN executions each. Safe to evaluate "
        "on many replicas at once."
    ),
)
def due_executions_sensor(context: dg.SensorEvaluationContext, app_db: AppDatabase) -> dg.SensorResult | dg.SkipReason:
    settings = Settings.from_env()
    try:
        engine = app_db.ready_engine()
    except (SchemaNotReady, DatabaseUnavailable) as exc:
        return dg.SkipReason(str(exc))
    requests, summary = claim_execution_requests(
        engine,
        new_claim_owner(),
        settings.sensor_batch_size,
        settings.execution_lease_seconds,
        settings.executions_per_run,
    )
    if not requests:
        return dg.SkipReason(f"Nothing due ({summary}).")
    context.log.info(summary)
    return dg.SensorResult(run_requests=requests)


def reconcile_execution_run(engine: sa.Engine, run: dg.DagsterRun, outcome: str, reason: str) -> dict[str, int]:
    """Record the outcome of every execution a Dagster run held when it ended without recording one.

    Each execution is fenced on its own by the run's lease owner (or the sensor's claim, when the
    run died before taking it over) and by run id: executions the run already finished, or that
    another attempt owns by now, are left alone. Returns how many rows got which new status.
    """
    held = executions_of_run(run.tags)
    reason = redact_urls(reason)  # a run's failure message may quote a webhook URL
    owners = [run_owner(run.run_id), run.tags.get(TAG_CLAIMED_BY, "")]
    settings = Settings.from_env()
    statuses: Counter[str] = Counter()
    with engine.begin() as conn:
        for execution_id, attempt in sorted(held.items()):
            if outcome == CANCELLED:
                done = finish(conn, EXECUTIONS, execution_id, owners, CANCELLED, {"last_error": reason})
                status = CANCELLED if done else None
            else:
                delay = retry_delay_seconds(settings, attempt)
                status = retry_or_fail(conn, EXECUTIONS, execution_id, owners, reason, delay, run_id=run.run_id)
            if status is not None:
                end_attempt(conn, execution_id, attempt, attempt_outcome(status), reason)
                statuses[status] += 1
    return dict(statuses)


def _log_reconciled(context: dg.RunStatusSensorContext, statuses: Mapping[str, int]) -> None:
    if statuses:
        summary = ", ".join(f"{n} now {status}" for status, n in sorted(statuses.items()))
        context.log.info(f"Run {context.dagster_run.run_id}: executions {summary}.")


@dg.run_failure_sensor(
    name="execution_run_failure_sensor",
    monitored_jobs=[marketing_execution_job],
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Retries or fails each execution a failed marketing_execution_job run held without recording it.",
)
def execution_run_failure_sensor(context: dg.RunFailureSensorContext, app_db: AppDatabase) -> None:
    run = context.dagster_run
    message = context.failure_event.message or "run failed"
    _log_reconciled(
        context, reconcile_execution_run(app_db.engine(), run, "FAILED", f"Dagster run {run.run_id} failed: {message}")
    )


@dg.run_status_sensor(
    name="execution_run_canceled_sensor",
    run_status=dg.DagsterRunStatus.CANCELED,
    monitored_jobs=[marketing_execution_job],
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Marks the executions a canceled marketing_execution_job run held CANCELLED.",
)
def execution_run_canceled_sensor(context: dg.RunStatusSensorContext, app_db: AppDatabase) -> None:
    run = context.dagster_run
    _log_reconciled(
        context, reconcile_execution_run(app_db.engine(), run, CANCELLED, f"Dagster run {run.run_id} was canceled")
    )
