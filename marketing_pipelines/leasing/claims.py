"""The Dagster side of the lease protocol both queues share: claim into run requests, take over, reconcile.

`leasing/lease.py` holds the SQL; this module holds what a claiming sensor, the op of a run and a
run-status sensor do with it, identically for executions and agent runs: the tags a run carries
to say who claimed it, the lease owner a run takes over as, the claim-and-summary of a tick (each
queue described once by a ``ClaimedQueue``), the take-over at the top of an op, and the
reconciliation of a run that ended without recording.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines import run_tags
from marketing_pipelines.leasing.lease import (
    CANCELLED,
    FENCE_SECONDS,
    RUNNING,
    LeaseQueue,
    Recovery,
    claim_batch,
    claims_older_than,
    describe,
    expire_claims,
    extend_claims,
    fence_leases,
    finish,
    recover_expired,
    retry_or_fail,
    take_over_many,
)
from marketing_pipelines.redact import shown_text

logger = logging.getLogger(__name__)

# How often the run-status sensors hand back what failed or canceled runs held. Dagster's default
# (30 s) would be most of the minute a dead replica may cost; each tick is one event-log query.
RECONCILE_INTERVAL_SECONDS = 10

# A tick's claim with no Dagster run tagged with it this long after the claim was never launched: the code
# server evaluating the tick died between committing the claim and returning the run requests (or the
# daemon gave up on the evaluation, or "Test sensor" in the UI evaluated it). Dagster's sensor daemon
# evaluates one sensor's ticks one after another, and a tick's runs are created before the next tick is
# evaluated: a daemon killed after an evaluation resumes that tick's run submissions (stored with the tick)
# before it evaluates a new one, or never creates them. So a claim that an evaluation of this sensor finds
# older than the previous tick with no run will never get one; the seconds only cover evaluations that
# overlap (one the daemon timed out while its code server went on, a test calling the sensor directly).
# A run created after its claim was ended all the same finds its rows owned by another claim and leaves
# them, as with any expired lease; the claim cost each row no attempt (a queue with ``action_began`` hands
# back what never began), or a lost one.
UNLAUNCHED_CLAIM_SECONDS = 10

# What reconcile_run counts, for rows it left to their run's worker with their leases shortened.
LEASE_SHORTENED = "RUNNING (lease shortened)"

# The Dagster statuses in which a run's worker may work its rows.
_WORKING = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)
# The statuses of a run that has not taken its claim over yet and still may: its claim is kept.
_WAITING = (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING)


def run_owner(run_id: str) -> str:
    """The lease owner of the rows a Dagster run took over."""
    return f"run:{run_id}"


@dataclass(frozen=True)
class Room:
    """How many rows a tick may claim, and the rule that gave the number, in the rule's own terms.

    ``rule`` is shown after ``room N =`` in the tick's summary, so it must compute ``rows`` as written
    (e.g. ``pool limit 2 x backlog factor 2 minus 1 running, at most 5000 a tick``): a bare number
    named after one of its terms ("pool free 4" beside a pool limit of 2) reads as a contradiction.
    """

    rows: int
    rule: str


@dataclass(frozen=True)
class Claim:
    """What one claiming tick did: the run requests it built, from how many rows, with what room."""

    requests: list[dg.RunRequest]
    claimed: int
    room: Room
    recovery: Recovery
    abandoned_runs: tuple[str, ...] = ()
    unlaunched_claims: tuple[str, ...] = ()

    def summary(self, queue_name: str) -> str:
        text = (
            f"{queue_name}: claimed {self.claimed} into {len(self.requests)} run(s) "
            f"(room {self.room.rows} = {self.room.rule})"
        )
        if self.recovery.requeued or self.recovery.failed:
            text += f", expired leases requeued {list(self.recovery.requeued)} failed {list(self.recovery.failed)}"
        if self.unlaunched_claims:
            text += f", ended the leases of {len(self.unlaunched_claims)} earlier claim(s) that no run was created for"
        if self.abandoned_runs:
            text += f", marked FAILURE the runs whose workers stopped renewing: {list(self.abandoned_runs)}"
        return text


class ClaimedQueue(Protocol):
    """One work queue as its claiming tick sees it; each domain defines one (a frozen dataclass of the
    tick's settings) and hands it to ``claim_requests``."""

    @property
    def lease(self) -> LeaseQueue:
        """The table and columns the claim's SQL works on."""
        ...

    @property
    def lease_seconds(self) -> float:
        """The lease a claimed row gets, until its run takes it over (``after_claim`` may set another)."""
        ...

    @property
    def pool(self) -> str | None:
        """The concurrency pool the queue's runs wait for, if any: its waiting runs are alive."""
        ...

    def room(self, conn: sa.Connection) -> Room:
        """How many rows this tick may claim, computed in the claim's transaction."""
        ...

    def run_requests(self, rows: Sequence[sa.RowMapping], claimed_by: str) -> list[dg.RunRequest]:
        """The run requests for the rows a tick claimed (in queue order) as ``claimed_by``."""
        ...

    def rows_of_run(self, run: dg.DagsterRun) -> Sequence[int]:
        """The rows a Dagster run was launched for."""
        ...

    def after_recovery(self, conn: sa.Connection, recovery: Recovery) -> None:
        """In the recovery's transaction: what else the queue records of the rows it handed back."""
        ...

    def after_claim(self, conn: sa.Connection, rows: Sequence[sa.RowMapping], claimed_by: str) -> None:
        """In the claim's transaction, when it claimed rows: what else the queue sets on them."""
        ...


def claim_requests(
    engine: sa.Engine,
    claimed: ClaimedQueue,
    claimed_by: str,
    instance: Callable[[], dg.DagsterInstance | None] | None = None,
) -> Claim:
    """Recover expired leases, then claim up to ``claimed.room`` ready rows and turn them into run requests.

    Recovery commits first in its own transaction (with ``claimed.after_recovery``): a claim that fails
    must not undo it. The room is computed inside the claim's transaction (from the rows running or
    waiting then), and ``claimed.after_claim`` runs in it with the claimed rows (the agent queue sets
    each row's lease from its own time limit). With ``instance`` (called only when some lease expired
    under a run, or some tick's claim is older than ``UNLAUNCHED_CLAIM_SECONDS``), claims no run was
    created for are recovered now instead of a lease later (``end_unlaunched_claims``), and the runs
    whose leases expired are marked failed (``fail_abandoned_runs``): those that had taken rows over,
    and those that died before taking theirs over (``started_runs_of_claims``, by
    ``claimed.rows_of_run``; runs waiting for a slot of ``claimed.pool`` are alive).
    """
    queue = claimed.lease
    unlaunched = end_unlaunched_claims(engine, queue, instance, claimed.lease_seconds) if instance is not None else ()
    with engine.begin() as conn:
        recovery = recover_expired(conn, queue)
        claimed.after_recovery(conn, recovery)
    abandoned: tuple[str, ...] = ()
    if (recovery.run_ids or recovery.claims) and instance is not None and (dagster := instance()) is not None:
        run_ids = [
            *recovery.run_ids,
            *started_runs_of_claims(dagster, recovery.claims, claimed.rows_of_run, claimed.pool),
        ]
        abandoned = fail_abandoned_runs(dagster, run_ids, queue)
    with engine.begin() as conn:
        limit = claimed.room(conn)
        rows = claim_batch(conn, queue, claimed_by, limit.rows, claimed.lease_seconds) if limit.rows > 0 else []
        if rows:
            claimed.after_claim(conn, rows, claimed_by)
    return Claim(claimed.run_requests(rows, claimed_by), len(rows), limit, recovery, abandoned, unlaunched)


def claiming_sensor(
    tick: Callable[..., dg.SensorResult | dg.SkipReason],
    *,
    name: str,
    job: dg.JobDefinition,
    interval_seconds: int,
    description: str,
) -> dg.SensorDefinition:
    """A queue's claiming sensor: ``tick`` (whose parameters name the resources it takes, as any sensor
    function's do) evaluated at most every ``interval_seconds`` (MARKETING_SENSOR_INTERVAL_SECONDS),
    running by default, launching ``job``."""
    return dg.sensor(
        name=name,
        jobs=[job],
        minimum_interval_seconds=interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=description,
    )(tick)


def run_end_sensors(
    queue: str,
    job: dg.JobDefinition,
    *,
    on_failure: Callable[..., None],
    failure_description: str,
    on_canceled: Callable[..., None],
    canceled_description: str,
) -> tuple[dg.SensorDefinition, dg.SensorDefinition]:
    """A queue's two reconciling sensors, ``{queue}_run_failure_sensor`` and ``{queue}_run_canceled_sensor``:
    each hands a run of ``job`` that failed, or was canceled, to ``on_failure`` or ``on_canceled`` (whose
    parameters name the resources they take, as any sensor function's do). Two, because
    ``run_failure_sensor`` does not see CANCELED runs.
    """
    failure = dg.run_failure_sensor(
        name=f"{queue}_run_failure_sensor",
        monitored_jobs=[job],
        minimum_interval_seconds=RECONCILE_INTERVAL_SECONDS,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=failure_description,
    )(on_failure)
    canceled = dg.run_status_sensor(
        name=f"{queue}_run_canceled_sensor",
        run_status=dg.DagsterRunStatus.CANCELED,
        monitored_jobs=[job],
        minimum_interval_seconds=RECONCILE_INTERVAL_SECONDS,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=canceled_description,
    )(on_canceled)
    return failure, canceled


def end_unlaunched_claims(
    engine: sa.Engine,
    queue: LeaseQueue,
    instance: Callable[[], dg.DagsterInstance | None],
    lease_seconds: float,
) -> tuple[str, ...]:
    """End the leases of tick claims that no Dagster run carries (``run_tags.CLAIMED_BY``), and keep those whose
    runs wait; returns the owners ended.

    Claims older than ``UNLAUNCHED_CLAIM_SECONDS`` are those of runs waiting in Dagster's queue or starting
    (a started run has taken its rows over), or of ticks whose runs were never created. All are looked up
    in Dagster in one query. A claim without a run is ended now instead of a lease later; a run created
    after all finds its rows owned by another claim and leaves them, as with any expired lease. A claim
    whose run is QUEUED, NOT_STARTED or STARTING keeps its rows: its lease runs ``lease_seconds`` from
    now (``extend_claims``). On a loaded machine a run may wait in the queue longer than a lease; handing
    its rows to another claim then launched another run that waited as long, and the first one started
    to find nothing to do, so the work went round the queue without being done. Dagster's queue is
    where such waiting belongs (a run stuck STARTING fails at run monitoring's start timeout, and the
    run-failure sensor hands its claim back).
    """
    with engine.connect() as conn:
        owners = claims_older_than(conn, queue, UNLAUNCHED_CLAIM_SECONDS)
    if not owners or (dagster := instance()) is None:
        return ()
    launched: set[str] = set()
    waiting: set[str] = set()
    for record in dagster.get_run_records(dg.RunsFilter(tags={run_tags.CLAIMED_BY: owners})):
        owner = record.dagster_run.tags.get(run_tags.CLAIMED_BY, "")
        launched.add(owner)
        if record.dagster_run.status in _WAITING:
            waiting.add(owner)
    unlaunched = [owner for owner in owners if owner not in launched]
    if unlaunched or waiting:
        with engine.begin() as conn:
            if unlaunched:
                expire_claims(conn, queue, unlaunched)
            if waiting:
                extend_claims(conn, queue, sorted(waiting), lease_seconds)
    return tuple(unlaunched)


def sensor_instance(context: dg.SensorEvaluationContext) -> dg.DagsterInstance | None:
    """The sensor's Dagster instance, or None for a context built without one (a unit test's)."""
    try:
        return context.instance
    except dg.DagsterInvariantViolationError:
        return None


def started_runs_of_claims(
    instance: dg.DagsterInstance,
    claims: Mapping[str, Sequence[int]],
    rows_of_run: Callable[[dg.DagsterRun], Sequence[int]],
    pool: str | None = None,
) -> list[str]:
    """Runs of ``claims`` that Dagster shows STARTED and whose rows all expired still owned by the claim.

    Such a run never took any of its rows over in a whole lease: its worker died between starting
    and its first take-over. A run of the same tick that did take its rows over is not one (its rows
    were not among these), nor is a run whose step waits for a slot of ``pool`` (alive, and it will find
    its rows taken), nor a STARTING run (run monitoring's start timeout ends those).
    """
    if not claims:
        return []
    records = instance.get_run_records(
        dg.RunsFilter(tags={run_tags.CLAIMED_BY: list(claims)}, statuses=[dg.DagsterRunStatus.STARTED])
    )
    waiting = instance.event_log_storage.get_concurrency_info(pool).pending_run_ids if pool and records else set()
    dead = []
    for record in records:
        run = record.dagster_run
        rows = set(rows_of_run(run))
        if rows and rows <= set(claims.get(run.tags.get(run_tags.CLAIMED_BY, ""), ())) and run.run_id not in waiting:
            dead.append(run.run_id)
    return dead


def fail_abandoned_runs(instance: dg.DagsterInstance, run_ids: Sequence[str], queue: LeaseQueue) -> tuple[str, ...]:
    """Mark FAILURE each of ``run_ids`` that Dagster still shows starting or started; returns those it marked.

    A run worker renews the leases of everything it took over at each heartbeat (and extends
    them before a wait it chose, ``LeaseKeeper.hold_for``), so a lease that ran out means its worker
    is gone or was cut off from the database for a whole lease: its work is already back in the
    queue, and the run would otherwise show STARTED for ever. Dagster's run monitoring cannot see
    this with the default run launcher, which has no worker health check (a code server's machine
    that went away takes its run workers with it). Failing the run makes it show where operators
    look (the Runs page, run-failure alerts); the run-failure sensor then finds nothing left to hand
    back. A worker that was only cut off records nothing in the application database (every write
    is fenced by its lease), though Dagster lets its later run events overwrite this status. One
    run that cannot be marked is logged and left as it is: the work itself is already requeued.
    """
    message = (
        f"Run worker gone: it stopped renewing the leases of the {queue.row_noun.lower()}s it held, which are "
        "back in the queue (its code server's machine or process died, or it lost the database for a whole lease)."
    )
    marked = []
    for run_id in run_ids:
        run = instance.get_run_by_id(run_id)
        if run is None or run.status not in (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED):
            continue
        try:
            instance.report_run_failed(run, message)
        except Exception:  # Dagster's storage refused; the rows are requeued already, so only the run's status is left
            logger.exception("Could not mark run %s FAILURE after its leases expired", run_id)
            continue
        marked.append(run_id)
    return tuple(marked)


@dataclass(frozen=True)
class TakenOver:
    """The rows a run now owns (in the order asked) and, for each row it could not take, why."""

    owner: str
    rows: list[sa.RowMapping]
    skipped: dict[int, str]


def take_over_rows(
    engine: sa.Engine,
    queue: LeaseQueue,
    ids: Sequence[int],
    *,
    claimed_by: str,
    run_id: str,
    lease_seconds: float,
    log: Callable[[str], None],
    also: Callable[[sa.Connection, list[sa.RowMapping]], None] | None = None,
) -> TakenOver:
    """Take the sensor's claim on ``ids`` over as this run, in one transaction with ``also``.

    A row the run cannot take (a re-execution from the UI of finished work, a run that started after
    its claim expired and another attempt took the row) is described and logged, and left alone.
    """
    owner = run_owner(run_id)
    ids = list(dict.fromkeys(ids))
    with engine.begin() as conn:
        rows = take_over_many(
            conn,
            queue,
            ids,
            claimed_by=claimed_by,
            new_owner=owner,
            lease_seconds=lease_seconds,
            run_id=run_id,
        )
        if also is not None:
            also(conn, rows)
        taken = {row["id"] for row in rows}
        skipped = {i: describe(conn, queue, i) for i in ids if i not in taken}
    noun = queue.row_noun
    for row_id, state in skipped.items():
        log(f"{noun} {row_id} {state}; this run does not own it and does nothing.")
    return TakenOver(owner, rows, skipped)


def reconcile_run(
    engine: sa.Engine,
    queue: LeaseQueue,
    run: dg.DagsterRun,
    row_ids: Sequence[int],
    outcome: str,
    reason: str,
    *,
    on_status: Callable[[sa.Connection, int, int, str], None] | None = None,
) -> dict[str, int]:
    """Hand back, or end, each row a run was launched for and still holds, when it ended without recording one.

    Each row is fenced on its own by the run's lease owner (or the sensor's claim, when the run never
    took it over) and by run id: rows the run already finished, or that another attempt owns by now, are
    left alone. ``outcome`` CANCELLED ends a row CANCELLED. Otherwise (the run failed):

    * a row still owned by the claim was never taken over: nothing was tried. It goes back to the queue
      now, with ``reason`` as its error: handed back in a queue with ``action_began`` (the attempt given
      back, due after ``UNSTARTED_DELAYS_SECONDS``), else a lost attempt, due at once. Its run's worker,
      should it start after all, takes nothing over (``take_over_many`` is fenced on the claim).
    * a row the run took over is not requeued here, as its worker may be alive (a run Dagster failed at
      its start timeout whose worker started late). Its lease is shortened to ``FENCE_SECONDS`` after its
      last renewal (``fence_leases``): a dead worker's rows expire within seconds, and the next claiming
      tick requeues them (``recover_expired``: lost if the action began, else handed back; due at once),
      while a live worker, which stops at its next heartbeat on its run's status, records what it has
      in flight. Counted as ``LEASE_SHORTENED``.

    ``on_status`` gets each changed row's id, its attempt (read from the row, so no run tag has to carry
    it) and new status. Returns how many rows got which status.
    """
    # Stored as each row's error and shown by the command line and alerts: a run's failure message may quote
    # anything (a stage, a receiver's answer), so it is redacted and its control characters written visibly.
    reason = shown_text(reason)
    claimed_by = run.tags.get(run_tags.CLAIMED_BY, "")
    taken_by = run_owner(run.run_id)
    owners = [taken_by, claimed_by]
    statuses: dict[str, int] = {}
    with engine.begin() as conn:
        held = held_rows(conn, queue, row_ids, owners)
        if outcome != CANCELLED:
            taken = [row_id for row_id, _, owner in held if owner == taken_by]
            if fenced := fence_leases(conn, queue, taken, taken_by, run.run_id, FENCE_SECONDS):
                statuses[LEASE_SHORTENED] = len(fenced)
        for row_id, attempt, owner in held:
            if outcome == CANCELLED:
                done = finish(conn, queue, row_id, owners, CANCELLED, {queue.error_column: reason})
                status = CANCELLED if done else None
            elif owner == claimed_by:
                status = retry_or_fail(conn, queue, row_id, [owner], reason, 0.0, run_id=run.run_id, lost=True)
            else:
                continue
            if status is not None:
                if on_status is not None:
                    on_status(conn, row_id, attempt, status)
                statuses[status] = statuses.get(status, 0) + 1
    return statuses


def run_never_started(instance: dg.DagsterInstance, run_id: str) -> bool:
    """Whether Dagster never saw this run's worker start (no start time on its run record)."""
    record = instance.get_run_record_by_id(run_id)
    return record is not None and record.start_time is None


def run_ended_check(instance: dg.DagsterInstance, run_id: str) -> Callable[[], str | None]:
    """What a run's worker asks before it takes rows over and at each heartbeat: why its Dagster run is no
    longer starting or started, or None while it is.

    A run Dagster ended once counts as ended even if it shows STARTED again: Dagster sets a run's status
    from its latest event, so a worker that passed Dagster's own start check just before run monitoring's
    start timeout failed the run writes RUN_START after that FAILURE, and the run shows STARTED while the
    run-failure sensor hands its rows back. The end time that FAILURE left on the run's record stays.
    """

    def ended() -> str | None:
        record = instance.get_run_record_by_id(run_id)
        if record is None:
            return f"Dagster run {run_id} is gone"
        status = record.dagster_run.status
        if status not in _WORKING:
            return f"Dagster run {run_id} is {status.value}, no longer STARTING or STARTED"
        if record.end_time is not None:
            return f"Dagster run {run_id} was ended (it shows {status.value} after a later event)"
        return None

    return ended


def held_rows(
    conn: sa.Connection, queue: LeaseQueue, row_ids: Sequence[int], owners: Sequence[str]
) -> list[tuple[int, int, str]]:
    """``(id, attempt, owner)`` of the rows among ``row_ids`` still RUNNING under one of ``owners``, by id.

    Only a hint of what to reconcile: each write that follows is fenced again on its own.
    """
    if not row_ids:
        return []
    t = queue.table
    query = (
        sa.select(t.c.id, t.c.attempts, t.c.lease_owner)
        .where(t.c.id.in_(list(row_ids)), t.c.status == RUNNING, t.c.lease_owner.in_([o for o in owners if o]))
        .order_by(t.c.id)
    )
    return [(row.id, row.attempts, row.lease_owner) for row in conn.execute(query)]
