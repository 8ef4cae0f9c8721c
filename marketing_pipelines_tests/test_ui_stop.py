"""Stopping `marketing-pipelines ui` is not a failure, and `ui` only reads the application database.

A stop (`kill PID`, systemd's or docker's stop, Ctrl-C at the terminal) that lands while the daemon
evaluates sensors must store no FAILURE tick and print no ERROR; `ui` in a folder without a database
says what to run and creates none (only `db upgrade` and the demo create one).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml

from marketing_pipelines.db.engine import create_sqlite_folder, get_engine
from marketing_pipelines.db.migrate import upgrade
from marketing_pipelines.local_dagster import DAGSTER_YAML, dagster_home
from marketing_pipelines_tests.cli_runner import invoke
from marketing_pipelines_tests.processes import Child, child_env, dagster_bin, free_port, start, stop, wait_for

# Stops in a row: each lands as the daemon's first sensor loop starts, when every sensor is due at once.
STOPS = 5
# CPU-bound processes beside each stop (the issue saw the failures at a load of about 12 on 2 cores).
BURNERS = 2
TICK_STARTED = "Checking for new runs for sensor"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# The Dagster home's config as the release before this one wrote it: the daemon's thread pools on.
EARLIER_DAGSTER_YAML = """\
# Written by marketing-pipelines for the demo and `marketing-pipelines ui`; the same settings as the
# repository's dagster.yaml. Storage: SQLite files in this folder.
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
  config:
    dequeue_interval_seconds: 1
    dequeue_use_threads: true
    dequeue_num_workers: 4
sensors:
  use_threads: true
  num_workers: 4
run_monitoring:
  enabled: true
  poll_interval_seconds: 5
  start_timeout_seconds: 180
  free_slots_after_run_end_seconds: 15
concurrency:
  pools:
    default_limit: 4
    granularity: run
  runs:
    max_concurrent_runs: 10
telemetry:
  enabled: false
"""


def _sensor_ticks(home: Path) -> dict[str, list[Any]]:
    # Read through the instance's own methods; the enums they return are compared by value.
    with dg.DagsterInstance.from_config(str(home)) as instance:
        states = [s for s in instance.all_instigator_state() if s.instigator_type.value == "SENSOR"]
        return {s.instigator_name: list(instance.get_ticks(s.instigator_origin_id, s.selector_id)) for s in states}


# Python's report of an exception in a destructor, printed and ignored: Dagster 1.13.27's
# GrpcServerCodeLocation.__del__ on a code location whose __init__ the interrupt cut short (it has no
# _heartbeat_shutdown_event yet). Seen once in CI when the stop landed as the daemon opened the location;
# nothing is stored and the stop goes on. It is not the stop's failure this test is about, but it does
# print a traceback (the stop note of issue 45 says so).
IGNORED_DESTRUCTOR = "Exception ignored in: <function CodeLocation.__del__"


def _errors(log: Path) -> list[str]:
    lines = ANSI.sub("", log.read_text(errors="replace")).splitlines()
    ignored = {i + 1 for i, line in enumerate(lines) if line.startswith(IGNORED_DESTRUCTOR)}
    return [
        line
        for i, line in enumerate(lines)
        if (" - ERROR - " in line or line.startswith("Traceback")) and i not in ignored
    ]


def _start_ui(folder: Path, name: str) -> Child:
    argv = [dagster_bin("marketing-pipelines"), "ui", "--port", str(free_port())]
    # The embedded default database and Dagster home under folder/.marketing, as a user's first `ui` there.
    return start(name, argv, child_env(), folder, cwd=folder)


def _until_sensors_tick(ui: Child) -> None:
    wait_for(
        "the daemon's first sensor tick", lambda: TICK_STARTED in ui.log_path.read_text(errors="replace"), 150, [ui]
    )


def _stop_as_a_user(ui: Child, nth: int) -> None:
    """Signal ``ui`` as a user would, alternately: SIGTERM to its pid (kill, systemd, docker), SIGINT to its
    process group (Ctrl-C at a terminal); the machine kept busy until it has exited."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(BURNERS)]
    try:
        if nth % 2 == 0:
            os.kill(ui.process.pid, signal.SIGTERM)
        else:
            os.killpg(ui.process.pid, signal.SIGINT)
        try:
            ui.process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{ui.name} did not stop on its signal:\n{ui.log_tail()}")
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals a process group")
def test_stopping_ui_while_its_sensors_tick_stores_no_failure(tmp_path: Path) -> None:
    engine = get_engine(f"sqlite:///{tmp_path / '.marketing' / 'marketing.db'}")
    create_sqlite_folder(engine)
    upgrade(engine)
    engine.dispose()
    home = dagster_home(tmp_path)
    for nth in range(STOPS):
        ui = _start_ui(tmp_path, f"ui-{nth}")
        try:
            _until_sensors_tick(ui)
            _stop_as_a_user(ui, nth)
        finally:
            stop(ui)  # what is left of its group (dagster dev's code server may go a moment later)
        # Each start after the first is the "next start" of a stop: it reports no failure either.
        assert not _errors(ui.log_path), f"start and stop {nth}:\n" + "\n".join(_errors(ui.log_path))
        ticks = _sensor_ticks(home)
        failed = {name: [t.error.message for t in ts if t.status.value == "FAILURE"] for name, ts in ticks.items()}
        failed = {name: errors for name, errors in failed.items() if errors}
        assert not failed, f"after stop {nth}: {failed}"
    # Each stop landed after a tick had begun.
    assert sum(len(ts) for ts in ticks.values()) >= STOPS, {n: len(ts) for n, ts in ticks.items()}


