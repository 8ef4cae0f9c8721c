"""The agents domain's sensors: claim queued agent runs as pool slots free up; reconcile runs that died.

``queued_agent_runs_sensor`` is this domain's only claiming sensor: nothing the execution sensor does
(or fails to do) can leave a claimed agent run without a run, and the other way round.
"""

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines import run_tags
from marketing_pipelines.agents.jobs import OP_NAME, POOL, agent_run_job
from marketing_pipelines.agents.queue import AGENT_RUNS, running_count
from marketing_pipelines.agents.resources import AgentSettings
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.leasing.claims import (
    Room,
    claim_requests,
    claiming_sensor,
    reconcile_run,
    run_end_sensors,
    sensor_instance,
)
from marketing_pipelines.leasing.lease import CANCELLED, LeaseQueue, Recovery, new_claim_owner, renew_many

# Claimed agent runs per unit of pool limit: the pool's own, plus as many waiting in Dagster's run queue
# to start the moment one ends (docs/PERFORMANCE.md, "Agent pool kept busy").
BACKLOG_FACTOR = 2


def ensure_pool_limit(instance: dg.DagsterInstance, limit: int) -> bool:
    """Make the agent_runs pool's limit equal ``limit``; True when it had to change."""
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
            run_tags.AGENT_RUN_ID: str(row["id"]),
            run_tags.REQUESTED_BY: row["requested_by"],
            run_tags.AGENT: row["agent"],
            run_tags.CAMPAIGN_ID: row["campaign_id"],
            run_tags.ATTEMPT: str(row["attempts"]),
            run_tags.CLAIMED_BY: claimed_by,
            # Enforced by run monitoring: the run is stopped if it overruns, whatever the loop does.
            "dagster/max_runtime": str(row["max_run_seconds"] + grace_seconds),
        },
    )


def agent_run_room(pool_limit: int, running: int, batch_size: int) -> Room:
    """The agent runs a tick may claim: BACKLOG_FACTOR x the pool limit, less those RUNNING, at most a batch."""
    backlog = BACKLOG_FACTOR * pool_limit - running
    return Room(
        max(0, min(batch_size, backlog)),
        f"pool limit {pool_limit} x backlog factor {BACKLOG_FACTOR} minus {running} running, "
        f"at most {batch_size} a tick" + (", not below 0" if backlog < 0 else ""),
    )


@dataclass(frozen=True)
class ClaimedAgentRuns:
    """The agent-run queue as ``claim_requests`` sees it (``leasing.claims.ClaimedQueue``).

    Claims at most ``BACKLOG_FACTOR x pool_limit - RUNNING`` rows. The pool's runs in progress are at
    most ``pool_limit`` (Dagster's run queue holds the rest, pools at granularity run); the others
    wait QUEUED in Dagster's run queue, so a run that ends is followed within the queue's next pass
    (1 s) instead of the next tick of this sensor. Anything beyond stays QUEUED in the database,
    where it survives restarts and holds no lease. Each claimed row's lease covers the run ahead of
    it in the queue: the grace plus its own time limit.
    """

    batch_size: int
    pool_limit: int
    grace_seconds: int
    lease: ClassVar[LeaseQueue] = AGENT_RUNS
    pool: ClassVar[str | None] = POOL

    @property
    def lease_seconds(self) -> float:
        return self.grace_seconds

    def room(self, conn: sa.Connection) -> Room:
        return agent_run_room(self.pool_limit, running_count(conn), self.batch_size)

    def run_requests(self, rows: Sequence[sa.RowMapping], claimed_by: str) -> list[dg.RunRequest]:
        return [agent_run_request(row, claimed_by, self.grace_seconds) for row in rows]

    def rows_of_run(self, run: dg.DagsterRun) -> list[int]:
        return agent_run_of(run)

    def after_recovery(self, conn: sa.Connection, recovery: Recovery) -> None:
        return  # an agent run's attempt is its row: the recovery recorded all there is

    def after_claim(self, conn: sa.Connection, rows: Sequence[sa.RowMapping], claimed_by: str) -> None:
        """Lease each claimed row for the wait in Dagster's run queue: the grace plus its own time limit."""
        by_limit: dict[int, list[int]] = {}
        for row in rows:
            by_limit.setdefault(row["max_run_seconds"], []).append(row["id"])
        for max_run_seconds, ids in by_limit.items():
            renew_many(conn, AGENT_RUNS, ids, claimed_by, self.grace_seconds + max_run_seconds)


def claim_agent_run_requests(
    engine: sa.Engine,
    claimed_by: str,
    batch_size: int,
    pool_limit: int,
    grace_seconds: int,
    instance: Callable[[], dg.DagsterInstance | None] | None = None,
) -> tuple[list[dg.RunRequest], str]:
    """Recover expired agent-run leases and claim what the pool can start now, and as many again
    (``ClaimedAgentRuns``); (requests, summary) of the tick."""
    claim = claim_requests(engine, ClaimedAgentRuns(batch_size, pool_limit, grace_seconds), claimed_by, instance)
    return claim.requests, claim.summary("agent runs")


