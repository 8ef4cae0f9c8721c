"""The lease/claim protocol both work queues share (executions and agent runs).

A row moves READY -> RUNNING only through ``claim_batch``: one statement per batch that the
database itself makes exclusive (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, the single-writer
conditional ``UPDATE ... WHERE status = <ready>`` on SQLite). There is no in-process lock, so
any number of sensors on any number of machines can claim at once and each row goes to one.

Every later change to a claimed row names the state it expects *and* the lease owner in its
``WHERE`` (fencing): a worker whose lease expired and was reclaimed matches no row, so it can
neither complete, fail nor renew what another attempt now owns. Callers check the returned
row/boolean and say so in their logs.

Time comes from the database clock on PostgreSQL (replicas' clocks may drift) and from this
process's clock on SQLite (one machine, one clock).
"""

from __future__ import annotations

import functools
import os
import socket
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.db.engine import one_of
from marketing_pipelines.db.types import UTCDateTime

RUNNING = "RUNNING"
# Rows a sensor tick claimed are owned by "claim:<host>:<pid>:<random>" until a run takes them over.
CLAIM_OWNER_PREFIX = "claim:"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
# The finished statuses an operator may put back in the queue (`executions retry`, `agents retry`).
RETRYABLE = (FAILED, CANCELLED)

LEASE_EXPIRED_ERROR = "lease expired: the worker stopped renewing it (crashed, killed, or its run never started)"
LEASE_EXPIRED_UNBEGUN_ERROR = (
    "lease expired before the action began (its run never started, or its worker died, was starved or was cut off "
    "from the database first); not an attempt"
)

# An attempt lost to the infrastructure (its lease ran out, or its run failed or never started before
# recording the row's outcome) says nothing about the work itself: a daemon kill, a code-server
# restart or a database restart must not spend the budget a row has for a failing receiver or model,
# the way Dagster's run retries tell a crashed worker from a failed op. Such an attempt moves the
# row's last attempt out by one instead. A row lost this many times (one that kills every worker
# it reaches, say) ends FAILED all the same.
MAX_LOST_ATTEMPTS = 5
LOST_ATTEMPTS_ERROR = f"gave up after {MAX_LOST_ATTEMPTS} attempts lost before they recorded an outcome"

# An attempt is spent only on the target. In a queue that records when an attempt's action began
# (``LeaseQueue.action_began``), a row whose run ended, or whose lease ran out, before its action began is
# handed back instead: its attempt given back (attempts - 1), no lost attempt counted, never FAILED for it.
# A run that never started, a worker starved by its machine or refused by the database: waiting for this
# machine is no try at the receiver. Such a row is due again after the delay for its n-th hand-back in a row
# (index n - 1): at once for the first, then doubling from a few seconds, so a run launcher that fails every
# launch costs a launch every few minutes, not a loop of runs; each such run shows FAILED on Dagster's Runs
# page. An attempt whose action began resets the count.
UNSTARTED_DELAYS_SECONDS = (0, 5, 10, 20, 40, 80, 160)
MAX_UNSTARTED_DELAY_SECONDS = 300

# A run worker renews its leases every HEARTBEAT_SECONDS (or a third of a shorter lease), whatever the
# lease's length, and at each heartbeat asks Dagster whether its run is still starting or started. A run
# Dagster ended while its worker held rows has their leases shortened to FENCE_HEARTBEATS heartbeats after
# their last renewal (``fence_leases``): a dead worker's rows expire within seconds, and a live worker,
# which stops at its next heartbeat, still records what it has in flight within them. FENCE_SECONDS is
# longer than the default webhook timeout (10 s), so a send in flight ends before its row can be requeued.
HEARTBEAT_SECONDS = 5.0
FENCE_HEARTBEATS = 3
FENCE_SECONDS = FENCE_HEARTBEATS * HEARTBEAT_SECONDS


def unstarted_delay_seconds(hand_backs: int) -> float:
    """The delay before a row's next claim after its ``hand_backs``-th hand-back in a row (1: the first)."""
    if 1 <= hand_backs <= len(UNSTARTED_DELAYS_SECONDS):
        return UNSTARTED_DELAYS_SECONDS[hand_backs - 1]
    return MAX_UNSTARTED_DELAY_SECONDS


