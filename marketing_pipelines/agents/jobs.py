"""``agent_run_job``: performs one claimed agent run in the ``agent_runs`` concurrency pool and shows its
output and transcript in the run's metadata; an agent run that ends FAILED fails its Dagster run.

Every wait of the run (a model-call token, a provider's ``Retry-After``, a step retried later) ends before
the run's deadline, and a worker whose Dagster run is no longer STARTED (run monitoring failed it at
``dagster/max_runtime``, or an operator terminated it) stops instead of waiting on (``RunClock``).
"""

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines import run_tags
from marketing_pipelines.agents import costs
from marketing_pipelines.agents.admission import TOKEN_WAIT_S, LimitsGate
from marketing_pipelines.agents.catalog import get_agent
from marketing_pipelines.agents.display import output_markdown, transcript_markdown
from marketing_pipelines.agents.models import pick_provider
from marketing_pipelines.agents.providers.anthropic import AnthropicModel
from marketing_pipelines.agents.providers.base import HTTPModel, RequestRejected, SpendLimitReached
from marketing_pipelines.agents.providers.offline import OfflineModel
from marketing_pipelines.agents.providers.openai import OpenAIModel
from marketing_pipelines.agents.providers.registry import ProviderResource
from marketing_pipelines.agents.providers.types import ModelProvider
from marketing_pipelines.agents.queue import AGENT_RUNS, Transcript, get_agent_run, transcript
from marketing_pipelines.agents.resources import AgentSettings
from marketing_pipelines.agents.runner import AgentResult, AgentStopped, LeaseLost, RunLimits, run_agent_loop
from marketing_pipelines.agents.users import get_user
from marketing_pipelines.db import token_bucket
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.http import RateLimited, ServiceError
from marketing_pipelines.leasing.claims import run_ended_check, take_over_rows
from marketing_pipelines.leasing.lease import LeaseKeeper, finish, retry_or_fail
from marketing_pipelines.redact import hide_secrets, redact_text, shown_text

OP_NAME = "run_agent"
POOL = "agent_runs"
MAX_STEPS = 8
RATE_LIMIT_RETRIES = 20
# How long a waiting worker goes at most without asking the instance whether its run is still STARTED.
STATUS_CHECK_S = 5.0


class RunEnded(RuntimeError):
    """The Dagster run is no longer STARTED: run monitoring failed it, or it was terminated. Its worker stops."""


class OutOfTime(RuntimeError):
    """A wait would end past the run's deadline."""


@dataclass
class RunClock:
    """The run's deadline, and the waits that must end before it (``providers.base.WaitLimit``).

    The deadline is the Dagster run's start plus the agent run's ``max_run_seconds``: a step retried within the
    run (``RetryRequested``) keeps it, as run monitoring keeps ``dagster/max_runtime`` (that plus the grace)
    from the same start. A wait is made in slices of at most ``STATUS_CHECK_S``, the run's status read before
    and after each: a worker sleeping past a run that monitoring already failed held its memory for nothing.
    """

    instance: dg.DagsterInstance
    run_id: str
    deadline: float  # time.monotonic() value
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = field(default=time.monotonic)

    @classmethod
    def of_run(cls, context: dg.OpExecutionContext, max_run_seconds: float) -> "RunClock":
        record = context.instance.get_run_record_by_id(context.run_id)
        started = record.start_time if record is not None and record.start_time is not None else time.time()
        deadline = time.monotonic() + (started + max_run_seconds - time.time())
        return cls(context.instance, context.run_id, deadline)

    def seconds_left(self) -> float:
        return self.deadline - self.clock()

    def check(self) -> None:
        run = self.instance.get_run_by_id(self.run_id)
        status = run.status if run is not None else None
        if status != dg.DagsterRunStatus.STARTED:
            raise RunEnded(f"the Dagster run is {status.value if status else 'gone'}, no longer STARTED")

    def wait(self, seconds: float, sleep: Callable[[float], None] | None = None) -> None:
        left = self.seconds_left()
        if seconds > left:
            raise OutOfTime(f"a wait of {seconds:.1f}s would end past the run's deadline ({max(left, 0):.1f}s left)")
        self.check()
        while seconds > 0:
            step = min(seconds, STATUS_CHECK_S)
            (sleep or self.sleep)(step)
            seconds -= step
            self.check()

    def fits(self, seconds: float) -> bool:
        """Whether a step retried after ``seconds`` still has time to work: at least ``TOKEN_WAIT_S`` (the
        longest it may wait for its next token) before the deadline. Else the wait is not worth this run."""
        return seconds + TOKEN_WAIT_S < self.seconds_left()


