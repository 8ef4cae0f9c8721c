"""The agent_runs pool bounds agent runs across OS processes, through the real daemon's run queue."""

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
    StepWindow,
    agent_env,
    agent_step_windows,
    max_overlap,
    request_openai_runs,
    seed_requester,
    throwaway_postgres_database,
    wait_until,
    write_dagster_home,
)

RUNS = 5
LIMIT = 2
FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}

# Real run-worker processes and daemons: left out of the quick loop (pytest -m "not slow").
pytestmark = pytest.mark.slow


@pytest.fixture
def dagster_storage_url(pg_url: str) -> Iterator[str]:
    """A second throwaway database on the same server, for Dagster's own storage."""
    admin_url = sa.engine.make_url(pg_url).set(database="postgres").render_as_string(hide_password=False)
    with throwaway_postgres_database(admin_url) as url:
        yield url.replace("postgresql://", "postgresql+psycopg2://", 1)


QUEUE_YAML = """
run_coordinator:
  module: dagster._core.run_coordinator
  class: QueuedRunCoordinator
  config:
    dequeue_interval_seconds: 1
"""


def _agent_runs(instance: dg.DagsterInstance) -> list[dg.DagsterRun]:
    return list(instance.get_runs(dg.RunsFilter(job_name="agent_run_job")))


@pytest.mark.parametrize("storage", ["postgres", "sqlite"])
def test_pool_limit_holds_for_agent_runs_queued_at_once(
    storage: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The shipped pool granularity (run): the real daemon's run queue holds runs beyond the limit.

    Five agent runs are claimed and queued while the queue launches nothing (max_concurrent_runs 0),
    an operator then lowers the pool to 2, and the daemon starts again with room for 10 runs: only
    the pool can keep them apart. Before, with Dagster's per-step slot claim (granularity op), CI saw
    3 agent ops at once against a limit of 2 on PostgreSQL (benchmarks/pool_overshoot_sqlite.py).
    """
    app_url = request.getfixturevalue("pg_url" if storage == "postgres" else "sqlite_url")
    storage_url = request.getfixturevalue("dagster_storage_url") if storage == "postgres" else None
    app_engine = get_engine(app_url)
    seed_requester(app_engine)
    workspace = _workspace(tmp_path)
    with FakeOpenAI(final_delay_s=1.5).running() as fake:
        fake.release.set()
        home = tmp_path / "dagster_home"
        env = agent_env(
            fake, app_url, home, MARKETING_MAX_CONCURRENT_AGENT_RUNS=str(RUNS), MARKETING_SENSOR_INTERVAL_SECONDS="1"
        )
        agent_run_ids = request_openai_runs(app_engine, RUNS)
        write_dagster_home(home, storage_url, extra_yaml=QUEUE_YAML, max_concurrent_runs=0)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            # queued_agent_runs_sensor claims all five (its limit is 5) and the queue holds them.
            with running_daemon(workspace, env, tmp_path / "queueing.log"):
                wait_until(lambda: len(_agent_runs(instance)) == RUNS, 90, f"{RUNS} agent runs to be queued")
            assert {r.status for r in _agent_runs(instance)} == {dg.DagsterRunStatus.QUEUED}
            # An operator lowers the limit (Deployment > Concurrency); it stands, the setting is unchanged.
            instance.event_log_storage.set_concurrency_slots("agent_runs", LIMIT)
        write_dagster_home(home, storage_url, extra_yaml=QUEUE_YAML, max_concurrent_runs=10)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            log = tmp_path / "daemon.log"
            with running_daemon(workspace, env, log):
                try:
                    wait_until(
                        lambda: all(r.status in FINISHED for r in _agent_runs(instance)),
                        120,
                        "the queued agent runs to finish",
                    )
                except AssertionError:
                    print(log.read_text()[-5000:])
                    raise
            runs = _agent_runs(instance)
            assert [r.status for r in runs] == [dg.DagsterRunStatus.SUCCESS] * RUNS
            windows = agent_step_windows(instance, [r.run_id for r in runs])
            overlap = max_overlap(windows)
            assert overlap <= LIMIT, f"{overlap} agent ops ran at once, limit {LIMIT}: {windows}"
            # The queue held whole runs back: no run worker was started to sit waiting for a slot.
            records = instance.get_run_records(dg.RunsFilter(job_name="agent_run_job"))
            run_windows = [StepWindow(r.dagster_run.run_id, r.start_time, r.end_time, "") for r in records]
            assert max_overlap(run_windows) <= LIMIT, f"{max_overlap(run_windows)} agent runs in progress at once"
            # The limit, not start-up timing, kept them apart: the queue held runs back for the pool.
            assert "blocked by global concurrency limits" in log.read_text(), "no run was held back by the pool"
            assert instance.event_log_storage.get_concurrency_info("agent_runs").slot_count == LIMIT
    with app_engine.connect() as conn:
        rows = [get_agent_run(conn, i) for i in agent_run_ids]
    assert [(r["status"], r["attempts"], r["output"]["text"]) for r in rows] == [
        ("SUCCEEDED", 1, "Spring launch is on track.")
    ] * RUNS
    assert fake.finals_requested() == RUNS


# --- a killed run worker gives its place in the pool back -----------------------------------

DAEMON = Path(sys.executable).parent / "dagster-daemon"
REPO_ROOT = Path(__file__).resolve().parents[2]
MONITORING_YAML = """
run_monitoring:
  enabled: true
  poll_interval_seconds: 1
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


def _workspace(tmp_path: Path) -> Path:
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        "load_from:\n  - python_module:\n      module_name: marketing_pipelines.definitions\n"
        f"      working_directory: {json.dumps(str(REPO_ROOT))}\n"
    )
    return workspace


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


def test_a_killed_run_worker_gives_its_place_in_the_pool_back(
    pg_url: str, dagster_storage_url: str, tmp_path: Path
) -> None:
    """At limit 1, the retry of an agent run whose worker was killed can only start once the killed run
    stops counting against the pool: when its code server marks it FAILURE."""
    app_engine = get_engine(pg_url)
    seed_requester(app_engine)
    workspace = _workspace(tmp_path)
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
                assert instance.get_run_by_id(first.run_id).status == dg.DagsterRunStatus.STARTED
                held = instance.event_log_storage.get_concurrency_info("agent_runs")
                # Granularity run: the queue counts the run itself; no step slot is claimed to be leaked.
                assert (held.slot_count, held.claimed_slots) == (1, [])
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
                # With a limit of 1 the retry can only be dequeued once the killed run no longer counts.
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
            assert daemon.poll() is None, "dagster-daemon exited during the test"
    with app_engine.connect() as conn:
        row = get_agent_run(conn, agent_run_id)
    assert row is not None and (row["status"], row["attempts"]) == ("SUCCEEDED", 2)


def _row_status(engine: sa.Engine, agent_run_id: int) -> str | None:
    with engine.connect() as conn:
        row = get_agent_run(conn, agent_run_id)
    return row["status"] if row else None
