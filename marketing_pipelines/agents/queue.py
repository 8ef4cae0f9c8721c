"""The agent-run queue: request (never run inline; a refusal is kept as a REFUSED row), list, show, cancel,
retry, and the transcript."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from marketing_pipelines.agents.budget_reads import admission_refusal
from marketing_pipelines.agents.users import Grant, User, current_grants, grants_on_campaign, holds, require_user
from marketing_pipelines.db.campaigns import require_campaign
from marketing_pipelines.db.schema import AGENT_RUN_STATUSES, agent_run, agent_run_step
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.leasing.lease import RETRYABLE, LeaseQueue, cancel
from marketing_pipelines.redact import hide_secrets
from marketing_pipelines.settings import MODEL_PROVIDERS, Settings
from marketing_pipelines.strict_json import refuse_lone_surrogates

if TYPE_CHECKING:
    from marketing_pipelines.agents.catalog import AgentDefinition

# The catalog (its tools import the executions queue and its pydantic models, about 25 ms) is imported by the
# functions that request or retry a run: `agents list`, `show` and `cancel` read rows only.

AGENT_RUNS = LeaseQueue(
    table=agent_run,
    ready_status="QUEUED",
    due_column="requested_at",
    error_column="error",
    retry_moves_due=False,  # a retried run keeps its place in the queue
    started_column="started_at",
    claim_columns=("id", "agent", "campaign_id", "requested_by", "attempts", "max_run_seconds"),
    row_noun="Agent run",
)
MAX_INPUT_BYTES = 16 * 1024
DEFAULT_MAX_ATTEMPTS = 2


class AgentRunRefused(InvalidInput):
    """A request refused for who asked (inactive, or no permission on the campaign), kept as a REFUSED agent run.

    The REFUSED row is written in the caller's transaction before this is raised: a caller that
    keeps the trace commits, then re-raises (the command line does).
    """

    def __init__(self, reason: str, agent_run_id: int) -> None:
        super().__init__(f"{reason} (recorded as agent run {agent_run_id}, REFUSED)")
        self.reason = reason
        self.agent_run_id = agent_run_id


def configured_provider_problem(provider: str, settings: Settings) -> str | None:
    """Why ``provider`` cannot be used in this deployment, or None when it can."""
    # Deferred: the registry loads every provider's Dagster resource and httpx, which the command
    # line's read commands (list, show, retry) import this module without needing.
    from marketing_pipelines.agents.providers.registry import provider_spec

    spec = provider_spec(provider)
    if spec is None:
        return f"unknown model provider {provider!r}; known: {', '.join(MODEL_PROVIDERS)}"
    missing = spec.missing_key(settings)
    if missing:
        return f"model provider {provider!r} is not configured: set {missing}"
    return None


def _checked_request(
    definition: AgentDefinition,
    input: Mapping[str, Any] | None,
    provider: str,
    max_run_seconds: int,
    max_attempts: int,
    settings: Settings,
) -> dict[str, Any]:
    """The request's input as the agent accepts it; InvalidInput names the first thing that is wrong."""
    payload = definition.validate_input(dict(input or {}))
    # No database stores a lone surrogate (PostgreSQL's json refuses it mid-insert): refused here, in one line.
    refuse_lone_surrogates(payload, "input")
    if len(json.dumps(payload)) > MAX_INPUT_BYTES:
        raise InvalidInput(f"input is larger than {MAX_INPUT_BYTES} bytes")
    # The requester's deployment's settings: a provider without a key is refused at once, not at run time.
    problem = configured_provider_problem(provider, settings)
    if problem:
        raise InvalidInput(problem)
    if not 1 <= max_run_seconds <= 86_400:
        raise InvalidInput(f"max_run_seconds must be from 1 to 86400, got {max_run_seconds}")
    if not 1 <= max_attempts <= 100:
        raise InvalidInput(f"max_attempts must be from 1 to 100, got {max_attempts}")
    return payload


