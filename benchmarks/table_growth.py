"""How much each table grows per million executions, per agent run and per day of sensor ticks, on PostgreSQL;
the numbers of docs/OPERATIONS.md, "Retention".

Every row is made by the path a deployment's rows take, in throwaway PostgreSQL databases (the application's and
Dagster's own, an instance of deploy/dagster.yaml):

* **executions**: ``--executions`` ``log`` executions scheduled one by one with ``schedule_execution`` (each with
  a dedupe key, as an idempotent caller sends), claimed by ``due_executions_sensor`` and performed by
  ``marketing_execution_job`` runs of ``MARKETING_EXECUTIONS_PER_RUN`` (1,000) executions each.
* **agent runs**: ``--agent-runs`` ``measurement_analyst`` runs on the offline model, each requested, claimed by
  ``queued_agent_runs_sensor`` and run by ``agent_run_job``.
* **ticks**: the daemon's own sensor loop (``execute_sensor_iteration``) ticks every sensor of the code location
  (a code server of ``marketing_pipelines.definitions``) with nothing to do, then ``due_executions_sensor``
  again with 5,000 due executions (a successful tick requesting 5 runs, which stay queued). Each kind of tick is
  then stored ``--tick-copies`` times more through ``DagsterInstance.create_tick`` (the daemon's write path),
  and ``job_ticks`` measured.

Sizes are ``pg_total_relation_size`` (table, TOAST and indexes): "as left" is what the path left, dead row
versions of the updates included (autovacuum lets new rows reuse that space, it does not return it); "compact"
is after ``VACUUM FULL``, the live rows alone. A megabyte (MB) is 10^6 bytes, so bytes per execution are also MB
per million executions. Ticks a day are the sensors' minimum intervals, the daemon's loop
visiting them at most every 5 s (``MIN_INTERVAL_LOOP_TIME``). Last, the purge of everything measured (cutoff a
minute ahead) is timed per batch of ``BATCH_ROWS``, the longest a batch holds its locks.

    python benchmarks/table_growth.py
    python benchmarks/table_growth.py --executions 2000 --agent-runs 5 --tick-copies 200
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import sqlalchemy as sa
from _common import empty_postgres_database, print_table
from _daemon import environ

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from marketing_pipelines.agents import users
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.migrate import upgrade
from marketing_pipelines.definitions import build_defs
from marketing_pipelines.executions.queue import schedule_execution
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.monitoring.purge import BATCH_ROWS, HISTORY_TABLES, purge_batches
from marketing_pipelines.settings import load_settings
from marketing_pipelines_tests.agents.fake_models import unconfigured_models
from marketing_pipelines_tests.agents.runs import run_one
from marketing_pipelines_tests.built import due_executions_sensor
from marketing_pipelines_tests.executions.runs import perform, sensor_requests
from marketing_pipelines_tests.factories import add_campaign, bulk_due_executions, request_offline_analysis

REPO_ROOT = Path(__file__).resolve().parent.parent
DAEMON_LOOP_SECONDS = 5  # dagster/_daemon/sensor.py, MIN_INTERVAL_LOOP_TIME
DEFAULT_SENSOR_INTERVAL = 30  # Dagster's minimum_interval_seconds when a sensor sets none
APP_TABLES = ("marketing_execution", "marketing_execution_attempt", "agent_run", "agent_run_step")


def table_bytes(engine: sa.Engine, tables: Iterator[str] | tuple[str, ...]) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            t: conn.execute(sa.text("SELECT pg_total_relation_size(CAST(:t AS regclass))"), {"t": t}).scalar_one()
            for t in tables
        }


def all_tables(engine: sa.Engine) -> tuple[str, ...]:
    with engine.connect() as conn:
        return tuple(conn.execute(sa.text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars())


def row_counts(engine: sa.Engine, tables: tuple[str, ...]) -> dict[str, int]:
    with engine.connect() as conn:
        return {t: conn.execute(sa.text(f'SELECT count(*) FROM "{t}"')).scalar_one() for t in tables}


def vacuum_full(engine: sa.Engine, tables: tuple[str, ...]) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for t in tables:
            conn.execute(sa.text(f'VACUUM FULL "{t}"'))


@contextlib.contextmanager
def dagster_instance(prefix: str) -> Iterator[dg.DagsterInstance]:
    """An instance of deploy/dagster.yaml on a throwaway PostgreSQL database of its own."""
    with empty_postgres_database(f"{prefix}_dagster") as url:
        pg = {
            "DAGSTER_PG_HOST": url.host or "127.0.0.1",
            "DAGSTER_PG_PORT": str(url.port or 5432),
            "DAGSTER_PG_USER": url.username or "postgres",
            "DAGSTER_PG_PASSWORD": url.password or "",
            "DAGSTER_PG_DB": url.database or "",
        }
        home = Path(tempfile.mkdtemp(prefix="mp-table-growth-"))
        shutil.copy(REPO_ROOT / "deploy" / "dagster.yaml", home / "dagster.yaml")
        try:
            with environ(pg), dg.DagsterInstance.from_config(str(home)) as instance:
                yield instance
        finally:
            shutil.rmtree(home, ignore_errors=True)


def dagster_engine(instance: dg.DagsterInstance) -> sa.Engine:
    """The instance's own PostgreSQL database, for measuring (Dagster's storage holds its runs, events, ticks)."""
    env = os.environ
    url = sa.engine.URL.create(
        "postgresql+psycopg2",
        username=env["DAGSTER_PG_USER"],
        password=env["DAGSTER_PG_PASSWORD"] or None,
        host=env["DAGSTER_PG_HOST"],
        port=int(env["DAGSTER_PG_PORT"]),
        database=env["DAGSTER_PG_DB"],
    )
    return sa.create_engine(url, poolclass=sa.pool.NullPool)


# ---- the application database: executions and agent runs --------------------------------------------


def make_executions(url: str, instance: dg.DagsterInstance, n: int) -> float:
    """``n`` executions scheduled, claimed and performed as a deployment's are; the seconds it took."""
    engine, started = get_engine(url), time.monotonic()
    due = datetime.now(UTC) - timedelta(seconds=1)
    for first in range(0, n, 1000):
        with engine.begin() as conn:
            for i in range(first, min(n, first + 1000)):
                schedule_execution(
                    conn,
                    campaign_id="spring-launch",
                    stage="launch",
                    action="log",
                    due_at=due,
                    payload={"message": f"spring launch reminder {i}"},
                    dedupe_key=f"spring-launch:reminder:{i}",
                )
    settings = ExecutionSettings()
    while requests := sensor_requests(due_executions_sensor, url, instance, settings):
        for request in requests:
            # The op prints a line per success to the run's stdout, which a real run worker captures.
            with contextlib.redirect_stdout(io.StringIO()):
                assert perform(request, url, instance, settings=settings).success
    return time.monotonic() - started


