"""`executions schedule --file`: JSON Lines, a bad line costs only itself, a re-run adds nothing by dedupe key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from marketing_pipelines.cli import main
from marketing_pipelines.db.schema import marketing_execution as t
from marketing_pipelines.executions.queue import MAX_FILE_BYTES, MAX_FILE_LINES, MAX_LINE_BYTES, MAX_PAYLOAD_BYTES
from marketing_pipelines_tests.cli_runner import Cli, cli_for
from marketing_pipelines_tests.factories import add_campaign

GOOD = {"campaign": "spring-launch", "stage": "launch", "action": "log", "due": "2026-12-01T09:00:00+01:00"}


@pytest.fixture
def cli(db_url: str, engine: sa.Engine) -> Cli:
    add_campaign(engine)
    return cli_for(db_url)


def _line(**changes: Any) -> str:
    return json.dumps({**GOOD, **changes})


def _write(tmp_path: Path, *lines: str | bytes) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines))
    return str(path)


def _rows(engine: sa.Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        query = sa.select(t.c.id, t.c.stage, t.c.payload, t.c.due_at, t.c.max_attempts, t.c.dedupe_key, t.c.status)
        return [dict(r) for r in conn.execute(query.order_by(t.c.id)).mappings()]


def test_good_lines_are_scheduled_bad_ones_named_by_line_and_a_rerun_adds_nothing(
    engine: sa.Engine, cli: Cli, tmp_path: Path
) -> None:
    path = _write(
        tmp_path,
        _line(stage="one", payload={"message": "hi"}, max_attempts=5, dedupe_key="k1"),
        _line(stage="two", colour="red", dedupe_key="k2"),
        "",  # blank lines are skipped, and still counted in line numbers
        json.dumps(
            {"campaign_id": "spring-launch", "stage": "three", "action": "log", "due": GOOD["due"], "dedupe_key": "k3"}
        ),
        _line(stage="four", campaign="nope", dedupe_key="k4"),
        _line(stage="five", dedupe_key="k1"),  # the key of line 1: that execution, nothing new
    )
    result = cli("executions", "schedule", "--file", path)
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "line 2: unknown key 'colour' (known: campaign, campaign_id, stage, action, due, payload, max_attempts, "
        "dedupe_key)",
        "line 5: unknown campaign 'nope'; add it with `marketing-pipelines campaigns add`",
    ]
    assert result.stdout == "scheduled 2 new, 1 already scheduled by dedupe key, 2 rejected\n"
    rows = _rows(engine)
    assert [(r["stage"], r["payload"], r["max_attempts"], r["dedupe_key"], r["status"]) for r in rows] == [
        ("one", {"message": "hi"}, 5, "k1", "SCHEDULED"),
        ("three", {}, 3, "k3", "SCHEDULED"),  # the default budget (MARKETING_EXECUTION_MAX_ATTEMPTS)
    ]
    assert {r["due_at"].isoformat() for r in rows} == {"2026-12-01T08:00:00+00:00"}

    again = cli("executions", "schedule", "--file", path)
    assert again.exit_code == 1
    assert again.stdout == "scheduled 0 new, 3 already scheduled by dedupe key, 2 rejected\n"
    assert _rows(engine) == rows


def test_a_file_of_good_lines_exits_0_and_stdin_is_read_with_a_dash(db_url: str, engine: sa.Engine, cli: Cli) -> None:
    text = "\n".join(_line(stage=f"s{i}") for i in range(3))  # no newline after the last line
    result = CliRunner(env={"MARKETING_DATABASE_URL": db_url}).invoke(
        main, ["executions", "schedule", "--file", "-"], input=text.encode()
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "scheduled 3 new, 0 already scheduled by dedupe key, 0 rejected\n"
    assert [r["stage"] for r in _rows(engine)] == ["s0", "s1", "s2"]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "is not valid JSON: Expecting property name enclosed in double quotes at column 2"),
        ('[{"stage": "x"}]', "must be a JSON object, got list"),
        (_line(payload=[1]), "payload: Input should be a valid dictionary"),
        (_line()[:-1] + ', "payload": {"x": NaN}}', "is not valid JSON: NaN is not a JSON number"),
        (_line()[:-1] + ', "payload": {"x": -Infinity}}', "is not valid JSON: -Infinity is not a JSON number"),
        (_line()[:-1] + ', "payload": {"x": 1e400}}', "is not valid JSON: number 1e400 is out of range"),
        (json.dumps({"campaign": "spring-launch", "action": "log"}), "missing key 'stage'; missing key 'due'"),
        (_line(campaign_id="spring-launch"), "give campaign or campaign_id, not both"),
        (_line(stage=7), "stage: Input should be a valid string"),
        (_line(max_attempts=0), "max_attempts: Input should be greater than or equal to 1"),
        (_line(max_attempts=101), "max_attempts: Input should be less than or equal to 100"),
        (_line(max_attempts="3"), "max_attempts: Input should be a valid integer"),  # strict: no coercion
        (_line(max_attempts=True), "max_attempts: Input should be a valid integer"),
        (_line(due="2026-12-01T09:00:00"), "due time '2026-12-01T09:00:00' has no UTC offset"),
        (_line(due="soon"), "due time 'soon' is not ISO-8601"),
        (_line(action="fax"), "unknown action 'fax'; known actions: log, webhook"),
        (_line(action="webhook", payload={"url": "http://169.254.169.254/x"}), "cloud metadata"),
        (_line(stage="x" * 65), "must be 1-64 characters"),
        (_line(dedupe_key="k" * 201), "dedupe_key must be 1-200 characters, got 201"),
        # PostgreSQL cannot store NUL in text or JSON; each was a traceback there.
        (_line(stage="a\x00b"), "stage holds a NUL character"),
        (_line(payload={"message": "a\x00b"}), "payload holds a NUL character"),
        (_line(payload={"m": "x" * MAX_PAYLOAD_BYTES}), f"payload is larger than {MAX_PAYLOAD_BYTES} bytes"),
        (b"\xff" + _line().encode(), "is not UTF-8"),
        (_line(payload={"m": "x" * MAX_LINE_BYTES}), f"is longer than {MAX_LINE_BYTES // 1024} KiB"),
    ],
)
def test_a_bad_line_is_named_with_its_reason_and_schedules_nothing_of_itself(
    engine: sa.Engine, cli: Cli, tmp_path: Path, line: str | bytes, reason: str
) -> None:
    result = cli(
        "executions", "schedule", "--file", _write(tmp_path, _line(stage="before"), line, _line(stage="after"))
    )
    assert result.exit_code == 1
    [error] = result.stderr.splitlines()
    assert error.startswith("line 2: ") and reason in error, error
    assert result.stdout == "scheduled 2 new, 0 already scheduled by dedupe key, 1 rejected\n"
    assert [r["stage"] for r in _rows(engine)] == ["before", "after"]


def test_a_file_past_the_line_limit_schedules_nothing(engine: sa.Engine, cli: Cli, tmp_path: Path) -> None:
    result = cli("executions", "schedule", "--file", _write(tmp_path, *[_line()] * (MAX_FILE_LINES + 1)))
    assert result.exit_code == 1
    assert result.output == f"Error: file has more than {MAX_FILE_LINES} lines; split it (nothing was scheduled)\n"
    assert _rows(engine) == []


def test_an_endless_stream_without_newlines_stops_at_the_size_bound(engine: sa.Engine, db_url: str) -> None:
    """stdin from /dev/zero never ends and holds no newline: one endless line, refused at MAX_FILE_BYTES."""
    add_campaign(engine)
    env = {**os.environ, "MARKETING_DATABASE_URL": db_url}
    with open("/dev/zero", "rb") as zeros:
        # The timeout is the failure: reading past the bound would run until the test is killed.
        done = subprocess.run(
            [sys.executable, "-m", "marketing_pipelines.cli", "executions", "schedule", "--file", "-"],
            stdin=zeros,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    assert done.returncode == 1
    bound = MAX_FILE_BYTES // 2**20
    assert done.stderr == f"Error: file is larger than {bound} MiB; split it (nothing was scheduled)\n"
    assert _rows(engine) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--file", "{path}", "--stage", "x", "--dedupe-key", "k"],
            "--file cannot be combined with --stage, --dedupe-key",
        ),
        (["--stage", "x"], "Missing option --campaign, --action, --due (or give --file)"),
        (["--file", "{path}.missing"], "No such file or directory"),
    ],
)
def test_file_and_single_row_options_do_not_mix(
    engine: sa.Engine, cli: Cli, tmp_path: Path, args: list[str], message: str
) -> None:
    path = _write(tmp_path, _line())
    result = cli("executions", "schedule", *[a.format(path=path) for a in args])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert _rows(engine) == []
