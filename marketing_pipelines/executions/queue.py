"""The execution queue: scheduling (one or a file), retrying, listing, its LeaseQueue and each execution's attempts.

A webhook's header values are stored sealed under MARKETING_SECRETS_KEY (``actions.seal_headers``); scheduling
one without a key is refused, and ``reseal_execution_headers`` seals them again after a key rotation.
"""

from __future__ import annotations

import functools
import json
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

import sqlalchemy as sa
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, model_validator

from marketing_pipelines.db.campaigns import require_campaign
from marketing_pipelines.db.engine import insert_ignoring_conflicts, one_of
from marketing_pipelines.db.schema import EXECUTION_STATUSES, marketing_execution, marketing_execution_attempt
from marketing_pipelines.egress import PUBLIC_ONLY, EgressPolicy
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.executions.actions import InvalidPayload, get_action, reseal_headers, seal_headers
from marketing_pipelines.executions.endpoints import refuse_user_info, require_endpoint
from marketing_pipelines.leasing.lease import MAX_LOST_ATTEMPTS, RETRYABLE, RUNNING, LeaseQueue, cancel, now_expr
from marketing_pipelines.sealing import KEY_SETTING, KeySource, SealingError, SecretBox
from marketing_pipelines.strict_json import check_depth, loads_json, refuse_lone_surrogates


def _action_began() -> sa.ColumnElement[bool]:
    """Whether an execution's current attempt reached its action (``begin_attempts`` recorded it)."""
    a, t = marketing_execution_attempt, marketing_execution
    return sa.exists().where(a.c.execution_id == t.c.id, a.c.attempt == t.c.attempts, a.c.began_at.is_not(None))


EXECUTIONS = LeaseQueue(
    table=marketing_execution,
    ready_status="SCHEDULED",
    due_column="due_at",
    error_column="last_error",
    retry_moves_due=True,
    claim_columns=("id", "campaign_id", "stage", "action", "attempts"),
    row_noun="Execution",
    action_began=_action_began,
)
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_ATTEMPTS = 100
STAGE_MAX = 64
DEDUPE_KEY_MAX = 200  # the column's length


def parse_due(value: str) -> datetime:
    """Parse ``now`` or an ISO-8601 time; a time without an offset is refused, not guessed."""
    if value.strip().lower() == "now":
        return datetime.now(UTC)
    return parse_time(value, "due time", alternatives=" or 'now'")


def parse_time(value: str, name: str, alternatives: str = "") -> datetime:
    """Parse an ISO-8601 time with a UTC offset into UTC; errors name ``name`` and the value."""
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(f"{name} {value!r} is not ISO-8601 (e.g. 2026-12-01T09:00:00+00:00){alternatives}") from None
    if parsed.tzinfo is None:
        raise InvalidInput(f"{name} {value!r} has no UTC offset; add one, e.g. {parsed.isoformat()}+00:00")
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise InvalidInput(f"{name} {value!r} is out of range in UTC") from None


def execution_with_dedupe_key(conn: sa.Connection, dedupe_key: str) -> int | None:
    """The id of the execution scheduled with ``dedupe_key``, if any."""
    t = marketing_execution
    return conn.execute(sa.select(t.c.id).where(t.c.dedupe_key == dedupe_key)).scalar_one_or_none()


