"""How often simultaneous op-level pool slot claims (``granularity: op``) overshoot the limit on PostgreSQL storage.

The shipped dagster.yaml files use ``concurrency.pools.granularity: run`` because of what this
measures. At ``granularity: op`` each step claims a slot with
``claim_concurrency_slot(key, run_id, step_key)``: Dagster (1.13.27) registers the step as pending
(assigning it when a count says a slot is free, with nothing held between the count and the insert),
then ``_claim_concurrency_slot`` selects a free slot row ``FOR UPDATE SKIP LOCKED`` and updates it
without checking it is still free. Both run on an autocommit connection
(``PostgresEventLogStorage.index_connection``), so the row lock ends with the SELECT: claimers that
select the same row at once all update it, each is told CLAIMED, and the row names only the last.

Here ``--processes`` long-lived worker processes, each with its own DagsterInstance on a throwaway
PostgreSQL database (``granularity: op``), call ``claim_concurrency_slot`` on one pool set to
``--limit`` slots, all released at one instant by a barrier, for ``--rounds`` rounds. After each
round it counts the workers told CLAIMED and the claims not backed by a slot row, then frees every
run with ``free_concurrency_slots_for_run`` and checks the pool is empty again. This is the worst
case (every claim at the same instant), so it shows the race exists, not how often it bites in
production, where steps rarely start within the same few milliseconds; CI once saw 3 agent ops
against a limit of 2 (docs/OPERATIONS.md, "The agent_runs pool"). The numbers decide nothing: the
script exits 0 whenever it ran.

    python benchmarks/pool_claim_race.py --rounds 50 --processes 6 --limit 2
    python benchmarks/pool_claim_race.py --rounds 200 --processes 8 --limit 1
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import tempfile
import time
import traceback
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
import yaml
from _common import postgres_storage, print_table
from _daemon import dagster_storage_database

POOL = "claim_race"
STEP_KEY = "op"
# Seconds a worker waits at the barrier, and the parent for a worker's answer.
TIMEOUT_S = 180.0


def _write_dagster_home(home: Path, pg: Mapping[str, str]) -> Path:
    """A DAGSTER_HOME on the throwaway database, pools at ``granularity: op`` (what is measured)."""
    postgres_db = postgres_storage(pg)
    config = {
        "storage": {"postgres": {"postgres_db": postgres_db}},
        "concurrency": {"pools": {"granularity": "op"}},
        "telemetry": {"enabled": False},
    }
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return home


def _worker(index: int, home: str, barrier: Any, tasks: Any, results: Any) -> None:
    """Claims one slot per round, the moment every worker has reached the barrier."""
    try:
        instance = dg.DagsterInstance.from_config(home)
        storage = instance.event_log_storage
    except Exception:
        results.put(("error", index, traceback.format_exc()))
        return
    results.put(("ready", index, None))
    with instance:
        while (run_id := tasks.get()) is not None:
            try:
                barrier.wait(timeout=TIMEOUT_S)
                status = storage.claim_concurrency_slot(POOL, run_id=run_id, step_key=STEP_KEY)
            except Exception:
                results.put(("error", index, traceback.format_exc()))
                return
            results.put(("claimed" if status.is_claimed else "blocked", index, run_id))


@contextlib.contextmanager
def _workers(home: Path, processes: int) -> Iterator[tuple[list[Any], Any]]:
    """``processes`` spawned workers, each with its own task queue, all answering on one result queue."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    tasks = [ctx.Queue() for _ in range(processes)]
    procs = [
        ctx.Process(target=_worker, args=(i, str(home), barrier, tasks[i], results), daemon=True)
        for i in range(processes)
    ]
    try:
        for p in procs:
            p.start()
        for _ in procs:
            kind, index, detail = results.get(timeout=TIMEOUT_S)
            if kind != "ready":
                raise RuntimeError(f"worker {index} failed to start:\n{detail}")
        yield tasks, results
    finally:
        barrier.abort()  # a worker still waiting for a round that will not come gives up at once
        for q, p in zip(tasks, procs, strict=True):
            if p.is_alive():
                with contextlib.suppress(Exception):
                    q.put(None)
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


