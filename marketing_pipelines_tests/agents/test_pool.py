"""The agent_runs pool bounds agent ops across OS processes on a real PostgreSQL-backed instance."""

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents.queue import get_agent_run
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines_tests.agents.agent_processes import (
    FakeOpenAI,
    agent_env,
    blocked_runs,
    pool_trial,
    request_openai_runs,
    seed_requester,
    throwaway_postgres_database,
    wait_until,
    write_dagster_home,
)

RUNS = 5
LIMIT = 2

# Real run-worker processes and daemons: left out of the quick loop (pytest -m "not slow").
pytestmark = pytest.mark.slow


@pytest.fixture
def dagster_storage_url(pg_url: str) -> Iterator[str]:
    """A second throwaway database on the same server, for Dagster's own storage."""
    admin_url = sa.engine.make_url(pg_url).set(database="postgres").render_as_string(hide_password=False)
    with throwaway_postgres_database(admin_url) as url:
        yield url.replace("postgresql://", "postgresql+psycopg2://", 1)


def test_pool_limit_holds_for_agent_runs_launched_at_once(
    pg_url: str, dagster_storage_url: str, tmp_path: Path
) -> None:
    app_engine = get_engine(pg_url)
    seed_requester(app_engine)
    with FakeOpenAI(final_delay_s=1.5).running() as fake:
        fake.release.set()
        home = write_dagster_home(tmp_path / "dagster_home", storage_url=dagster_storage_url)
        env = agent_env(fake, pg_url, home, MARKETING_MAX_CONCURRENT_AGENT_RUNS=str(RUNS))
        with dg.DagsterInstance.from_config(str(home)) as instance:
            assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
            # In-process executor: the run worker that claims the slot also runs the op, which
            # halves the processes started on a small CI machine; the slot claim is the same code.
            trial = pool_trial(instance, app_engine, pg_url, env, runs=RUNS, limit=LIMIT)

            assert trial.worker_results == [0] * RUNS
            assert [w.outcome for w in trial.windows] == ["STEP_SUCCESS"] * RUNS
            assert trial.overlap <= LIMIT, f"{trial.overlap} agent ops ran at once, limit {LIMIT}: {trial.windows}"
            # Some steps waited on the pool: the limit, not process start-up timing, kept them apart.
            assert blocked_runs(instance, trial.run_ids, "agent_runs"), "no step was ever blocked by the pool"
            statuses = [instance.get_run_by_id(run_id).status for run_id in trial.run_ids]
            assert statuses == [dg.DagsterRunStatus.SUCCESS] * RUNS
            info = instance.event_log_storage.get_concurrency_info("agent_runs")
            assert (info.slot_count, info.claimed_slots, info.pending_steps) == (LIMIT, [], [])
    with app_engine.connect() as conn:
        rows = [get_agent_run(conn, i) for i in trial.agent_run_ids]
    assert [(r["status"], r["attempts"], r["output"]["text"]) for r in rows] == [
        ("SUCCEEDED", 1, "Spring launch is on track.")
    ] * RUNS
    assert fake.finals_requested() == RUNS


# --- run monitoring gives back the slot of a killed run worker -----------------------------------

DAEMON = Path(sys.executable).parent / "dagster-daemon"
REPO_ROOT = Path(__file__).resolve().parents[2]
MONITORING_YAML = """
run_monitoring:
  enabled: true
  poll_interval_seconds: 1
  free_slots_after_run_end_seconds: 2
run_coordinator:
  module: dagster._core.run_coordinator
  class: QueuedRunCoordinator
  config:
    dequeue_interval_seconds: 1
"""


