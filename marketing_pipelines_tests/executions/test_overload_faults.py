"""Overload is slowness, not failure: a run that never reached an execution's action spent none of its attempts.

Seen at a load of 35-47: runs failed by run monitoring's start timeout cost each of their executions an
attempt, and a long enough overload ended executions FAILED; a run failed at its start timeout whose worker
had already passed Dagster's own check went on to send what the run-failure sensor handed back; and the
executions of a killed run worker waited out the retry backoff although nothing had failed. Each test here
forces one of those, with real Dagster instances (the daemon's, for run monitoring and the default launcher).
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import marketing_execution as t
from marketing_pipelines.egress import EgressPolicy, parse_networks
from marketing_pipelines.executions.jobs import HOLD_BEFORE_TAKE_OVER
from marketing_pipelines.executions.queue import (
    EXECUTIONS,
    begin_attempts,
    get_execution,
    schedule_execution,
    start_attempts,
)
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.executions.sensors import execution_run_failure_sensor, executions_of_run
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.leasing import lease
from marketing_pipelines_tests.built import due_executions_sensor
from marketing_pipelines_tests.cli_runner import cli_for
from marketing_pipelines_tests.executions.late_start_location import LATE_START_GATE
from marketing_pipelines_tests.executions.runs import LOCAL, outcome_metadata, perform, sensor_requests
from marketing_pipelines_tests.factories import add_campaign
from marketing_pipelines_tests.processes import REPO_ROOT, Child, child_env, dagster_bin, running, start, wait_for
from marketing_pipelines_tests.webserver import Received, Recorder, webhook_server

T = TypeVar("T")
START_TIMEOUT = "Run timed out due to taking longer than 90 seconds to start."
# A short lease: its heartbeat (a third of it) comes every 2 s, so a worker notices its run ended within seconds.
QUICK = ExecutionSettings(lease_seconds=6, retry_backoff_seconds=0)
# Real daemons on a machine shared with other work: generous, and never a measure of speed.
DAEMON_TIMEOUT_S = 240
# Run monitoring's start timeout in the daemon tests: short, yet long enough for a worker that is not held.
START_TIMEOUT_S = 15


def _schedule(engine: sa.Engine, url: str, n: int, max_attempts: int = 3) -> list[int]:
    add_campaign(engine)
    with engine.begin() as conn:
        return [
            schedule_execution(
                conn,
                campaign_id="spring-launch",
                stage="launch",
                action="webhook",
                due_at=datetime.now(UTC) - timedelta(seconds=n - i),
                payload={"url": f"{url}/{i}", "body": {"n": i}},
                max_attempts=max_attempts,
                egress=EgressPolicy(parse_networks(LOCAL)),
            )
            for i in range(n)
        ]


def _rows(engine: sa.Engine, ids: list[int]) -> list[sa.RowMapping]:
    with engine.connect() as conn:
        return [get_execution(conn, i) for i in ids]  # type: ignore[misc]


def _tick(db_url: str, instance: dg.DagsterInstance, settings: ExecutionSettings = QUICK) -> list[dg.RunRequest]:
    return sensor_requests(due_executions_sensor, db_url, instance, settings)


@contextmanager
def _in_thread(work: Callable[[], T]) -> Iterator[Future[T]]:
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool.submit(work)


def _reconcile_failure(instance: dg.DagsterInstance, run_id: str, db_url: str) -> None:
    """What the run-failure sensor does with the run's (latest) failure."""
    failed = instance.get_run_by_id(run_id)
    assert failed is not None and failed.status == dg.DagsterRunStatus.FAILURE
    failure = [e for e in instance.all_logs(run_id) if e.dagster_event and e.dagster_event.is_run_failure][-1]
    context = dg.build_run_status_sensor_context(
        sensor_name="execution_run_failure_sensor",
        dagster_instance=instance,
        dagster_run=failed,
        dagster_event=failure.dagster_event,
        resources={"app_db": AppDatabase(url=db_url), "execution_settings": QUICK},
    ).for_run_failure()
    execution_run_failure_sensor(context)


