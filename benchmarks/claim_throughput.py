"""Claims per second of the project's claim (leasing/lease.py claim_batch) next to its ceiling.

The ceiling is the bare statement written inline: ``UPDATE ... FROM (SELECT id ... FOR UPDATE
SKIP LOCKED LIMIT n) RETURNING id`` on PostgreSQL, the conditional ``UPDATE ... RETURNING id`` on
SQLite. Both run with the same worker processes, batch sizes and rows, alternating in one run,
and every claimed id is checked for duplicates across workers (must be 0).

    python benchmarks/claim_throughput.py --rows 100000 --workers 1 2 4 8 --batches 1 10 100
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from _common import print_table, throwaway_database
from _seed import seed_due

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import marketing_execution as t
from marketing_pipelines.executions.queue import EXECUTIONS
from marketing_pipelines.leasing.lease import claim_batch

BARE_PG = sa.text(
    "WITH picked AS MATERIALIZED (SELECT id FROM marketing_execution WHERE status = 'SCHEDULED' "
    "AND due_at <= now() ORDER BY due_at, id LIMIT :n FOR UPDATE SKIP LOCKED) "
    "UPDATE marketing_execution AS m SET status = 'RUNNING', lease_owner = :owner, "
    "lease_expires_at = now() + interval '300 seconds', attempts = m.attempts + 1, updated_at = now() "
    "FROM picked WHERE m.id = picked.id RETURNING m.id"
)
BARE_SQLITE = sa.text(
    "UPDATE marketing_execution SET status = 'RUNNING', lease_owner = :owner, lease_expires_at = :lease, "
    "attempts = attempts + 1, updated_at = :now WHERE id IN (SELECT id FROM marketing_execution "
    "WHERE status = 'SCHEDULED' AND due_at <= :now ORDER BY due_at, id LIMIT :n) AND status = 'SCHEDULED' "
    "RETURNING id"
)


def _worker(url: str, method: str, batch: int, seconds: float, start: Any, out: Any) -> None:
    engine = get_engine(url)
    owner = f"bench-{mp.current_process().pid}"
    ids: list[int] = []
    postgres = engine.dialect.name == "postgresql"
    with engine.connect():
        pass  # open the pooled connection before the clock starts
    start.wait()
    stop_at = time.monotonic() + seconds
    while time.monotonic() < stop_at:
        with engine.begin() as conn:
            if method == "project":
                got = [row["id"] for row in claim_batch(conn, EXECUTIONS, owner, batch, 300)]
            elif postgres:
                got = list(conn.execute(BARE_PG, {"n": batch, "owner": owner}).scalars())
            else:
                now = datetime.now(UTC).replace(tzinfo=None)
                params = {"n": batch, "owner": owner, "now": now, "lease": now + timedelta(seconds=300)}
                got = list(conn.execute(BARE_SQLITE, params).scalars())
        if not got:
            break
        ids += got
    out.put((ids, time.monotonic()))


def reset(url: str) -> None:
    engine = get_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.update(t).values(status="SCHEDULED", lease_owner=None, lease_expires_at=None, attempts=0))
    if engine.dialect.name == "postgresql":
        # Every claim leaves a dead tuple; without a vacuum the later measurement pays for the earlier one.
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("VACUUM ANALYZE marketing_execution"))


def measure(url: str, method: str, workers: int, batch: int, seconds: float) -> tuple[float, int, int]:
    """Returns (claims per second, claimed, duplicates)."""
    reset(url)
    ctx = mp.get_context("spawn")
    # The clock starts when every worker has imported and connected (a barrier, not a guess).
    start, out = ctx.Barrier(workers + 1, timeout=300), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, method, batch, seconds, start, out)) for _ in range(workers)]
    for p in procs:
        p.start()
    start.wait()
    began = time.monotonic()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    ended = max(r[1] for r in results)
    counts = Counter(i for ids, _ in results for i in ids)
    claimed = sum(counts.values())
    return claimed / (ended - began), claimed, sum(n - 1 for n in counts.values() if n > 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", choices=["postgres", "sqlite"], nargs="+", default=["postgres", "sqlite"])
    parser.add_argument("--rows", type=int, default=100_000, help="due rows seeded (default 100000)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--seconds", type=float, default=4.0, help="time limit of one measurement")
    args = parser.parse_args()
    for database in args.database:
        with throwaway_database(database) as url:
            seed_due(url, args.rows)
            rows = []
            duplicates = 0
            for workers in args.workers:
                for batch in args.batches:
                    project, claimed_p, dup_p = measure(url, "project", workers, batch, args.seconds)
                    ceiling, _, dup_c = measure(url, "ceiling", workers, batch, args.seconds)
                    duplicates += dup_p + dup_c
                    rows.append((workers, batch, project, ceiling, project / ceiling, claimed_p, dup_p, dup_c))
            print_table(
                f"claim throughput on {database}, {args.rows} due rows (claims/s)",
                ["workers", "batch", "claim_batch", "bare SQL", "ratio", "claimed", "dup", "dup bare"],
                rows,
            )
            print(f"duplicates across all runs: {duplicates}")


if __name__ == "__main__":
    main()