def new_claim_owner() -> str:
    """A lease owner unique to one sensor tick on one replica (host, pid, random suffix)."""
    return f"{CLAIM_OWNER_PREFIX}{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class LeaseQueue:
    """Which table and columns make up one work queue."""

    table: sa.Table
    ready_status: str  # the status a claimable row has: SCHEDULED / QUEUED
    due_column: str  # claim order, and "not before" for rows that carry a due time
    error_column: str
    # Executions back off by moving due_at into the future; agent runs keep their queue place.
    retry_moves_due: bool
    started_column: str | None = None
    # What claim_batch returns: only the columns a run request needs. Every column would have each
    # row's JSON payload decoded and timestamps converted on the claim's path, for nothing.
    claim_columns: tuple[str, ...] = ("id", "attempts")
    row_noun: str = "Row"  # how log lines name one row: "Execution 12", "Agent run 7"
    # SQL true when the row's current attempt reached its action (the executions' attempt row's began_at).
    # With it, an attempt that did not is handed back (``UNSTARTED_DELAYS_SECONDS``); the table then has
    # the columns unstarted_runs and handed_back. Without it (agent runs, whose attempt begins when its run
    # takes it over, and whose queue place cannot be delayed), every unfinished attempt is a lost one.
    action_began: Callable[[], sa.ColumnElement[bool]] | None = None

    def col(self, name: str) -> sa.Column[Any]:
        return self.table.c[name]


@dataclass(frozen=True)
class Recovery:
    requeued: tuple[int, ...]
    failed: tuple[int, ...]
    # The Dagster runs that had taken these rows over and stopped renewing them: their workers are gone.
    run_ids: tuple[str, ...] = ()
    # The rows that expired while still owned by the tick that claimed them (no run took them over),
    # by that claim: a started run of the claim whose rows are all here died before its take-over.
    claims: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # Of ``requeued``, those whose action never began: handed back, their attempt given back.
    handed_back: tuple[int, ...] = ()


def now_expr(conn: sa.Connection, offset_s: float = 0.0, at: datetime | None = None) -> sa.ColumnElement[datetime]:
    """The current time (plus an offset) as the database should see it in a statement; ``at`` instead of now."""
    if at is not None:
        return sa.bindparam(None, at + timedelta(seconds=offset_s), type_=UTCDateTime())
    if conn.dialect.name == "postgresql":
        expr: sa.ColumnElement[datetime] = sa.func.now()
        if offset_s:
            expr = expr + sa.literal(timedelta(seconds=offset_s), sa.Interval())
        return expr
    return sa.bindparam(None, datetime.now(UTC) + timedelta(seconds=offset_s), type_=UTCDateTime())


@functools.cache
def _claim_statement(queue: LeaseQueue, dialect: str) -> sa.Update:
    """The claim UPDATE for one queue and dialect, built once: every sensor tick runs it.

    Parameters: ``owner``, ``limit`` and the lease, as ``lease`` (an interval added to the
    database's ``now()``) on PostgreSQL, or ``now`` and ``lease_expires_at`` on SQLite.
    """
    t = queue.table
    due = queue.col(queue.due_column)
    now: sa.ColumnElement[datetime]
    if dialect == "postgresql":
        now = sa.func.now()
        expires: sa.ColumnElement[datetime] = now + sa.bindparam("lease", type_=sa.Interval())
    else:
        now = sa.bindparam("now", type_=UTCDateTime())
        expires = sa.bindparam("lease_expires_at", type_=UTCDateTime())
    candidates = (
        sa.select(t.c.id)
        .where(t.c.status == queue.ready_status, due <= now)
        .order_by(due, t.c.id)
        .limit(sa.bindparam("limit", type_=sa.Integer()))
    )
    values: dict[str, Any] = {
        "status": RUNNING,
        "lease_owner": sa.bindparam("owner", type_=sa.String()),
        "lease_expires_at": expires,
        "attempts": t.c.attempts + 1,
        "updated_at": now,
        "run_id": None,
    }
    if queue.started_column:
        values[queue.started_column] = now
    returned = [queue.col(name) for name in dict.fromkeys(("id", queue.due_column, *queue.claim_columns))]
    if dialect == "postgresql":
        # MATERIALIZED pins the LIMIT: as a plain IN (subquery) the planner may re-run the
        # subquery (e.g. as a semi-join) and update more rows than asked. SKIP LOCKED lets a
        # concurrent claimer take the next rows instead of waiting on ours.
        picked = candidates.with_for_update(skip_locked=True).cte("picked").prefix_with("MATERIALIZED")
        return sa.update(t).where(t.c.id == picked.c.id).values(values).returning(*returned)
    # SQLite has one writer at a time (BEGIN IMMEDIATE), and the status guard makes the
    # update conditional: a row some other claimer took is simply not matched.
    return (
        sa.update(t)
        .where(t.c.id.in_(candidates.scalar_subquery()), t.c.status == queue.ready_status)
        .values(values)
        .returning(*returned)
    )


