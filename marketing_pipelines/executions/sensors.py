"""The executions domain's sensors: claim due executions and launch batched runs; reconcile runs that died.

``due_executions_sensor`` is this domain's only claiming sensor: nothing the agent-run sensor does
(or fails to do) can leave a claimed execution without a run, and the other way round.
"""

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines import run_tags
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.executions.jobs import OP_NAME, marketing_execution_job
from marketing_pipelines.executions.queue import (
    EXECUTIONS,
    attempt_outcome,
    end_attempt,
    end_open_attempts,
    forget_unbegun_attempts,
)
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.leasing.claims import (
    LEASE_SHORTENED,
    Room,
    claim_requests,
    claiming_sensor,
    reconcile_run,
    run_end_sensors,
    run_never_started,
    sensor_instance,
)
from marketing_pipelines.leasing.lease import (
    CANCELLED,
    FENCE_SECONDS,
    LEASE_EXPIRED_ERROR,
    LeaseQueue,
    Recovery,
    claimed_waiting,
    new_claim_owner,
)
from marketing_pipelines.redact import shown_text

# The run's tags are run_tags' fixed set (no key per execution). A tag value is shown whole in the UI's
# run list: past this, the campaigns tag says how many there are.
CAMPAIGNS_TAG_MAX = 200


def executions_of_run(run_config: Mapping[str, Any]) -> list[int]:
    """The executions a run (or run request) was launched for, from its run config."""
    config = run_config.get("ops", {}).get(OP_NAME, {}).get("config", {})
    return [int(i) for i in config.get("execution_ids", [])]


def _campaigns_tag(campaigns: set[str]) -> str:
    text = ",".join(sorted(campaigns))
    return text if len(text) <= CAMPAIGNS_TAG_MAX else f"{len(campaigns)} campaigns"


def batch_run_request(rows: Sequence[sa.RowMapping], claimed_by: str) -> dg.RunRequest:
    """One run for a batch of claimed rows (each with id, campaign_id, attempts)."""
    pairs = [(row["id"], row["attempts"]) for row in rows]
    # Run keys are deduplicated forever. A repeated submission of the same tick's requests must
    # not launch twice, while a later claim of the same rows must: a retry (new attempts), or the
    # same attempts again after a run that never began them gave them back. The claim tells them apart.
    digest = hashlib.sha1(f"{claimed_by};{','.join(f'{i}:{a}' for i, a in pairs)}".encode()).hexdigest()[:16]
    campaigns = {row["campaign_id"] for row in rows}
    tags = {
        run_tags.EXECUTIONS: str(len(rows)),
        run_tags.CLAIMED_BY: claimed_by,
        run_tags.CAMPAIGNS: _campaigns_tag(campaigns),
    }
    if len(campaigns) == 1:
        # Campaign slugs are up to 64 characters, longer than a tag key's section may be: values only.
        tags[run_tags.CAMPAIGN_ID] = rows[0]["campaign_id"]
    return dg.RunRequest(
        run_key=f"executions:{pairs[0][0]}:{pairs[0][1]}:{len(pairs)}:{digest}",
        job_name=marketing_execution_job.name,
        run_config={"ops": {OP_NAME: {"config": {"execution_ids": [i for i, _ in pairs], "claimed_by": claimed_by}}}},
        tags=tags,
    )


def execution_room(batch_size: int, waiting: int) -> Room:
    """The executions a tick may claim: the batch less those claimed earlier and still waiting for their runs."""
    room = batch_size - waiting
    return Room(
        max(0, room),
        f"batch size {batch_size} minus {waiting} claimed and waiting for their runs"
        + (", not below 0" if room < 0 else ""),
    )


@dataclass(frozen=True)
class ClaimedExecutions:
    """The executions queue as ``claim_requests`` sees it (``leasing.claims.ClaimedQueue``).

    A tick claims what brings the rows claimed and still waiting for their runs (every replica's)
    up to ``batch_size``: a backlog of runs in Dagster's queue stops the claiming instead of growing
    past what the leases cover while the runs wait. Rows stay in due order: the first run holds the
    longest-waiting executions.
    """

    settings: ExecutionSettings
    lease: ClassVar[LeaseQueue] = EXECUTIONS
    pool: ClassVar[str | None] = None

    @property
    def lease_seconds(self) -> float:
        return self.settings.lease_seconds

    def room(self, conn: sa.Connection) -> Room:
        return execution_room(self.settings.batch_size, claimed_waiting(conn, EXECUTIONS))

    def run_requests(self, rows: Sequence[sa.RowMapping], claimed_by: str) -> list[dg.RunRequest]:
        per_run = self.settings.executions_per_run
        return [batch_run_request(rows[start : start + per_run], claimed_by) for start in range(0, len(rows), per_run)]

    def rows_of_run(self, run: dg.DagsterRun) -> list[int]:
        return executions_of_run(run.run_config)

    def after_recovery(self, conn: sa.Connection, recovery: Recovery) -> None:
        # A handed-back attempt never began: its row goes, and the next take-over opens the number again.
        forget_unbegun_attempts(conn, recovery.handed_back)
        lost = set(recovery.requeued).difference(recovery.handed_back)
        end_open_attempts(conn, sorted(lost.union(recovery.failed)), "LEASE_EXPIRED", LEASE_EXPIRED_ERROR)

    def after_claim(self, conn: sa.Connection, rows: Sequence[sa.RowMapping], claimed_by: str) -> None:
        return  # a claimed execution's lease is the setting's; its attempt opens when its run takes it over


