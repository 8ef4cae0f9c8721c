"""What signing costs a batch run: ``marketing_execution_job`` sending N webhooks to a registered endpoint
(sealed URL opened once per batch, a Standard Webhooks signature per POST) next to N raw-URL webhooks.

Each round schedules N due executions on a throwaway application database, lets the real
``due_executions_sensor`` claim them into one run request, and runs that request's job in process (the
op a launched run executes: take-over, leases, the POSTs at MARKETING_WEBHOOK_CONCURRENCY, an attempt
and an outcome per execution). The receiver is a local HTTP server that answers 204 at once, so the
time is the job's own, not a network's. Shapes alternate round by round in one invocation; the ratio
of medians (signed / unsigned) is what to read, the absolute seconds drift with the machine.

    python benchmarks/signed_webhooks.py --executions 250 --rounds 5 --database postgres
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from datetime import UTC, datetime, timedelta

import dagster as dg
import sqlalchemy as sa
from _common import counting_receiver, print_table, throwaway_database

from marketing_pipelines.agents.resources import AgentSettings
from marketing_pipelines.db.campaigns import Campaign, upsert_campaign
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.migrate import upgrade
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import marketing_execution
from marketing_pipelines.egress import EgressPolicy, parse_networks
from marketing_pipelines.executions.endpoints import add_endpoint
from marketing_pipelines.executions.jobs import marketing_execution_job
from marketing_pipelines.executions.queue import schedule_execution
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.executions.sensors import build_due_executions_sensor
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.sealing import SecretBox, new_key

# Evaluated directly, as the daemon would: the interval only paces the daemon's ticks.
due_executions_sensor = build_due_executions_sensor(interval_seconds=1)

LOCAL = "127.0.0.1/32"
KEY = new_key()


def receiver() -> contextlib.AbstractContextManager[tuple[str, list[int]]]:
    return counting_receiver("/hooks/T0/B0/token", lambda headers: 1 if headers.get("webhook-signature") else 0)


def one_round(url: str, engine: sa.Engine, instance: dg.DagsterInstance, n: int, signed: bool) -> float:
    """Seconds of the job's run for ``n`` due webhooks; every one must succeed."""
    target = {"endpoint": "bench"} if signed else {"url": url}
    due = datetime.now(UTC) - timedelta(seconds=1)
    with engine.begin() as conn:
        ids = [
            schedule_execution(
                conn,
                campaign_id="bench",
                stage="s",
                action="webhook",
                due_at=due,
                payload={**target, "body": {"n": i}},
                egress=EgressPolicy(parse_networks(LOCAL)),
            )
            for i in range(n)
        ]
    db_url = engine.url.render_as_string(hide_password=False)
    settings = ExecutionSettings(executions_per_run=n, batch_size=n)
    context = dg.build_sensor_context(
        instance=instance,
        resources={
            "app_db": AppDatabase(url=db_url),
            "execution_settings": settings,
            "agent_settings": AgentSettings(),
        },
    )
    result = due_executions_sensor(context)
    [request] = result.run_requests
    began = time.perf_counter()
    run = marketing_execution_job.execute_in_process(
        run_config=request.run_config,
        tags=request.tags,
        instance=instance,
        resources={
            "app_db": AppDatabase(url=db_url),
            "webhook": WebhookClient(timeout_s=10, allow_networks=[LOCAL], secrets_key=KEY),
            "execution_settings": settings,
        },
    )
    seconds = time.perf_counter() - began
    with engine.connect() as conn:
        done = conn.execute(
            sa.select(sa.func.count())
            .select_from(marketing_execution)
            .where(marketing_execution.c.id.in_(ids), marketing_execution.c.status == "SUCCEEDED")
        ).scalar_one()
    if not run.success or done != n:
        raise SystemExit(f"round failed: run success={run.success}, {done} of {n} SUCCEEDED")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--executions", type=int, default=250, help="webhooks per round (one batch run)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per shape, alternating")
    parser.add_argument("--database", choices=["postgres", "sqlite"], default="postgres")
    args = parser.parse_args()

    with throwaway_database(args.database) as url, receiver() as (hook_url, got), dg.instance_for_test() as instance:
        engine = get_engine(url)
        upgrade(engine)
        with engine.begin() as conn:
            upsert_campaign(conn, Campaign("bench", "Bench", "bench"))
            add_endpoint(conn, SecretBox(KEY), "bench", hook_url, EgressPolicy(parse_networks(LOCAL)))
        one_round(hook_url, engine, instance, min(10, args.executions), signed=True)  # warm-up: imports, pools
        times: dict[str, list[float]] = {"unsigned (url)": [], "signed (endpoint)": []}
        for _ in range(args.rounds):
            times["unsigned (url)"].append(one_round(hook_url, engine, instance, args.executions, signed=False))
            times["signed (endpoint)"].append(one_round(hook_url, engine, instance, args.executions, signed=True))
    medians = {shape: statistics.median(values) for shape, values in times.items()}
    base = medians["unsigned (url)"]
    print_table(
        f"{args.executions} webhooks per batch run, {args.rounds} rounds each, {args.database}",
        ["shape", "median s", "webhooks/s", "ratio to unsigned"],
        [[shape, f"{m:.3f}", f"{args.executions / m:.0f}", f"{m / base:.2f}"] for shape, m in medians.items()],
    )
    print(f"signed deliveries received: {sum(got)} of {len(got)} (warm-up included)")


if __name__ == "__main__":
    main()
