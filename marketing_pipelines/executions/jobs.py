"""``marketing_execution_job``: performs one claimed execution, fenced by its lease."""

from typing import Any

import dagster as dg

from marketing_pipelines.db.lease import LeaseKeeper, describe, finish, retry_or_fail, take_over
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.executions.actions import ActionContext, ActionFailed, WebhookClient, get_action
from marketing_pipelines.executions.queue import EXECUTIONS, get_execution
from marketing_pipelines.settings import Settings

OP_NAME = "run_marketing_execution"


class ExecutionRunConfig(dg.Config):
    execution_id: int
    claimed_by: str  # the sensor's lease owner; the run takes the lease over from it


def run_owner(run_id: str) -> str:
    return f"run:{run_id}"


def retry_delay_seconds(settings: Settings, attempt: int) -> float:
    # Exponential backoff per attempt, capped at an hour so a long-failing webhook is still retried.
    return min(3600.0, settings.retry_backoff_seconds * 2 ** max(0, attempt - 1))


@dg.op(name=OP_NAME, description="Run one claimed marketing execution and record its outcome.")
def run_marketing_execution(
    context: dg.OpExecutionContext, config: ExecutionRunConfig, app_db: AppDatabase, webhook: WebhookClient
) -> dg.Output[dict[str, Any]]:
    settings = Settings.from_env()
    engine = app_db.ready_engine()
    owner = run_owner(context.run_id)
    execution_id = config.execution_id
    with engine.begin() as conn:
        row = take_over(
            conn,
            EXECUTIONS,
            execution_id,
            claimed_by=config.claimed_by,
            new_owner=owner,
            lease_seconds=settings.execution_lease_seconds,
            run_id=context.run_id,
        )
        state = describe(conn, EXECUTIONS, execution_id) if row is None else ""
    if row is None:
        # E.g. a re-execution from the UI of a run whose execution already finished, or a run
        # that started after its claim expired and another attempt took the row.
        context.log.info(f"Execution {execution_id} {state}; this run does not own it and does nothing.")
        return dg.Output({"execution_id": execution_id, "outcome": "skipped"}, metadata={"outcome": "skipped"})

    attempt, max_attempts = row["attempts"], row["max_attempts"]
    context.log.info(
        f"Execution {execution_id}: campaign {row['campaign_id']}, stage {row['stage']}, action {row['action']}, "
        f"attempt {attempt} of {max_attempts}."
    )
    action = get_action(row["action"])
    action_ctx = ActionContext(execution_id, attempt, row["campaign_id"], row["stage"], context.log)
    error: str | None = None
    result: dict[str, Any] = {}
    with LeaseKeeper(
        engine, EXECUTIONS, execution_id, owner, settings.execution_lease_seconds, on_lost=context.log.error
    ) as keeper:
        try:
            result = action.run(action_ctx, row["payload"], webhook)
        except ActionFailed as exc:
            error = str(exc)

    with engine.begin() as conn:
        if error is None and not keeper.lost.is_set():
            recorded = finish(conn, EXECUTIONS, execution_id, owner, "SUCCEEDED", {"last_error": None})
            new_status: str | None = "SUCCEEDED" if recorded else None
        else:
            error = error or "lease lost while the action ran"
            delay = retry_delay_seconds(settings, attempt)
            new_status = retry_or_fail(conn, EXECUTIONS, execution_id, owner, error, delay)
        current = get_execution(conn, execution_id)
        state = describe(conn, EXECUTIONS, execution_id) if new_status is None else ""

    if new_status is None:
        raise dg.Failure(
            description=(
                f"Execution {execution_id} attempt {attempt}: this run lost its lease (it {state}); "
                "its outcome was not recorded. The action may have run; receivers dedupe on the Idempotency-Key."
            )
        )
    if new_status == "SUCCEEDED":
        context.log.info(f"Execution {execution_id} SUCCEEDED on attempt {attempt}.")
        return dg.Output(
            {"execution_id": execution_id, "outcome": "SUCCEEDED", **result},
            metadata={"outcome": "SUCCEEDED", "attempt": attempt},
        )
    if new_status == "FAILED":
        raise dg.Failure(description=f"Execution {execution_id} FAILED after {attempt} attempts: {error}")
    raise dg.Failure(
        description=(
            f"Execution {execution_id} attempt {attempt} of {max_attempts} failed: {error}. "
            f"Rescheduled for {current['due_at'] if current else '?'}."
        )
    )


@dg.job(
    name="marketing_execution_job",
    description="Performs one scheduled marketing execution claimed by due_work_sensor.",
    tags={"marketing/kind": "execution"},
)
def marketing_execution_job() -> None:
    run_marketing_execution()
