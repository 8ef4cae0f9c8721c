"""How fast queued agent runs drain through the real daemon, against what the pool allows (N / D).

For each ``--limits`` value N this starts ``dagster-daemon run`` on a PostgreSQL Dagster instance
(``deploy/dagster.yaml``: pools at granularity run) and a throwaway application database, with
``MARKETING_MAX_CONCURRENT_AGENT_RUNS=N``, requests ``--runs`` agent runs at once (offline provider,
so a run is a run worker's start-up plus a few tool calls), and waits until every one has ended.

Reported per limit: the drain time (first ``requested_at`` to last ``finished_at``, the database's
clock), D (the median time a run holds its place in the pool: dequeued to ended, from Dagster's run
records), the drain rate against N / D, the goal time (``runs / (0.7 x N / D)`` plus one sensor
interval), the most agent runs in progress at once (never above N) and whether every run SUCCEEDED
once. On a 2-core machine D itself grows with N: eight run workers starting at once share two cores.

    python benchmarks/agent_drain.py
    python benchmarks/agent_drain.py --runs 40 --limits 2 8
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path

import dagster as dg
import sqlalchemy as sa
from _common import print_table
from e2e_executions import DRAIN_TIMEOUT_S, _wait_runs_ended, daemon_session, request_offline_analyses

from marketing_pipelines.db.schema import agent_run
from marketing_pipelines.settings import Settings

JOB = "agent_run_job"
GOAL_FRACTION = 0.7


def _rows(engine: sa.Engine) -> list[sa.Row]:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(agent_run.c.status, agent_run.c.attempts, agent_run.c.requested_at, agent_run.c.finished_at)
        ).all()


def _run_windows(instance: dg.DagsterInstance) -> list[tuple[float, float]]:
    """(dequeued, ended) of every agent run: the time each held its place in the pool."""
    windows = []
    for record in instance.get_run_records(dg.RunsFilter(job_name=JOB)):
        starting = instance.get_records_for_run(
            record.dagster_run.run_id, of_type=dg.DagsterEventType.RUN_STARTING
        ).records
        if starting and record.end_time:
            windows.append((starting[0].event_log_entry.timestamp, record.end_time))
    return windows


def _most_at_once(windows: list[tuple[float, float]]) -> int:
    points = sorted([(s, 1) for s, _ in windows] + [(e, -1) for _, e in windows], key=lambda p: (p[0], p[1]))
    current = peak = 0
    for _, delta in points:
        current += delta
        peak = max(peak, current)
    return peak


def measure(limit: int, runs: int, timeout: float, log_dir: Path) -> tuple[float, float, int, str, float]:
    """(drain seconds, median D, most runs at once, outcome, load average) for one pool limit."""
    overrides = {"MARKETING_MAX_CONCURRENT_AGENT_RUNS": str(limit)}
    with daemon_session(f"agents-{limit}", overrides, log_dir) as session:
        request_offline_analyses(session.engine, runs)
        deadline = time.monotonic() + timeout
        while True:
            session.daemon.check_alive()
            rows = _rows(session.engine)
            if all(r.status in ("SUCCEEDED", "FAILED", "CANCELLED") for r in rows):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"limit {limit}: not drained after {timeout:.0f} s: {[r.status for r in rows]}")
            time.sleep(0.5)
        load = os.getloadavg()[0]
        _wait_runs_ended(session.instance, session.daemon, DRAIN_TIMEOUT_S, job=JOB)
        windows = _run_windows(session.instance)
    drain = (max(r.finished_at for r in rows) - min(r.requested_at for r in rows)).total_seconds()
    once = all(r.status == "SUCCEEDED" and r.attempts == 1 for r in rows) and len(windows) == runs
    outcome = "yes" if once else f"no: {sorted({(r.status, r.attempts) for r in rows})}, {len(windows)} runs"
    return drain, statistics.median(e - s for s, e in windows), _most_at_once(windows), outcome, load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40, help="agent runs requested at once (default 40)")
    parser.add_argument("--limits", type=int, nargs="+", default=[2, 8], help="pool limits to measure (default 2 8)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one limit may take to drain")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep the daemon logs here (default: a temp dir)")
    args = parser.parse_args()
    if not 1 <= args.runs <= 1000:
        parser.error("--runs must be between 1 and 1000")
    if any(not 1 <= n <= 64 for n in args.limits):
        parser.error("--limits must each be between 1 and 64")
    if args.timeout <= 0:
        parser.error("--timeout must be positive")

    tick = Settings().sensor_interval_seconds
    rows = []
    with (
        contextlib.nullcontext(args.log_dir)
        if args.log_dir
        else tempfile.TemporaryDirectory(prefix="mp-bench-agents-") as log_dir
    ):
        for limit in args.limits:
            print(f"[limit {limit}] {args.runs} agent runs through dagster-daemon ...", flush=True)
            drain, d, peak, once, load = measure(limit, args.runs, args.timeout, Path(log_dir))
            ideal = limit / d
            goal = args.runs / (GOAL_FRACTION * ideal) + tick
            rows.append(
                (
                    limit,
                    args.runs,
                    drain,
                    d,
                    args.runs / drain,
                    ideal,
                    (args.runs / drain) / ideal,
                    goal,
                    peak,
                    once,
                    load,
                )
            )
            print(f"[limit {limit}] drained in {drain:.1f} s (goal {goal:.1f} s), D {d:.1f} s", flush=True)
    print_table(
        f"agent runs drained through the real daemon (sensor interval {tick} s)",
        [
            "limit N",
            "runs",
            "drain s",
            "D s",
            "runs/s",
            "N/D",
            "rate / (N/D)",
            "goal s",
            "most at once",
            "each once",
            "load avg",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
