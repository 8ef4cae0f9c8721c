"""The execution half of due_work_sensor and of run reconciliation, as testable functions.

``marketing_pipelines/work.py`` wires these (and the agent-run half) into the sensors.
"""

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines.db.lease import CANCELLED, claim_batch, finish, recover_expired, retry_or_fail
from marketing_pipelines.executions.jobs import OP_NAME, marketing_execution_job, retry_delay_seconds, run_owner
from marketing_pipelines.executions.queue import EXECUTIONS
from marketing_pipelines.settings import Settings

TAG_EXECUTION_ID = "marketing/execution_id"
TAG_CAMPAIGN_ID = "marketing/campaign_id"
TAG_STAGE = "marketing/stage"
TAG_ACTION = "marketing/action"
TAG_CLAIMED_BY = "marketing/claimed_by"
TAG_ATTEMPT = "marketing/attempt"


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