def agent_run_of(run: dg.DagsterRun) -> list[int]:
    """The agent run a Dagster run was launched for (its tag), or none for a run without one."""
    agent_run_id = run.tags.get(run_tags.AGENT_RUN_ID, "")
    return [int(agent_run_id)] if agent_run_id.isdigit() else []


def reconcile_agent_run(engine: sa.Engine, run: dg.DagsterRun, outcome: str, reason: str) -> str | None:
    """Record the outcome of an agent run whose Dagster run ended without recording one."""
    rows = agent_run_of(run)
    if not rows:
        return None
    # An agent run keeps its place in the queue: its retry is due at once.
    statuses = reconcile_run(engine, AGENT_RUNS, run, rows, outcome, reason)
    return next(iter(statuses), None)


def _pool_limit(context: dg.SensorEvaluationContext, setting: int) -> int:
    """The agent_runs limit in force: the setting when it is new or changed, else the instance's own.

    The setting is applied once (the sensor's cursor remembers which value it applied), not on every
    tick: a limit an operator edits in the UI (Deployment > Concurrency) stands until
    MARKETING_MAX_CONCURRENT_AGENT_RUNS itself changes, instead of being silently set back.
    """
    if context.instance is None:
        return setting
    applied = json.loads(context.cursor)["applied_pool_limit"] if context.cursor else None
    if applied != setting:
        if ensure_pool_limit(context.instance, setting):
            context.log.info(f"Set the agent_runs pool limit to {setting} (MARKETING_MAX_CONCURRENT_AGENT_RUNS).")
        context.update_cursor(json.dumps({"applied_pool_limit": setting}))
        return setting
    return context.instance.event_log_storage.get_concurrency_info(POOL).slot_count


def claim_queued_agent_runs(
    context: dg.SensorEvaluationContext, app_db: AppDatabase, agent_settings: AgentSettings
) -> dg.SensorResult | dg.SkipReason:
    """One tick of ``queued_agent_runs_sensor``: apply the pool limit, claim what it has room for, one run each."""
    engine = app_db.ready_engine_or_skip()
    if isinstance(engine, dg.SkipReason):
        return engine
    pool_limit = _pool_limit(context, agent_settings.max_concurrent_agent_runs)
    requests, summary = claim_agent_run_requests(
        engine,
        new_claim_owner(),
        agent_settings.batch_size,
        pool_limit,
        agent_settings.lease_grace_seconds,
        lambda: sensor_instance(context),
    )
    if not requests:
        return dg.SkipReason(f"Nothing to start ({summary}).")
    context.log.info(summary)
    return dg.SensorResult(run_requests=requests)


def build_queued_agent_runs_sensor(interval_seconds: int) -> dg.SensorDefinition:
    """The claiming sensor, evaluated at most every ``interval_seconds`` (MARKETING_SENSOR_INTERVAL_SECONDS)."""
    return claiming_sensor(
        claim_queued_agent_runs,
        name="queued_agent_runs_sensor",
        job=agent_run_job,
        interval_seconds=interval_seconds,
        description=(
            "Applies MARKETING_MAX_CONCURRENT_AGENT_RUNS to the agent_runs pool when it changes (a UI edit stands "
            "until then), recovers expired agent-run leases and claims as many queued agent runs as the pool has "
            "room for and as many again, to wait in the run queue (FOR UPDATE SKIP LOCKED on PostgreSQL), one run "
            "each. Safe to evaluate on many replicas at once."
        ),
    )


def _on_run_failure(context: dg.RunFailureSensorContext, app_db: AppDatabase) -> None:
    run = context.dagster_run
    message = context.failure_event.message or "run failed"
    status = reconcile_agent_run(app_db.engine(), run, "FAILED", f"Dagster run {run.run_id} failed: {message}")
    if status:
        context.log.info(f"Run {run.run_id}: agent run now {status}.")


def _on_run_canceled(context: dg.RunStatusSensorContext, app_db: AppDatabase) -> None:
    run = context.dagster_run
    status = reconcile_agent_run(app_db.engine(), run, CANCELLED, f"Dagster run {run.run_id} was canceled")
    if status:
        context.log.info(f"Run {run.run_id}: agent run now {status}.")


agent_run_failure_sensor, agent_run_canceled_sensor = run_end_sensors(
    "agent",
    agent_run_job,
    on_failure=_on_run_failure,
    failure_description="Retries or fails an agent run whose Dagster run failed before recording it.",
    on_canceled=_on_run_canceled,
    canceled_description="Marks an agent run CANCELLED when its Dagster run was canceled.",
)
