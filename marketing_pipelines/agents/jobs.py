"""``agent_run_job``: performs one claimed agent run in the ``agent_runs`` concurrency pool and shows its
output and transcript in the run's metadata; an agent run that ends FAILED fails its Dagster run."""

import time
from typing import Any

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines.agents import token_bucket
from marketing_pipelines.agents.catalog import get_agent
from marketing_pipelines.agents.display import output_markdown, transcript_markdown
from marketing_pipelines.agents.models import ModelGateway
from marketing_pipelines.agents.queue import AGENT_RUNS, Transcript, get_agent_run, transcript
from marketing_pipelines.agents.resources import AgentSettings
from marketing_pipelines.agents.runner import AgentResult, AgentStopped, LeaseLost, RunLimits, run_agent_loop
from marketing_pipelines.agents.users import get_user
from marketing_pipelines.db.lease import LeaseKeeper, finish, retry_or_fail
from marketing_pipelines.db.leased_runs import take_over_rows
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.http import RateLimited, ServiceError
from marketing_pipelines.redact import redact_text, shown_text

OP_NAME = "run_agent"
POOL = "agent_runs"
MAX_STEPS = 8
# How long one model call may wait for a token before the step is retried later instead.
TOKEN_WAIT_S = 20.0
RATE_LIMIT_RETRIES = 20


class AgentRunConfig(dg.Config):
    agent_run_id: int
    claimed_by: str