@contextmanager
def waits_bounded(provider: ModelProvider, clock: RunClock) -> Iterator[None]:
    """Within the block, the provider's waits between tries are the run's (the offline provider makes none)."""
    with provider.waits_bounded_by(clock) if isinstance(provider, HTTPModel) else nullcontext():
        yield


class AgentRunConfig(dg.Config):
    agent_run_id: int
    claimed_by: str


def run_metadata(
    engine: sa.Engine, agent_run_id: int, attempt: int, result: AgentResult | None = None
) -> dict[str, dg.MetadataValue]:
    """What the Dagster UI shows of an agent run that ended: this attempt's transcript and its output, if any."""
    with engine.connect() as conn:
        steps = transcript(conn, agent_run_id, attempt)
        # The run's tokens and cost over all its attempts: what it cost to get here, shown on every outcome (none
        # for a row gone meanwhile, e.g. purged: the outcome is still shown).
        try:
            cost = costs.cost_metadata(conn, agent_run_id)
        except InvalidInput:
            cost = {}
    metadata: dict[str, dg.MetadataValue] = {
        "transcript": dg.MetadataValue.md(transcript_markdown(steps, agent_run_id, attempt)),
        **cost,
    }
    if result is not None:
        metadata["output"] = dg.MetadataValue.md(output_markdown(result.text, agent_run_id))
        metadata["steps"] = dg.MetadataValue.int(result.steps)
        metadata["tool_calls"] = dg.MetadataValue.int(result.tool_calls)
        metadata["denials"] = dg.MetadataValue.int(result.denials)
        # Of the denials, the calls past the agent's budget: a model asking far more than its task needs.
        metadata["over_budget"] = dg.MetadataValue.int(result.over_budget)
    return metadata