def request_agent_run(
    conn: sa.Connection,
    *,
    agent: str,
    campaign_id: str,
    requested_by: str,
    input: Mapping[str, Any] | None = None,
    provider: str = "offline",
    max_run_seconds: int = 300,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    settings: Settings,
) -> int:
    """Validate a request, capture the requester's current permissions on the campaign, insert a QUEUED row.

    Returns the agent run id. The agent never runs here: queued_agent_runs_sensor claims the row and a
    Dagster run performs it, so a request survives restarts and obeys the concurrency pool.

    Invalid input raises ``InvalidInput`` and writes nothing. A valid request that its requester may
    not make inserts a REFUSED row (never claimed: a claim takes only QUEUED) and raises
    ``AgentRunRefused``, so a refusal leaves a trace that ``agents list`` shows.
    """
    from marketing_pipelines.agents.catalog import get_agent

    definition = get_agent(agent)
    payload = _checked_request(definition, input, provider, max_run_seconds, max_attempts, settings)
    require_campaign(conn, campaign_id)
    user = require_user(conn, requested_by)
    grants, refusal = requester_refusal(conn, user, campaign_id, definition)
    now = datetime.now(UTC)
    if refusal is None:
        # A budget already used up today refuses the run now, not at its first model call.
        refusal = admission_refusal(conn, campaign_id=campaign_id, requested_by=requested_by, day=now.date())
    run_id = conn.execute(
        sa.insert(agent_run)
        .values(
            agent=agent,
            campaign_id=campaign_id,
            input=payload,
            status="QUEUED" if refusal is None else "REFUSED",
            requested_by=requested_by,
            permissions=[g.to_json() for g in grants],
            model_provider=provider,
            requested_at=now,
            attempts=0,
            max_attempts=max_attempts,
            max_run_seconds=max_run_seconds,
            error=refusal,
            finished_at=None if refusal is None else now,
            updated_at=now,
        )
        .returning(agent_run.c.id)
    ).scalar_one()
    if refusal is not None:
        # Refused now, not after a run in which every tool call would be denied.
        raise AgentRunRefused(refusal, run_id)
    return run_id


def requester_refusal(
    conn: sa.Connection, user: User, campaign_id: str, definition: AgentDefinition
) -> tuple[list[Grant], str | None]:
    """The user's grants on ``campaign_id`` now, and why they may not run ``definition`` there (None when they may).

    Only grants on the run's campaign are returned (a global one narrowed to it): they are what the
    run captures, so nothing the model is steered to ask can reach another campaign.
    """
    from marketing_pipelines.agents.catalog import TOOLS

    grants = grants_on_campaign(current_grants(conn, user.id), campaign_id)
    if not user.active:
        return grants, f"user {user.id!r} is not active and cannot request agent runs"
    needed = sorted({TOOLS[name].permission for name in definition.tools})
    if not any(holds(grants, permission, campaign_id) for permission in needed):
        return grants, (
            f"user {user.id!r} holds no permission on campaign {campaign_id!r} that agent {definition.name!r} uses "
            f"({', '.join(needed)}); grant one with: marketing-pipelines users grant {user.id} "
            f"{needed[0]} --campaign {campaign_id}"
        )
    return grants, None


def get_agent_run(conn: sa.Connection, run_id: int) -> sa.RowMapping | None:
    return conn.execute(sa.select(agent_run).where(agent_run.c.id == run_id)).mappings().one_or_none()


def require_agent_run(conn: sa.Connection, run_id: int) -> sa.RowMapping:
    row = get_agent_run(conn, run_id)
    if row is None:
        raise InvalidInput(f"unknown agent run {run_id}")
    return row


def list_agent_runs(
    conn: sa.Connection, status: str | None = None, requested_by: str | None = None, limit: int = 200
) -> list[sa.RowMapping]:
    query = sa.select(agent_run).order_by(agent_run.c.id.desc()).limit(limit)
    if status is not None:
        if status not in AGENT_RUN_STATUSES:
            raise InvalidInput(f"status {status!r} is not one of {', '.join(AGENT_RUN_STATUSES)}")
        query = query.where(agent_run.c.status == status)
    if requested_by is not None:
        query = query.where(agent_run.c.requested_by == requested_by)
    return list(conn.execute(query).mappings())


def running_count(conn: sa.Connection) -> int:
    return conn.execute(sa.select(sa.func.count()).where(agent_run.c.status == "RUNNING")).scalar_one()


@dataclass(frozen=True)
class CancelResult:
    previous_status: str
    run_id: str | None


def cancel_agent_run(conn: sa.Connection, run_id: int, reason: str) -> CancelResult:
    row = require_agent_run(conn, run_id)
    cancelled = cancel(conn, AGENT_RUNS, run_id, reason)
    if cancelled is None:
        raise InvalidInput(
            f"agent run {run_id} is already {row['status']}; only QUEUED or RUNNING runs can be cancelled"
        )
    return CancelResult(cancelled.status, cancelled.run_id)


@dataclass(frozen=True)
class RetryResult:
    previous_status: str
    attempts: int
    max_attempts: int