def claim_batch(
    conn: sa.Connection, queue: LeaseQueue, owner: str, limit: int, lease_seconds: float
) -> list[sa.RowMapping]:
    """Claim up to ``limit`` due rows for ``owner`` in one statement.

    Returns the claimed rows in queue order, each with ``id``, the due column and the queue's
    ``claim_columns`` (``attempts`` already counts this claim).
    """
    if limit < 1:
        raise ValueError(f"claim limit must be >= 1, got {limit}")
    params: dict[str, Any] = {"owner": owner, "limit": limit}
    if conn.dialect.name == "postgresql":
        params["lease"] = timedelta(seconds=lease_seconds)
    else:
        params["now"] = datetime.now(UTC)
        params["lease_expires_at"] = params["now"] + timedelta(seconds=lease_seconds)
    rows = conn.execute(_claim_statement(queue, conn.dialect.name), params).all()
    if len(rows) > limit:  # would mean the statement above is wrong; never paper over it
        raise AssertionError(f"claim returned {len(rows)} rows for a limit of {limit}")
    # RETURNING has no order. Rows start (id, due, ...): tuples sort by position, cheaper than
    # mappings by name.
    rows.sort(key=lambda row: (row[1], row[0]))
    return [row._mapping for row in rows]


def take_over_many(
    conn: sa.Connection,
    queue: LeaseQueue,
    row_ids: Sequence[int],
    *,
    claimed_by: str,
    new_owner: str,
    lease_seconds: float,
    run_id: str | None,
) -> list[sa.RowMapping]:
    """Move claimed rows' leases from the sensor's claim to the run that works them, in one statement;
    returns the rows taken, in ``row_ids`` order.

    Accepts ``new_owner`` too, so a retried step of the same run takes its own rows back. Each row is
    still fenced on its own: its ``WHERE`` names its status and owner, so a row that
    another claim took since (its lease expired) is simply not among the returned rows.
    """
    if not row_ids:
        return []
    t = queue.table
    stmt = (
        sa.update(t)
        .where(one_of(conn, t.c.id, row_ids), t.c.status == RUNNING, t.c.lease_owner.in_([claimed_by, new_owner]))
        .values(
            lease_owner=new_owner,
            lease_expires_at=now_expr(conn, lease_seconds),
            run_id=run_id,
            updated_at=now_expr(conn),
        )
        .returning(*t.c)
    )
    taken = {row["id"]: row for row in conn.execute(stmt).mappings()}
    return [taken[i] for i in row_ids if i in taken]


def describe(conn: sa.Connection, queue: LeaseQueue, row_id: int) -> str:
    """A row's lease state for a log line, e.g. "is RUNNING (attempt 2, owner run:...)"."""
    t = queue.table
    row = conn.execute(sa.select(t.c.status, t.c.attempts, t.c.lease_owner).where(t.c.id == row_id)).one_or_none()
    if row is None:
        return "does not exist"
    return f"is {row.status} (attempt {row.attempts}, owner {row.lease_owner or 'none'})"


def renew_many(
    conn: sa.Connection, queue: LeaseQueue, row_ids: Sequence[int], owner: str, lease_seconds: float
) -> set[int]:
    """Extend the leases of rows this owner holds in one statement; returns the ids still held."""
    if not row_ids:
        return set()
    t = queue.table
    stmt = (
        sa.update(t)
        .where(one_of(conn, t.c.id, row_ids), t.c.status == RUNNING, t.c.lease_owner == owner)
        .values(lease_expires_at=now_expr(conn, lease_seconds), updated_at=now_expr(conn))
        .returning(t.c.id)
    )
    return set(conn.execute(stmt).scalars())


def _owned_by(queue: LeaseQueue, owner: str | Sequence[str]) -> sa.ColumnElement[bool]:
    owners = [owner] if isinstance(owner, str) else list(owner)
    return queue.col("lease_owner").in_(owners)


def finish(
    conn: sa.Connection,
    queue: LeaseQueue,
    row_id: int,
    owner: str | Sequence[str],
    status: str,
    values: Mapping[str, Any] | None = None,
) -> bool:
    """Record a final status for a row this owner still holds; False when the lease was lost."""
    return row_id in finish_many(conn, queue, [row_id], owner, status, values)