def schedule_execution(
    conn: sa.Connection,
    *,
    campaign_id: str,
    stage: str,
    action: str,
    due_at: datetime,
    payload: Mapping[str, Any] | None = None,
    max_attempts: int = 3,
    dedupe_key: str | None = None,
    egress: EgressPolicy = PUBLIC_ONLY,
    keys: Callable[[], KeySource] | None = None,
) -> int:
    """Validate and insert one SCHEDULED execution; returns its id.

    With ``dedupe_key``, scheduling the same key again returns the existing id instead of a
    second row, so a caller that retries its request cannot double-schedule. ``egress`` is where a
    webhook may go: the caller's deployment's policy (``cli.common.cli_webhook_policy()`` at the command line,
    the run's ``webhook`` resource in an agent's tool); left out, only public addresses, as with
    MARKETING_WEBHOOK_ALLOW_NETWORKS unset.

    A webhook's header values are stored sealed with ``keys`` (called only then): the command line's
    ``Settings.sealing_keys``, a run's ``WebhookClient.sealing_keys``. Left out, or finding no key, a payload
    with headers is refused in one line naming MARKETING_SECRETS_KEY; like ``egress``, keys are never read
    from the caller's environment here. The dedupe key is the caller's (an agent's is hashed over the
    plaintext payload, ``agents.catalog.agent_execution_key``), never the stored tokens, which differ at
    each sealing.
    """
    payload = dict(payload or {})
    for name, text in (("campaign", campaign_id), ("stage", stage), ("action", action), ("dedupe_key", dedupe_key)):
        if text is not None and "\x00" in text:
            raise InvalidInput(f"{name} holds a NUL character, which PostgreSQL cannot store")
        # Before the first statement: a driver asked to send one raises UnicodeEncodeError, not a refusal.
        refuse_lone_surrogates(text, name)
    refuse_lone_surrogates(payload, "payload")
    require_campaign(conn, campaign_id)
    if not stage or len(stage) > STAGE_MAX:
        raise InvalidInput(f"stage {stage!r} must be 1-{STAGE_MAX} characters")
    if dedupe_key is not None and not 1 <= len(dedupe_key) <= DEDUPE_KEY_MAX:
        raise InvalidInput(f"dedupe_key must be 1-{DEDUPE_KEY_MAX} characters, got {len(dedupe_key)}")
    # A repeat of a request already scheduled gets the first one's id before the checks below: its own
    # values would not be stored, so checking them (the endpoint's lookup, a policy changed since) could
    # only turn the repeat's answer into an error. The INSERT below settles the race of first requests.
    existing = execution_with_dedupe_key(conn, dedupe_key) if dedupe_key is not None else None
    if existing is not None:
        return existing
    if not 1 <= max_attempts <= MAX_ATTEMPTS:
        raise InvalidInput(f"max_attempts must be from 1 to {MAX_ATTEMPTS}, got {max_attempts}")
    if due_at.tzinfo is None:
        raise InvalidInput("due_at must be timezone-aware")
    try:
        check_depth(payload)  # a Python caller's payload: validating and json.dumps recurse per level
    except ValueError as exc:
        raise InvalidInput(f"payload is {exc}") from None
    try:
        get_action(action).validate(payload, egress)
    except InvalidPayload as exc:
        raise InvalidInput(str(exc)) from None
    if action == "webhook" and "endpoint" in payload:
        require_endpoint(conn, payload["endpoint"], campaign_id)
    try:
        encoded = json.dumps(payload, allow_nan=False)
    except ValueError:
        raise InvalidInput("payload holds NaN or Infinity, which is not JSON") from None
    if len(encoded) > MAX_PAYLOAD_BYTES:
        raise InvalidInput(f"payload is larger than {MAX_PAYLOAD_BYTES} bytes")
    if _holds_nul(payload):
        raise InvalidInput("payload holds a NUL character (\\u0000), which PostgreSQL cannot store")
    # Sealed last: every check above (the size limit included) is of the payload as its scheduler wrote it.
    if action == "webhook" and payload.get("headers"):
        payload["headers"] = seal_headers(payload["headers"], _header_box(keys))
    t = marketing_execution
    now = datetime.now(UTC)
    # One statement, not a lookup then an INSERT: of concurrent first requests with one key, one inserts
    # and the others (PostgreSQL makes them wait for its commit) insert nothing, instead of an IntegrityError.
    inserted = conn.execute(
        insert_ignoring_conflicts(conn, t, t.c.dedupe_key)
        .values(
            campaign_id=campaign_id,
            stage=stage,
            action=action,
            payload=payload,
            due_at=due_at,
            status="SCHEDULED",
            attempts=0,
            max_attempts=max_attempts,
            dedupe_key=dedupe_key,
            created_at=now,
            updated_at=now,
        )
        .returning(t.c.id)
    ).scalar_one_or_none()
    if inserted is not None:
        return inserted
    # Only dedupe_key can conflict (a NULL key never does), and executions are never deleted.
    winner = execution_with_dedupe_key(conn, dedupe_key) if dedupe_key is not None else None
    if winner is None:
        raise RuntimeError(f"dedupe_key {dedupe_key!r} conflicted on insert but names no execution")
    return winner


