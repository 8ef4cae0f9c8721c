"""``marketing_execution_job``: performs a batch of claimed executions, each fenced by its own lease.

A Dagster run costs seconds of process start-up while a ``log`` or ``webhook`` action costs
milliseconds, so one run performs up to ``MARKETING_EXECUTIONS_PER_RUN`` executions. Each one
keeps everything it had as a run of its own: its take-over, its lease (renewed together with the
others' in one fenced statement), its attempt, and its outcome, fenced by its own owner and status
and committed with the other outcomes finished at the same moment (group commit).
One failing execution is recorded as that execution's failure and costs the others nothing; a
run killed mid-batch leaves what it finished finished, and the rest to reconciliation or lease
expiry.

An attempt is spent only on the receiver: each wave of actions is recorded as begun (one statement)
just before it is dispatched, and an attempt whose action never began is handed back, not lost, if
its run dies or is failed (leasing/lease.py). The worker asks Dagster whether its run is still
starting or started before it takes its executions over, right after, and at each lease heartbeat;
once it is not (run monitoring failed it at its start timeout, say, while the run-failure sensor hands
its executions back) it begins nothing more.
"""

import functools
import os
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines import run_tags
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.executions.actions import (
    ActionContext,
    ActionFailed,
    ActionRefused,
    Endpoint,
    InvalidPayload,
    get_action,
    sealed_headers_box,
)
from marketing_pipelines.executions.endpoints import endpoint_names, open_endpoints
from marketing_pipelines.executions.queue import (
    EXECUTIONS,
    attempt_outcome,
    begin_attempts,
    end_attempt,
    end_attempts,
    failure_cause,
    get_execution,
    start_attempts,
)
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.leasing.claims import run_ended_check, take_over_rows
from marketing_pipelines.leasing.lease import LeaseKeeper, describe, finish, finish_many, retry_or_fail
from marketing_pipelines.redact import (
    hide_values,
    redact_text,
    secret_parts,
    shown_cell,
    visible_cell,
    visible_controls,
)
from marketing_pipelines.sealing import SecretBox

OP_NAME = "perform_executions"
# A run's outcome table shows at most this many rows; its stdout has a line for every success.
OUTCOME_TABLE_ROWS = 1000
# Executions of a computing action (log) performed and recorded together, in the run's own thread.
INLINE_CHUNK = 100

# A test hook (marketing_pipelines_tests/executions/test_overload_faults.py), inert unless this variable names
# a file: the first worker to rename "<file>.armed" to "<file>.reached" (writing its run id in it) waits, after
# its run's status check and before its take-over, until "<file>" exists, so a test can fail the run in that
# window. Unset, as everywhere but that test, it costs one lookup of the environment per run.
HOLD_BEFORE_TAKE_OVER = "MARKETING_TEST_HOLD_BEFORE_TAKE_OVER"
HOLD_SECONDS_MAX = 300


class ExecutionBatchConfig(dg.Config):
    execution_ids: list[int]
    claimed_by: str  # the sensor's lease owner; the run takes each lease over from it


@dataclass(frozen=True)
class ExecutionOutcome:
    """What one execution of a batch came to, as the run's log and outcome table show it."""

    execution_id: int
    campaign_id: str  # campaign, stage and action as they may be shown (_shown_where): the scheduler's text
    stage: str
    action: str
    attempt: int
    outcome: str  # SUCCEEDED, RESCHEDULED, FAILED, LEASE_LOST, NOT_BEGUN or SKIPPED
    detail: str  # as it may be shown (made by _redacted, or our own state text), even quoting a receiver
    seconds: float
    cause: str = ""  # why a FAILED execution failed, with its counts (queue.failure_cause)


@dataclass(frozen=True)
class _Attempted:
    """One execution's action done (or failed), its outcome not yet recorded."""

    row: Mapping[str, Any]
    error: str | None
    refused: bool  # the action was refused (e.g. its destination is not allowed): FAILED, no retry
    result: Mapping[str, Any]
    began: float
    lost: bool  # the lease keeper saw another attempt take the row while the action ran

    @functools.cached_property
    def where(self) -> tuple[str, str, str]:
        """``_shown_where`` of the row, made once for its log line, its outcome and its stdout line."""
        return _shown_where(self.row)

    @property
    def label(self) -> str:
        return _label(self.row, self.where)