@dataclass(frozen=True)
class AgentAttempt:
    """One attempt of an agent run, taken over by this Dagster run: how each way it ends is recorded and shown.

    Every outcome is written under ``owner`` (the run's lease), so a run that lost the row records
    nothing; a FAILED agent run fails the Dagster run, so it shows where Dagster users look.
    """

    context: dg.OpExecutionContext
    engine: sa.Engine
    agent_run_id: int
    owner: str
    attempt: int

    def metadata(self, result: AgentResult | None = None) -> dict[str, dg.MetadataValue]:
        return run_metadata(self.engine, self.agent_run_id, self.attempt, result)

    def provider(self, name: str, providers: Mapping[str, ProviderResource]) -> ModelProvider:
        """The provider the run asked for; one that is unknown or not configured fails the run for good."""
        try:
            return pick_provider(name, providers)
        except ServiceError as exc:
            # Every attempt would meet the same configuration, so this one is the last, whatever is left.
            raise self.fail(
                f"model provider {exc}; not retried, as every attempt would fail the same way. "
                f"After the fix: marketing-pipelines agents retry {self.agent_run_id}"
            ) from None

    def gate(self, row: sa.RowMapping, provider: ModelProvider, settings: AgentSettings, clock: RunClock) -> LimitsGate:
        """The run's ``ModelGate``: each call admitted by the provider's limits (its wait ending before the run's
        deadline, and stopping when the run is no longer STARTED), its budgets and its cost recorded."""
        return LimitsGate(
            engine=self.engine,
            provider=row["model_provider"],
            model=provider.model,
            agent_run_id=self.agent_run_id,
            campaign_id=row["campaign_id"],
            requested_by=row["requested_by"],
            default_limits=settings.default_limits(),
            prices=settings.model_prices,
            max_wait_s=lambda: min(TOKEN_WAIT_S, clock.seconds_left()),
            sleep=clock.wait,
            log=self.context.log.info,
        )

    def fail(self, reason: str) -> dg.Failure:
        """FAILED for good (no attempt would do better): recorded, and the Dagster run's failure."""
        with self.engine.begin() as conn:
            # Redacted when stored, as an execution's last_error is: alerts and a database dump read it too.
            error = {"error": redact_text(reason)}
            recorded = finish(conn, AGENT_RUNS, self.agent_run_id, self.owner, "FAILED", error)
        suffix = "" if recorded else " (not recorded: lease lost)"
        return dg.Failure(
            description=shown_text(f"Agent run {self.agent_run_id} FAILED: {reason}{suffix}"),
            metadata=self.metadata(),
        )

    def attempt_failed(self, exc: ServiceError, steps: Transcript, provider_name: str) -> dg.Failure:
        """The provider failed this attempt: retried if attempts are left, else FAILED; the run fails either way."""
        error = redact_text(str(exc))
        steps.add("error", provider_name, {"error": error})
        with self.engine.begin() as conn:
            status = retry_or_fail(conn, AGENT_RUNS, self.agent_run_id, self.owner, error, retry_delay_s=0)
        now = status or "not recorded: lease lost"
        return dg.Failure(
            description=shown_text(f"Agent run {self.agent_run_id} attempt {self.attempt} failed ({exc}); now {now}."),
            metadata=self.metadata(),
        )

    def succeeded(self, result: AgentResult) -> dg.Output[dict[str, Any]]:
        with self.engine.begin() as conn:
            # A key the model repeated is not stored; an earlier attempt's error is not this run's outcome.
            output = {"output": hide_secrets(asdict(result)), "error": None}
            recorded = finish(conn, AGENT_RUNS, self.agent_run_id, self.owner, "SUCCEEDED", output)
        if not recorded:
            # The result is lost with the lease; whoever holds the row now records its outcome.
            raise dg.Failure(
                description=f"Agent run {self.agent_run_id}: lease lost before recording the result.",
                metadata=self.metadata(result),
            )
        self.context.log.info(
            f"Agent run {self.agent_run_id} SUCCEEDED: {result.steps} model turn(s), {result.tool_calls} tool call(s), "
            f"{result.denials} refused."
        )
        return dg.Output({"agent_run_id": self.agent_run_id, "outcome": "SUCCEEDED"}, metadata=self.metadata(result))

    def handed_back(self, exc: RateLimited | token_bucket.ModelRateLimited, left: float) -> dg.Output[dict[str, Any]]:
        """A rate limit longer than the run has left: back in the queue, the attempt not spent; the run stays green.

        Nothing failed: a throttle made the run wait. The attempt counts as lost (``retry_or_fail(lost=True)``),
        so a provider that throttles every attempt ends the agent run FAILED after ``MAX_LOST_ATTEMPTS``.
        """
        why = f"{exc}; the wait is past this run's deadline ({max(left, 0):.0f}s left): handed back, attempt not spent"
        with self.engine.begin() as conn:
            status = retry_or_fail(conn, AGENT_RUNS, self.agent_run_id, self.owner, redact_text(why), 0, lost=True)
        message = shown_text(f"Agent run {self.agent_run_id}: {why}; now {status or 'not recorded: lease lost'}.")
        if status == "FAILED":
            raise dg.Failure(description=message, metadata=self.metadata())
        self.context.log.warning(message)
        return dg.Output(
            {"agent_run_id": self.agent_run_id, "outcome": "handed back"},
            metadata={"outcome": "handed back", "status": str(status), **self.metadata()},
        )

    def lease_lost(self, why: str) -> dg.Output[dict[str, Any]]:
        """The loop stopped because the row is no longer this run's: fail the run if the agent run ended FAILED.

        Whoever took the row recorded its state: an operator's cancel (CANCELLED), or the expiry of this
        run's lease, which requeued the row (the attempt lost, not spent) or, at MAX_LOST_ATTEMPTS,
        FAILED it. Otherwise this run recorded nothing and stays green, saying why.
        """
        with self.engine.connect() as conn:
            row = get_agent_run(conn, self.agent_run_id)
        status = row["status"] if row is not None else "gone"
        message = f"Agent run {self.agent_run_id}: {why}; it is {status} now and this run recorded nothing."
        if status == "FAILED":
            raise dg.Failure(
                description=shown_text(f"{message} Its error: {row['error'] if row is not None else ''}"),
                metadata=self.metadata(),
            )
        self.context.log.warning(shown_text(message))
        return dg.Output(
            {"agent_run_id": self.agent_run_id, "outcome": "stopped"},
            metadata={"outcome": "stopped", "status": status, **self.metadata()},
        )


def _skipped(agent_run_id: int, state: str) -> dg.Output[dict[str, Any]]:
    # take_over_rows logged the row's state: this run changed nothing, so it may stay green.
    return dg.Output(
        {"agent_run_id": agent_run_id, "outcome": "skipped"},
        metadata={"outcome": "skipped", "reason": f"agent run {agent_run_id} {state}; this run does not own it"},
    )


