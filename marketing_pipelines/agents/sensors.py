"""The agent-run half of due_work_sensor and of run reconciliation, as testable functions."""

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines.agents.jobs import OP_NAME, POOL, agent_run_job, run_owner
from marketing_pipelines.agents.queue import AGENT_RUNS, running_count
from marketing_pipelines.db.lease import CANCELLED, claim_batch, finish, recover_expired, retry_or_fail

TAG_AGENT_RUN_ID = "marketing/agent_run_id"
TAG_REQUESTED_BY = "marketing/requested_by"
TAG_AGENT = "marketing/agent"
TAG_CAMPAIGN_ID = "marketing/campaign_id"
TAG_CLAIMED_BY = "marketing/claimed_by"
TAG_ATTEMPT = "marketing/attempt"


def ensure_pool_limit(instance: dg.DagsterInstance, limit: int) -> bool:
    """Make the agent_runs pool's limit equal the setting; True when it had to change."""
    info = instance.event_log_storage.get_concurrency_info(POOL)
    if info.slot_count == limit and not getattr(info, "using_default_limit", False):
        return False
    try:
        instance.event_log_storage.set_concurrency_slots(POOL, limit)
    except sa.exc.IntegrityError:
        # Dagster inserts a new pool's limit row without an upsert, so replicas ticking at once on
        # a fresh instance collide on it. The row exists now; setting again locks it and updates.
        instance.event_log_storage.set_concurrency_slots(POOL, limit)
    return True


def agent_run_request(row: sa.RowMapping, claimed_by: str, grace_seconds: int) -> dg.RunRequest:
    return dg.RunRequest(
        run_key=f"agent_run:{row['id']}:{row['attempts']}",
        job_name=agent_run_job.name,
        run_config={"ops": {OP_NAME: {"config": {"agent_run_id": row["id"], "claimed_by": claimed_by}}}},
        tags={
            TAG_AGENT_RUN_ID: str(row["id"]),
            TAG_REQUESTED_BY: row["requested_by"],
            TAG_AGENT: row["agent"],
            TAG_CAMPAIGN_ID: row["campaign_id"],
            TAG_ATTEMPT: str(row["attempts"]),
            TAG_CLAIMED_BY: claimed_by,
            # Enforced by run monitoring: the run is stopped if it overruns, whatever the loop does.
            "dagster/max_runtime": str(row["max_run_seconds"] + grace_seconds),
        },
    )


def claim_agent_run_requests(
    engine: sa.Engine, claimed_by: str, batch_size: int, pool_limit: int, grace_seconds: int
) -> tuple[list[dg.RunRequest], str]:
    """Recover expired agent-run leases and claim what the pool can start now.

    Claims at most ``pool_limit - RUNNING`` rows: the rest stay QUEUED in the database, where
    they survive restarts and hold no lease, instead of waiting inside Dagster with a lease
    ticking. The pool remains the hard limit if two replicas race to the same free slots.
    """
    with engine.begin() as conn:
        recovery = recover_expired(conn, AGENT_RUNS)
    with engine.begin() as conn:
        free = min(batch_size, pool_limit - running_count(conn))
        rows = claim_batch(conn, AGENT_RUNS, claimed_by, free, grace_seconds) if free > 0 else []
    summary = f"agent runs: claimed {len(rows)} (pool free {max(free, 0)})"
    if recovery.requeued or recovery.failed:
        summary += f", expired leases requeued {list(recovery.requeued)} failed {list(recovery.failed)}"
    return [agent_run_request(row, claimed_by, grace_seconds) for row in rows], summary


def reconcile_agent_run(engine: sa.Engine, run: dg.DagsterRun, outcome: str, reason: str) -> str | None:
    """Record the outcome of an agent run whose Dagster run ended without recording one."""
    agent_run_id = run.tags.get(TAG_AGENT_RUN_ID)
    if agent_run_id is None:
        return None
    owners = [run_owner(run.run_id), run.tags.get(TAG_CLAIMED_BY, "")]
    with engine.begin() as conn:
        if outcome == CANCELLED:
            done = finish(conn, AGENT_RUNS, int(agent_run_id), owners, CANCELLED, {"error": reason})
            return CANCELLED if done else None
        return retry_or_fail(conn, AGENT_RUNS, int(agent_run_id), owners, reason, 0, run_id=run.run_id)
