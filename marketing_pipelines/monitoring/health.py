"""Queue health: how many executions and agent runs wait, run and fail, read in two statements.

The figures behind ``marketing-pipelines status`` and the queue observations in the Dagster UI. No
Dagster import here: the CLI reads them and must start without Dagster.

Every count is answered from an index (the partial indexes on SCHEDULED / RUNNING / QUEUED rows and
the ``(status, finished_at)`` indexes of migration 0006), so the time does not grow with the
finished rows a table accumulates. Time comes from the database clock on PostgreSQL and from this
process's clock on SQLite, as in ``leasing/lease.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.db.schema import agent_run, marketing_execution
from marketing_pipelines.db.types import UTCDateTime
from marketing_pipelines.leasing.lease import now_expr

# "Failed / succeeded in the last hour".
RECENT_WINDOW = timedelta(hours=1)


@dataclass(frozen=True)
class ExecutionsHealth:
    """The executions queue at one moment."""

    due: int  # SCHEDULED and due_at has passed
    oldest_due_seconds: float | None  # how long the oldest of those has been due; None when none is
    running: int
    failed_last_hour: int
    succeeded_last_hour: int


@dataclass(frozen=True)
class AgentRunsHealth:
    """The agent-run queue at one moment. REFUSED runs were never queued, so they count nowhere."""

    queued: int
    oldest_queued_seconds: float | None  # since the oldest QUEUED run was requested; None when none is
    running: int
    failed_last_hour: int


@dataclass(frozen=True)
class QueueHealth:
    """Both queues, read at ``measured_at`` (the database's clock on PostgreSQL)."""

    measured_at: datetime
    executions: ExecutionsHealth
    agent_runs: AgentRunsHealth

    def as_json(self) -> dict[str, dict[str, Any]]:
        """The shape ``status --json`` prints: each queue's fields in order, ``None`` (JSON null) where none waits."""
        return {"executions": asdict(self.executions), "agent_runs": asdict(self.agent_runs)}


def _clock(conn: sa.Connection, now: datetime | None) -> tuple[sa.ColumnElement[datetime], sa.ColumnElement[datetime]]:
    """The statement's "now" and "an hour ago": PostgreSQL's ``now()`` unless a time is given."""
    if now is None and conn.dialect.name == "postgresql":
        return now_expr(conn), now_expr(conn, -RECENT_WINDOW.total_seconds())
    # One Python reading for both, so the window is exactly an hour on SQLite too.
    at = now if now is not None else datetime.now(UTC)
    return sa.bindparam(None, at, type_=UTCDateTime()), sa.bindparam(None, at - RECENT_WINDOW, type_=UTCDateTime())


def _count(table: sa.Table, *where: sa.ColumnElement[bool]) -> sa.ScalarSelect[int]:
    return sa.select(sa.func.count()).select_from(table).where(*where).scalar_subquery()


def _seconds_since(now: datetime, then: datetime | None) -> float | None:
    # Milliseconds are as precise as a queue's lag is worth; a clock a hair ahead of a row's time is 0.
    return None if then is None else round(max(0.0, (now - then).total_seconds()), 3)


def executions_health(conn: sa.Connection, now: datetime | None = None) -> tuple[datetime, ExecutionsHealth]:
    """The executions queue in one statement, and the time it was read at."""
    t = marketing_execution
    current, hour_ago = _clock(conn, now)
    due = (t.c.status == "SCHEDULED", t.c.due_at <= current)
    row = conn.execute(
        sa.select(
            sa.type_coerce(current, UTCDateTime()).label("now"),
            _count(t, *due).label("due"),
            sa.select(sa.func.min(t.c.due_at)).where(*due).scalar_subquery().label("oldest_due_at"),
            _count(t, t.c.status == "RUNNING").label("running"),
            _count(t, t.c.status == "FAILED", t.c.finished_at >= hour_ago).label("failed"),
            _count(t, t.c.status == "SUCCEEDED", t.c.finished_at >= hour_ago).label("succeeded"),
        )
    ).one()
    return row.now, ExecutionsHealth(
        due=row.due,
        oldest_due_seconds=_seconds_since(row.now, row.oldest_due_at),
        running=row.running,
        failed_last_hour=row.failed,
        succeeded_last_hour=row.succeeded,
    )


def agent_runs_health(conn: sa.Connection, now: datetime | None = None) -> tuple[datetime, AgentRunsHealth]:
    """The agent-run queue in one statement, and the time it was read at."""
    t = agent_run
    current, hour_ago = _clock(conn, now)
    queued = t.c.status == "QUEUED"
    row = conn.execute(
        sa.select(
            sa.type_coerce(current, UTCDateTime()).label("now"),
            _count(t, queued).label("queued"),
            sa.select(sa.func.min(t.c.requested_at)).where(queued).scalar_subquery().label("oldest_requested_at"),
            _count(t, t.c.status == "RUNNING").label("running"),
            _count(t, t.c.status == "FAILED", t.c.finished_at >= hour_ago).label("failed"),
        )
    ).one()
    return row.now, AgentRunsHealth(
        queued=row.queued,
        oldest_queued_seconds=_seconds_since(row.now, row.oldest_requested_at),
        running=row.running,
        failed_last_hour=row.failed,
    )


def queue_health(conn: sa.Connection, now: datetime | None = None) -> QueueHealth:
    """Both queues, read at ``now`` (default: the database's clock on PostgreSQL, this process's on SQLite)."""
    measured_at, executions = executions_health(conn, now)
    # One clock reading for both queues, so their ages compare.
    _, agent_runs = agent_runs_health(conn, now if now is not None else measured_at)
    return QueueHealth(measured_at=measured_at, executions=executions, agent_runs=agent_runs)