@dg.op(
    name=OP_NAME,
    pool=POOL,
    description="Run one queued agent run as its requester, in the agent_runs concurrency pool.",
)
def run_agent(
    context: dg.OpExecutionContext,
    config: AgentRunConfig,
    app_db: AppDatabase,
    agent_settings: AgentSettings,
    # One parameter per provider of registry.PROVIDERS, named by its resource key (test_model_resources
    # holds the two equal): each provider is its own resource in the UI, with its own config.
    offline_model: OfflineModel,
    anthropic_model: AnthropicModel,
    openai_model: OpenAIModel,
    # Its destination policy (MARKETING_WEBHOOK_ALLOW_NETWORKS) bounds what the schedule_execution tool may
    # schedule, as it bounds what the executions job sends.
    webhook: WebhookClient,
) -> dg.Output[dict[str, Any]]:
    engine, agent_run_id, lease_s = app_db.ready_engine(), config.agent_run_id, agent_settings.lease_grace_seconds
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
        return _skipped(agent_run_id, taken.skipped.get(agent_run_id, ""))
    [row], user = taken.rows, users[agent_run_id]
    attempt = AgentAttempt(context, engine, agent_run_id, taken.owner, row["attempts"])
    if user is None or not user.active:
        raise attempt.fail(f"user {row['requested_by']} is not active; runs of inactive users do not start")
    providers = {"offline_model": offline_model, "anthropic_model": anthropic_model, "openai_model": openai_model}
    provider = attempt.provider(row["model_provider"], providers)
    # The requester's and agent's names are as they were stored: shown with their controls visible, as every line.
    context.log.info(
        shown_text(
            f"Agent run {agent_run_id}: agent {row['agent']} for campaign {row['campaign_id']}, "
            f"as {row['requested_by']}, provider {row['model_provider']}, attempt {attempt.attempt} of "
            f"{row['max_attempts']}, time limit {row['max_run_seconds']}s."
        )
    )

    steps = Transcript(engine, agent_run_id, attempt.attempt)
    clock = RunClock.of_run(context, row["max_run_seconds"])
    gate = attempt.gate(row, provider, agent_settings, clock)
    # The keeper stops renewing once Dagster ended the run (run_ended_check), so the run-failure sensor's
    # shortened lease (leasing.claims.reconcile_run) is not lengthened again by a worker on its way out.
    with LeaseKeeper(
        engine,
        AGENT_RUNS,
        agent_run_id,
        taken.owner,
        lease_s,
        on_lost=context.log.warning,
        run_ended=run_ended_check(context.instance, context.run_id),
        on_stopped=context.log.warning,
    ) as keeper:
        limits = RunLimits(MAX_STEPS, clock.deadline, is_cancelled=keeper.lost.is_set)
        try:
            clock.check()  # a step retried after a wait: the run may have been failed meanwhile
            with waits_bounded(provider, clock):
                result = run_agent_loop(
                    engine=engine,
                    definition=get_agent(row["agent"]),
                    run=row,
                    provider=provider,
                    transcript=steps,
                    limits=limits,
                    gate=gate,
                    egress=webhook.policy(),
                    sealing_keys=webhook.sealing_keys,
                    # What the loop logs quotes the model's tool calls and refusals, which may hold secrets.
                    log=lambda message: context.log.info(shown_text(message)),
                )
        except RunEnded as exc:
            # Whoever ended the run (monitoring, an operator) hands its agent run back (the run-failure and
            # run-canceled sensors); this worker only stops, without writing.
            raise dg.Failure(description=shown_text(f"Agent run {agent_run_id}: {exc}; this worker stops.")) from None
        except OutOfTime as exc:
            raise attempt.fail(f"stopped at the time limit (max_run_seconds): {exc}") from None
        except LeaseLost as exc:
            return attempt.lease_lost(str(exc))
        except AgentStopped as exc:
            raise attempt.fail(str(exc)) from None
        except (SpendLimitReached, RequestRejected) as exc:
            # No retry fixes these: the provider's spend limit or credit, or a request it will always refuse.
            what = (
                "the provider's spend limit" if isinstance(exc, SpendLimitReached) else "a request the provider refuses"
            )
            raise attempt.fail(
                f"{what}: {exc}; not retried. After the fix: marketing-pipelines agents retry {agent_run_id}"
            ) from None
        except (token_bucket.ModelRateLimited, RateLimited) as exc:
            wait = exc.retry_after_s
            if isinstance(exc, RateLimited):
                # Told by the provider: every replica's calls to this model wait it out, not only this one's.
                gate.throttled(wait, exc.rate_limits)
            if not clock.fits(wait):
                return attempt.handed_back(exc, clock.seconds_left())
            context.log.info(shown_text(f"Agent run {agent_run_id}: {exc}; retrying this step in {wait:.0f}s."))
            # The row stays RUNNING under this run for the wait and its usual lease after it, so the
            # retried step takes it over again instead of finding it requeued (and the claiming sensor
            # does not take a run that is waiting on purpose for one whose worker died).
            keeper.hold_for(wait + lease_s)
            raise dg.RetryRequested(max_retries=RATE_LIMIT_RETRIES, seconds_to_wait=wait) from exc
        except ServiceError as exc:
            raise attempt.attempt_failed(exc, steps, row["model_provider"]) from None
    return attempt.succeeded(result)


@dg.job(
    name="agent_run_job",
    description="Performs one queued agent run claimed by queued_agent_runs_sensor.",
    tags={run_tags.KIND: "agent_run"},
    # The agent waits on the model's API and the database: a step subprocess would only add start-up
    # time. The in-process executor claims the agent_runs pool slot just as the multiprocess one does.
    executor_def=dg.in_process_executor,
)
def agent_run_job() -> None:
    run_agent()
