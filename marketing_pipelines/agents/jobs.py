"""``agent_run_job``: performs one claimed agent run in the ``agent_runs`` concurrency pool."""

import time
from typing import Any

import dagster as dg

from marketing_pipelines.agents import token_bucket
from marketing_pipelines.agents.catalog import get_agent
from marketing_pipelines.agents.models import ModelGateway
from marketing_pipelines.agents.queue import AGENT_RUNS, Transcript
from marketing_pipelines.agents.resources import AgentSettings
from marketing_pipelines.agents.runner import AgentStopped, LeaseLost, RunLimits, run_agent_loop
from marketing_pipelines.agents.users import get_user
from marketing_pipelines.db.lease import LeaseKeeper, finish, retry_or_fail
from marketing_pipelines.db.leased_runs import take_over_rows
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.http import RateLimited, ServiceError

OP_NAME = "run_agent"
POOL = "agent_runs"
MAX_STEPS = 8
# How long one model call may wait for a token before the step is retried later instead.
TOKEN_WAIT_S = 20.0
RATE_LIMIT_RETRIES = 20


class AgentRunConfig(dg.Config):
    agent_run_id: int
    claimed_by: str


@dg.op(
    name=OP_NAME,
    pool=POOL,
    description="Run one queued agent run as its requester, in the agent_runs concurrency pool.",
)
def run_agent(
    context: dg.OpExecutionContext,
    config: AgentRunConfig,
    app_db: AppDatabase,
    models: ModelGateway,
    agent_settings: AgentSettings,
) -> dg.Output[dict[str, Any]]:
    engine = app_db.ready_engine()
    agent_run_id = config.agent_run_id
    lease_s = agent_settings.lease_grace_seconds
    users: dict[int, Any] = {}
    taken = take_over_rows(
        engine,
        AGENT_RUNS,
        [agent_run_id],
        claimed_by=config.claimed_by,
        run_id=context.run_id,
        lease_seconds=lease_s,
        log=context.log.info,
        # The requester is read with the take-over: a user deactivated since the request stops the run.
        also=lambda conn, rows: users.update({r["id"]: get_user(conn, r["requested_by"]) for r in rows}),
    )
    if not taken.rows:
        return dg.Output({"agent_run_id": agent_run_id, "outcome": "skipped"}, metadata={"outcome": "skipped"})
    owner, [row] = taken.owner, taken.rows
    user = users[agent_run_id]

    context.log.info(
        f"Agent run {agent_run_id}: agent {row['agent']} for campaign {row['campaign_id']}, "
        f"as {row['requested_by']}, provider {row['model_provider']}, attempt {row['attempts']} of "
        f"{row['max_attempts']}, time limit {row['max_run_seconds']}s."
    )

    def fail(reason: str) -> dg.Failure:
        with engine.begin() as conn:
            recorded = finish(conn, AGENT_RUNS, agent_run_id, owner, "FAILED", {"error": reason})
        suffix = "" if recorded else " (not recorded: lease lost)"
        return dg.Failure(description=f"Agent run {agent_run_id} FAILED: {reason}{suffix}")

    if user is None or not user.active:
        raise fail(f"user {row['requested_by']} is not active; runs of inactive users do not start")
    try:
        provider = models.provider(row["model_provider"])
    except ServiceError as exc:
        raise fail(str(exc)) from None

    def acquire_token() -> None:
        waited = token_bucket.acquire(
            engine, row["model_provider"], agent_settings.max_model_calls_per_minute, max_wait_s=TOKEN_WAIT_S
        )
        if waited > 0.5:
            context.log.info(f"Waited {waited:.1f}s for a {row['model_provider']} model-call token.")

    transcript = Transcript(engine, agent_run_id, row["attempts"])
    with LeaseKeeper(engine, AGENT_RUNS, agent_run_id, owner, lease_s, on_lost=context.log.warning) as keeper:
        limits = RunLimits(
            max_steps=MAX_STEPS,
            deadline=time.monotonic() + row["max_run_seconds"],
            is_cancelled=keeper.lost.is_set,
        )
        try:
            result = run_agent_loop(
                engine=engine,
                definition=get_agent(row["agent"]),
                run=row,
                provider=provider,
                transcript=transcript,
                limits=limits,
                acquire_model_token=acquire_token,
                log=context.log.info,
            )
        except LeaseLost as exc:
            context.log.warning(f"Agent run {agent_run_id}: {exc}. Nothing recorded by this run.")
            return dg.Output({"agent_run_id": agent_run_id, "outcome": "stopped"}, metadata={"outcome": "stopped"})
        except AgentStopped as exc:
            raise fail(str(exc)) from None
        except (token_bucket.ModelRateLimited, RateLimited) as exc:
            wait = exc.retry_after_s
            context.log.info(f"Agent run {agent_run_id}: {exc}; retrying this step in {wait:.0f}s.")
            # The row stays RUNNING under this run; the retried step takes it over again.
            raise dg.RetryRequested(max_retries=RATE_LIMIT_RETRIES, seconds_to_wait=wait) from exc
        except ServiceError as exc:
            transcript.add("error", row["model_provider"], {"error": str(exc)})
            with engine.begin() as conn:
                status = retry_or_fail(conn, AGENT_RUNS, agent_run_id, owner, str(exc), retry_delay_s=0)
            raise dg.Failure(description=f"Agent run {agent_run_id} attempt failed ({exc}); now {status}.") from None

    with engine.begin() as conn:
        recorded = finish(conn, AGENT_RUNS, agent_run_id, owner, "SUCCEEDED", {"output": result.as_output()})
    if not recorded:
        raise dg.Failure(description=f"Agent run {agent_run_id}: lease lost before recording the result.")
    context.log.info(
        f"Agent run {agent_run_id} SUCCEEDED: {result.steps} model turn(s), {result.tool_calls} tool call(s), "
        f"{result.denials} refused."
    )
    return dg.Output(
        {"agent_run_id": agent_run_id, "outcome": "SUCCEEDED"},
        metadata={"steps": result.steps, "tool_calls": result.tool_calls, "denials": result.denials},
    )


@dg.job(
    name="agent_run_job",
    description="Performs one queued agent run claimed by queued_agent_runs_sensor.",
    tags={"marketing/kind": "agent_run"},
    # The agent waits on the model's API and the database: a step subprocess would only add start-up
    # time. The in-process executor claims the agent_runs pool slot just as the multiprocess one does.
    executor_def=dg.in_process_executor,
)
def agent_run_job() -> None:
    run_agent()
