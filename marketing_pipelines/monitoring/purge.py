"""The history of finished work, deleted once it is older than a cutoff: the SQL behind ``db purge`` and
``history_purge_job``.

History is what records work that is over: executions that finished (SUCCEEDED, FAILED, CANCELLED) with
their attempt rows, agent runs that finished (SUCCEEDED, FAILED, CANCELLED, REFUSED) with their transcript
steps, and the rejected lines of event-file loads. Rows are old by ``finished_at`` (``rejected_at`` for a
reject), which every path that finishes a row sets. SCHEDULED, RUNNING and QUEUED rows are never touched,
however old. Everything else is data and stays: the events the rollup is built from, the importers'
tables, the rollups, campaigns, users and grants, endpoints and token buckets.

A purge deletes in batches of at most ``BATCH_ROWS`` rows of a table, each batch one short transaction, so
a first purge of years of history never holds its locks for long: the batch's rows are locked as they are
picked (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; SQLite's write lock is the whole database's), so a row
retried meanwhile is either skipped or kept from being retried until the batch commits, never half deleted.
Child rows (attempts, transcript steps) are deleted before their parent, in the same transaction, so each
is counted; their foreign keys' ON DELETE CASCADE would delete them anyway.

No Dagster import here: the command line runs it and must start without Dagster.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from marketing_pipelines.db.engine import one_of
from marketing_pipelines.db.schema import (
    agent_run,
    agent_run_step,
    marketing_event_reject,
    marketing_execution,
    marketing_execution_attempt,
)

# Rows of one table deleted per transaction. A batch of 5,000 executions with their attempts took 70 ms (133 ms
# at most) on PostgreSQL here (benchmarks/table_growth.py). Its row locks hold finished rows, which no claim
# reads; on SQLite a batch holds the database's one write lock, so another writer waits one batch at most.
BATCH_ROWS = 5_000

# The statuses after which a row never changes again by itself. A retry (`executions retry`, `agents retry`)
# brings a FAILED or CANCELLED row back, which the batch's row locks order before or after its deletion.
FINISHED_EXECUTION_STATUSES = ("SUCCEEDED", "FAILED", "CANCELLED")
FINISHED_AGENT_RUN_STATUSES = ("SUCCEEDED", "FAILED", "CANCELLED", "REFUSED")


@dataclass(frozen=True)
class HistoryTable:
    """A table of finished work: which of its rows are history, by what time, and the child table going with them."""

    table: sa.Table
    finished_statuses: tuple[str, ...] | None  # None: every row records something over
    finished_at: sa.Column[datetime]
    child: sa.Table | None = None
    child_key: sa.Column[int] | None = None

    def finished_before(self, cutoff: datetime) -> list[sa.ColumnElement[bool]]:
        """The conditions of a row of this table that is history older than ``cutoff``."""
        conditions = [self.finished_at < cutoff]
        if self.finished_statuses is not None:
            conditions.insert(0, self.table.c.status.in_(self.finished_statuses))
        return conditions

    @property
    def names(self) -> tuple[str, ...]:
        """This table's name, then its child's."""
        return (self.table.name,) if self.child is None else (self.table.name, self.child.name)


HISTORY = (
    HistoryTable(
        marketing_execution,
        FINISHED_EXECUTION_STATUSES,
        marketing_execution.c.finished_at,
        marketing_execution_attempt,
        marketing_execution_attempt.c.execution_id,
    ),
    HistoryTable(
        agent_run, FINISHED_AGENT_RUN_STATUSES, agent_run.c.finished_at, agent_run_step, agent_run_step.c.agent_run_id
    ),
    HistoryTable(marketing_event_reject, None, marketing_event_reject.c.rejected_at),
)
# Every table a purge deletes from, in the order it reports them.
HISTORY_TABLES = tuple(name for history in HISTORY for name in history.names)


def history_cutoff(days: int, now: datetime | None = None) -> datetime:
    """The moment ``days`` days before ``now`` (default: this process's clock): history finished before it goes."""
    return (now or datetime.now(UTC)) - timedelta(days=days)


def no_rows() -> dict[str, int]:
    """A count of 0 for every table a purge deletes from."""
    return dict.fromkeys(HISTORY_TABLES, 0)


def count_history(engine: sa.Engine, cutoff: datetime) -> dict[str, int]:
    """Rows a purge at ``cutoff`` would delete, by table (``db purge --dry-run``)."""
    counts = no_rows()
    with engine.connect() as conn:
        for history in HISTORY:
            conditions = history.finished_before(cutoff)
            counts[history.table.name] = conn.execute(
                sa.select(sa.func.count()).select_from(history.table).where(*conditions)
            ).scalar_one()
            if history.child is not None and history.child_key is not None:
                finished = sa.select(history.table.c.id).where(*conditions)
                counts[history.child.name] = conn.execute(
                    sa.select(sa.func.count()).select_from(history.child).where(history.child_key.in_(finished))
                ).scalar_one()
    return counts


def purge_batches(engine: sa.Engine, cutoff: datetime, batch_rows: int = BATCH_ROWS) -> Iterator[dict[str, int]]:
    """Delete the history older than ``cutoff``, one committed batch at a time; yields each batch's rows by table.

    A caller that stops early (or fails midway) leaves what earlier batches deleted deleted, and every row
    not yet reached as it was: a purge is safe to stop and to run again.
    """
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be at least 1, got {batch_rows}")
    for history in HISTORY:
        while True:
            with engine.begin() as conn:
                deleted = _delete_one_batch(conn, history, cutoff, batch_rows)
            if deleted[history.table.name]:
                yield deleted
            # A short batch is the last one: what is left is locked by others (retried this moment) or newer.
            if deleted[history.table.name] < batch_rows:
                break


def _delete_one_batch(conn: sa.Connection, history: HistoryTable, cutoff: datetime, batch_rows: int) -> dict[str, int]:
    t, conditions = history.table, history.finished_before(cutoff)
    # Locked as picked: a concurrent retry of one of these rows waits for this batch (then finds no row) or,
    # holding it first, keeps it out of the batch. SQLite ignores FOR UPDATE; its transaction holds the write lock.
    picked = list(
        conn.execute(sa.select(t.c.id).where(*conditions).limit(batch_rows).with_for_update(skip_locked=True)).scalars()
    )
    deleted = dict.fromkeys(history.names, 0)
    if not picked:
        return deleted
    if history.child is not None and history.child_key is not None:
        deleted[history.child.name] = conn.execute(
            sa.delete(history.child).where(one_of(conn, history.child_key, picked))
        ).rowcount
    deleted[t.name] = conn.execute(sa.delete(t).where(one_of(conn, t.c.id, picked), *conditions)).rowcount
    if deleted[t.name] != len(picked):
        # Cannot happen while the rows are locked; if it did, the rollback keeps their children too.
        raise RuntimeError(f"{t.name}: {len(picked)} row(s) picked for deletion, {deleted[t.name]} still history")
    return deleted
