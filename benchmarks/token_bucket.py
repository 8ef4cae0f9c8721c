"""Token-bucket acquires per second with 1, 4 and 8 processes, next to a bare single-row UPDATE.

The bare statement (``UPDATE model_rate_limit SET tokens = tokens - 1 ... RETURNING tokens``,
no refill arithmetic, no condition) on the same row and table is the ceiling: it is what one
contended row can take. "call" is what the agent gate does before each model call: one admission
against three rows at once (requests, input tokens, output tokens: ``token_bucket.reserve``). The
bucket is sized so that it never runs dry during the measurement
(capacity and rate far above what the machine reaches), so both sides measure the statement, not
the limit. A second measurement with a small bucket checks over-admission against
``capacity + rate * elapsed`` (must be 0).

    python benchmarks/token_bucket.py --processes 1 4 8 --seconds 3
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from typing import Any

import sqlalchemy as sa
from _common import print_table, throwaway_database

from marketing_pipelines.db import token_bucket as tb
from marketing_pipelines.db.engine import get_engine

BARE = sa.text(
    "UPDATE model_rate_limit SET tokens = tokens - 1 "
    "WHERE provider = 'bench' AND model = '*' AND unit = 'requests' RETURNING tokens"
)
CALL = {"requests": 1, "input_tokens": 1, "output_tokens": 1}


def _worker(url: str, mode: str, seconds: float, start: Any, out: Any) -> None:
    engine = get_engine(url)
    admitted: list[tuple[float, float]] = []
    with engine.connect():
        pass  # open the pooled connection before the clock starts
    start.wait()
    stop_at = time.time() + seconds
    while time.time() < stop_at:
        before = time.time()
        with engine.begin() as conn:
            if mode == "bucket":
                ok = tb.try_acquire(conn, "bench")
            elif mode == "call":
                ok = tb.reserve(conn, "bench", "bench-model", CALL) is not None
            else:
                ok = conn.execute(BARE).first() is not None
        if ok:
            # The bucket's own clock read for this admission lies between these two times.
            admitted.append((before, time.time()))
    out.put(admitted)


def _measure(url: str, mode: str, processes: int, seconds: float) -> tuple[float, list[tuple[float, float]], float]:
    ctx = mp.get_context("spawn")
    # The clock starts when every process has imported and connected (a barrier, not a guess).
    start, out = ctx.Barrier(processes + 1, timeout=300), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, mode, seconds, start, out)) for _ in range(processes)]
    for p in procs:
        p.start()
    start.wait()
    began = time.time()
    admitted = sorted((pair for _ in procs for pair in out.get(timeout=300)), key=lambda pair: pair[1])
    for p in procs:
        p.join()
    return len(admitted) / seconds, admitted, began


def _configure(url: str, per_minute: float, burst: float, units: tuple[str, ...] = ("requests",)) -> None:
    with get_engine(url).begin() as conn:
        conn.execute(sa.text("DELETE FROM model_rate_limit WHERE provider = 'bench'"))
        tb.configure_bucket(conn, "bench", per_minute, burst)
        for unit in units:
            if unit != "requests":
                tb.configure_limit(conn, "bench", "bench-model", unit, per_minute, burst)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", choices=["postgres", "sqlite"], nargs="+", default=["postgres", "sqlite"])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--limited-rate", type=float, default=20.0, help="tokens/s of the over-admission check")
    args = parser.parse_args()
    for database in args.database:
        with throwaway_database(database) as url:
            rows = []
            for processes in args.processes:
                # The largest bucket the project accepts: a million tokens do not run out in a few
                # seconds, so this measures the statement, not the limit.
                _configure(url, tb.MAX_CALLS_PER_MINUTE, tb.MAX_BURST)
                bucket, _, _ = _measure(url, "bucket", processes, args.seconds)
                _configure(url, tb.MAX_CALLS_PER_MINUTE, tb.MAX_BURST, tuple(CALL))
                call, _, _ = _measure(url, "call", processes, args.seconds)
                _configure(url, tb.MAX_CALLS_PER_MINUTE, tb.MAX_BURST)
                bare, _, _ = _measure(url, "bare", processes, args.seconds)
                capacity, rate = 5.0, args.limited_rate
                _configure(url, rate * 60, capacity)
                _, pairs, began = _measure(url, "bucket", processes, args.seconds)
                # As in agents/test_token_bucket.py: the bucket held at most `capacity` when the first
                # admission's clock was read (a worker may pass the barrier before this process reads
                # its clock), and each admission's clock reading lies before its `after` time.
                # On SQLite the bucket's clock has millisecond resolution (it reads truncated times).
                began = min([began, *(before for before, _ in pairs)]) - (0.001 if database == "sqlite" else 0.0)
                admitted = [after for _, after in pairs]
                over = sum(1 for i, t in enumerate(admitted) if i + 1 > capacity + rate * (t - began) + 1e-6)
                allowed = capacity + rate * ((admitted[-1] if admitted else began) - began)
                rows.append((processes, bucket, call, bare, bucket / bare, call / bare, len(admitted), allowed, over))
            print_table(
                f"token bucket on {database} (acquires per second)",
                [
                    "processes",
                    "bucket",
                    "call (3 rows)",
                    "bare UPDATE",
                    "ratio",
                    "call ratio",
                    "limited: admitted",
                    "allowed",
                    "over-admitted",
                ],
                rows,
            )


if __name__ == "__main__":
    main()