def _shown_where(r: Mapping[str, Any]) -> tuple[str, str, str]:
    """A row's campaign, stage and action as every log line, failure and table of the run shows them.

    The stage is anyone's text (``executions schedule --stage``, an agent's ``schedule_execution`` tool): each
    is redacted and on one line with its control, bidi and invisible characters written visibly, so an escape
    sequence in it cannot drive the terminal that shows the run's log, nor a line break forge another line.
    """
    return shown_cell(str(r["campaign_id"])), shown_cell(str(r["stage"])), shown_cell(str(r["action"]))


def _label(r: Mapping[str, Any], where: tuple[str, str, str] | None = None) -> str:
    campaign, stage, action = where or _shown_where(r)
    return f"Execution {r['id']} ({campaign}/{stage}, {action}, attempt {r['attempts']})"


def _attempt(
    context: dg.OpExecutionContext,
    row: Mapping[str, Any],
    keeper: LeaseKeeper,
    webhook: WebhookClient,
    endpoints: Mapping[str, Endpoint | str],
    headers_box: SecretBox | str | None = None,
) -> _Attempted:
    """Run one execution's action (in a worker thread, or the op's own for a computing one); the op records it."""
    began = time.monotonic()
    error: str | None = None
    refused = False
    result: Mapping[str, Any] = {}
    try:
        action = get_action(row["action"])
        ctx = ActionContext(
            row["id"], row["attempts"], row["campaign_id"], row["stage"], context.log, endpoints, headers_box
        )
        result = action.run(ctx, row["payload"], webhook)
    except ActionFailed as exc:
        error, refused = _redacted(str(exc), row["payload"]), isinstance(exc, ActionRefused)
    except Exception as exc:  # a bug in one action must cost only its own execution
        context.log.error(
            f"{_label(row)}: unexpected error\n{_redacted(''.join(traceback.format_exception(exc)), row['payload'])}"
        )
        error = _redacted(f"internal error: {type(exc).__name__}: {exc}", row["payload"])
    # Stop renewing first: a renewal racing the outcome's commit would see the row finished and
    # report a lost lease that was not lost. The outcome's own WHERE still fences it.
    lost = keeper.is_lost(row["id"])
    keeper.release(row["id"])
    return _Attempted(row, error, refused, result, began, lost)


def _record_failure(
    conn: sa.Connection, done: _Attempted, owner: str, settings: ExecutionSettings
) -> tuple[str | None, str]:
    """Record one failed attempt (FAILED when refused, else retried or FAILED at max_attempts)."""
    execution_id, attempt, error = done.row["id"], done.row["attempts"], done.error or ""
    if done.refused:
        status: str | None = (
            "FAILED" if finish(conn, EXECUTIONS, execution_id, owner, "FAILED", {"last_error": error}) else None
        )
    else:
        status = retry_or_fail(conn, EXECUTIONS, execution_id, owner, error, settings.retry_delay_seconds(attempt))
    if status is None:
        return None, describe(conn, EXECUTIONS, execution_id)
    end_attempt(conn, execution_id, attempt, attempt_outcome(status), error)
    if status == EXECUTIONS.ready_status:
        current = get_execution(conn, execution_id)
        return status, f"rescheduled for {current['due_at'].isoformat() if current else '?'}"
    return status, ""


def _record_in(
    conn: sa.Connection, batch: Sequence[_Attempted], owner: str, settings: ExecutionSettings
) -> list[tuple[str | None, str]]:
    """Record a batch of attempts in one transaction: the successes in two statements, each row fenced."""
    succeeded = [d for d in batch if not d.lost and d.error is None]
    recorded = finish_many(conn, EXECUTIONS, [d.row["id"] for d in succeeded], owner, "SUCCEEDED", {"last_error": None})
    end_attempts(conn, [(d.row["id"], d.row["attempts"]) for d in succeeded if d.row["id"] in recorded], "SUCCEEDED")
    results: list[tuple[str | None, str]] = []
    for done in batch:
        if done.lost:
            results.append((None, "lost its lease while the action ran"))
        elif done.error is not None:
            results.append(_record_failure(conn, done, owner, settings))
        elif done.row["id"] in recorded:
            results.append(("SUCCEEDED", ""))
        else:
            results.append((None, describe(conn, EXECUTIONS, done.row["id"])))
    return results