def _header_box(keys: Callable[[], KeySource] | None) -> SecretBox:
    """What seals a webhook's header values, or InvalidInput in one line naming the key's source."""
    if keys is None:
        raise InvalidInput(
            f"a webhook payload's header values are stored encrypted under {KEY_SETTING}, and this caller holds "
            "no key; schedule it with `marketing-pipelines executions schedule`, or send to a registered endpoint "
            "without headers"
        )
    try:
        source = keys()
        if source.text is None:
            raise InvalidInput(
                f"{source.missing}: a webhook payload's header values are stored encrypted; create a key with "
                f"`marketing-pipelines webhooks new-key` and export it as {KEY_SETTING}, or put the credential "
                "in a registered endpoint (`webhooks add`)"
            )
        return SecretBox.of(source)
    except SealingError as exc:
        raise InvalidInput(str(exc)) from None


def reseal_execution_headers(conn: sa.Connection, box: SecretBox, chunk: int = 500) -> int:
    """Seal every webhook execution's header values under ``box``'s first key: tokens sealed under an older
    key again, and the plain values of executions scheduled before header values were sealed, whatever the
    execution's status. Returns how many executions changed; SealingError (naming the execution) when a token
    opens with none of the keys, and the caller's transaction then rolls back every change: all or nothing.
    """
    t = marketing_execution
    changed, after = 0, 0
    while True:
        rows = conn.execute(
            sa.select(t.c.id, t.c.payload).where(t.c.action == "webhook", t.c.id > after).order_by(t.c.id).limit(chunk)
        ).all()
        if not rows:
            return changed
        after = rows[-1].id
        for row in rows:
            headers = row.payload.get("headers") if isinstance(row.payload, dict) else None
            if not isinstance(headers, dict) or not headers:
                continue
            try:
                resealed = reseal_headers(headers, box)
            except SealingError as exc:
                raise SealingError(
                    f"execution {row.id}: {exc}; give the key it was sealed with after the new one (new,old) to "
                    "reseal; nothing was changed"
                ) from None
            # The payload is written once when scheduled and never changed after, but by this: no fence needed.
            conn.execute(sa.update(t).where(t.c.id == row.id).values(payload={**row.payload, "headers": resealed}))
            changed += 1


def list_executions(
    conn: sa.Connection, status: str | None = None, campaign_id: str | None = None, limit: int = 200
) -> list[sa.RowMapping]:
    t = marketing_execution
    query = sa.select(t).order_by(t.c.due_at, t.c.id).limit(limit)
    if status is not None:
        if status not in EXECUTION_STATUSES:
            raise InvalidInput(f"status {status!r} is not one of {', '.join(EXECUTION_STATUSES)}")
        query = query.where(t.c.status == status)
    if campaign_id is not None:
        query = query.where(t.c.campaign_id == campaign_id)
    return list(conn.execute(query).mappings())


def get_execution(conn: sa.Connection, execution_id: int) -> sa.RowMapping | None:
    t = marketing_execution
    return conn.execute(sa.select(t).where(t.c.id == execution_id)).mappings().one_or_none()


def start_attempts(conn: sa.Connection, rows: Sequence[Mapping[str, Any]], run_id: str) -> None:
    """Record that ``run_id`` started each row's current attempt (rows as ``take_over_many`` returns them).

    A retried step of the same run starts the same attempt again; that keeps the first row.
    """
    if not rows:
        return
    a = marketing_execution_attempt
    now = datetime.now(UTC)
    if conn.dialect.name == "postgresql":
        # One statement over two arrays: executemany would send one INSERT per row (a round trip
        # each), and a VALUES list as long as the batch takes SQLAlchemy longer to compile than to run.
        ids, attempts = [r["id"] for r in rows], [r["attempts"] for r in rows]
        conn.execute(_start_attempts_pg(), {"ids": ids, "attempts": attempts, "run_id": run_id, "now": now})
        return
    conn.execute(
        insert_ignoring_conflicts(conn, a, a.c.execution_id, a.c.attempt),
        [{"execution_id": r["id"], "attempt": r["attempts"], "run_id": run_id, "started_at": now} for r in rows],
    )