def make_agent_runs(url: str, instance: dg.DagsterInstance, n: int) -> float:
    engine, started = get_engine(url), time.monotonic()
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        for permission in ("campaign:read", "measurement:read", "execution:read"):
            users.grant(conn, "ana", permission)
    models = unconfigured_models()
    for _ in range(n):
        with engine.begin() as conn:
            request_offline_analysis(conn, "ana")
        with contextlib.redirect_stdout(io.StringIO()):
            assert run_one(url, instance, models).success
    return time.monotonic() - started


# ---- Dagster's ticks ------------------------------------------------------------------------------------


def tick_intervals() -> dict[str, int]:
    """Each sensor's seconds between ticks at the default settings, at least the daemon loop's 5 s."""
    repo = build_defs(load_settings()).get_repository_def()
    return {
        s.name: max(DAEMON_LOOP_SECONDS, s.minimum_interval_seconds or DEFAULT_SENSOR_INTERVAL)
        for s in repo.sensor_defs
    }


def sample_ticks(url: str, instance: dg.DagsterInstance) -> dict[tuple[str, str], object]:
    """One real tick of every sensor with nothing to do, and one successful ``due_executions_sensor`` tick."""
    # Dagster's private daemon API: the loop `dagster-daemon` runs, once, on this code location.
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import ModuleTarget
    from dagster._daemon.controller import create_daemon_grpc_server_registry
    from dagster._daemon.sensor import execute_sensor_iteration

    logger = logging.getLogger("table_growth")
    target = ModuleTarget("marketing_pipelines.definitions", None, str(REPO_ROOT), "marketing_pipelines")
    samples: dict[tuple[str, str], object] = {}
    with (
        environ({"MARKETING_DATABASE_URL": url}),  # the code server reads it, as a deployment's does
        create_daemon_grpc_server_registry(instance) as registry,
        WorkspaceProcessContext(instance, target, grpc_server_registry=registry) as workspace,
    ):
        list(execute_sensor_iteration(workspace, logger, None, None))
        bulk_due_executions(get_engine(url), 5000)
        time.sleep(DAEMON_LOOP_SECONDS + 1)  # past due_executions_sensor's interval
        list(execute_sensor_iteration(workspace, logger, None, None))
        location = next(iter(workspace.create_request_context().get_code_location_entries().values()))
        assert location.code_location is not None, location.load_error
        for sensor in location.code_location.get_repository("__repository__").get_sensors():
            for tick in instance.get_ticks(sensor.get_remote_origin_id(), sensor.selector_id):
                samples.setdefault((sensor.name, tick.status.value), tick.tick_data)
    return samples