@contextmanager
def running_daemon(workspace: Path, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``dagster-daemon run`` in its own session with SIGINT reset, so killpg(SIGINT) stops it."""
    with log.open("wb") as out:
        daemon = subprocess.Popen(
            [str(DAEMON), "run", "-w", str(workspace)],
            cwd=REPO_ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            yield daemon
        finally:
            _stop_group(daemon)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGINT, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait_s)
            # The group may outlive its leader (a run worker re-parented to init).
            if sig == signal.SIGKILL:
                return
            os.killpg(process.pid, signal.SIGKILL)
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return


def _event_pid(instance: dg.DagsterInstance, run_id: str, event_type: dg.DagsterEventType) -> int | None:
    for entry in instance.all_logs(run_id, of_type=event_type):
        if entry.dagster_event is not None:
            return entry.dagster_event.pid
    return None


def _runs_of(instance: dg.DagsterInstance, agent_run_id: int) -> list[dg.DagsterRun]:
    return sorted(
        instance.get_runs(dg.RunsFilter(tags={"marketing/agent_run_id": str(agent_run_id)})),
        key=lambda r: int(r.tags["marketing/attempt"]),
    )


def test_run_monitoring_frees_the_slot_of_a_killed_run_worker(
    pg_url: str, dagster_storage_url: str, tmp_path: Path
) -> None:
    app_engine = get_engine(pg_url)
    seed_requester(app_engine)
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        "load_from:\n  - python_module:\n      module_name: marketing_pipelines.definitions\n"
        f"      working_directory: {json.dumps(str(REPO_ROOT))}\n"
    )
    with FakeOpenAI(final_delay_s=0.2).running() as fake:
        home = write_dagster_home(tmp_path / "dagster_home", dagster_storage_url, extra_yaml=MONITORING_YAML)
        env = agent_env(
            fake,
            pg_url,
            home,
            MARKETING_MAX_CONCURRENT_AGENT_RUNS="1",
            MARKETING_SENSOR_INTERVAL_SECONDS="1",
            MARKETING_AGENT_LEASE_GRACE_SECONDS="30",
        )
        [agent_run_id] = request_openai_runs(app_engine, 1)
        with (
            dg.DagsterInstance.from_config(str(home)) as instance,
            running_daemon(workspace, env, tmp_path / "daemon.log") as daemon,
        ):
            try:
                # queued_agent_runs_sensor claims it, the run is launched and the agent waits on its second model call.
                wait_until(lambda: fake.finals_requested() == 1, 90, "the launched agent run to reach the model")
                [first] = _runs_of(instance, agent_run_id)
                held = instance.event_log_storage.get_concurrency_info("agent_runs")
                assert (held.slot_count, [s.run_id for s in held.claimed_slots]) == (1, [first.run_id])
                # The in-process executor runs the step in the run worker: the step's pid is the worker's.
                worker = _event_pid(instance, first.run_id, dg.DagsterEventType.STEP_START)
                assert worker, "no pid of the run worker in the event log"
                os.kill(worker, signal.SIGKILL)  # the whole worker dies, as with a lost container
                fake.release.set()

                wait_until(
                    lambda: instance.get_run_by_id(first.run_id).status == dg.DagsterRunStatus.FAILURE,
                    30,
                    "the code server to mark the killed run FAILURE",
                )
                wait_until(
                    lambda: (
                        first.run_id
                        not in {
                            s.run_id
                            for s in instance.event_log_storage.get_concurrency_info("agent_runs").claimed_slots
                        }
                    ),
                    30,
                    "run monitoring to free the killed run's pool slot",
                )
                # With a limit of 1 the retry can only run in the slot that came back.
                wait_until(
                    lambda: _row_status(app_engine, agent_run_id) == "SUCCEEDED",
                    60,
                    "the retried agent run to succeed",
                )
                # The row is recorded inside the step; the run ends a moment later.
                wait_until(
                    lambda: (
                        [r.status for r in _runs_of(instance, agent_run_id)]
                        == [dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.SUCCESS]
                    ),
                    30,
                    "the killed run to stay FAILURE and the retry's run to end in SUCCESS",
                )
            except AssertionError:
                print((tmp_path / "daemon.log").read_text()[-5000:])
                raise
            wait_until(
                lambda: not instance.event_log_storage.get_concurrency_info("agent_runs").claimed_slots,
                15,
                "the retried run to free its slot",
            )
            assert daemon.poll() is None, "dagster-daemon exited during the test"
    with app_engine.connect() as conn:
        row = get_agent_run(conn, agent_run_id)
    assert row is not None and (row["status"], row["attempts"]) == ("SUCCEEDED", 2)


def _row_status(engine: sa.Engine, agent_run_id: int) -> str | None:
    with engine.connect() as conn:
        row = get_agent_run(conn, agent_run_id)
    return row["status"] if row else None