def _messages(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [e.message for e in instance.all_logs(run_id) if e.message]


def _held_first(path: str) -> tuple[threading.Event, threading.Event, Callable[[Received], None]]:
    """A receiver's hook that holds the first request to ``path`` until released: an action in flight."""
    arrived, release = threading.Event(), threading.Event()

    def hold(received: Received) -> None:
        if received.path == path and not arrived.is_set():
            arrived.set()
            release.wait(timeout=120)

    return arrived, release, hold


def test_a_worker_held_past_its_status_check_takes_nothing_over_once_its_run_failed(
    db_url: str,
    engine: sa.Engine,
    instance: dg.DagsterInstance,
    hook: Recorder,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The worker passes its status check; run monitoring fails the run (its start timeout, under load) and
    # the run-failure sensor hands the executions back before the worker takes them over.
    ids = _schedule(engine, hook.url, n=3)
    [request] = _tick(db_url, instance)
    gate = tmp_path / "gate"
    Path(f"{gate}.armed").touch()
    monkeypatch.setenv(HOLD_BEFORE_TAKE_OVER, str(gate))
    reached = Path(f"{gate}.reached")
    with _in_thread(lambda: perform(request, db_url, instance, settings=QUICK)) as first:
        run_id = wait_for(
            "the worker to stop before its take-over", lambda: reached.exists() and reached.read_text(), 60
        )
        run = instance.get_run_by_id(run_id)
        assert run is not None
        instance.report_run_failed(run, START_TIMEOUT)
        _reconcile_failure(instance, run_id, db_url)
        rows = _rows(engine, ids)
        # Handed back: nothing was tried, so the attempt is given back, and the first hand-back is due at once.
        assert [(r["status"], r["attempts"], r["lost_attempts"], r["handed_back"]) for r in rows] == [
            ("SCHEDULED", 0, 0, 1)
        ] * 3
        assert all(
            f"run {run_id} ended before it took this execution over ({START_TIMEOUT}); not an attempt"
            == r["last_error"]
            for r in rows
        )
        [again] = _tick(db_url, instance)
        assert perform(again, db_url, instance, settings=QUICK).success
        gate.touch()
        held = first.result(timeout=120)
    # The held worker, let go, finds its executions handed back and another run's: it sends nothing.
    assert not held.success
    assert any(
        "no longer STARTING or STARTED" in m and "took none of its executions over" in m
        for m in _messages(instance, run_id)
    )
    assert Counter(r.path for r in hook.received) == {f"/hook/{i}": 1 for i in range(3)}
    rows = _rows(engine, ids)
    assert [(r["status"], r["attempts"], r["lost_attempts"]) for r in rows] == [("SUCCEEDED", 1, 0)] * 3


def test_a_run_failed_while_its_worker_sends_sends_each_execution_once(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance
) -> None:
    # The worker took its executions over and sends the first (one at a time) when Dagster fails its run. The
    # run-failure sensor must not requeue what a live worker holds: it shortens the leases; the worker, at
    # its next heartbeat, begins nothing more and records what it has in flight; what it never began comes
    # back seconds later, its attempt not spent, for another run.
    arrived, release, hold = _held_first("/hook/0")
    one_at_a_time = WebhookClient(timeout_s=60, allow_networks=LOCAL, concurrency=1)
    with webhook_server() as hook:
        hook.on_request = hold
        ids = _schedule(engine, hook.url, n=4)
        [request] = _tick(db_url, instance)
        try:
            with _in_thread(lambda: perform(request, db_url, instance, webhook=one_at_a_time, settings=QUICK)) as first:
                assert arrived.wait(timeout=60), "the first webhook never arrived"
                run_id = _rows(engine, ids)[0]["run_id"]
                run = instance.get_run_by_id(run_id)
                assert run is not None
                instance.report_run_failed(run, START_TIMEOUT)
                _reconcile_failure(instance, run_id, db_url)
                assert all(r["status"] == "RUNNING" for r in _rows(engine, ids))  # left to its worker, fenced
                [second] = wait_for("the executions not begun to be handed back", lambda: _tick(db_url, instance), 60)
                assert sorted(executions_of_run(second.run_config)) == ids[1:]
                assert perform(second, db_url, instance, settings=QUICK).success
                release.set()
                failed = first.result(timeout=120)
        finally:
            release.set()
    assert Counter(r.path for r in hook.received) == {f"/hook/{i}": 1 for i in range(4)}
    rows = _rows(engine, ids)
    # The one in flight was recorded by the failed run's worker; the others, never begun, were given back.
    assert [(r["status"], r["attempts"], r["lost_attempts"], r["handed_back"]) for r in rows] == [
        ("SUCCEEDED", 1, 0, 0),
        *[("SUCCEEDED", 1, 0, 1)] * 3,
    ]
    assert not failed.success
    assert any("begins no further action" in m for m in _messages(instance, failed.run_id))
    table = {r.data["execution_id"]: r.data["outcome"] for r in outcome_metadata(failed)["executions"].records}
    assert table == {ids[0]: "SUCCEEDED", **dict.fromkeys(ids[1:], "NOT_BEGUN")}


def test_a_failed_execution_says_why_in_executions_show_and_in_its_runs_failure(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    hook.status = 500
    exhausted, lost = _schedule(engine, hook.url, n=2, max_attempts=1)
    with engine.begin() as conn:  # only the first is due now
        conn.execute(sa.update(t).where(t.c.id == lost).values(due_at=datetime.now(UTC) + timedelta(days=1)))
    [request] = _tick(db_url, instance)
    result = perform(request, db_url, instance, settings=QUICK)
    assert not result.success
    cause = (
        "its action failed every attempt it had (1 of 1); 1 attempt(s) with an outcome, 0 lost after the action "
        "began, 0 run(s) that never began it (not attempts)"
    )
    [step_failure] = [e for e in result.all_node_events if e.event_type_value == "STEP_FAILURE"]
    assert cause in (step_failure.step_failure_data.user_failure_data.description or "")
    [record] = outcome_metadata(result)["executions"].records
    assert record.data["cause"] == cause
    # One that kills every worker it reaches: its attempts are lost after the action began, MAX_LOST_ATTEMPTS times.
    for n in range(lease.MAX_LOST_ATTEMPTS):
        with engine.begin() as conn:
            conn.execute(sa.update(t).where(t.c.id == lost).values(due_at=datetime.now(UTC) - timedelta(seconds=1)))
            [row] = lease.claim_batch(conn, EXECUTIONS, f"run:{n}", 1, 60)
            start_attempts(conn, [row], str(n))
            assert begin_attempts(conn, [lost], f"run:{n}") == {lost}
            lease.recover_expired(conn, EXECUTIONS, at=datetime.now(UTC) + timedelta(seconds=61))
    cli = cli_for(db_url)
    shown = {i: cli("executions", "show", str(i)).output for i in (exhausted, lost)}
    assert f"failed because: {cause}" in shown[exhausted]
    assert (
        f"failed because: its attempts were lost after the action began {lease.MAX_LOST_ATTEMPTS} times (the limit "
        f"is {lease.MAX_LOST_ATTEMPTS}); 0 attempt(s) with an outcome, {lease.MAX_LOST_ATTEMPTS} lost after the "
        "action began, 0 run(s) that never began it (not attempts)"
    ) in shown[lost]


# --- with the daemon: run monitoring's start timeout, and the default run launcher's run workers -------------


def _daemon(tmp_path: Path, pg_url: str, module: str, **env: str) -> tuple[Path, dict[str, str], list[str]]:
    """A DAGSTER_HOME with the repository's dagster.yaml (run monitoring's start timeout START_TIMEOUT_S), the
    daemon's environment and its command, for a workspace of the code location ``module``."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    instance = yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
    instance["run_monitoring"].update(start_timeout_seconds=START_TIMEOUT_S, poll_interval_seconds=2)
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance))
    workspace = tmp_path / "workspace.yaml"
    location = {"module_name": module, "location_name": "marketing_pipelines", "working_directory": str(REPO_ROOT)}
    workspace.write_text(yaml.safe_dump({"load_from": [{"python_module": location}]}))
    environment = child_env(
        DAGSTER_HOME=str(home),
        MARKETING_DATABASE_URL=pg_url,
        MARKETING_SENSOR_INTERVAL_SECONDS="2",
        MARKETING_WEBHOOK_ALLOW_NETWORKS=LOCAL[0],
        **env,
    )
    return home, environment, [dagster_bin("dagster-daemon"), "run", "-w", str(workspace)]


def _statuses(engine: sa.Engine, ids: list[int]) -> str:
    return str([dict(r) for r in _rows(engine, ids)])


def _worker_pid(instance: dg.DagsterInstance, run_id: str, daemon: Child) -> int:
    """The pid of the run's worker: a process the daemon's code server spawned (it says so in RUN_START)."""
    [pid] = [
        e.dagster_event.pid
        for e in instance.all_logs(run_id)
        if e.dagster_event and e.dagster_event.event_type_value == "PIPELINE_START"
    ]
    assert pid is not None and os.getpgid(pid) == daemon.process.pid, "not a process of the daemon's group"
    assert b"--multiprocessing-fork" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return pid


@pytest.mark.slow  # a real daemon, its code server and run workers
def test_runs_that_never_start_give_their_attempts_back_and_never_fail_their_executions(
    pg_url: str, tmp_path: Path
) -> None:
    engine = get_engine(pg_url)
    gate = tmp_path / "late-start"
    gate.touch()
    module = "marketing_pipelines_tests.executions.late_start_location"
    home, env, argv = _daemon(tmp_path, pg_url, module, **{LATE_START_GATE: str(gate)})
    # Each hand-back in a row as it was seen while the execution waited: (its delay, its error).
    seen: dict[int, tuple[float, str]] = {}

    def watch(ids: list[int]) -> list[sa.RowMapping]:
        rows = _rows(engine, ids)
        for r in rows:
            assert r["status"] != "FAILED", _statuses(engine, ids)
            if r["status"] == "SCHEDULED" and r["unstarted_runs"]:
                delay = (r["due_at"] - r["updated_at"]).total_seconds()
                seen.setdefault(r["unstarted_runs"], (delay, r["last_error"]))
        return rows

    with webhook_server() as hook:
        ids = _schedule(engine, hook.url, n=2, max_attempts=1)
        with running([]) as children:
            children.append(start("dagster-daemon", argv, env, tmp_path))
            # Every run worker waits in its load past the start timeout: each run fails without starting.
            wait_for(
                "two runs in a row to fail at their start timeout",
                lambda: all(r["unstarted_runs"] >= 2 for r in watch(ids)),
                DAEMON_TIMEOUT_S,
                children,
                detail=lambda: _statuses(engine, ids),
            )
            gate.unlink()  # the machine has room again: the held workers go on, and the next run starts
            wait_for(
                "the executions to succeed",
                lambda: all(r["status"] == "SUCCEEDED" for r in watch(ids)),
                DAEMON_TIMEOUT_S,
                children,
                detail=lambda: _statuses(engine, ids),
            )
            with dg.DagsterInstance.from_config(str(home)) as instance:
                never_started = [
                    r.run_id
                    for r in instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
                    if any("taking longer than" in m for m in _messages(instance, r.run_id))
                ]
                # Such runs show FAILED on the Runs page; their workers, let go, took nothing over.
                wait_for(
                    "the late workers to stop",
                    lambda: all(
                        any("takes none of its" in m or "Ignoring a run worker" in m for m in _messages(instance, i))
                        for i in never_started
                    ),
                    60,
                    children,
                )
    rows = _rows(engine, ids)
    # Never FAILED, however many runs never started; the one attempt each had was spent on the receiver once.
    assert [(r["status"], r["attempts"], r["lost_attempts"], r["max_attempts"]) for r in rows] == [
        ("SUCCEEDED", 1, 0, 1)
    ] * 2
    assert all(r["handed_back"] >= 2 for r in rows) and len(never_started) >= 2
    assert Counter(r.path for r in hook.received) == {"/hook/0": 1, "/hook/1": 1}
    # The delay grows with the hand-backs in a row (the first is due at once, in its place).
    assert 2 in seen and all(delay == lease.unstarted_delay_seconds(n) for n, (delay, _) in seen.items() if n > 1)
    assert all(
        "never started (Run timed out due to taking longer than" in error and error.endswith("; not an attempt")
        for _, error in seen.values()
    )


@pytest.mark.slow  # a real daemon, its code server and run workers
def test_a_killed_run_workers_executions_are_due_again_at_once_not_after_the_backoff(
    pg_url: str, tmp_path: Path
) -> None:
    engine = get_engine(pg_url)
    # A backoff of an hour: a lost attempt that waited for it would not finish within this test.
    home, env, argv = _daemon(
        tmp_path,
        pg_url,
        "marketing_pipelines.definitions",
        MARKETING_RETRY_BACKOFF_SECONDS="3600",
        MARKETING_WEBHOOK_CONCURRENCY="1",
    )
    arrived, release, hold = _held_first("/hook/0")
    with webhook_server() as hook:
        hook.on_request = hold
        ids = _schedule(engine, hook.url, n=3)
        try:
            with running([]) as children, dg.DagsterInstance.from_config(str(home)) as instance:
                children.append(daemon := start("dagster-daemon", argv, env, tmp_path))
                wait_for("the first webhook to be in flight", arrived.is_set, DAEMON_TIMEOUT_S, children)
                run_id = _rows(engine, ids)[0]["run_id"]
                os.kill(_worker_pid(instance, run_id, daemon), signal.SIGKILL)
                release.set()
                wait_for(
                    "the executions to succeed",
                    lambda: all(r["status"] == "SUCCEEDED" for r in _rows(engine, ids)),
                    DAEMON_TIMEOUT_S,
                    children,
                    detail=lambda: _statuses(engine, ids),
                )
                killed = instance.get_run_by_id(run_id)
                assert killed is not None and killed.status == dg.DagsterRunStatus.FAILURE
        finally:
            release.set()
    rows = _rows(engine, ids)
    # The send in flight was lost (sent again, its attempt not spent); the two waiting for a thread had not
    # begun, and were given back. None waited out the backoff.
    assert [(r["attempts"], r["lost_attempts"], r["handed_back"]) for r in rows] == [(2, 1, 0), (1, 0, 1), (1, 0, 1)]
    assert Counter(r.path for r in hook.received) == {"/hook/0": 2, "/hook/1": 1, "/hook/2": 1}
    assert {r.headers["idempotency-key"] for r in hook.received if r.path == "/hook/0"} == {
        f"marketing-execution-{ids[0]}"
    }
