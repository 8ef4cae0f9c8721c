"""The execution queue: scheduling, listing, its LeaseQueue description and each execution's attempts."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.db.campaigns import require_campaign
from marketing_pipelines.db.engine import insert_ignoring_conflicts
from marketing_pipelines.db.lease import LeaseQueue, cancel
from marketing_pipelines.db.schema import EXECUTION_STATUSES, marketing_execution, marketing_execution_attempt
from marketing_pipelines.egress import EgressPolicy
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.executions.actions import InvalidPayload, get_action, webhook_policy
from marketing_pipelines.strict_json import parse_json_object

EXECUTIONS = LeaseQueue(
    table=marketing_execution,
    ready_status="SCHEDULED",
    due_column="due_at",
    error_column="last_error",
    retry_moves_due=True,
    claim_columns=("id", "campaign_id", "stage", "action", "attempts"),
    row_noun="Execution",
)
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_ATTEMPTS = 100
STAGE_MAX = 64


def parse_due(value: str) -> datetime:
    """Parse ``now`` or an ISO-8601 time; a time without an offset is refused, not guessed."""
    if value.strip().lower() == "now":
        return datetime.now(UTC)
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(f"due time {value!r} is not ISO-8601 (e.g. 2026-12-01T09:00:00+00:00) or 'now'") from None
    if parsed.tzinfo is None:
        raise InvalidInput(f"due time {value!r} has no UTC offset; add one, e.g. {value}+00:00")
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        raise InvalidInput(f"due time {value!r} is out of range in UTC") from None


def parse_payload(value: str | None) -> dict[str, Any]:
    return parse_json_object(value, "payload")


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
    egress: EgressPolicy | None = None,
) -> int:
    """Validate and insert one SCHEDULED execution; returns its id.

    With ``dedupe_key``, scheduling the same key again returns the existing id instead of a
    second row, so a caller that retries its request cannot double-schedule. ``egress`` is the
    webhook destination policy (default: the settings', MARKETING_WEBHOOK_ALLOW_NETWORKS).
    """
    payload = dict(payload or {})
    require_campaign(conn, campaign_id)
    if not stage or len(stage) > STAGE_MAX:
        raise InvalidInput(f"stage {stage!r} must be 1-{STAGE_MAX} characters")
    if not 1 <= max_attempts <= MAX_ATTEMPTS:
        raise InvalidInput(f"max_attempts must be from 1 to {MAX_ATTEMPTS}, got {max_attempts}")
    if due_at.tzinfo is None:
        raise InvalidInput("due_at must be timezone-aware")
    try:
        get_action(action).validate(payload, egress or webhook_policy())
    except InvalidPayload as exc:
        raise InvalidInput(str(exc)) from None
    try:
        encoded = json.dumps(payload, allow_nan=False)
    except ValueError:
        raise InvalidInput("payload holds NaN or Infinity, which is not JSON") from None
    if len(encoded) > MAX_PAYLOAD_BYTES:
        raise InvalidInput(f"payload is larger than {MAX_PAYLOAD_BYTES} bytes")
    t = marketing_execution
    if dedupe_key is not None:
        existing = conn.execute(sa.select(t.c.id).where(t.c.dedupe_key == dedupe_key)).scalar_one_or_none()
        if existing is not None:
            return existing
    now = datetime.now(UTC)
    return conn.execute(
        sa.insert(t)
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
    ).scalar_one()


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
    conn.execute(
        insert_ignoring_conflicts(conn, a, a.c.execution_id, a.c.attempt),
        [{"execution_id": r["id"], "attempt": r["attempts"], "run_id": run_id, "started_at": now} for r in rows],
    )


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