def finish_many(
    conn: sa.Connection,
    queue: LeaseQueue,
    row_ids: Sequence[int],
    owner: str | Sequence[str],
    status: str,
    values: Mapping[str, Any] | None = None,
) -> set[int]:
    """``finish`` for many rows in one statement; the ids it recorded.

    Each row is still fenced on its own (RUNNING under ``owner``): a row whose lease was lost is
    simply not matched, and costs no other row its outcome.
    """
    if not row_ids:
        return set()
    t = queue.table
    stmt = (
        sa.update(t)
        .where(one_of(conn, t.c.id, row_ids), t.c.status == RUNNING, _owned_by(queue, owner))
        .values(
            status=status,
            lease_owner=None,
            lease_expires_at=None,
            finished_at=now_expr(conn),
            updated_at=now_expr(conn),
            **_reached(queue),
            **dict(values or {}),
        )
        .returning(t.c.id)
    )
    return set(conn.execute(stmt).scalars())


def _reached(queue: LeaseQueue) -> dict[str, Any]:
    """The values of a row whose attempt reached its action: its hand-backs in a row start again from 0."""
    return {"unstarted_runs": 0} if queue.action_began is not None else {}


def retry_or_fail(
    conn: sa.Connection,
    queue: LeaseQueue,
    row_id: int,
    owner: str | Sequence[str],
    error: str,
    retry_delay_s: float,
    run_id: str | None = None,
    lost: bool = False,
) -> str | None:
    """After a failed attempt: back to the queue, or FAILED once attempts reach max_attempts.

    ``lost``: the attempt ended without an outcome of its own (its run failed before recording
    one), so it does not spend the budget (``MAX_LOST_ATTEMPTS``); in a queue with ``action_began``,
    one whose action never began is handed back instead (``UNSTARTED_DELAYS_SECONDS``, not
    ``retry_delay_s``).

    One fenced statement decides and writes, so two reporters of the same failure (the run
    itself and the run-failure sensor) cannot both act. Returns the new status, or None when
    the row was not held by ``owner`` (and ``run_id``, when given).
    """
    t = queue.table
    if lost:
        exhausted, values = _unfinished_values(
            queue, error, error, lambda s: now_expr(conn, s), due=now_expr(conn, retry_delay_s)
        )
    else:
        exhausted = t.c.attempts >= t.c.max_attempts
        values = {
            "status": sa.case((exhausted, FAILED), else_=queue.ready_status),
            "finished_at": sa.case((exhausted, now_expr(conn)), else_=None),
            queue.error_column: error,
            **_reached(queue),
        }
        if queue.retry_moves_due:
            values[queue.due_column] = sa.case(
                (exhausted, queue.col(queue.due_column)), else_=now_expr(conn, retry_delay_s)
            )
    values.update(lease_owner=None, lease_expires_at=None, updated_at=now_expr(conn))
    conditions = [t.c.id == row_id, t.c.status == RUNNING, _owned_by(queue, owner)]
    if run_id is not None:
        conditions.append(sa.or_(t.c.run_id == run_id, t.c.run_id.is_(None)))
    stmt = sa.update(t).where(*conditions).values(values).returning(t.c.status)
    return conn.execute(stmt).scalar_one_or_none()


def claimed_waiting(conn: sa.Connection, queue: LeaseQueue) -> int:
    """Rows claimed by a tick and not yet taken over by a run: their runs wait in Dagster's queue.

    Counted over the RUNNING rows only (the lease index's few), across every replica's claims.
    """
    t = queue.table
    stmt = (
        sa.select(sa.func.count())
        .select_from(t)
        .where(t.c.status == RUNNING, t.c.lease_owner.startswith(CLAIM_OWNER_PREFIX, autoescape=True))
    )
    return int(conn.execute(stmt).scalar_one())


def claims_older_than(conn: sa.Connection, queue: LeaseQueue, seconds: float) -> list[str]:
    """Tick owners still holding rows they claimed over ``seconds`` ago.

    A run that starts takes its rows over (owner ``run:<id>``), so rows still owned by a tick are
    those of runs waiting in Dagster's queue, or of a tick whose runs were never created.
    """
    t = queue.table
    stmt = (
        sa.select(t.c.lease_owner)
        .where(
            t.c.status == RUNNING,
            t.c.lease_owner.startswith(CLAIM_OWNER_PREFIX, autoescape=True),
            t.c.updated_at < now_expr(conn, -seconds),
        )
        .distinct()
    )
    return sorted(conn.execute(stmt).scalars())