@functools.cache
def _start_attempts_pg() -> sa.Insert:
    from sqlalchemy.dialects import postgresql

    a = marketing_execution_attempt
    picked = sa.select(
        sa.func.unnest(sa.bindparam("ids", type_=postgresql.ARRAY(sa.BigInteger()))),
        sa.func.unnest(sa.bindparam("attempts", type_=postgresql.ARRAY(sa.Integer()))),
        sa.bindparam("run_id", type_=sa.String()),
        sa.bindparam("now", type_=a.c.started_at.type),
    )
    return (
        postgresql.insert(a)
        .from_select(["execution_id", "attempt", "run_id", "started_at"], picked)
        .on_conflict_do_nothing(index_elements=[a.c.execution_id, a.c.attempt])
    )


def begin_attempts(conn: sa.Connection, execution_ids: Sequence[int], owner: str) -> set[int]:
    """Record that the actions of these executions' current attempts begin now, in one statement; the ids recorded.

    Only executions still RUNNING under ``owner`` with a live lease: a worker begins no action on a row it
    lost (its run was failed and the row handed back) or whose lease ran out while it waited on this machine.
    An attempt whose action began is a try at the receiver: lost, not handed back, if its run dies now.
    """
    if not execution_ids:
        return set()
    a, t = marketing_execution_attempt, marketing_execution
    ours = sa.select(t.c.id, t.c.attempts).where(
        one_of(conn, t.c.id, execution_ids),
        t.c.status == RUNNING,
        t.c.lease_owner == owner,
        t.c.lease_expires_at > now_expr(conn),
    )
    stmt = (
        sa.update(a)
        .where(sa.tuple_(a.c.execution_id, a.c.attempt).in_(ours))
        .values(began_at=sa.func.coalesce(a.c.began_at, now_expr(conn)))
        .returning(a.c.execution_id)
    )
    return set(conn.execute(stmt).scalars())


def forget_unbegun_attempts(conn: sa.Connection, execution_ids: Iterable[int]) -> None:
    """Delete the attempt rows of these executions past their attempts: attempts handed back, never begun.

    A hand-back gives its attempt number back, and the next take-over opens that number again.
    """
    ids = list(execution_ids)
    if not ids:
        return
    a, t = marketing_execution_attempt, marketing_execution
    attempts = sa.select(t.c.attempts).where(t.c.id == a.c.execution_id).scalar_subquery()
    conn.execute(sa.delete(a).where(a.c.execution_id.in_(ids), a.c.attempt > attempts, a.c.began_at.is_(None)))


def failure_cause(execution: Mapping[str, Any], refused: bool | None = None) -> str | None:
    """Why a FAILED execution failed, with its counts (an execution's row as read); None for any other status.

    Attempts with an outcome are those not lost (``attempts - lost_attempts``); the runs that handed it back
    before its action began spent none (``handed_back``), and never make it FAILED. ``refused``: whether its
    last attempt was refused, when the caller knows (the run that recorded it); else a FAILED execution with
    attempts left is taken to have been refused, as nothing else ends one early.
    """
    if execution["status"] != "FAILED":
        return None
    attempts, lost, budget = execution["attempts"], execution["lost_attempts"], execution["max_attempts"]
    counts = (
        f"{attempts - lost} attempt(s) with an outcome, {lost} lost after the action began, "
        f"{execution['handed_back']} run(s) that never began it (not attempts)"
    )
    if refused is None:
        refused = lost < MAX_LOST_ATTEMPTS and attempts < budget
    if lost >= MAX_LOST_ATTEMPTS and not refused:
        cause = f"its attempts were lost after the action began {lost} times (the limit is {MAX_LOST_ATTEMPTS})"
    elif not refused:
        cause = f"its action failed every attempt it had ({attempts - lost} of {budget - lost})"
    else:
        cause = "its action was refused (e.g. its destination is not allowed), which no retry changes"
    return f"{cause}; {counts}"


