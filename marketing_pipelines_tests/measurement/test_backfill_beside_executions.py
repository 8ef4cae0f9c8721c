"""A measurement backfill never starves campaign executions: the run queue's ``dagster/backfill`` tag limit.

Through the real daemon on the local instance the demo and ``ui`` use (``local_dagster.DAGSTER_YAML``): a
60-day backfill of one-day runs is queued, then executions fall due. Before the limit the backfill's 60 runs
held the queue's 10 slots and the executions' run waited behind all of them (an operator saw a ``log``
execution wait about 8.5 minutes); with it, at most 2 backfill runs are in progress and the executions' run is
dequeued past the queued backfill runs.
"""

from __future__ import annotations

import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import marketing_execution
from marketing_pipelines.executions.queue import schedule_execution
from marketing_pipelines.local_dagster import code_location, dagster_home, local_environment
from marketing_pipelines.settings import load_settings
from marketing_pipelines_tests.measurement.test_cli_backfill import backfill_through, seeded

# Real daemon processes: end to end, left out of the quick loop.
pytestmark = pytest.mark.slow

FIRST, DAYS = date(2026, 9, 1), 60
EXECUTIONS = 3
LIMIT = 2  # the dagster/backfill tag limit of local_dagster.DAGSTER_YAML
# Backfill runs still queued when the executions fall due: the old queue made the executions wait for all of them.
QUEUED_AHEAD = 20


def _records(instance: dg.DagsterInstance) -> tuple[list[dg.RunRecord], list[dg.RunRecord]]:
    """(the backfill's run records, the other runs' records)."""
    records = instance.get_run_records()
    backfill_runs = [r for r in records if "dagster/backfill" in r.dagster_run.tags]
    return backfill_runs, [r for r in records if "dagster/backfill" not in r.dagster_run.tags]


def _execution_statuses(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(marketing_execution.c.status)).scalars())


def _launched_at(instance: dg.DagsterInstance, record: dg.RunRecord) -> float:
    """When the run queue launched the run (its RUN_STARTING event), or infinity while it is still queued."""
    launched = instance.all_logs(record.dagster_run.run_id, of_type=dg.DagsterEventType.RUN_STARTING)
    return launched[0].timestamp if launched else float("inf")


def test_executions_due_during_a_60_day_backfill_run_beside_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = seeded(tmp_path)
    monkeypatch.chdir(tmp_path)
    home = dagster_home()
    env = {
        **local_environment(load_settings(database_url=url), home),
        "MARKETING_BACKFILL_DAYS_PER_RUN": "1",
        "MARKETING_SENSOR_INTERVAL_SECONDS": "2",
    }
    engine = get_engine(url)
    with (
        dg.DagsterInstance.from_config(str(home)) as instance,
        code_location(instance, env, start_daemon=True) as workspace,
    ):
        done = backfill_through(tmp_path, FIRST, FIRST + timedelta(days=DAYS - 1), workspace, home, days_per_run=1)
        assert done.returncode == 0, done.stderr
        assert f"as {DAYS} run(s)" in done.stdout, done.stdout

        # The backfill daemon submits the backfill's runs (in its 30-second iterations); the executions fall due
        # once all of them are in the queue and many still wait there, as a log execution did behind an
        # operator's backfill.
        def queued() -> int:
            return sum(r.dagster_run.status == dg.DagsterRunStatus.QUEUED for r in _records(instance)[0])

        deadline = time.monotonic() + 180
        while (len(_records(instance)[0]) < DAYS or queued() < QUEUED_AHEAD) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(_records(instance)[0]) == DAYS and queued() >= QUEUED_AHEAD, "the backfill's runs were not queued"
        with engine.begin() as conn:
            for i in range(EXECUTIONS):
                schedule_execution(
                    conn,
                    campaign_id="spring-launch",
                    stage="launch",
                    action="log",
                    due_at=datetime.now(UTC) - timedelta(seconds=1),
                    payload={"message": f"due during the backfill {i}"},
                )
        most_in_progress = 0
        deadline = time.monotonic() + 240
        while _execution_statuses(engine) != ["SUCCEEDED"] * EXECUTIONS and time.monotonic() < deadline:
            in_progress = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)
            most_in_progress = max(
                most_in_progress, sum(r.dagster_run.status in in_progress for r in _records(instance)[0])
            )
            time.sleep(0.5)
        assert _execution_statuses(engine) == ["SUCCEEDED"] * EXECUTIONS
        backfill_runs, others = _records(instance)

        [executions_run] = [r for r in others if r.dagster_run.job_name == "marketing_execution_job"]
        queued_at = executions_run.create_timestamp.timestamp()
        launched_at = _launched_at(instance, executions_run)
        # The backfill runs queued before the executions' run that the queue launched while it waited: every one of
        # them (about 40 here) before the limit, as a first-in-first-out queue with free slots takes them in order.
        # With it, at most what the limit lets through in the dequeue that took the executions' run and the one
        # before it.
        overtook = [
            r
            for r in backfill_runs
            if r.create_timestamp.timestamp() < queued_at and queued_at < _launched_at(instance, r) < launched_at
        ]
    assert len(overtook) <= 2 * LIMIT, f"{len(overtook)} backfill runs queued earlier were launched first"
    assert most_in_progress <= LIMIT, f"{most_in_progress} backfill runs in progress at once (limit {LIMIT})"