def end_leases(conn: sa.Connection, queue: LeaseQueue, row_ids: Sequence[int], owner: str) -> set[int]:
    """End the leases ``owner`` holds on ``row_ids`` now, for ``recover_expired`` to take; the ids ended.

    For a worker that will not begin their actions (its Dagster run ended): the next claiming tick hands
    them back, through the one recovery path every expired lease takes.
    """
    if not row_ids:
        return set()
    t = queue.table
    stmt = (
        sa.update(t)
        .where(one_of(conn, t.c.id, row_ids), t.c.status == RUNNING, t.c.lease_owner == owner)
        .values(lease_expires_at=now_expr(conn, -1))
        .returning(t.c.id)
    )
    return set(conn.execute(stmt).scalars())


def fence_leases(
    conn: sa.Connection, queue: LeaseQueue, row_ids: Sequence[int], owner: str, run_id: str, seconds: float
) -> set[int]:
    """Shorten the leases ``owner`` (of Dagster run ``run_id``) holds on ``row_ids`` to ``seconds`` after their
    last renewal, never lengthening one; the ids whose leases now end within that.

    For a run Dagster ended while its worker held rows, instead of requeueing them under a worker that may
    be alive: a dead worker renews nothing, so its rows expire ``seconds`` after its last heartbeat and
    ``recover_expired`` requeues them; a live one records what it has in flight meanwhile (its run's status
    stops it from beginning more). Each statement is fenced by owner, status and the renewal it read (rows
    renewed at one instant share it, so mostly one statement): a renewal in between leaves its rows alone,
    as their worker is plainly alive.
    """
    if not row_ids:
        return set()
    t = queue.table
    held = conn.execute(
        sa.select(t.c.id, t.c.updated_at, t.c.lease_expires_at).where(
            one_of(conn, t.c.id, row_ids), t.c.status == RUNNING, t.c.lease_owner == owner, t.c.run_id == run_id
        )
    ).all()
    fenced = {r.id for r in held if r.lease_expires_at <= r.updated_at + timedelta(seconds=seconds)}
    by_renewal: dict[datetime, list[int]] = defaultdict(list)
    for r in held:
        if r.id not in fenced:
            by_renewal[r.updated_at].append(r.id)
    for renewed, ids in by_renewal.items():
        stmt = (
            sa.update(t)
            .where(
                one_of(conn, t.c.id, ids),
                t.c.status == RUNNING,
                t.c.lease_owner == owner,
                t.c.updated_at == renewed,
            )
            .values(lease_expires_at=renewed + timedelta(seconds=seconds))
            .returning(t.c.id)
        )
        fenced.update(conn.execute(stmt).scalars())
    return fenced


def expire_claims(conn: sa.Connection, queue: LeaseQueue, owners: Sequence[str]) -> int:
    """End the leases of rows still held by ``owners`` (tick owners only); ``recover_expired`` then takes them."""
    t = queue.table
    stmt = (
        sa.update(t)
        .where(
            t.c.status == RUNNING,
            _owned_by(queue, [o for o in owners if o.startswith(CLAIM_OWNER_PREFIX)]),
        )
        .values(lease_expires_at=now_expr(conn, -1))
    )
    return conn.execute(stmt).rowcount


def extend_claims(conn: sa.Connection, queue: LeaseQueue, owners: Sequence[str], lease_seconds: float) -> int:
    """Let the rows still held by ``owners`` (tick owners only) run ``lease_seconds`` from now; never shortened.

    Also takes back a lease that ran out since the last tick, as long as no recovery took the row: its claim
    still owns it. ``updated_at`` stays the claim's time, so the claim is looked up again next tick.
    """
    t = queue.table
    until = now_expr(conn, lease_seconds)
    stmt = (
        sa.update(t)
        .where(
            t.c.status == RUNNING,
            _owned_by(queue, [o for o in owners if o.startswith(CLAIM_OWNER_PREFIX)]),
            t.c.lease_expires_at < until,
        )
        .values(lease_expires_at=until)
    )
    return conn.execute(stmt).rowcount


