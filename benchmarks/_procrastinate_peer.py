"""A peer for ``e2e_executions.py``: how long procrastinate, a PostgreSQL job queue, takes to drain N no-op jobs.

A user who only needs "run this job when due, once" could pick procrastinate instead of Dagster.
``drain_seconds`` measures it on the same PostgreSQL server as the project's own benchmark, in the
same invocation: a throwaway database (``mp_bench_procrastinate_*``, dropped WITH (FORCE) afterwards)
gets procrastinate's own schema, N jobs of a no-op task are deferred in one batch (not timed, as
the project's benchmark starts from executions already due), then the clock runs from starting a
worker with ``wait=False`` until it returns with the queue empty. Every job must then be
``succeeded`` in ``procrastinate_jobs``.

procrastinate (the ``bench`` extra) is imported inside the function only: the package
``marketing_pipelines`` never imports it, and ``--help`` of a calling script works without it.
It talks to PostgreSQL with psycopg 3 (its ``PsycopgConnector``), next to the project's psycopg2.

    python benchmarks/_procrastinate_peer.py --jobs 1000
    python benchmarks/_procrastinate_peer.py --jobs 10000 --concurrency 1 4 8
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Sequence

from _common import empty_postgres_database, print_table

DEFER_CHUNK = 5000  # jobs per batch_defer statement
POOL_SPARE = 4  # pool connections beyond the running jobs: fetching, LISTEN, heartbeat, abort polling


@contextlib.contextmanager
def _throwaway_database() -> Iterator[str]:
    """An empty PostgreSQL database on the local server, as a libpq URL; dropped afterwards."""
    with empty_postgres_database("mp_bench_procrastinate") as url:
        yield url.set(drivername="postgresql").render_as_string(hide_password=False)


def drain_seconds(n: int, concurrency: int) -> float:
    """Seconds for a procrastinate worker to run ``n`` no-op jobs that are all due at once,
    on a throwaway database of the local server."""
    if n < 1 or concurrency < 1:
        raise ValueError("n and concurrency must be at least 1")
    import procrastinate  # the bench extra; lazily, so nothing else needs it installed

    # procrastinate logs every job at INFO: keep the measurement free of log formatting. Its warning
    # that the app lives in __main__ concerns workers importing tasks by path, which this one does not.
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)

    async def run(url: str) -> float:
        pool_size = concurrency + POOL_SPARE
        app = procrastinate.App(
            connector=procrastinate.PsycopgConnector(conninfo=url, min_size=pool_size, max_size=pool_size)
        )

        @app.task(name="noop")
        async def noop() -> None:
            pass

        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            for start in range(0, n, DEFER_CHUNK):
                await noop.batch_defer_async(*({} for _ in range(min(DEFER_CHUNK, n - start))))
            started = time.perf_counter()
            await app.run_worker_async(concurrency=concurrency, wait=False, install_signal_handlers=False)
            elapsed = time.perf_counter() - started
            rows = await app.connector.execute_query_all_async(
                "SELECT status::text AS status, count(*) AS jobs FROM procrastinate_jobs GROUP BY status"
            )
        counts = {row["status"]: row["jobs"] for row in rows}
        if counts != {"succeeded": n}:
            raise RuntimeError(f"expected {n} succeeded procrastinate jobs, found {counts}")
        return elapsed

    with _throwaway_database() as url:
        return asyncio.run(run(url))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000, help="no-op jobs due at once (default 1000)")
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[1, 4], help="worker concurrencies to measure (default 1 4)"
    )
    args = parser.parse_args(argv)
    rows = []
    for concurrency in args.concurrency:
        seconds = drain_seconds(args.jobs, concurrency)
        rows.append((concurrency, args.jobs, seconds, args.jobs / seconds))
    print_table(
        "procrastinate: one worker draining no-op jobs due at once", ["concurrency", "jobs", "s", "jobs/s"], rows
    )


if __name__ == "__main__":
    main()