def attempt_outcome(status: str) -> str:
    """The attempt's outcome for the status its execution moved to (SCHEDULED again: RESCHEDULED)."""
    return "RESCHEDULED" if status == EXECUTIONS.ready_status else status


def end_attempt(conn: sa.Connection, execution_id: int, attempt: int, outcome: str, error: str | None) -> None:
    """Record an attempt's outcome, once: a later report about the same attempt changes nothing."""
    a = marketing_execution_attempt
    conn.execute(
        sa.update(a)
        .where(a.c.execution_id == execution_id, a.c.attempt == attempt, a.c.outcome.is_(None))
        .values(outcome=outcome, error=error, finished_at=datetime.now(UTC))
    )


def end_attempts(conn: sa.Connection, attempts: Sequence[tuple[int, int]], outcome: str) -> None:
    """``end_attempt`` for many (execution_id, attempt) pairs with one outcome and no error, in one statement."""
    if not attempts:
        return
    a = marketing_execution_attempt
    pairs: Any = list(attempts)
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects import postgresql  # as in insert_ignoring_conflicts

        # Two arrays zipped by the server, as in start_attempts: two parameters, not two per attempt.
        ids, numbers = zip(*attempts, strict=True)
        pairs = sa.select(
            sa.func.unnest(sa.bindparam(None, list(ids), type_=postgresql.ARRAY(sa.BigInteger()))),
            sa.func.unnest(sa.bindparam(None, list(numbers), type_=postgresql.ARRAY(sa.Integer()))),
        )
    conn.execute(
        sa.update(a)
        .where(sa.tuple_(a.c.execution_id, a.c.attempt).in_(pairs), a.c.outcome.is_(None))
        .values(outcome=outcome, error=None, finished_at=datetime.now(UTC))
    )


def end_open_attempts(conn: sa.Connection, execution_ids: Iterable[int], outcome: str, error: str) -> None:
    """Close every attempt of these executions still open (e.g. after their leases expired)."""
    ids = list(execution_ids)
    if not ids:
        return
    a = marketing_execution_attempt
    conn.execute(
        sa.update(a)
        .where(a.c.execution_id.in_(ids), a.c.outcome.is_(None))
        .values(outcome=outcome, error=error, finished_at=datetime.now(UTC))
    )


def list_attempts(conn: sa.Connection, execution_id: int) -> list[sa.RowMapping]:
    a = marketing_execution_attempt
    query = sa.select(a).where(a.c.execution_id == execution_id).order_by(a.c.attempt)
    return list(conn.execute(query).mappings())


def cancel_execution(conn: sa.Connection, execution_id: int, reason: str) -> str:
    """Cancel a SCHEDULED or RUNNING execution; returns the status it had.

    A RUNNING execution's batch run is not stopped (it performs other executions too): its next
    lease renewal or its outcome finds the row CANCELLED and records nothing. An action already
    in flight may still complete once.
    """
    row = get_execution(conn, execution_id)
    if row is None:
        raise InvalidInput(f"execution {execution_id} does not exist; see marketing-pipelines executions list")
    cancelled = cancel(conn, EXECUTIONS, execution_id, reason)
    if cancelled is None:
        raise InvalidInput(
            f"execution {execution_id} is already {row['status']}; "
            "only SCHEDULED or RUNNING executions can be cancelled"
        )
    end_open_attempts(conn, [execution_id], "CANCELLED", reason)
    return cancelled.status