def _lost_values(
    queue: LeaseQueue, error: str, now: sa.ColumnElement[datetime]
) -> tuple[sa.ColumnElement[bool], dict[str, Any]]:
    """Whether a row gives up after losing one more attempt, and the values that record the loss.

    Back in the queue with its last attempt moved out by one, or FAILED at ``MAX_LOST_ATTEMPTS``.
    """
    t = queue.table
    gives_up = t.c.lost_attempts + 1 >= MAX_LOST_ATTEMPTS
    return gives_up, {
        "status": sa.case((gives_up, FAILED), else_=queue.ready_status),
        "finished_at": sa.case((gives_up, now), else_=None),
        "max_attempts": sa.case((gives_up, t.c.max_attempts), else_=t.c.max_attempts + 1),
        "lost_attempts": t.c.lost_attempts + 1,
        queue.error_column: sa.case((gives_up, f"{LOST_ATTEMPTS_ERROR}; {error}"), else_=error),
    }


def _unfinished_values(
    queue: LeaseQueue,
    lost_error: str,
    unbegun_error: str,
    later: Callable[[float], sa.ColumnElement[datetime]],
    due: sa.ColumnElement[Any] | None = None,
) -> tuple[sa.ColumnElement[bool], dict[str, Any]]:
    """Whether a row that ended an attempt without an outcome gives up, and the values that record it.

    A lost attempt (``_lost_values``; due at ``due``, when given) if the queue cannot tell whether its action
    began, or if it did; else handed back: its attempt given back, due after ``UNSTARTED_DELAYS_SECONDS``
    for its hand-backs in a row. One statement for rows of either kind: each column picks by the row.
    ``later(s)``: the statement's now plus ``s`` seconds.
    """
    t = queue.table
    gives_up, lost = _lost_values(queue, lost_error, later(0))
    if queue.retry_moves_due and due is not None:
        lost[queue.due_column] = sa.case((gives_up, queue.col(queue.due_column)), else_=due)
    if queue.action_began is None:
        return gives_up, lost
    began = queue.action_began()
    # A first hand-back keeps the due time the row was claimed at: due again at once, and still first in line.
    delayed = sa.case(
        *(
            (t.c.unstarted_runs == n, later(s) if s else queue.col(queue.due_column))
            for n, s in enumerate(UNSTARTED_DELAYS_SECONDS)
        ),
        else_=later(MAX_UNSTARTED_DELAY_SECONDS),
    )
    unbegun = {
        "status": queue.ready_status,
        "finished_at": None,
        "attempts": t.c.attempts - 1,
        "max_attempts": t.c.max_attempts,
        "lost_attempts": t.c.lost_attempts,
        "unstarted_runs": t.c.unstarted_runs + 1,
        "handed_back": t.c.handed_back + 1,
        queue.error_column: unbegun_error,
        queue.due_column: delayed,
    }
    reached = {
        **lost,
        "attempts": t.c.attempts,
        "unstarted_runs": 0,
        "handed_back": t.c.handed_back,
        queue.due_column: lost.get(queue.due_column, queue.col(queue.due_column)),
    }
    values = {name: sa.case((began, reached[name]), else_=unbegun[name]) for name in unbegun}
    return sa.and_(began, gives_up), values


def recover_expired(
    conn: sa.Connection, queue: LeaseQueue, limit: int = 1000, *, at: datetime | None = None
) -> Recovery:
    """Return RUNNING rows whose lease ran out to the queue: the attempt lost, not spent (FAILED at
    ``MAX_LOST_ATTEMPTS``), or, in a queue with ``action_began``, handed back if its action never began.
    A lost attempt is due again at once: nothing failed at the receiver, so nothing backs off.

    Safe to run from every replica at once: each row is updated by whichever statement locks
    it first, and the other re-checks ``status``/``lease_expires_at`` and skips it. ``at``: the
    instant to judge expiry by instead of the database's now (tests of the protocol's logic, which
    need not wait for a lease to run out).
    """
    t = queue.table
    now = now_expr(conn, at=at)
    _, values = _unfinished_values(
        queue, LEASE_EXPIRED_ERROR, LEASE_EXPIRED_UNBEGUN_ERROR, lambda s: now_expr(conn, s, at=at)
    )
    expired = (
        sa.select(t.c.id)
        .where(t.c.status == RUNNING, t.c.lease_expires_at < now)
        .order_by(t.c.lease_expires_at, t.c.id)  # the id: SQLite's pre-select and update pick the same rows
        .limit(limit)
    )
    # The owner each row had: RETURNING gives the values after the update, which clears it.
    old_owner: sa.ColumnElement[Any] | None = None
    if conn.dialect.name == "postgresql":
        picked = (
            expired.add_columns(t.c.lease_owner.label("old_owner"))
            .with_for_update(skip_locked=True)
            .cte("expired")
            .prefix_with("MATERIALIZED")
        )
        where = [t.c.id == picked.c.id]
        old_owner = picked.c.old_owner
        owners: dict[int, str | None] = {}
    else:
        # One writer at a time: what this reads is what the update below changes.
        owners = {row.id: row.lease_owner for row in conn.execute(expired.add_columns(t.c.lease_owner))}
        where = [t.c.id.in_(expired.scalar_subquery())]
    where += [t.c.status == RUNNING, t.c.lease_expires_at < now]
    # After the update a handed-back row counts its hand-back, and any other row none in a row.
    handed = (t.c.unstarted_runs > 0) if queue.action_began is not None else sa.false()
    stmt = (
        sa.update(t)
        .where(*where)
        .values({**values, "lease_owner": None, "lease_expires_at": None, "updated_at": now})
        .returning(
            t.c.id, t.c.status, t.c.run_id, handed.label("handed"), *([old_owner] if old_owner is not None else [])
        )
    )
    rows = conn.execute(stmt).all()
    if old_owner is not None:
        owners = {r.id: r.old_owner for r in rows}
    claims: dict[str, list[int]] = {}
    for r in rows:
        owner = owners.get(r.id)
        if not r.run_id and owner and owner.startswith(CLAIM_OWNER_PREFIX):
            claims.setdefault(owner, []).append(r.id)
    return Recovery(
        requeued=tuple(sorted(r.id for r in rows if r.status != FAILED)),
        failed=tuple(sorted(r.id for r in rows if r.status == FAILED)),
        run_ids=tuple(sorted({r.run_id for r in rows if r.run_id})),
        claims={owner: tuple(sorted(ids)) for owner, ids in claims.items()},
        handed_back=tuple(sorted(r.id for r in rows if r.handed)),
    )