@pytest.mark.slow
def test_ui_and_its_sensors_create_no_database_in_an_empty_folder(tmp_path: Path) -> None:
    ui = _start_ui(tmp_path, "ui")
    try:
        _until_sensors_tick(ui)
        wait_for(
            "the claiming sensor's tick to skip",
            lambda: "Sensor due_executions_sensor skipped" in ui.log_path.read_text(errors="replace"),
            60,
            [ui],
        )
        _stop_as_a_user(ui, 0)
    finally:
        stop(ui)
    assert not (tmp_path / ".marketing" / "marketing.db").exists()
    text = ANSI.sub("", ui.log_path.read_text(errors="replace"))
    [note] = [line for line in text.splitlines() if line.startswith("Note: ")]
    assert "no SQLite database at" in note and "`marketing-pipelines db upgrade`" in note, note


def _ui_in(folder: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict[str, str]]:
    """What `marketing-pipelines ui` in ``folder`` says on stderr and the environment it starts dagster dev with."""
    started: list[dict[str, str]] = []

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        started.append(env)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execve", execve)
    monkeypatch.chdir(folder)
    # "" is unset: the embedded default under folder/.marketing.
    result = invoke({"MARKETING_DATABASE_URL": "", "MARKETING_MEASUREMENT_START_DATE": ""}, "ui", "--port", "3111")
    assert result.exit_code == 0, result.output
    [env] = started
    return result.stderr, env


def test_ui_in_an_empty_folder_says_what_to_run_and_creates_no_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stderr, env = _ui_in(tmp_path, monkeypatch)
    database = tmp_path / ".marketing" / "marketing.db"
    assert not database.exists()
    [note] = [line for line in stderr.splitlines() if line.startswith("Note: ")]
    assert note == (
        f"Note: no SQLite database at {database}: run `marketing-pipelines db upgrade` to create it; until then "
        "the sensors skip their ticks (`marketing-pipelines demo` creates and fills it)"
    )
    assert not env.get("MARKETING_MEASUREMENT_START_DATE")
    # Once the database is there, nothing to say.
    upgrade(get_engine(f"sqlite:///{database}"))
    stderr, _ = _ui_in(tmp_path, monkeypatch)
    assert "Note: " not in stderr


def test_the_local_daemon_evaluates_on_its_own_thread() -> None:
    # Dagster 1.13.27's daemon closes its workspace before it drains these pools: a stop failed what they held.
    config = yaml.safe_load(DAGSTER_YAML)
    assert config["sensors"]["use_threads"] is False
    assert config["backfills"]["use_threads"] is False
    assert config["run_coordinator"]["config"]["dequeue_use_threads"] is False


@pytest.mark.parametrize(
    ("written", "kept"),
    [
        # What the release before this one wrote: replaced, its thread pools with it.
        (EARLIER_DAGSTER_YAML, False),
        # Edited by someone: theirs.
        ("telemetry:\n  enabled: false\n", True),
    ],
    ids=["earlier", "edited"],
)
def test_the_dagster_home_config_is_replaced_only_where_an_earlier_release_wrote_it(
    tmp_path: Path, written: str, kept: bool
) -> None:
    config = tmp_path / ".marketing" / "dagster_home" / "dagster.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(written)
    dagster_home(tmp_path)
    assert config.read_text() == (written if kept else DAGSTER_YAML)
    assert kept or "use_threads: true" not in config.read_text()