def refuse_webhook_user_info(action: str, payload: Mapping[str, Any]) -> None:
    """Refuse a webhook's raw ``url`` with ``user:password@``, as ``webhooks add`` refuses it for an endpoint
    (``endpoints.refuse_user_info``). Checked where a person writes the payload (the command line, each line of a
    schedule file); ``schedule_execution`` still takes one from Python code, which the redaction tests use to
    plant such a URL (test_no_secret_shown.py).
    """
    url = payload.get("url") if action == "webhook" else None
    if isinstance(url, str):
        refuse_user_info(url, "webhook 'url'", "the payload")


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_nul(v) for v in value)
    return False


# --- retry -------------------------------------------------------------------------------------

# Each retry adds a budget of at most MAX_ATTEMPTS on top of the attempts already made (attempt
# numbers go on counting: they key the attempt history). Ten full budgets is far beyond any
# transient failure; an execution past it needs its action or payload fixed, not more attempts.
MAX_TOTAL_ATTEMPTS = 10 * MAX_ATTEMPTS


@dataclass(frozen=True)
class Retried:
    ids: tuple[int, ...]
    # Matching executions left FAILED/CANCELLED: another budget would take them past MAX_TOTAL_ATTEMPTS.
    over_cap: int


def _check_budget(budget: int) -> None:
    if not 1 <= budget <= MAX_ATTEMPTS:
        raise InvalidInput(f"max_attempts must be from 1 to {MAX_ATTEMPTS}, got {budget}")


def _rescheduled(conn: sa.Connection, budget: int) -> dict[str, Any]:
    """The values that put a finished execution back in the queue, due now, with ``budget`` more attempts.

    The id, and with it the webhook's Idempotency-Key, stays the same: a receiver that already
    got the effect recognises the redelivery.
    """
    t = marketing_execution
    return {
        "status": EXECUTIONS.ready_status,
        "due_at": now_expr(conn),
        "max_attempts": t.c.attempts + budget,
        "last_error": None,
        "unstarted_runs": 0,
        "finished_at": None,
        "lease_owner": None,
        "lease_expires_at": None,
        "updated_at": now_expr(conn),
    }


def retry_execution(conn: sa.Connection, execution_id: int, budget: int) -> str:
    """Put a FAILED or CANCELLED execution back to SCHEDULED, due now, with ``budget`` more attempts.

    Returns the status it had. Refused (InvalidInput naming the status) for any other status, so
    of two concurrent retries of one execution the second finds it SCHEDULED and changes nothing.
    """
    _check_budget(budget)
    t = marketing_execution
    # Locked, so the status read is the one the UPDATE below expects (SQLite: BEGIN IMMEDIATE).
    row = conn.execute(
        sa.select(t.c.status, t.c.attempts).where(t.c.id == execution_id).with_for_update()
    ).one_or_none()
    if row is None:
        raise InvalidInput(f"execution {execution_id} does not exist; see marketing-pipelines executions list")
    if row.status not in RETRYABLE:
        raise InvalidInput(
            f"execution {execution_id} is {row.status}; only FAILED or CANCELLED executions can be retried"
        )
    if row.attempts + budget > MAX_TOTAL_ATTEMPTS:
        raise InvalidInput(
            f"execution {execution_id} has made {row.attempts} attempts; {budget} more would pass the limit "
            f"of {MAX_TOTAL_ATTEMPTS}: fix its action or payload and schedule it anew"
        )
    updated = conn.execute(
        sa.update(t)
        .where(t.c.id == execution_id, t.c.status == row.status, t.c.attempts == row.attempts)
        .values(_rescheduled(conn, budget))
    ).rowcount
    if updated != 1:
        raise InvalidInput(f"execution {execution_id} changed while it was being retried; see executions show")
    return str(row.status)


