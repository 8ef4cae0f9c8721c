"""``marketing_execution_job``: performs a batch of claimed executions, each fenced by its own lease.

A Dagster run costs seconds of process start-up while a ``log`` or ``webhook`` action costs
milliseconds, so one run performs up to ``MARKETING_EXECUTIONS_PER_RUN`` executions. Each one
keeps everything it had as a run of its own: its take-over, its lease (renewed together with the
others' in one fenced statement), its attempt, and an outcome recorded in its own transaction.
One failing execution is recorded as that execution's failure and costs the others nothing; a
run killed mid-batch leaves what it finished finished, and the rest to reconciliation or lease
expiry.
"""

import time
import traceback
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines.db.lease import LeaseKeeper, describe, finish, retry_or_fail
from marketing_pipelines.db.leased_runs import take_over_rows
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.executions.actions import (
    ActionContext,
    ActionFailed,
    ActionRefused,
    get_action,
)
from marketing_pipelines.executions.endpoints import Endpoint, endpoint_names, open_endpoints
from marketing_pipelines.executions.queue import (
    EXECUTIONS,
    attempt_outcome,
    end_attempt,
    get_execution,
    start_attempts,
)
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.redact import hide_values, redact_text, secret_parts, shown_text

OP_NAME = "perform_executions"
# A run's outcome table shows at most this many rows; the run log has a line for every execution.
OUTCOME_TABLE_ROWS = 1000


class ExecutionBatchConfig(dg.Config):
    execution_ids: list[int]
    claimed_by: str  # the sensor's lease owner; the run takes each lease over from it


@dataclass(frozen=True)
class ExecutionOutcome:
    """What one execution of a batch came to, as the run's log and outcome table show it."""

    execution_id: int
    campaign_id: str
    stage: str
    action: str
    attempt: int
    outcome: str  # SUCCEEDED, RESCHEDULED, FAILED, LEASE_LOST or SKIPPED
    detail: str
    seconds: float


def _record(
    engine: sa.Engine,
    row: Mapping[str, Any],
    owner: str,
    error: str | None,
    settings: ExecutionSettings,
    final: bool,
) -> tuple[str | None, str]:
    """Record one attempt's outcome in its own transaction; returns (new status or None, state).

    ``final``: the action was refused (e.g. its destination is not allowed): FAILED, no retry.
    """
    execution_id, attempt = row["id"], row["attempts"]
    with engine.begin() as conn:
        if error is None:
            recorded = finish(conn, EXECUTIONS, execution_id, owner, "SUCCEEDED", {"last_error": None})
            status: str | None = "SUCCEEDED" if recorded else None
        elif final:
            recorded = finish(conn, EXECUTIONS, execution_id, owner, "FAILED", {"last_error": error})
            status = "FAILED" if recorded else None
        else:
            delay = settings.retry_delay_seconds(attempt)
            status = retry_or_fail(conn, EXECUTIONS, execution_id, owner, error, delay)
        if status is None:
            return None, describe(conn, EXECUTIONS, execution_id)
        end_attempt(conn, execution_id, attempt, attempt_outcome(status), error)
        if status == EXECUTIONS.ready_status:
            current = get_execution(conn, execution_id)
            return status, f"rescheduled for {current['due_at'].isoformat() if current else '?'}"
    return status, ""


