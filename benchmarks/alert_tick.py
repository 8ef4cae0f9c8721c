"""What it costs to tell the alert webhook about a burst of N failed runs: ``marketing_alerts_sensor``'s
own cursor against Dagster's ``run_failure_sensor``, side by side on one PostgreSQL Dagster instance.

N runs of a job named like ``marketing_execution_job`` fail (real runs, executed in this process, so
Dagster records their RUN_FAILURE events); the application database is a throwaway PostgreSQL one,
and the receiver answers 204 at once. Then, each from a cursor set before the failures:

* **own cursor**: one tick of ``marketing_alerts_sensor`` (what the daemon's code server runs,
  ``evaluate_tick``): reads the failures after its cursor, describes them, posts one message.
* **run_failure_sensor**: the least the library path needs before any message: a
  ``run_failure_sensor`` over the same job whose function only marks its run as pending in Dagster's
  own storage (a run tag, the cheapest durable outbox), ticked until every run was marked. A
  once-a-minute sender would still have to read those marks and post: not counted here.

Prints, per N, ticks needed, ms per tick and in all, and the minutes a burst waits at one tick a
minute (the alerts' cadence), the median of ``--repeat`` rounds.

    python benchmarks/alert_tick.py
    python benchmarks/alert_tick.py --runs 10 100 --repeat 3
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time
from typing import Any

import dagster as dg
from _common import counting_receiver, postgres_storage, print_table, throwaway_database
from _daemon import dagster_storage_database

from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.executions.jobs import marketing_execution_job
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.monitoring.alert_sensor import marketing_alerts_sensor
from marketing_pipelines.monitoring.alerts import AlertWebhook

TAG = "marketing/alert"
# The failing op's traceback, N times over, is not what this prints.
QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}


@dg.op
def explode() -> None:
    raise RuntimeError("bench failure")


# The watched job's name, so both sensors take its runs for the real job's.
@dg.job(name=marketing_execution_job.name)
def failing_job() -> None:
    explode()


@dg.run_failure_sensor(monitored_jobs=[failing_job])
def mark_pending(context: dg.RunFailureSensorContext) -> None:
    context.instance.add_run_tags(context.dagster_run.run_id, {TAG: "pending"})


def receiver() -> contextlib.AbstractContextManager[tuple[str, list[int]]]:
    return counting_receiver("/services/T0/B0/token")


def _instance(pg: dict[str, str]) -> contextlib.AbstractContextManager[dg.DagsterInstance]:
    postgres_db = postgres_storage(pg)
    return dg.instance_for_test(overrides={"storage": {"postgres": {"postgres_db": postgres_db}}})


def own_cursor(instance: dg.DagsterInstance, cursor: str, resources: dict[str, Any], got: list[int]) -> float:
    """ms of the one tick that alerts the burst."""
    before = len(got)
    began = time.perf_counter()
    tick = marketing_alerts_sensor.evaluate_tick(
        dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources)
    )
    ms = (time.perf_counter() - began) * 1000
    if len(got) != before + 1 or not (tick.skip_message or "").startswith("Alerted"):
        raise SystemExit(f"the tick did not alert once: {tick.skip_message}")
    return ms


def library(instance: dg.DagsterInstance, cursor: str, n: int) -> tuple[int, float]:
    """Ticks of ``mark_pending`` until all ``n`` runs are marked, and their ms in all."""
    ticks, spent = 0, 0.0
    while True:
        began = time.perf_counter()
        result = mark_pending.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=cursor))
        spent += time.perf_counter() - began
        ticks += 1
        cursor = result.cursor or cursor
        if not result.dagster_run_reactions:
            raise SystemExit(f"tick {ticks} marked nothing: {result.skip_message}")
        marked = len(instance.get_run_ids(dg.RunsFilter(tags={TAG: "pending"})))
        if marked == n:
            return ticks, spent * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[10, 50], help="failed runs in the burst")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per N (the median is shown)")
    args = parser.parse_args()

    rows = []
    with (
        throwaway_database("postgres") as app_url,
        dagster_storage_database() as pg,
        receiver() as (hook_url, got),
    ):
        resources = {
            "alerts": AlertWebhook(url=hook_url),
            "webhook": WebhookClient(timeout_s=5, allow_networks=["127.0.0.1/32"]),
            "app_db": AppDatabase(url=app_url),
        }
        for n in args.runs:
            own_ms, lib_ticks, lib_ms = [], [], []
            for _ in range(args.repeat):
                with _instance(pg) as instance:
                    ctx = dg.build_sensor_context(instance=instance, resources=resources)
                    own_start = marketing_alerts_sensor.evaluate_tick(ctx).cursor
                    lib_start = mark_pending.evaluate_tick(dg.build_sensor_context(instance=instance)).cursor
                    assert own_start and lib_start
                    for _ in range(n):
                        failing_job.execute_in_process(instance=instance, raise_on_error=False, run_config=QUIET)
                    own_ms.append(own_cursor(instance, own_start, resources, got))
                    ticks, ms = library(instance, lib_start, n)
                    lib_ticks.append(ticks)
                    lib_ms.append(ms)
                    instance.wipe()
            ticks = int(statistics.median(lib_ticks))
            own, lib = statistics.median(own_ms), statistics.median(lib_ms)
            rows.append(["own cursor", n, 1, own, own, 0])
            rows.append(["run_failure_sensor", n, ticks, lib / ticks, lib, math.ceil(ticks - 1)])
            rows.append(["ratio lib/own", n, ticks, lib / ticks / own, lib / own, ""])
    print_table(
        "A burst of N failed runs to one alert (PostgreSQL instance; median of rounds)",
        ["path", "N", "ticks", "ms/tick", "ms total", "min waiting at 1 tick/min"],
        rows,
    )


if __name__ == "__main__":
    main()