def _round(tasks: list[Any], results: Any, number: int) -> tuple[list[str], list[str]]:
    """One simultaneous claim per worker; the run ids of this round and those told CLAIMED."""
    run_ids = [f"race-{number:05d}-{i}-{uuid.uuid4().hex[:8]}" for i in range(len(tasks))]
    for q, run_id in zip(tasks, run_ids, strict=True):
        q.put(run_id)
    claimed: list[str] = []
    for _ in tasks:
        kind, index, detail = results.get(timeout=TIMEOUT_S)
        if kind == "error":
            raise RuntimeError(f"worker {index} failed in round {number}:\n{detail}")
        if kind == "claimed":
            claimed.append(detail)
    return run_ids, claimed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50, help="rounds of simultaneous claims (default 50)")
    parser.add_argument("--processes", type=int, default=6, help="claimers per round, 2..8 (default 6)")
    parser.add_argument("--limit", type=int, default=2, help="slots in the pool, below --processes (default 2)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not 2 <= args.processes <= 8:
        parser.error("--processes must be between 2 and 8")
    if not 1 <= args.limit < args.processes:
        parser.error("--limit must be at least 1 and below --processes, or the pool is never contended")

    started = time.monotonic()
    rounds_over = max_claimed = unbacked = 0
    with dagster_storage_database() as pg, tempfile.TemporaryDirectory(prefix="mp-claim-race-") as tmp:
        home = _write_dagster_home(Path(tmp) / "dagster_home", pg)
        with dg.DagsterInstance.from_config(str(home)) as instance, _workers(home, args.processes) as (tasks, results):
            storage = instance.event_log_storage
            storage.set_concurrency_slots(POOL, args.limit)
            info = storage.get_concurrency_info(POOL)
            if info.slot_count != args.limit:
                raise RuntimeError(f"pool has {info.slot_count} slots after setting {args.limit}")
            print(
                f"{args.processes} workers ready on {type(storage).__name__}; {args.rounds} rounds, limit {args.limit}",
                flush=True,
            )
            for number in range(1, args.rounds + 1):
                run_ids, claimed = _round(tasks, results, number)
                # The runs a slot row names; a claim whose run is not among them was overwritten.
                holders = {slot.run_id for slot in storage.get_concurrency_info(POOL).claimed_slots}
                unbacked += sum(1 for run_id in claimed if run_id not in holders)
                rounds_over += int(len(claimed) > args.limit)
                max_claimed = max(max_claimed, len(claimed))
                for run_id in run_ids:
                    storage.free_concurrency_slots_for_run(run_id)
                after = storage.get_concurrency_info(POOL)
                if after.claimed_slots or after.pending_steps:
                    raise RuntimeError(
                        f"round {number}: pool not empty after freeing every run: "
                        f"{len(after.claimed_slots)} claimed slots, {len(after.pending_steps)} pending steps"
                    )
                if number % 10 == 0 or number == args.rounds:
                    print(
                        f"  {number} rounds: {rounds_over} over the limit, most claimed at once {max_claimed}, "
                        f"{unbacked} claims with no slot row, {time.monotonic() - started:.0f}s",
                        flush=True,
                    )
    print_table(
        f"op-level slot claims on PostgreSQL storage, all at one instant (load average {os.getloadavg()[0]:.2f})",
        ["processes", "limit", "rounds", "rounds over limit", "max claimed at once", "claims with no slot row"],
        [(args.processes, args.limit, args.rounds, rounds_over, max_claimed, unbacked)],
    )
    print(f"\nwall time {time.monotonic() - started:.1f}s")


if __name__ == "__main__":
    main()