def _record(
    engine: sa.Engine, batch: Sequence[_Attempted], owner: str, settings: ExecutionSettings
) -> list[tuple[str | None, str]]:
    """Record the outcomes of the attempts that finished since the last call: (new status or None, state) each.

    One transaction for the batch (group commit: while one commits, the next batch gathers), so a
    thousand log executions cost a handful of commits instead of a thousand. All or nothing: a run
    killed while it commits leaves each execution of the batch with its outcome and its attempt's,
    or with neither (RUNNING under the run, for reconciliation or lease expiry to retry). What a
    receiver quoted is made storable first (``_redacted``), so no row's text can fail the batch.
    """
    with engine.begin() as conn:
        return _record_in(conn, batch, owner, settings)


def _report(context: dg.OpExecutionContext, done: _Attempted, status: str | None, state: str) -> ExecutionOutcome:
    """The outcome of one recorded attempt; everything but a success is logged to the run's event log."""
    row, error = done.row, done.error
    seconds = time.monotonic() - done.began

    def outcome(kind: str, detail: str) -> ExecutionOutcome:
        return ExecutionOutcome(row["id"], *done.where, row["attempts"], kind, detail, seconds)

    if status is None:
        # Another attempt owns the row now (its lease expired); that attempt records the outcome.
        context.log.warning(
            f"{done.label}: this run lost its lease ({state}); its outcome was not recorded. The action may have "
            "run; the next attempt sends the same Idempotency-Key, so a receiver can drop the repeat."
        )
        return outcome("LEASE_LOST", state)
    if status == "SUCCEEDED":
        detail = _redacted(", ".join(f"{k}={v}" for k, v in done.result.items()), row["payload"])
        return outcome("SUCCEEDED", detail)
    if status == "FAILED":
        cause = failure_cause({**row, "status": "FAILED"}, refused=done.refused) or ""
        context.log.error(f"{done.label} FAILED: {cause}. Its last error: {error}")
        return ExecutionOutcome(row["id"], *done.where, row["attempts"], "FAILED", error or "", seconds, cause)
    context.log.warning(f"{done.label} failed: {error}; {state}.")
    return outcome("RESCHEDULED", f"{error}; {state}")


def _recorded(
    context: dg.OpExecutionContext,
    engine: sa.Engine,
    batch: Sequence[_Attempted],
    owner: str,
    settings: ExecutionSettings,
) -> list[ExecutionOutcome]:
    """Record a batch of attempts, then report each (event log for all but successes, stdout for those)."""
    reported = [_report(context, d, *r) for d, r in zip(batch, _record(engine, batch, owner, settings), strict=True)]
    _print_successes(batch, reported)
    return reported


def _waits(action: str) -> bool:
    """Whether an action waits on the network (an unknown one goes to a worker thread, where it fails alone)."""
    try:
        return get_action(action).waits
    except InvalidPayload:
        return True


def _print_successes(batch: Sequence[_Attempted], outcomes: Sequence[ExecutionOutcome]) -> None:
    """One line per success to the run's captured stdout (the run page's stdout view), in one write.

    Not the event log: an event per execution was an INSERT and a commit in Dagster's database each,
    the largest cost of a log execution. Failures, reschedules and lost leases stay in the event log,
    and the outcome table lists every execution.
    """
    # One line each whatever a payload's message holds (visible_cell: a line break as \n), so none forges another.
    lines = [
        f"{done.label} SUCCEEDED{f': {visible_cell(o.detail)}' if o.detail else ''}.\n"
        for done, o in zip(batch, outcomes, strict=True)
        if o.outcome == "SUCCEEDED"
    ]
    if lines:
        sys.stdout.write("".join(lines))
        sys.stdout.flush()


def _redacted(text: str, payload: Any) -> str:
    """An action's message as it is stored and logged: redacted, without any piece of the payload's URL
    or headers, which a receiver's answer may quote bare ("no hook /services/T0/B0/<token>"), and with
    control characters written visibly: PostgreSQL text cannot hold the NUL a receiver may answer with,
    and a terminal showing ``executions show`` should not obey an escape sequence."""
    return visible_controls(hide_values(redact_text(text), secret_parts(payload)))


