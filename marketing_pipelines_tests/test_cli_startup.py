"""A command imports only what it needs, and ``ui`` starts without warnings a user cannot act on.

The latency itself is printed by benchmarks/cli_latency.py; these tests hold its causes.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest

from marketing_pipelines.cli import COMMANDS, SUMMARIES, main

# Libraries that cost a read command 0.01-1 s each to import and that none of them uses (dagster_shared: the
# warning classes only the demo needs).
HEAVY = ("alembic", "dagster", "dagster_shared", "httpx", "jsonschema", "pandas")

RUN_AND_LIST_MODULES = """
import json, sys
from marketing_pipelines.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
except Exception as exc:  # a known error (e.g. no such row) still exercises the command's imports
    print(type(exc).__name__, exc, file=sys.stderr)
print(json.dumps(sorted(sys.modules)))
"""


def modules_after(db_url: str, *args: str) -> list[str]:
    """The modules a fresh interpreter has loaded after running ``marketing-pipelines ARGS``."""
    env = {**os.environ, "MARKETING_DATABASE_URL": db_url}
    done = subprocess.run(
        [sys.executable, "-c", RUN_AND_LIST_MODULES, *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def heavy_modules_after(db_url: str, *args: str) -> list[str]:
    """The heavy libraries a fresh interpreter has loaded after running ``marketing-pipelines ARGS``."""
    return sorted({m.split(".")[0] for m in modules_after(db_url, *args)} & set(HEAVY))


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("db", "current"),
        ("executions", "list"),
        ("executions", "show", "1"),
        ("executions", "schedule", "--campaign", "none", "--stage", "launch", "--action", "log", "--due", "now"),
        ("campaigns", "list"),
        ("users", "list"),
        ("status",),
        ("agents", "list"),
        ("agents", "show", "1"),
        ("limits", "show"),
    ],
    ids=" ".join,
)
def test_a_read_command_imports_no_heavy_library(sqlite_url: str, args: tuple[str, ...]) -> None:
    assert heavy_modules_after(sqlite_url, *args) == []


def test_help_lists_the_commands_without_importing_them_or_the_database_libraries(sqlite_url: str) -> None:
    loaded = modules_after(sqlite_url, "--help")
    libraries = {"sqlalchemy", "pydantic", "pydantic_settings", "dagster_shared", *HEAVY}
    assert {m.split(".")[0] for m in loaded} & libraries == set()
    assert [m for m in loaded if m.startswith("marketing_pipelines.") and m != "marketing_pipelines.cli"] == [
        "marketing_pipelines.cli.common",
        "marketing_pipelines.errors",
    ]


def test_the_summaries_help_lists_are_the_commands_own_first_lines() -> None:
    ctx = click.Context(main)
    commands = {name: main.get_command(ctx, name) for name in COMMANDS}
    own = {name: command.get_short_help_str(limit=1000) for name, command in commands.items() if command is not None}
    assert own == SUMMARIES


@pytest.mark.parametrize("args", [("agents", "list"), ("agents", "show", "1"), ("agents", "cancel", "1")], ids=" ".join)
def test_reading_agent_runs_loads_no_agent_catalog(sqlite_url: str, args: tuple[str, ...]) -> None:
    # The catalog's tools import the executions queue and its models: only requesting or retrying needs them.
    assert "marketing_pipelines.agents.catalog" not in modules_after(sqlite_url, *args)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ui_starts_without_warnings(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "marketing-pipelines"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MARKETING_", "DAGSTER_HOME"))}
    proc = subprocess.Popen(
        [str(script), "ui", "--port", str(free_port())],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output: list[str] = []
    try:
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            # The webserver serving is the end of start-up: every service and the code location are up.
            if "Serving dagster-webserver" in line or time.monotonic() > deadline:
                break
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = "".join(output)
    assert "Serving dagster-webserver" in text, text[-3000:]
    assert "Warning" not in text, text
