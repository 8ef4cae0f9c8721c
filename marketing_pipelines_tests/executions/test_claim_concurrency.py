"""Two replicas never launch the same execution: separate processes race through due_executions_sensor.

The harness also runs the first version's read-then-update claim, which must double-claim
under the same race; that proves the harness can see a double claim at all.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections import Counter
from typing import Any

import pytest
import sqlalchemy as sa

from marketing_pipelines_tests.factories import add_campaign, bulk_due_executions, start_runs

DUE = 2000
WORKERS = 2
BATCH = 25
PER_RUN = 10  # a tick of 25 makes runs of 10, 10 and 5


def _sensor_worker(db_url: str, start: Any, out: Any) -> None:
    """Evaluate due_executions_sensor in a loop until it finds nothing; report the execution ids."""
    import dagster as dg

    from marketing_pipelines.db.resources import AppDatabase
    from marketing_pipelines.executions.resources import ExecutionSettings
    from marketing_pipelines.executions.sensors import executions_of_run
    from marketing_pipelines_tests.built import due_executions_sensor

    context = dg.build_sensor_context(
        instance=dg.DagsterInstance.ephemeral(),
        resources={
            "app_db": AppDatabase(url=db_url),
            "execution_settings": ExecutionSettings(batch_size=BATCH, executions_per_run=PER_RUN),
        },
    )
    # Pay the first tick's one-off costs (resources, engine, schema check) before the race: on a busy
    # machine a process paying them after the barrier could find every row already claimed.
    engine = context.resources.app_db.ready_engine()
    claimed: list[int] = []
    empty_ticks = 0
    start.wait()
    while empty_ticks < 3:
        result = due_executions_sensor(context)
        if isinstance(result, dg.SkipReason) and (result.skip_message or "").startswith("Nothing claimed"):
            # The other process's claim fills the batch until it has started its runs: not the end.
            time.sleep(0.002)
            continue
        requests = result.run_requests if isinstance(result, dg.SensorResult) else []
        # Each claimed row goes into exactly one run of the tick: runs hold disjoint batches.
        claimed += [i for r in requests or [] for i in executions_of_run(r.run_config)]
        # Each run starts and takes its rows over, as a launched run does: a tick claims only up to
        # BATCH rows still waiting for their runs, so rows never taken over would end the race.
        start_runs(engine, requests or [])
        empty_ticks = 0 if requests else empty_ticks + 1
        # Ticks are never back to back (the daemon spaces them by seconds). Without a pause, SQLite's lock,
        # which is not fair, can go to the same process tick after tick on a busy machine and leave the
        # other with nothing to race for.
        time.sleep(0.002)
    out.put(claimed)


def _naive_worker(db_url: str, start: Any, out: Any) -> None:
    """The first version's claim: read due ids, then mark them RUNNING in a second statement."""
    from marketing_pipelines.db.engine import get_engine
    from marketing_pipelines.db.schema import marketing_execution as t

    engine = get_engine(db_url)
    claimed: list[int] = []
    start.wait()
    while True:
        with engine.begin() as conn:
            ids = list(conn.execute(sa.select(t.c.id).where(t.c.status == "SCHEDULED").limit(BATCH)).scalars())
        if not ids:
            break
        time.sleep(0.002)  # the application's work between read and write, where the race lives
        with engine.begin() as conn:
            conn.execute(sa.update(t).where(t.c.id.in_(ids)).values(status="RUNNING"))
        claimed += ids
    out.put(claimed)


def _next_result(out: Any, procs: list[Any], timeout_s: float = 300) -> list[int]:
    """The next worker's result; fails fast (not after the timeout) when a worker died."""
    import queue

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return out.get(timeout=1)
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"a worker process exited with {dead}"
    raise AssertionError("workers did not finish in time")


def _race(db_url: str, worker: Any) -> Counter[int]:
    ctx = mp.get_context("spawn")
    # A barrier, not a sleep: the race starts when every process has imported and is ready.
    # A process still importing Dagster when the other starts would leave nothing to race for.
    start, out = ctx.Barrier(WORKERS + 1, timeout=120), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(db_url, start, out)) for _ in range(WORKERS)]
    for p in procs:
        p.start()
    start.wait()
    results = [_next_result(out, procs) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert all(results), "each process must have claimed something, or there was no race"
    return Counter(i for claimed in results for i in claimed)


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_two_sensor_processes_launch_every_execution_exactly_once(
    database: str, request: pytest.FixtureRequest
) -> None:
    db_url = request.getfixturevalue("sqlite_url" if database == "sqlite" else "pg_url")
    from marketing_pipelines.db.engine import get_engine

    engine = get_engine(db_url)
    add_campaign(engine)
    bulk_due_executions(engine, DUE)
    counts = _race(db_url, _sensor_worker)
    assert sorted(counts) == list(range(1, DUE + 1))
    assert [i for i, n in counts.items() if n > 1] == []


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_harness_detects_double_claims_of_read_then_update(database: str, request: pytest.FixtureRequest) -> None:
    db_url = request.getfixturevalue("sqlite_url" if database == "sqlite" else "pg_url")
    from marketing_pipelines.db.engine import get_engine

    engine = get_engine(db_url)
    add_campaign(engine)
    bulk_due_executions(engine, DUE)
    counts = _race(db_url, _naive_worker)
    assert sum(1 for n in counts.values() if n > 1) > 0