def claim_execution_requests(
    engine: sa.Engine,
    claimed_by: str,
    settings: ExecutionSettings,
    instance: Callable[[], dg.DagsterInstance | None] | None = None,
) -> tuple[list[dg.RunRequest], str, int]:
    """Recover expired leases, claim due rows and group them into runs; (requests, summary, room) of the tick."""
    claim = claim_requests(engine, ClaimedExecutions(settings), claimed_by, instance)
    return claim.requests, claim.summary("executions"), claim.room.rows


def claim_due_executions(
    context: dg.SensorEvaluationContext, app_db: AppDatabase, execution_settings: ExecutionSettings
) -> dg.SensorResult | dg.SkipReason:
    """One tick of ``due_executions_sensor``: claim what the batch has room for, one run request per run."""
    engine = app_db.ready_engine_or_skip()
    if isinstance(engine, dg.SkipReason):
        return engine
    requests, summary, room = claim_execution_requests(
        engine, new_claim_owner(), execution_settings, lambda: sensor_instance(context)
    )
    if not requests and room == 0:
        return dg.SkipReason(
            f"Nothing claimed: executions claimed earlier fill the batch ({execution_settings.batch_size}, "
            f"MARKETING_SENSOR_BATCH_SIZE) until their runs start ({summary})."
        )
    if not requests:
        return dg.SkipReason(f"Nothing due ({summary}).")
    context.log.info(summary)
    return dg.SensorResult(run_requests=requests)


def build_due_executions_sensor(interval_seconds: int) -> dg.SensorDefinition:
    """The claiming sensor, evaluated at most every ``interval_seconds`` (MARKETING_SENSOR_INTERVAL_SECONDS)."""
    return claiming_sensor(
        claim_due_executions,
        name="due_executions_sensor",
        job=marketing_execution_job,
        interval_seconds=interval_seconds,
        description=(
            "Recovers expired execution leases, claims due executions in the database (FOR UPDATE SKIP LOCKED on "
            "PostgreSQL) and launches runs of up to MARKETING_EXECUTIONS_PER_RUN executions each. Safe to "
            "evaluate on many replicas at once."
        ),
    )


def reconcile_execution_run(engine: sa.Engine, run: dg.DagsterRun, outcome: str, reason: str) -> dict[str, int]:
    """Hand back (or cancel) the executions a Dagster run held when it ended without recording them, and close
    each one's attempt, or shorten the leases of those its worker took over (``reconcile_run``); returns how
    many rows got which new status."""
    # A run's failure message may quote a webhook URL, a credential or a stage: redacted, controls visible.
    reason = shown_text(reason)

    def end_its_attempt(conn: sa.Connection, execution_id: int, attempt: int, status: str) -> None:
        end_attempt(conn, execution_id, attempt, attempt_outcome(status), reason)

    return reconcile_run(
        engine,
        EXECUTIONS,
        run,
        executions_of_run(run.run_config),
        outcome,
        reason,
        on_status=end_its_attempt,
    )


def _log_reconciled(context: dg.RunStatusSensorContext, statuses: Mapping[str, int]) -> None:
    if statuses:
        summary = ", ".join(f"{n} now {status}" for status, n in sorted(statuses.items()))
        context.log.info(f"Run {context.dagster_run.run_id}: executions {summary}.")
    if statuses.get(LEASE_SHORTENED):
        context.log.info(
            f"Its worker had taken {statuses[LEASE_SHORTENED]} over: their leases end {FENCE_SECONDS:.0f} s after "
            "its last heartbeat, and the claiming sensor requeues them then unless a live worker records them."
        )


def _on_run_failure(context: dg.RunFailureSensorContext, app_db: AppDatabase) -> None:
    run = context.dagster_run
    # The text only rows the run never took over get: nothing was tried, so no attempt was spent.
    message = context.failure_event.message or "run failed"
    if run_never_started(context.instance, run.run_id):
        reason = f"run {run.run_id} never started ({message}); not an attempt"
    else:
        reason = f"run {run.run_id} ended before it took this execution over ({message}); not an attempt"
    _log_reconciled(context, reconcile_execution_run(app_db.engine(), run, "FAILED", reason))


def _on_run_canceled(context: dg.RunStatusSensorContext, app_db: AppDatabase) -> None:
    run = context.dagster_run
    reason = f"Dagster run {run.run_id} was canceled"
    _log_reconciled(context, reconcile_execution_run(app_db.engine(), run, CANCELLED, reason))


execution_run_failure_sensor, execution_run_canceled_sensor = run_end_sensors(
    "execution",
    marketing_execution_job,
    on_failure=_on_run_failure,
    failure_description=(
        "Hands back each execution a failed marketing_execution_job run never took over (its attempt not spent), "
        "and shortens the leases of those it took over so they are requeued seconds after its worker's last "
        "heartbeat."
    ),
    on_canceled=_on_run_canceled,
    canceled_description="Marks the executions a canceled marketing_execution_job run held CANCELLED.",
)
