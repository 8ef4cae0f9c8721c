"""Concurrent schedules with one dedupe key: every caller gets the one execution's id, none an IntegrityError.

Processes, not threads: each has its own engine and connections, as two CLI calls or two code servers do.
Each round gives every process a fresh key and releases them together, so the first requests race; a key
already stored is answered by the lookup before any of them. The harness also runs the former lookup-then-
INSERT, which must raise IntegrityError under the same race on PostgreSQL: that proves the race is real. On
SQLite each transaction takes the write lock at BEGIN (db/engine.py), so there the calls run one at a time.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from collections import defaultdict
from typing import Any

import pytest
import sqlalchemy as sa

from marketing_pipelines.db.schema import marketing_execution as t
from marketing_pipelines_tests.factories import add_campaign

PROCESSES = 4
ROUNDS = 30


def _schedule(conn: sa.Connection, key: str) -> int:
    from datetime import UTC, datetime

    from marketing_pipelines.executions.queue import schedule_execution

    return schedule_execution(
        conn, campaign_id="spring-launch", stage="launch", action="log", due_at=datetime.now(UTC), dedupe_key=key
    )


def _lookup_then_insert(conn: sa.Connection, key: str) -> int:
    """The former schedule_execution's end: look the key up, then INSERT."""
    from datetime import UTC, datetime

    from marketing_pipelines.executions.queue import execution_with_dedupe_key

    existing = execution_with_dedupe_key(conn, key)
    if existing is not None:
        return existing
    now = datetime.now(UTC)
    values = {
        "campaign_id": "spring-launch",
        "stage": "launch",
        "action": "log",
        "payload": {},
        "due_at": now,
        "status": "SCHEDULED",
        "attempts": 0,
        "max_attempts": 3,
        "dedupe_key": key,
        "created_at": now,
        "updated_at": now,
    }
    return conn.execute(sa.insert(t).values(values).returning(t.c.id)).scalar_one()


SCHEDULERS = {"schedule_execution": _schedule, "lookup_then_insert": _lookup_then_insert}


def _worker(db_url: str, scheduler: str, barrier: Any, out: Any) -> None:
    """Schedule each round's key once, in its own transaction; report (key, id) or (key, the exception)."""
    from marketing_pipelines.db.engine import get_engine

    engine = get_engine(db_url)
    schedule = SCHEDULERS[scheduler]
    with engine.connect() as conn:  # imports and the first connection paid before the race
        conn.execute(sa.text("SELECT 1"))
    results: list[tuple[str, int | str]] = []
    for round_ in range(ROUNDS):
        key = f"race-{round_}"
        barrier.wait()
        try:
            with engine.begin() as conn:
                results.append((key, schedule(conn, key)))
        except Exception as exc:
            results.append((key, f"{type(exc).__name__}: {str(exc).splitlines()[0]}"))
    out.put(results)


def _race(db_url: str, scheduler: str) -> dict[str, list[int | str]]:
    """Each key's answers, one from every process."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(PROCESSES, timeout=120), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(db_url, scheduler, barrier, out)) for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    answers: dict[str, list[int | str]] = defaultdict(list)
    deadline = time.monotonic() + 300
    for _ in procs:
        while True:
            try:
                results = out.get(timeout=1)
                break
            except queue.Empty:  # fail fast when a worker died, not after the deadline
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                assert not dead, f"a worker process exited with {dead}"
                assert time.monotonic() < deadline, "workers did not finish in time"
        for key, answer in results:
            answers[key].append(answer)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return answers


def _rows(engine: sa.Engine) -> list[tuple[str, int]]:
    with engine.connect() as conn:
        return [(key, id_) for key, id_ in conn.execute(sa.select(t.c.dedupe_key, t.c.id).order_by(t.c.id))]


@pytest.mark.slow
def test_concurrent_schedules_with_one_key_all_get_its_one_execution(db_url: str, engine: sa.Engine) -> None:
    add_campaign(engine)
    answers = _race(db_url, "schedule_execution")
    rows = dict(stored := _rows(engine))
    assert sorted(key for key, _ in stored) == sorted(f"race-{i}" for i in range(ROUNDS))  # one row per key
    failed = {key: [a for a in got if isinstance(a, str)] for key, got in answers.items()}
    assert {key: errors for key, errors in failed.items() if errors} == {}
    assert {key: set(got) for key, got in answers.items()} == {key: {rows[key]} for key in rows}
    assert all(len(got) == PROCESSES for got in answers.values())


@pytest.mark.slow
@pytest.mark.parametrize("database", ["postgres"])
def test_harness_sees_the_race_of_lookup_then_insert(database: str, pg_url: str) -> None:
    from marketing_pipelines.db.engine import get_engine

    add_campaign(get_engine(pg_url))
    answers = _race(pg_url, "lookup_then_insert")
    errors = [a for got in answers.values() for a in got if isinstance(a, str)]
    assert errors, "no IntegrityError in any round: the harness did not make the first requests race"
    assert all(e.startswith("IntegrityError") for e in errors), errors[:3]