def _perform_one(
    context: dg.OpExecutionContext,
    engine: sa.Engine,
    row: Mapping[str, Any],
    owner: str,
    keeper: LeaseKeeper,
    webhook: WebhookClient,
    settings: ExecutionSettings,
    endpoints: Mapping[str, Endpoint | str],
) -> ExecutionOutcome:
    execution_id, attempt = row["id"], row["attempts"]
    began = time.monotonic()
    label = f"Execution {execution_id} ({row['campaign_id']}/{row['stage']}, {row['action']}, attempt {attempt})"
    error: str | None = None
    refused = False
    result: dict[str, Any] = {}
    try:
        action = get_action(row["action"])
        action_ctx = ActionContext(execution_id, attempt, row["campaign_id"], row["stage"], context.log, endpoints)
        result = action.run(action_ctx, row["payload"], webhook)
    except ActionFailed as exc:
        error, refused = _redacted(str(exc), row["payload"]), isinstance(exc, ActionRefused)
    except Exception as exc:  # a bug in one action must cost only its own execution
        context.log.error(
            f"{label}: unexpected error\n{_redacted(''.join(traceback.format_exception(exc)), row['payload'])}"
        )
        error = _redacted(f"internal error: {type(exc).__name__}: {exc}", row["payload"])
    # Stop renewing first: a renewal racing the outcome's commit would see the row finished and
    # report a lost lease that was not lost. The outcome's own WHERE still fences it.
    lost = keeper.is_lost(execution_id)
    keeper.release(execution_id)
    if lost:
        status, state = None, "lost its lease while the action ran"
    else:
        status, state = _record(engine, row, owner, error, settings, final=refused)
    seconds = time.monotonic() - began

    def outcome(kind: str, detail: str) -> ExecutionOutcome:
        return ExecutionOutcome(
            execution_id, row["campaign_id"], row["stage"], row["action"], attempt, kind, detail, seconds
        )

    if status is None:
        # Another attempt owns the row now (its lease expired); that attempt records the outcome.
        context.log.warning(
            f"{label}: this run lost its lease ({state}); its outcome was not recorded. The action may have run; "
            "the next attempt sends the same Idempotency-Key, so a receiver can drop the repeat."
        )
        return outcome("LEASE_LOST", state)
    if status == "SUCCEEDED":
        detail = shown_text(_redacted(", ".join(f"{k}={v}" for k, v in result.items()), row["payload"]))
        context.log.info(f"{label} SUCCEEDED{f': {detail}' if detail else ''}.")
        return outcome("SUCCEEDED", detail)
    if status == "FAILED":
        context.log.error(f"{label} FAILED after {attempt} of {row['max_attempts']} attempts: {error}")
        return outcome("FAILED", error or "")
    context.log.warning(f"{label} failed: {error}; {state}.")
    return outcome("RESCHEDULED", f"{error}; {state}")


def _redacted(text: str, payload: Any) -> str:
    """An action's message as it is stored and logged: redacted, and without any piece of the payload's URL
    or headers, which a receiver's answer may quote bare ("no hook /services/T0/B0/<token>")."""
    return hide_values(redact_text(text), secret_parts(payload))


def _outcome_table(outcomes: Sequence[ExecutionOutcome]) -> dg.TableMetadataValue:
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord(
                {
                    "execution_id": o.execution_id,
                    "campaign": o.campaign_id,
                    "stage": o.stage,
                    "action": o.action,
                    "attempt": o.attempt,
                    "outcome": o.outcome,
                    "detail": shown_text(o.detail)[:300],  # may quote a receiver's answer
                    "seconds": round(o.seconds, 3),
                }
            )
            for o in outcomes[:OUTCOME_TABLE_ROWS]
        ],
        schema=dg.TableSchema(
            columns=[
                dg.TableColumn("execution_id", "int"),
                dg.TableColumn("campaign", "string"),
                dg.TableColumn("stage", "string"),
                dg.TableColumn("action", "string"),
                dg.TableColumn("attempt", "int"),
                dg.TableColumn("outcome", "string"),
                dg.TableColumn("detail", "string"),
                dg.TableColumn("seconds", "float"),
            ]
        ),
    )