def _outcome_table(outcomes: Sequence[ExecutionOutcome]) -> dg.TableMetadataValue:
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord(
                {
                    "execution_id": o.execution_id,
                    "campaign": o.campaign_id,
                    "stage": o.stage,
                    "action": o.action,
                    "attempt": o.attempt,
                    "outcome": o.outcome,
                    # Already as shown (_redacted); redacting a thousand details again cost more than the SQL.
                    "detail": o.detail[:300],
                    "cause": o.cause,
                    "seconds": round(o.seconds, 3),
                }
            )
            for o in outcomes[:OUTCOME_TABLE_ROWS]
        ],
        schema=dg.TableSchema(
            columns=[
                dg.TableColumn("execution_id", "int"),
                dg.TableColumn("campaign", "string"),
                dg.TableColumn("stage", "string"),
                dg.TableColumn("action", "string"),
                dg.TableColumn("attempt", "int"),
                dg.TableColumn("outcome", "string"),
                dg.TableColumn("detail", "string"),
                dg.TableColumn("cause", "string"),
                dg.TableColumn("seconds", "float"),
            ]
        ),
    )


def _held_for_test(run_id: str) -> None:
    """The test hook ``HOLD_BEFORE_TAKE_OVER``: nothing unless the variable is set and this worker arms it first."""
    gate = os.environ.get(HOLD_BEFORE_TAKE_OVER)
    if not gate:
        return
    try:
        Path(f"{gate}.armed").rename(f"{gate}.reached")  # one worker wins; the others go on at once
    except OSError:
        return
    Path(f"{gate}.reached").write_text(run_id)
    deadline = time.monotonic() + HOLD_SECONDS_MAX
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


