"""Outcomes recorded a batch at a time (group commit) stay fenced row by row, on both databases."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import marketing_execution as t
from marketing_pipelines.db.schema import marketing_execution_attempt
from marketing_pipelines.egress import EgressPolicy
from marketing_pipelines.executions.jobs import _Attempted, _record
from marketing_pipelines.executions.queue import (
    EXECUTIONS,
    end_attempts,
    get_execution,
    list_attempts,
    schedule_execution,
    start_attempts,
)
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.leasing.claims import take_over_rows
from marketing_pipelines.leasing.lease import claim_batch
from marketing_pipelines_tests.factories import add_campaign

BACKING_OFF = ExecutionSettings(retry_backoff_seconds=600)


def _taken_over(engine: sa.Engine, n: int, run_id: str = "run-1") -> tuple[str, list[sa.RowMapping]]:
    add_campaign(engine)
    with engine.begin() as conn:
        for i in range(n):
            schedule_execution(
                conn,
                campaign_id="spring-launch",
                stage="launch",
                action="log",
                due_at=datetime.now(UTC) - timedelta(seconds=n - i),
                payload={"message": f"hello {i}"},
                egress=EgressPolicy(()),
            )
        claimed = claim_batch(conn, EXECUTIONS, "sensor-claim", n, 300)
    taken = take_over_rows(
        engine,
        EXECUTIONS,
        [r["id"] for r in claimed],
        claimed_by="sensor-claim",
        run_id=run_id,
        lease_seconds=300,
        log=lambda _: None,
        also=lambda conn, rows: start_attempts(conn, rows, run_id),
    )
    assert len(taken.rows) == n
    return taken.owner, taken.rows


def _done(row: sa.RowMapping, error: str | None = None, refused: bool = False, lost: bool = False) -> _Attempted:
    return _Attempted(row, error, refused, {"message": "hi"} if error is None else {}, time.monotonic(), lost)


def _state(engine: sa.Engine, execution_id: int) -> tuple[str, str | None, list[str | None]]:
    with engine.connect() as conn:
        row = get_execution(conn, execution_id)
        attempts = [a["outcome"] for a in list_attempts(conn, execution_id)]
    assert row is not None
    return row["status"], row["lease_owner"], attempts


def test_a_lost_lease_inside_a_batch_costs_only_its_own_row(engine: sa.Engine) -> None:
    owner, rows = _taken_over(engine, 6)
    ids = [r["id"] for r in rows]
    # Another attempt took row 2 (its lease expired and the sensor claimed it again) before the batch was recorded.
    with engine.begin() as conn:
        conn.execute(sa.update(t).where(t.c.id == ids[2]).values(lease_owner="run:another"))
    batch = [
        _done(rows[0]),
        _done(rows[1]),
        _done(rows[2]),  # succeeded here, but the row is no longer this run's
        _done(rows[3], error="webhook answered HTTP 500"),
        _done(rows[4], error="webhook refused: private address", refused=True),
        _done(rows[5], lost=True),  # the lease keeper saw it lost while the action ran
    ]
    results = _record(engine, batch, owner, BACKING_OFF)

    assert [status for status, _ in results] == ["SUCCEEDED", "SUCCEEDED", None, "SCHEDULED", "FAILED", None]
    assert "run:another" in results[2][1]
    assert results[3][1].startswith("rescheduled for ")
    assert _state(engine, ids[0]) == ("SUCCEEDED", None, ["SUCCEEDED"])
    assert _state(engine, ids[1]) == ("SUCCEEDED", None, ["SUCCEEDED"])
    # The row another attempt holds is left to it: still RUNNING under its owner, this attempt left open.
    assert _state(engine, ids[2]) == ("RUNNING", "run:another", [None])
    assert _state(engine, ids[3]) == ("SCHEDULED", None, ["RESCHEDULED"])
    assert _state(engine, ids[4]) == ("FAILED", None, ["FAILED"])
    # Lost while running: nothing recorded for it by this run; its lease runs out and it is claimed again.
    assert _state(engine, ids[5]) == ("RUNNING", owner, [None])


def test_a_batch_is_recorded_in_one_transaction_or_not_at_all(pg_url: str) -> None:
    """A run whose database connection dies while it commits a batch (its worker killed, the server
    restarted) leaves none of it half-written: each execution has its outcome and its attempt's, or
    neither, for reconciliation to retry."""
    engine = get_engine(pg_url)
    owner, rows = _taken_over(engine, 4)
    ids = [r["id"] for r in rows]
    batch = [_done(r) for r in rows]
    admin = sa.create_engine(engine.url, poolclass=sa.pool.NullPool)

    def kill_backend_before_commit(conn: sa.Connection) -> None:
        pid = conn.connection.dbapi_connection.get_backend_pid()
        with admin.connect() as other:
            other.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})

    sa.event.listen(engine, "commit", kill_backend_before_commit)
    try:
        with pytest.raises(sa.exc.OperationalError):
            _record(engine, batch, owner, BACKING_OFF)
    finally:
        sa.event.remove(engine, "commit", kill_backend_before_commit)
        admin.dispose()
    assert [_state(engine, i) for i in ids] == [("RUNNING", owner, [None])] * 4
    # Recorded again (as reconciliation or the next attempt would), each row exactly once.
    assert [s for s, _ in _record(engine, batch, owner, BACKING_OFF)] == ["SUCCEEDED"] * 4
    assert [_state(engine, i) for i in ids] == [("SUCCEEDED", None, ["SUCCEEDED"])] * 4
    assert [s for s, _ in _record(engine, batch, owner, BACKING_OFF)] == [None] * 4


def test_ending_attempts_ends_exactly_the_pairs_named(engine: sa.Engine) -> None:
    """Each (execution, attempt) pair is matched as a pair: execution 1's attempt 2 and execution 2's
    attempt 1 named together end neither execution 1's attempt 1 nor execution 2's attempt 2."""
    _, rows = _taken_over(engine, 2)
    first, second = rows[0]["id"], rows[1]["id"]
    a = marketing_execution_attempt
    with engine.begin() as conn:
        conn.execute(
            sa.insert(a),
            [
                {"execution_id": first, "attempt": 2, "run_id": "run-1", "started_at": datetime.now(UTC)},
                {"execution_id": second, "attempt": 2, "run_id": "run-1", "started_at": datetime.now(UTC)},
            ],
        )
        end_attempts(conn, [(first, 2), (second, 1)], "SUCCEEDED")
    with engine.connect() as conn:
        assert [x["outcome"] for x in list_attempts(conn, first)] == [None, "SUCCEEDED"]
        assert [x["outcome"] for x in list_attempts(conn, second)] == ["SUCCEEDED", None]