def retry_executions(
    conn: sa.Connection,
    *,
    budget: int,
    campaign_id: str | None = None,
    finished_since: datetime | None = None,
    include_cancelled: bool = False,
) -> Retried:
    """Retry every FAILED (and, if asked, CANCELLED) execution that matches, in one statement.

    ``finished_since`` filters on ``finished_at`` (when the execution failed or was cancelled).
    """
    _check_budget(budget)
    if finished_since is not None and finished_since.tzinfo is None:
        raise InvalidInput("finished_since must be timezone-aware")
    t = marketing_execution
    statuses = list(RETRYABLE) if include_cancelled else ["FAILED"]
    matching = [t.c.status.in_(statuses)]
    if campaign_id is not None:
        require_campaign(conn, campaign_id)
        matching.append(t.c.campaign_id == campaign_id)
    if finished_since is not None:
        matching.append(t.c.finished_at >= finished_since)
    within_cap = t.c.attempts <= MAX_TOTAL_ATTEMPTS - budget
    ids = conn.execute(
        sa.update(t).where(*matching, within_cap).values(_rescheduled(conn, budget)).returning(t.c.id)
    ).scalars()
    over_cap = conn.execute(sa.select(sa.func.count()).where(*matching, sa.not_(within_cap))).scalar_one()
    return Retried(ids=tuple(sorted(ids)), over_cap=over_cap)


# --- schedule from a file ----------------------------------------------------------------------

MAX_FILE_LINES = 10_000
MAX_FILE_BYTES = 64 * 1024 * 1024
# A payload at its limit plus the other keys, with room for JSON escapes.
MAX_LINE_BYTES = 2 * MAX_PAYLOAD_BYTES