def cancel(conn: sa.Connection, queue: LeaseQueue, row_id: int, reason: str) -> sa.Row[Any] | None:
    """Cancel a waiting or running row. Returns (previous status, run_id), or None if already final."""
    t = queue.table
    before = (
        sa.select(t.c.status, t.c.run_id)
        .where(t.c.id == row_id, t.c.status.in_([queue.ready_status, RUNNING]))
        .with_for_update()
    )
    row = conn.execute(before).one_or_none()
    if row is None:
        return None
    stmt = (
        sa.update(t)
        .where(t.c.id == row_id, t.c.status == row.status)
        .values(
            {
                "status": CANCELLED,
                queue.error_column: reason,
                "lease_owner": None,
                "lease_expires_at": None,
                "finished_at": now_expr(conn),
                "updated_at": now_expr(conn),
            }
        )
    )
    return row if conn.execute(stmt).rowcount == 1 else None


class LeaseKeeper:
    """Renews the leases of one or more rows from a background thread while the work runs.

    All held rows are renewed in one statement per heartbeat, each still fenced by its own status
    and owner. A row whose renewal matches nothing (its lease expired and another attempt took it)
    goes into ``lost_ids`` and ``lost`` is set; the worker checks ``is_lost(id)`` and must not
    record an outcome for it. ``release(id)`` stops renewing a row once its outcome is recorded.

    ``run_ended`` (asked at each heartbeat and by ``check_run``) says why the worker's Dagster run is
    no longer starting or started, or None. Once it says so the keeper stops the work: ``stopped`` is
    set and ``begin`` begins nothing more. In a queue with ``action_began``, the rows whose actions did
    not begin have their leases ended now (``end_leases``), for the next claiming tick to hand back,
    and rows in flight stay renewed until their outcomes are recorded, so an answer already on its way
    is recorded, not sent again. In a queue without, a row's attempt began when its run took it over and
    ends with the worker: the keeper renews nothing more, and the lease (or ``fence_leases``) runs out.
    """

    def __init__(
        self,
        engine: sa.Engine,
        queue: LeaseQueue,
        row_ids: int | Sequence[int],
        owner: str,
        lease_seconds: float,
        on_lost: Callable[[str], None] | None = None,
        *,
        run_ended: Callable[[], str | None] | None = None,
        on_stopped: Callable[[str], None] | None = None,
    ) -> None:
        self._engine, self._queue, self._owner = engine, queue, owner
        self._held: set[int] = {row_ids} if isinstance(row_ids, int) else set(row_ids)
        self._lease_seconds = lease_seconds
        self._on_lost = on_lost
        self._run_ended, self._on_stopped = run_ended, on_stopped
        self._guard = threading.Lock()
        # Held while rows begin and while the work stops, so a stop either comes first (they do not
        # begin) or after (they are in flight): never a row begun and its lease ended as unbegun.
        self._beginning = threading.Lock()
        self._began: set[int] = set()
        self._stop = threading.Event()
        self.lost = threading.Event()
        self.lost_ids: set[int] = set()
        self.stopped = threading.Event()
        self.stop_reason: str | None = None
        name = f"lease-{queue.table.name}-{min(self._held) if self._held else 'none'}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def heartbeat_seconds(self) -> float:
        """How often the leases are renewed and the run's status asked: a third of the lease, at most
        ``HEARTBEAT_SECONDS`` (so two missed renewals still leave time for a third, and a run Dagster ended
        is noticed within seconds however long the lease)."""
        return max(0.5, min(self._lease_seconds / 3, HEARTBEAT_SECONDS))

    def is_lost(self, row_id: int) -> bool:
        with self._guard:
            return row_id in self.lost_ids

    def release(self, row_id: int) -> None:
        with self._guard:
            self._held.discard(row_id)

    def begin(self, row_ids: Sequence[int], mark: Callable[[Sequence[int]], set[int]]) -> set[int]:
        """The rows among ``row_ids`` whose actions may begin now: ``mark`` records them begun (one statement,
        fenced by owner and live lease) and returns those it marked; none once the work has stopped."""
        with self._beginning:
            if self.stopped.is_set() or not row_ids:
                return set()
            began = mark(row_ids)
            with self._guard:
                self._began.update(began)
            return began

    def check_run(self) -> str | None:
        """Why the work stopped, asking ``run_ended`` now if it has not yet; None while the run goes on.

        A failure to ask (Dagster's storage unreachable) is no evidence the run ended: the work goes on.
        """
        if self.stopped.is_set() or self._run_ended is None:
            return self.stop_reason
        try:
            why = self._run_ended()
        except Exception:  # any error of Dagster's storage; the next heartbeat asks again
            return None
        if why is not None:
            self._stop_work(why)
        return self.stop_reason

    def _stop_work(self, why: str) -> None:
        with self._beginning:
            if self.stopped.is_set():
                return
            self.stop_reason = why
            self.stopped.set()
            noun = self._queue.row_noun.lower()
            with self._guard:
                if self._queue.action_began is None:
                    held, self._held = len(self._held), set()
                    message = f"{why}: this worker stops and renews the leases of its {held} {noun}(s) no more."
                    unbegun: list[int] = []
                else:
                    unbegun = sorted(self._held - self._began)
                    self._held.difference_update(unbegun)
                    message = (
                        f"{why}: this worker begins no further action. {len(unbegun)} {noun}(s) not begun are "
                        f"handed back by the next claiming tick, their attempts not spent; {len(self._held)} in "
                        "flight keep their leases until their outcomes are recorded."
                    )
        if unbegun:
            try:
                with self._engine.begin() as conn:
                    end_leases(conn, self._queue, unbegun, self._owner)
            except sa.exc.SQLAlchemyError:
                pass  # their leases run out by themselves: this worker renews them no more
        if self._on_stopped:
            self._on_stopped(message)

    def _run(self) -> None:
        interval = self.heartbeat_seconds
        while not self._stop.wait(interval):
            self.check_run()
            with self._guard:
                held = sorted(self._held)
            if not held:
                continue
            try:
                with self._engine.begin() as conn:
                    still_ours = renew_many(conn, self._queue, held, self._owner, self._lease_seconds)
            except sa.exc.SQLAlchemyError:
                continue  # a passing database error; the next renewal may succeed within the lease
            with self._guard:
                # A row released while the renewal ran was finished by its worker, not lost.
                lost = [i for i in held if i not in still_ours and i in self._held]
                self._held.difference_update(lost)
                self.lost_ids.update(lost)
            for row_id in lost:
                self.lost.set()
                if self._on_lost:
                    self._on_lost(
                        f"{self._queue.table.name} {row_id}: lease lost (no longer RUNNING under {self._owner})"
                    )

    def hold_for(self, seconds: float) -> set[int]:
        """Stop renewing and extend every held lease to ``seconds`` from now, in one statement; the ids still held.

        For a worker about to wait on purpose (a step retried after a rate limit's Retry-After): its rows
        stay its own for the wait instead of expiring as if it had died. The renewal thread is stopped
        first, so it cannot shorten the lease again afterwards.
        """
        self._stop_renewing()
        with self._guard:
            held = sorted(self._held)
        with self._engine.begin() as conn:
            return renew_many(conn, self._queue, held, self._owner, seconds)

    def _stop_renewing(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop_renewing()