def run_metadata(
    engine: sa.Engine, agent_run_id: int, attempt: int, result: AgentResult | None = None
) -> dict[str, dg.MetadataValue]:
    """What the Dagster UI shows of an agent run that ended: this attempt's transcript and its output, if any."""
    with engine.connect() as conn:
        steps = transcript(conn, agent_run_id, attempt)
    metadata: dict[str, dg.MetadataValue] = {
        "transcript": dg.MetadataValue.md(transcript_markdown(steps, agent_run_id, attempt))
    }
    if result is not None:
        metadata["output"] = dg.MetadataValue.md(output_markdown(result.text, agent_run_id))
        metadata["steps"] = dg.MetadataValue.int(result.steps)
        metadata["tool_calls"] = dg.MetadataValue.int(result.tool_calls)
        metadata["denials"] = dg.MetadataValue.int(result.denials)
    return metadata


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
        # take_over_rows logged the row's state: this run changed nothing, so it may stay green.
        state = taken.skipped.get(agent_run_id, "")
        return dg.Output(
            {"agent_run_id": agent_run_id, "outcome": "skipped"},
            metadata={"outcome": "skipped", "reason": f"agent run {agent_run_id} {state}; this run does not own it"},
        )
    owner, [row] = taken.owner, taken.rows
    user = users[agent_run_id]
    attempt = row["attempts"]

    def fail(reason: str) -> dg.Failure:
        with engine.begin() as conn:
            # Redacted when stored, as an execution's last_error is: alerts and a database dump read it too.
            recorded = finish(conn, AGENT_RUNS, agent_run_id, owner, "FAILED", {"error": redact_text(reason)})
        suffix = "" if recorded else " (not recorded: lease lost)"
        return dg.Failure(
            description=shown_text(f"Agent run {agent_run_id} FAILED: {reason}{suffix}"),
            metadata=run_metadata(engine, agent_run_id, attempt),
        )

    if user is None or not user.active:
        raise fail(f"user {row['requested_by']} is not active; runs of inactive users do not start")
    try:
        provider = models.provider(row["model_provider"])
    except ServiceError as exc:
        # Every attempt would meet the same configuration, so this one is the last, whatever is left.
        raise fail(
            f"model provider {exc}; not retried, as every attempt would fail the same way. "
            f"After the fix: marketing-pipelines agents retry {agent_run_id}"
        ) from None

    context.log.info(
        f"Agent run {agent_run_id}: agent {row['agent']} for campaign {row['campaign_id']}, "
        f"as {row['requested_by']}, provider {row['model_provider']}, attempt {attempt} of "
        f"{row['max_attempts']}, time limit {row['max_run_seconds']}s."
    )

    def acquire_token() -> None:
        waited = token_bucket.acquire(
            engine, row["model_provider"], agent_settings.max_model_calls_per_minute, max_wait_s=TOKEN_WAIT_S
        )
        if waited > 0.5:
            context.log.info(f"Waited {waited:.1f}s for a {row['model_provider']} model-call token.")

    steps = Transcript(engine, agent_run_id, attempt)
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
                transcript=steps,
                limits=limits,
                acquire_model_token=acquire_token,
                # What the loop logs quotes the model's tool calls and refusals, which may hold secrets.
                log=lambda message: context.log.info(shown_text(message)),
            )
        except LeaseLost as exc:
            return lease_lost(context, engine, agent_run_id, attempt, str(exc))
        except AgentStopped as exc:
            raise fail(str(exc)) from None
        except (token_bucket.ModelRateLimited, RateLimited) as exc:
            wait = exc.retry_after_s
            context.log.info(shown_text(f"Agent run {agent_run_id}: {exc}; retrying this step in {wait:.0f}s."))
            # The row stays RUNNING under this run for the wait and its usual lease after it, so the
            # retried step takes it over again instead of finding it requeued (and the claiming sensor
            # does not take a run that is waiting on purpose for one whose worker died).
            keeper.hold_for(wait + lease_s)
            raise dg.RetryRequested(max_retries=RATE_LIMIT_RETRIES, seconds_to_wait=wait) from exc
        except ServiceError as exc:
            error = redact_text(str(exc))
            steps.add("error", row["model_provider"], {"error": error})
            with engine.begin() as conn:
                status = retry_or_fail(conn, AGENT_RUNS, agent_run_id, owner, error, retry_delay_s=0)
            now = status or "not recorded: lease lost"
            raise dg.Failure(
                description=shown_text(f"Agent run {agent_run_id} attempt {attempt} failed ({exc}); now {now}."),
                metadata=run_metadata(engine, agent_run_id, attempt),
            ) from None

    with engine.begin() as conn:
        recorded = finish(conn, AGENT_RUNS, agent_run_id, owner, "SUCCEEDED", {"output": result.as_output()})
    if not recorded:
        # The result is lost with the lease; whoever holds the row now records its outcome.
        raise dg.Failure(
            description=f"Agent run {agent_run_id}: lease lost before recording the result.",
            metadata=run_metadata(engine, agent_run_id, attempt, result),
        )
    context.log.info(
        f"Agent run {agent_run_id} SUCCEEDED: {result.steps} model turn(s), {result.tool_calls} tool call(s), "
        f"{result.denials} refused."
    )
    return dg.Output(
        {"agent_run_id": agent_run_id, "outcome": "SUCCEEDED"},
        metadata=run_metadata(engine, agent_run_id, attempt, result),
    )


def lease_lost(
    context: dg.OpExecutionContext, engine: sa.Engine, agent_run_id: int, attempt: int, why: str
) -> dg.Output[dict[str, Any]]:
    """The loop stopped because the row is no longer this run's: fail the run if the agent run ended FAILED.

    Whoever took the row recorded its state: an operator's cancel (CANCELLED), or the expiry of this
    run's lease, which requeued the row (the attempt lost, not spent) or, at MAX_LOST_ATTEMPTS,
    FAILED it. A FAILED agent run fails its Dagster run, so the failure shows where Dagster users
    look; otherwise this run recorded nothing and stays green, saying why.
    """
    with engine.connect() as conn:
        row = get_agent_run(conn, agent_run_id)
    status = row["status"] if row is not None else "gone"
    message = f"Agent run {agent_run_id}: {why}; it is {status} now and this run recorded nothing."
    if status == "FAILED":
        raise dg.Failure(
            description=shown_text(f"{message} Its error: {row['error'] if row is not None else ''}"),
            metadata=run_metadata(engine, agent_run_id, attempt),
        )
    context.log.warning(message)
    return dg.Output(
        {"agent_run_id": agent_run_id, "outcome": "stopped"},
        metadata={"outcome": "stopped", "status": status, **run_metadata(engine, agent_run_id, attempt)},
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