@dg.op(
    name=OP_NAME,
    description=(
        "Perform a batch of claimed marketing executions, each under its own lease, and record each outcome. "
        "Webhooks are sent concurrently (MARKETING_WEBHOOK_CONCURRENCY)."
    ),
)
def perform_executions(
    context: dg.OpExecutionContext,
    config: ExecutionBatchConfig,
    app_db: AppDatabase,
    webhook: WebhookClient,
    execution_settings: ExecutionSettings,
) -> dg.Output[dict[str, int]]:
    settings = execution_settings
    engine = app_db.ready_engine()
    ids = list(dict.fromkeys(config.execution_ids))
    taken_over = take_over_rows(
        engine,
        EXECUTIONS,
        ids,
        claimed_by=config.claimed_by,
        run_id=context.run_id,
        lease_seconds=settings.lease_seconds,
        log=context.log.info,
        also=lambda conn, rows: start_attempts(conn, rows, context.run_id),
    )
    owner, rows = taken_over.owner, taken_over.rows
    taken = {row["id"] for row in rows}
    outcomes: list[ExecutionOutcome] = [
        ExecutionOutcome(execution_id, "", "", "", 0, "SKIPPED", state, 0.0)
        for execution_id, state in taken_over.skipped.items()
    ]
    context.log.info(f"Performing {len(rows)} of {len(ids)} execution(s) as {owner}.")

    if rows:
        # The registered endpoints the batch names, opened once (one query, one key) for all its sends.
        names = endpoint_names(row["payload"] for row in rows if row["action"] == "webhook")
        endpoints: Mapping[str, Endpoint | str] = {}
        if names:
            with engine.connect() as conn:
                endpoints = open_endpoints(conn, webhook.sealing_keys(), names)
        with (
            LeaseKeeper(
                engine, EXECUTIONS, sorted(taken), owner, settings.lease_seconds, on_lost=context.log.error
            ) as keeper,
            ThreadPoolExecutor(max_workers=min(webhook.concurrency, len(rows))) as pool,
        ):
            futures = [
                pool.submit(_perform_one, context, engine, row, owner, keeper, webhook, settings, endpoints)
                for row in rows
            ]
            outcomes += [future.result() for future in futures]

    counts = {
        kind: sum(1 for o in outcomes if o.outcome == kind) for kind in dict.fromkeys(o.outcome for o in outcomes)
    }
    summary = ", ".join(f"{n} {kind}" for kind, n in counts.items()) or "nothing to do"
    context.log.info(f"Batch done: {summary}.")
    metadata: dict[str, Any] = {kind.lower(): dg.MetadataValue.int(n) for kind, n in counts.items()}
    if outcomes:
        metadata["executions"] = _outcome_table(outcomes)
    if not rows and ids:
        context.log.info(
            f"This run owns none of its {len(ids)} execution(s) (e.g. a re-execution of finished work) and did "
            "nothing; `marketing-pipelines executions retry ID` runs a failed or cancelled execution again."
        )
    failed = [o for o in outcomes if o.outcome == "FAILED"]
    if failed:
        # Every outcome is recorded by now: failing the run changes no row (the run-failure sensor's
        # reconciliation is fenced by status and owner), it makes the failure show where Dagster users
        # look: the run's status, the Runs page's "Failed" filter, run-failure sensors and alerts.
        raise dg.Failure(description=failure_description(failed, len(outcomes)), metadata=metadata)
    if counts.get("RESCHEDULED"):
        context.log.warning(
            f"{counts['RESCHEDULED']} execution(s) failed an attempt and are rescheduled; the run succeeds because "
            "a retry is coming (an execution that fails its last attempt fails its run)."
        )
    return dg.Output(counts, metadata=metadata)


# How many failed executions a run's failure message names; the outcome table lists them all.
FAILURE_MESSAGE_EXECUTIONS = 20


def failure_description(failed: Sequence[ExecutionOutcome], total: int) -> str:
    """The run's failure message: which executions FAILED (id, campaign, reason), as a person may read it.

    A reason may quote a receiver's answer: URLs are redacted and control characters written visibly.
    """
    lines = [
        f"{o.execution_id} ({o.campaign_id}/{o.stage}, {o.action}, attempt {o.attempt}): {shown_text(o.detail)[:300]}"
        for o in failed[:FAILURE_MESSAGE_EXECUTIONS]
    ]
    more = len(failed) - len(lines)
    if more:
        lines.append(f"... and {more} more (the outcome table lists every execution)")
    head = f"{len(failed)} of {total} execution(s) FAILED (attempts exhausted or refused); the others' outcomes stand:"
    return "\n".join([head, *(f"- {line}" for line in lines)])


@dg.job(
    name="marketing_execution_job",
    description=(
        "Performs a batch of scheduled marketing executions claimed by due_executions_sensor, each fenced by "
        "its own lease; the output's metadata lists every execution and its outcome."
    ),
    tags={"marketing/kind": "execution"},
    # The work waits on the network and the database: a step subprocess would only add start-up time.
    executor_def=dg.in_process_executor,
)
def marketing_execution_job() -> None:
    perform_executions()