class ScheduleLine(BaseModel):
    """One line of ``executions schedule --file``: the options of ``executions schedule`` as a JSON object."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    campaign: str = Field(validation_alias=AliasChoices("campaign", "campaign_id"))
    stage: str
    action: str
    due: str
    payload: dict[str, Any] = Field(default_factory=dict)
    max_attempts: int | None = Field(None, ge=1, le=MAX_ATTEMPTS)
    dedupe_key: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_campaign_key(cls, data: Any) -> Any:
        if isinstance(data, dict) and "campaign" in data and "campaign_id" in data:
            raise ValueError("give campaign or campaign_id, not both")
        return data


SCHEDULE_LINE_KEYS = ("campaign", "campaign_id", "stage", "action", "due", "payload", "max_attempts", "dedupe_key")


@dataclass(frozen=True)
class ParsedLine:
    number: int
    line: ScheduleLine
    due_at: datetime


@dataclass(frozen=True)
class LineError:
    number: int
    reason: str


@dataclass(frozen=True)
class ScheduledFile:
    new: tuple[int, ...]
    # Lines whose dedupe_key named an execution scheduled before: its id, nothing written.
    existing: tuple[int, ...]
    errors: tuple[LineError, ...]


def _validation_reason(exc: ValidationError) -> str:
    reasons = []
    for error in exc.errors(include_url=False)[:3]:
        field = ".".join(str(part) for part in error["loc"])
        if error["type"] == "extra_forbidden":
            reasons.append(f"unknown key {field!r} (known: {', '.join(SCHEDULE_LINE_KEYS)})")
        elif error["type"] == "missing":
            reasons.append(f"missing key {field!r}")
        else:
            message = str(error["msg"]).removeprefix("Value error, ")
            reasons.append(f"{field}: {message}" if field else message)
    return "; ".join(reasons)


def parse_schedule_line(number: int, raw: bytes) -> ParsedLine | LineError:
    """Validate one line of a schedule file, without the database."""
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff" if number == 1 else "")
    except UnicodeDecodeError:
        return LineError(number, "is not UTF-8")
    try:
        parsed = loads_json(text)
    except json.JSONDecodeError as exc:
        return LineError(number, f"is not valid JSON: {exc.msg} at column {exc.colno}")
    except ValueError as exc:  # NaN, Infinity, 1e400
        return LineError(number, f"is not valid JSON: {exc}")
    if not isinstance(parsed, dict):
        return LineError(number, f"must be a JSON object, got {type(parsed).__name__}")
    try:
        line = ScheduleLine.model_validate(parsed)
        refuse_webhook_user_info(line.action, line.payload)
        return ParsedLine(number, line, parse_due(line.due))
    except ValidationError as exc:
        return LineError(number, _validation_reason(exc))
    except InvalidInput as exc:
        return LineError(number, str(exc))


def read_schedule_file(stream: IO[bytes]) -> list[ParsedLine | LineError]:
    """Every non-blank line of a JSON Lines stream, validated; raises InvalidInput past the file's limits.

    The limits are checked while reading, before anything is scheduled, so a file past them
    schedules nothing.
    """
    data = _read_bounded(stream)
    lines: list[ParsedLine | LineError] = []
    # Blank lines are skipped by the regular expression, not one by one in Python: read a line at a time,
    # 64 MiB of newlines took 100 s to be refused; skipped so, a fraction of a second.
    position, number = 0, 1  # ``position`` starts line ``number``
    while (found := _NOT_WHITE_SPACE.search(data, position)) is not None:
        newline = data.rfind(b"\n", position, found.start())
        start = position if newline < 0 else newline + 1
        end = data.find(b"\n", found.start())
        end = len(data) if end < 0 else end
        number += data.count(b"\n", position, start)
        raw = data[start:end]
        if len(raw) > MAX_LINE_BYTES:
            lines.append(LineError(number, f"is longer than {MAX_LINE_BYTES // 1024} KiB"))
        else:
            lines.append(parse_schedule_line(number, bytes(raw)))
        if len(lines) > MAX_FILE_LINES:
            raise InvalidInput(f"file has more than {MAX_FILE_LINES} lines; split it (nothing was scheduled)")
        position, number = end + 1, number + 1
    return lines


# bytes.strip()'s white space: a line of these alone is blank.
_NOT_WHITE_SPACE = re.compile(rb"[^ \t\n\r\x0b\x0c]")
_READ_CHUNK = 1024 * 1024


def _read_bounded(stream: IO[bytes]) -> bytearray:
    """The whole stream, or InvalidInput as soon as it passes MAX_FILE_BYTES (a file by its size, unread)."""
    too_large = InvalidInput(f"file is larger than {MAX_FILE_BYTES // 2**20} MiB; split it (nothing was scheduled)")
    try:
        status = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):  # no file behind it (a test's BytesIO)
        status = None
    if status is not None and stat.S_ISREG(status.st_mode) and status.st_size > MAX_FILE_BYTES:
        raise too_large
    data = bytearray()
    # Bounded reads: a stream with no end (stdin from /dev/zero) must still stop at the bound.
    while chunk := stream.read(_READ_CHUNK):
        data += chunk
        if len(data) > MAX_FILE_BYTES:
            raise too_large
    return data


def schedule_lines(
    conn: sa.Connection,
    lines: Sequence[ParsedLine | LineError],
    *,
    default_max_attempts: int,
    egress: EgressPolicy = PUBLIC_ONLY,
    keys: Callable[[], KeySource] | None = None,
) -> ScheduledFile:
    """Schedule each valid line in its own savepoint, so a line the database refuses costs only itself.

    ``keys`` seal webhook header values, as in ``schedule_execution``; read once for the file.
    """
    keys = functools.cache(keys) if keys is not None else None
    new: list[int] = []
    existing: list[int] = []
    errors = [line for line in lines if isinstance(line, LineError)]
    for parsed in lines:
        if isinstance(parsed, LineError):
            continue
        line, key = parsed.line, parsed.line.dedupe_key
        try:
            with conn.begin_nested():
                # For the summary only: schedule_execution returns a concurrent scheduler's row for the same
                # key (never an IntegrityError), which a line that lost that race then counts as new.
                known = execution_with_dedupe_key(conn, key) if key is not None else None
                execution_id = schedule_execution(
                    conn,
                    campaign_id=line.campaign,
                    stage=line.stage,
                    action=line.action,
                    due_at=parsed.due_at,
                    payload=line.payload,
                    max_attempts=line.max_attempts or default_max_attempts,
                    dedupe_key=key,
                    egress=egress,
                    keys=keys,
                )
        except InvalidInput as exc:
            errors.append(LineError(parsed.number, str(exc)))
            continue
        (existing if known is not None else new).append(execution_id)
    return ScheduledFile(new=tuple(new), existing=tuple(existing), errors=tuple(sorted(errors, key=lambda e: e.number)))
