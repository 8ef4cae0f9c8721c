"""Due executions handed to Dagster runs per second through due_executions_sensor, next to a ceiling.

The ceiling is a sensor that returns the same RunRequests (same job, batches, run config and
tags, built by the project's own ``batch_run_request``) with no database work. Both sides then
create each requested run on the same real instance (``create_run_for_job``: config validation,
execution plan, run record), alternating in one run, so the ratio isolates what the claim adds.
Launching a run costs the same for both and is left out (benchmarks/e2e_executions.py measures the
whole path through the daemon); so is each run's take-over of its rows, done between the project's
ticks because a tick claims only up to the batch size less the rows still waiting for their runs.
Also prints the tick time for the batch size against Dagster's 60 s sensor timeout.

    python benchmarks/sensor_to_runs.py --executions 2000 --batch 100 --per-run 1
    python benchmarks/sensor_to_runs.py --executions 2000 --batch 1000 --per-run 100

Rates are executions handed to created runs per second.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg
from _common import print_table, throwaway_database

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines_tests.factories import start_runs

SENSOR_TIMEOUT_S = 60.0


def _ceiling_requests(n: int, start_id: int, per_run: int) -> list[dg.RunRequest]:
    from marketing_pipelines.executions.sensors import batch_run_request

    rows = [{"id": i, "attempts": 1, "campaign_id": "bench"} for i in range(start_id, start_id + n)]
    return [batch_run_request(rows[k : k + per_run], "claim:bench") for k in range(0, n, per_run)]  # type: ignore[arg-type]


def _run(url: str, executions: int, batch: int, per_run: int, mode: str) -> tuple[float, list[float], int]:
    """Returns (executions handed to created runs per second, tick seconds, executions)."""
    from _seed import seed_due

    from marketing_pipelines.definitions import defs
    from marketing_pipelines.executions.sensors import executions_of_run

    seed_due(url, executions)
    code_location = defs()
    job = code_location.resolve_job_def("marketing_execution_job")
    due_executions_sensor = code_location.resolve_sensor_def("due_executions_sensor")
    ticks: list[float] = []
    created = 0
    started = 0.0  # seconds spent starting the runs (not measured): the next tick claims only what they took over
    with tempfile.TemporaryDirectory() as home, dg.DagsterInstance.local_temp(tempdir=home) as instance:
        settings = ExecutionSettings(batch_size=batch, executions_per_run=per_run)
        context = dg.build_sensor_context(
            instance=instance, resources={"app_db": AppDatabase(url=url), "execution_settings": settings}
        )
        began = time.perf_counter()
        while created < executions:
            tick_start = time.perf_counter()
            if mode == "project":
                result = due_executions_sensor(context)
                requests = list(result.run_requests or []) if isinstance(result, dg.SensorResult) else []
            else:
                requests = _ceiling_requests(min(batch, executions - created), created + 1, per_run)
            ticks.append(time.perf_counter() - tick_start)
            if not requests:
                break
            for request in requests:
                instance.create_run_for_job(job_def=job, run_config=request.run_config, tags=request.tags)
                created += len(executions_of_run(request.run_config))
            if mode == "project":
                starting = time.perf_counter()
                start_runs(get_engine(url), requests)
                started += time.perf_counter() - starting
        elapsed = time.perf_counter() - began - started
    return created / elapsed, ticks, created


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", choices=["postgres", "sqlite"], nargs="+", default=["postgres", "sqlite"])
    parser.add_argument("--executions", type=int, default=2000, help="due executions per measurement")
    parser.add_argument("--batch", type=int, default=1000, help="ExecutionSettings.batch_size")
    parser.add_argument("--per-run", type=int, default=250, help="ExecutionSettings.executions_per_run")
    parser.add_argument("--repeat", type=int, default=2, help="alternating measurements per side")
    args = parser.parse_args()
    rows = []
    for database in args.database:
        with throwaway_database(database) as url:
            project_rates, ceiling_rates, claim_ticks = [], [], []
            _run(url, min(200, args.executions), args.batch, args.per_run, "ceiling")  # warm-up: imports, job snapshot
            for _ in range(args.repeat):
                rate, ticks, _n = _run(url, args.executions, args.batch, args.per_run, "project")
                project_rates.append(rate)
                claim_ticks += ticks[:-1] or ticks
                rate, _ticks, _n = _run(url, args.executions, args.batch, args.per_run, "ceiling")
                ceiling_rates.append(rate)
            project, ceiling = statistics.median(project_rates), statistics.median(ceiling_rates)
            tick = statistics.median(claim_ticks)
            rows.append((database, args.batch, project, ceiling, project / ceiling, tick, SENSOR_TIMEOUT_S / tick))
            get_engine(url).dispose()
    print_table(
        f"sensor to runs, {args.executions} due executions, batch {args.batch}, {args.per_run} per run "
        "(executions handed to created runs per second)",
        ["database", "batch", "due_executions_sensor", "ceiling", "ratio", "tick s", "timeout/tick"],
        rows,
    )


if __name__ == "__main__":
    main()