@dataclass
class _Batch:
    """A run's executions on their way: each wave of actions recorded as begun (``begin_attempts``, one
    statement) just before it is dispatched, and none once the lease keeper stopped the work.

    Webhooks go to the thread pool at most ``limit`` at a time (a row waiting in the pool's queue has not
    begun, and is handed back unspent if the run dies); computing actions run in the op's thread a chunk at
    a time, between which the webhooks that finished are recorded and replaced.
    """

    context: dg.OpExecutionContext
    engine: sa.Engine
    owner: str
    settings: ExecutionSettings
    keeper: LeaseKeeper
    pool: ThreadPoolExecutor
    limit: int
    attempt: Callable[[Mapping[str, Any]], _Attempted]
    performed: list[ExecutionOutcome] = field(default_factory=list)
    not_begun: list[Mapping[str, Any]] = field(default_factory=list)
    pending: set[Future[_Attempted]] = field(default_factory=set)

    def run(self, rows: Sequence[Mapping[str, Any]]) -> None:
        waiting = deque(row for row in rows if _waits(row["action"]))
        inline = [row for row in rows if not _waits(row["action"])]
        self._dispatch(waiting)
        # Actions that only compute (log) run here meanwhile, recorded a chunk at a time: a thread
        # hand-off per execution cost more than the action itself.
        for start in range(0, len(inline), INLINE_CHUNK):
            chunk = self._begin(inline[start : start + INLINE_CHUNK])
            if chunk:
                self._record([self.attempt(row) for row in chunk])
            self._collect(waiting, timeout=0)
        while self.pending:
            self._collect(waiting, timeout=None)

    def _begin(self, wave: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        def mark(ids: Sequence[int]) -> set[int]:
            with self.engine.begin() as conn:
                return begin_attempts(conn, ids, self.owner)

        began = self.keeper.begin([row["id"] for row in wave], mark)
        self.not_begun += [row for row in wave if row["id"] not in began]
        return [row for row in wave if row["id"] in began]

    def _dispatch(self, waiting: deque[Mapping[str, Any]]) -> None:
        while waiting and len(self.pending) < self.limit:
            wave = [waiting.popleft() for _ in range(min(len(waiting), self.limit - len(self.pending)))]
            self.pending.update(self.pool.submit(self.attempt, row) for row in self._begin(wave))

    def _collect(self, waiting: deque[Mapping[str, Any]], timeout: float | None) -> None:
        if self.pending:
            # Every attempt finished by now is recorded together; the next batch gathers meanwhile.
            finished, self.pending = wait(self.pending, timeout=timeout, return_when=FIRST_COMPLETED)
            if finished:
                self._record(sorted((f.result() for f in finished), key=lambda d: d.row["id"]))
        self._dispatch(waiting)

    def _record(self, batch: Sequence[_Attempted]) -> None:
        self.performed += _recorded(self.context, self.engine, batch, self.owner, self.settings)


def _not_begun(engine: sa.Engine, rows: Sequence[Mapping[str, Any]], stop_reason: str | None) -> list[ExecutionOutcome]:
    """The outcomes of rows this run took over and never began: handed back, or another attempt's by now."""
    with engine.connect() as conn:
        states = {row["id"]: describe(conn, EXECUTIONS, row["id"]) for row in rows}
    why = f"not begun ({stop_reason}); back in the queue, its attempt not spent" if stop_reason else "not begun"
    return [
        ExecutionOutcome(
            row["id"], *_shown_where(row), row["attempts"], "NOT_BEGUN", f"{why}; it {states[row['id']]}", 0.0
        )
        for row in rows
    ]


@dg.op(
    name=OP_NAME,
    description=(
        "Perform a batch of claimed marketing executions, each under its own lease, and record each outcome. "
        "Webhooks are sent concurrently (MARKETING_WEBHOOK_CONCURRENCY)."
    ),
    # No value for an IO manager to store (nothing downstream reads one): the outcomes live in the
    # application database and the output's metadata, and storing a value cost a pickle and an event.
    out=dg.Out(dg.Nothing),
)
def perform_executions(
    context: dg.OpExecutionContext,
    config: ExecutionBatchConfig,
    app_db: AppDatabase,
    webhook: WebhookClient,
    execution_settings: ExecutionSettings,
) -> dg.Output[None]:
    settings = execution_settings
    engine = app_db.ready_engine()
    ids = list(dict.fromkeys(config.execution_ids))
    run_ended = run_ended_check(context.instance, context.run_id)
    if (why := run_ended()) is not None:
        # Dagster ended the run before its worker got here (run monitoring's start timeout under load): the
        # run-failure sensor hands its executions back, and taking them over now would race it.
        raise dg.Failure(
            description=f"{why}: this worker takes none of its {len(ids)} execution(s) over and does nothing; "
            "the run-failure sensor hands them back, their attempts not spent."
        )
    _held_for_test(context.run_id)
    taken_over = take_over_rows(
        engine,
        EXECUTIONS,
        ids,
        claimed_by=config.claimed_by,
        run_id=context.run_id,
        lease_seconds=settings.lease_seconds,
        log=context.log.info,
        also=lambda conn, rows: start_attempts(conn, rows, context.run_id),
    )
    owner, rows = taken_over.owner, taken_over.rows
    taken = {row["id"] for row in rows}
    outcomes: list[ExecutionOutcome] = [
        ExecutionOutcome(execution_id, "", "", "", 0, "SKIPPED", state, 0.0)
        for execution_id, state in taken_over.skipped.items()
    ]
    context.log.info(f"Performing {len(rows)} of {len(ids)} execution(s) as {owner}.")

    stop_reason: str | None = None
    if rows:
        # The registered endpoints the batch names, opened once (one query, one key) for all its sends.
        names = endpoint_names(row["payload"] for row in rows if row["action"] == "webhook")
        endpoints: Mapping[str, Endpoint | str] = {}
        if names:
            with engine.connect() as conn:
                endpoints = open_endpoints(conn, webhook.sealing_keys, names)
        # What opens the batch's sealed header values, made once (one key read) for all its sends.
        headers_box = sealed_headers_box(webhook.sealing_keys, (r["payload"] for r in rows if r["action"] == "webhook"))
        limit = min(webhook.concurrency, len(rows))
        with (
            LeaseKeeper(
                engine,
                EXECUTIONS,
                sorted(taken),
                owner,
                settings.lease_seconds,
                on_lost=context.log.error,
                run_ended=run_ended,
                on_stopped=context.log.warning,
            ) as keeper,
            webhook.one_loop(),
            ThreadPoolExecutor(max_workers=limit) as pool,
        ):
            # Dagster may have ended the run while this worker took its executions over.
            keeper.check_run()
            batch = _Batch(
                context,
                engine,
                owner,
                settings,
                keeper,
                pool,
                limit,
                lambda row: _attempt(context, row, keeper, webhook, endpoints, headers_box),
            )
            batch.run(rows)
        stop_reason = keeper.stop_reason
        outcomes += sorted(
            batch.performed + _not_begun(engine, batch.not_begun, stop_reason), key=lambda o: o.execution_id
        )
    elif (why := run_ended()) is not None:
        stop_reason = why
        context.log.warning(f"{why}: this worker took none of its executions over and does nothing.")

    counts = {
        kind: sum(1 for o in outcomes if o.outcome == kind) for kind in dict.fromkeys(o.outcome for o in outcomes)
    }
    summary = ", ".join(f"{n} {kind}" for kind, n in counts.items()) or "nothing to do"
    context.log.info(f"Batch done: {summary}.")
    metadata: dict[str, Any] = {kind.lower(): dg.MetadataValue.int(n) for kind, n in counts.items()}
    if outcomes:
        metadata["executions"] = _outcome_table(outcomes)
    if not rows and ids and stop_reason is None:
        context.log.info(
            f"This run owns none of its {len(ids)} execution(s) (e.g. a re-execution of finished work) and did "
            "nothing; `marketing-pipelines executions retry ID` runs a failed or cancelled execution again."
        )
    failed = [o for o in outcomes if o.outcome == "FAILED"]
    if failed or stop_reason is not None:
        # Every outcome is recorded by now: failing the run changes no row (the run-failure sensor's
        # reconciliation is fenced by status and owner), it makes the failure show where Dagster users
        # look: the run's status, the Runs page's "Failed" filter, run-failure sensors and alerts. A run
        # Dagster ended stays failed: its worker's own later events would otherwise show it succeeded.
        description = failure_description(failed, len(outcomes)) if failed else ""
        if stop_reason is not None:
            ended = (
                f"{stop_reason}: this worker stopped; {counts.get('NOT_BEGUN', 0)} execution(s) not begun are "
                "back in the queue, their attempts not spent."
                if rows
                else f"{stop_reason}: this worker took none of its {len(ids)} execution(s) over and did nothing."
            )
            description = f"{ended}\n{description}" if description else ended
        raise dg.Failure(description=description, metadata=metadata)
    if counts.get("RESCHEDULED"):
        context.log.warning(
            f"{counts['RESCHEDULED']} execution(s) failed an attempt and are rescheduled; the run succeeds because "
            "a retry is coming (an execution that fails its last attempt fails its run)."
        )
    return dg.Output(None, metadata=metadata)


# How many failed executions a run's failure message names; the outcome table lists them all.
FAILURE_MESSAGE_EXECUTIONS = 20


def failure_description(failed: Sequence[ExecutionOutcome], total: int) -> str:
    """The run's failure message: which executions FAILED (id, campaign, reason), as a person may read it.

    A reason may quote a receiver's answer and a stage is anyone's text: each is redacted and on one line with
    its control characters written visibly (``shown_cell``), so no execution's text can forge another's line.
    """
    lines = [
        f"{o.execution_id} ({shown_cell(f'{o.campaign_id}/{o.stage}, {o.action}')}, attempt {o.attempt}): "
        f"{shown_cell(o.detail)[:300]}{f' ({shown_cell(o.cause)})' if o.cause else ''}"
        for o in failed[:FAILURE_MESSAGE_EXECUTIONS]
    ]
    more = len(failed) - len(lines)
    if more:
        lines.append(f"... and {more} more (the outcome table lists every execution)")
    head = f"{len(failed)} of {total} execution(s) FAILED (attempts exhausted or refused); the others' outcomes stand:"
    return "\n".join([head, *(f"- {line}" for line in lines)])


@dg.job(
    name="marketing_execution_job",
    description=(
        "Performs a batch of scheduled marketing executions claimed by due_executions_sensor, each fenced by "
        "its own lease; the output's metadata lists every execution and its outcome."
    ),
    tags={run_tags.KIND: "execution"},
    # The work waits on the network and the database: a step subprocess would only add start-up time.
    executor_def=dg.in_process_executor,
)
def marketing_execution_job() -> None:
    perform_executions()