def bytes_per_tick(instance: dg.DagsterInstance, samples: dict[tuple[str, str], object], copies: int) -> dict:
    """Each sampled tick stored ``copies`` times more; the growth of ``job_ticks`` per copy."""
    engine, sizes = dagster_engine(instance), {}
    for key, tick_data in sorted(samples.items()):
        before = table_bytes(engine, ("job_ticks",))["job_ticks"]
        now = time.time()
        for i in range(copies):
            instance.create_tick(tick_data._replace(timestamp=now - i))  # type: ignore[attr-defined]
        sizes[key] = (table_bytes(engine, ("job_ticks",))["job_ticks"] - before) / copies
    engine.dispose()
    return sizes


# ---- main ---------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executions", type=int, default=20_000, help="executions to make (default 20,000)")
    parser.add_argument("--agent-runs", type=int, default=50, help="agent runs to make (default 50)")
    parser.add_argument("--tick-copies", type=int, default=2000, help="copies stored of each kind of tick")
    parser.add_argument(
        "--database-prefix", default="mp_bench_growth", help="name prefix of the throwaway PostgreSQL databases"
    )
    args = parser.parse_args()
    if args.executions < 1 or args.agent_runs < 1 or args.tick_copies < 1:
        parser.error("--executions, --agent-runs and --tick-copies must be at least 1")

    with empty_postgres_database(args.database_prefix) as app, dagster_instance(args.database_prefix) as instance:
        url = app.render_as_string(hide_password=False)
        engine = get_engine(url)
        upgrade(engine)
        add_campaign(engine, "spring-launch")
        empty = table_bytes(engine, APP_TABLES)
        dagster_db = dagster_engine(instance)
        dagster_tables = all_tables(dagster_db)

        base = sum(table_bytes(dagster_db, dagster_tables).values())
        execution_s = make_executions(url, instance, args.executions)
        execution_runs = len(instance.get_run_records())
        after_executions = sum(table_bytes(dagster_db, dagster_tables).values())
        agent_s = make_agent_runs(url, instance, args.agent_runs)
        after_agents = sum(table_bytes(dagster_db, dagster_tables).values())
        print(
            f"made {args.executions} executions in {execution_s:.0f} s ({execution_runs} runs), "
            f"{args.agent_runs} agent runs in {agent_s:.0f} s",
            flush=True,
        )

        rows, left = row_counts(engine, APP_TABLES), table_bytes(engine, APP_TABLES)
        vacuum_full(engine, APP_TABLES)
        compact = table_bytes(engine, APP_TABLES)
        # Per row: the growth over the empty table (whose indexes and TOAST table take pages of their own).
        table = []
        for t in APP_TABLES:
            grown_left, grown_compact = left[t] - empty[t], compact[t] - empty[t]
            if t.startswith("marketing_execution"):
                per_unit = f"{grown_compact / args.executions:,.0f}-{grown_left / args.executions:,.0f} MB"
            else:
                per_unit = f"{grown_compact / args.agent_runs:,.0f}-{grown_left / args.agent_runs:,.0f} bytes"
            table.append((t, rows[t], grown_left / rows[t], grown_compact / rows[t], per_unit))
        print_table(
            "Application tables on PostgreSQL: bytes per row as the path left them and compact (after VACUUM FULL); "
            "growth per million executions (MB) or per agent run (bytes), compact-as left",
            ["table", "rows", "bytes/row", "compact", "per million executions or agent run"],
            table,
        )
        per_execution_run = (after_executions - base) / execution_runs
        per_agent_run = (after_agents - after_executions) / args.agent_runs
        runs_per_million = 1_000_000 / ExecutionSettings().executions_per_run
        print_table(
            "Dagster's storage (runs, events, tags and the rest of its PostgreSQL tables) per run",
            ["run of", "bytes/run", "per million executions"],
            [
                (
                    "marketing_execution_job (1,000 executions)",
                    per_execution_run,
                    f"{per_execution_run * runs_per_million / 1e6:,.0f} MB",
                ),
                ("agent_run_job (one agent run)", per_agent_run, "-"),
            ],
        )

        samples = sample_ticks(url, instance)
        sizes = bytes_per_tick(instance, samples, args.tick_copies)
        intervals = tick_intervals()
        tick_rows, skipped_day = [], 0.0
        for (sensor, status), size in sorted(sizes.items()):
            per_day = 86_400 / intervals[sensor]
            skipped_day += per_day * size if status == "SKIPPED" else 0
            tick_rows.append((sensor, status, intervals[sensor], per_day, size, per_day * size / 1e6))
        print_table(
            "Sensor ticks in Dagster's PostgreSQL storage (job_ticks, indexes included)",
            ["sensor", "tick", "every s", "ticks/day", "bytes/tick", "MB/day"],
            tick_rows,
        )
        ticks_per_day = sum(86_400 / s for s in intervals.values())
        print(
            f"\nAll {len(intervals)} sensors: {ticks_per_day:,.0f} ticks a day; idle (every tick skipped) "
            f"{skipped_day / 1e6:,.1f} MB a day, which the shipped retention keeps 1 day of."
        )

        cutoff = datetime.now(UTC) + timedelta(minutes=1)
        batch_ms, deleted, started = [], dict.fromkeys(HISTORY_TABLES, 0), time.monotonic()
        batches = purge_batches(engine, cutoff)
        while True:
            began = time.monotonic()
            batch = next(batches, None)
            if batch is None:
                break
            batch_ms.append((time.monotonic() - began) * 1000)
            for t, n in batch.items():
                deleted[t] += n
        print(
            f"\nPurge of it all: {sum(deleted.values())} rows in {len(batch_ms)} batches of up to {BATCH_ROWS} "
            f"in {time.monotonic() - started:.1f} s; a batch took {statistics.median(batch_ms):.0f} ms "
            f"(median), {max(batch_ms):.0f} ms at most (load average {os.getloadavg()[0]:.1f})"
        )
        dagster_db.dispose()
        engine.dispose()


if __name__ == "__main__":
    main()