def retry_agent_run(conn: sa.Connection, run_id: int, attempts: int = DEFAULT_MAX_ATTEMPTS) -> RetryResult:
    """Queue a FAILED or CANCELLED agent run again, as its requester, with ``attempts`` more attempts.

    The requester must still be active and hold a permission the agent uses on the campaign, and the budgets
    that apply must have room left today; the grants are captured again, as at a request. Attempt numbers keep
    counting (they key the transcript), so the budget is raised to attempts so far + ``attempts``. The row has no column
    for the budget it was requested with; ``attempts`` defaults to the one a request gets.
    A REFUSED request never ran and is not retried: a new request is the way.
    """
    if not 1 <= attempts <= 100:
        raise InvalidInput(f"attempts must be from 1 to 100, got {attempts}")
    row = require_agent_run(conn, run_id)
    if row["status"] == "REFUSED":
        raise InvalidInput(
            f"agent run {run_id} was REFUSED when requested and cannot be retried; once the user may run it, "
            "request it again with `marketing-pipelines agents request`"
        )
    if row["status"] not in RETRYABLE:
        raise InvalidInput(f"agent run {run_id} is {row['status']}; only FAILED or CANCELLED runs can be retried")
    # The provider's configuration is not checked here: what counts is the code location's, which
    # this process cannot see (a run whose provider is not configured fails at once, naming the fix).
    from marketing_pipelines.agents.catalog import get_agent

    grants, refusal = requester_refusal(
        conn, require_user(conn, row["requested_by"]), row["campaign_id"], get_agent(row["agent"])
    )
    now = datetime.now(UTC)
    if refusal is None:
        # As at a request: a budget already used up today refuses the retry now, not at its first model call.
        refusal = admission_refusal(
            conn, campaign_id=row["campaign_id"], requested_by=row["requested_by"], day=now.date()
        )
    if refusal is not None:
        raise InvalidInput(f"agent run {run_id} not retried: {refusal}")
    t = agent_run
    moved = conn.execute(
        sa.update(t)
        # Fenced by status: of two retries at once, the second matches nothing and says so below.
        .where(t.c.id == run_id, t.c.status.in_(RETRYABLE))
        .values(
            status="QUEUED",
            max_attempts=t.c.attempts + attempts,
            permissions=[g.to_json() for g in grants],
            # A retry queues behind what was requested before it instead of jumping the queue, and
            # queue health measures a queued run's wait from requested_at: the old time would report
            # a retried run as waiting since its first request.
            requested_at=now,
            error=None,
            output=None,
            run_id=None,
            lease_owner=None,
            lease_expires_at=None,
            started_at=None,
            finished_at=None,
            updated_at=now,
        )
        .returning(t.c.attempts, t.c.max_attempts)
    ).one_or_none()
    if moved is None:
        status = require_agent_run(conn, run_id)["status"]
        raise InvalidInput(f"agent run {run_id} is {status} now; only FAILED or CANCELLED runs can be retried")
    return RetryResult(row["status"], moved.attempts, moved.max_attempts)


def transcript(conn: sa.Connection, run_id: int, attempt: int | None = None) -> list[sa.RowMapping]:
    """The run's steps in order: every attempt's, or one ``attempt``'s."""
    s = agent_run_step
    query = sa.select(s.c.attempt, s.c.seq, s.c.kind, s.c.name, s.c.content, s.c.created_at).where(
        s.c.agent_run_id == run_id
    )
    if attempt is not None:
        query = query.where(s.c.attempt == attempt)
    return list(conn.execute(query.order_by(s.c.attempt, s.c.seq)).mappings())


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its name (``"NaN"``, ``"Infinity"``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


class Transcript:
    """Appends one attempt's steps, each in its own short transaction or in the caller's; reads the run's steps.

    Committing step by step means a run that is killed mid-way still leaves what it did (and
    which tool calls it made) readable with ``agents show``, and the next attempt resumes from it.
    """

    def __init__(self, engine: sa.Engine, run_id: int, attempt: int) -> None:
        self._engine, self._run_id, self._attempt = engine, run_id, attempt

    def steps(self) -> list[sa.RowMapping]:
        """Every step of the run so far, every attempt's, in order."""
        with self._engine.connect() as conn:
            return transcript(conn, self._run_id)

    def add(self, kind: str, name: str | None, content: Any, conn: sa.Connection | None = None) -> None:
        """Record a step, in ``conn``'s transaction when given (it commits or rolls back with the caller's writes)."""
        # Model output may hold NaN or Infinity, which is not JSON: stored as text, never refused
        # by PostgreSQL mid-run nor written as invalid JSON by SQLite. A secret the process holds (a key the model
        # or a tool's answer repeats, whole, cut or re-encoded) is hidden before it is stored.
        content = hide_secrets(json_safe(content))
        s = agent_run_step
        # Numbered in the statement from the attempt's last step: a step Dagster retried within the attempt, or a
        # step whose caller's transaction rolled back, leaves no gap and no duplicate. One writer per attempt (the
        # row's lease holder), so the read and the insert do not race.
        seq = (
            sa.select(sa.func.coalesce(sa.func.max(s.c.seq), 0) + 1)
            .where(s.c.agent_run_id == self._run_id, s.c.attempt == self._attempt)
            .scalar_subquery()
        )
        insert = sa.insert(s).values(
            agent_run_id=self._run_id,
            attempt=self._attempt,
            seq=seq,
            kind=kind,
            name=name,
            content=content,
            created_at=datetime.now(UTC),
        )
        if conn is not None:
            conn.execute(insert)
            return
        with self._engine.begin() as own:
            own.execute(insert)
