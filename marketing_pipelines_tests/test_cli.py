"""The command line: happy paths and one clear error line for each kind of bad input."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import click
import pytest
import sqlalchemy as sa

from marketing_pipelines.cli import main
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines_tests.cli_runner import Cli, cli_for, invoke, run


@pytest.fixture
def fresh_db(tmp_path: Path) -> Path:
    return tmp_path / "cli.db"


@pytest.fixture
def cli(fresh_db: Path) -> Cli:
    return cli_for(f"sqlite:///{fresh_db}")


@pytest.fixture
def ready_db(fresh_db: Path, cli: Cli) -> Path:
    assert cli("db", "upgrade").exit_code == 0
    assert cli("campaigns", "add", "spring-launch", "--name", "Spring", "--owner", "ana").exit_code == 0
    return fresh_db


def test_commands_refuse_a_database_without_schema(fresh_db: Path, cli: Cli) -> None:
    import sqlite3

    sqlite3.connect(fresh_db).close()  # the file exists, its schema does not
    result = cli("executions", "list")
    assert result.exit_code == 1
    assert "has no schema yet: run `marketing-pipelines db upgrade`" in result.output
    assert "Traceback" not in result.output


def test_upgrade_then_current_reports_head(fresh_db: Path, cli: Cli) -> None:
    assert "schema at" in cli("db", "upgrade").output
    assert cli("db", "current").output.startswith("database: 0")


def test_schedule_and_list(ready_db: Path, cli: Cli) -> None:
    result = cli(
        "executions", "schedule", "--campaign", "spring-launch", "--stage", "launch", "--action", "log",
        "--due", "2026-01-01T09:00:00+01:00", "--payload", '{"message": "hi"}',
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    execution_id = int(result.stdout.strip())  # stderr notes the due time is past
    listed = json.loads(cli("executions", "list", "--json").output)
    assert [(r["id"], r["status"], r["due_at"]) for r in listed] == [
        (execution_id, "SCHEDULED", "2026-01-01 08:00:00+00:00")
    ]


def test_dedupe_key_returns_the_first_execution(ready_db: Path, cli: Cli) -> None:
    args = ["executions", "schedule", "--campaign", "spring-launch", "--stage", "s", "--action", "log"]
    first = cli(*args, "--due", "now", "--dedupe-key", "k1").output
    second = cli(*args, "--due", "now", "--dedupe-key", "k1").output
    assert first == second
    assert len(json.loads(cli("executions", "list", "--json").output)) == 1


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (["--campaign", "nope"], "unknown campaign 'nope'"),
        (["--due", "tomorrow-ish"], "due time 'tomorrow-ish' is not ISO-8601"),
        (["--due", "2026-01-01T09:00:00"], "has no UTC offset"),
        (["--payload", "{not json"], "payload is not valid JSON"),
        (["--payload", "[1, 2]"], "payload must be a JSON object"),
        (["--action", "fax"], "unknown action 'fax'; known actions: log, webhook"),
        (["--action", "webhook"], "webhook payload needs one of 'endpoint'"),
        # Each of these was a traceback (or, on SQLite, an accepted non-JSON payload).
        (["--due", "9999-12-31T23:59:59-05:00"], "is out of range in UTC"),
        (["--due", "0001-01-01T00:00:00+05:00"], "is out of range in UTC"),
        (["--max-attempts", "99999999999999999999"], "Invalid value for '--max-attempts'"),
        (["--max-attempts", "2147483648"], "is not in the range 1<=x<=100"),
        (["--payload", '{"x": NaN}'], "payload is not valid JSON: NaN is not a JSON number"),
        (["--payload", '{"x": -Infinity}'], "payload is not valid JSON: -Infinity is not a JSON number"),
        (["--action", "webhook", "--payload", '{"url": "http://169.254.169.254/"}'], "cloud metadata"),
    ],
)
def test_bad_schedule_input_is_named_and_nothing_is_written(
    ready_db: Path, cli: Cli, override: list[str], message: str
) -> None:
    options = {"--campaign": "spring-launch", "--stage": "launch", "--action": "log", "--due": "now"}
    options.update(dict(zip(override[::2], override[1::2], strict=True)))
    result = cli("executions", "schedule", *[x for kv in options.items() for x in kv])
    assert result.exit_code in (1, 2)  # 2: Click refused the option itself
    assert message in result.output and "Traceback" not in result.output
    assert json.loads(cli("executions", "list", "--json").output) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["executions", "list", "--limit", "99999999999999999999999"], "is not in the range 1<=x<=10000"),
        (["agents", "show", "99999999999999999999"], "is not in the range 1<=x<=9223372036854775807"),
        (["executions", "show", "0"], "is not in the range"),
        (["limits", "set", "openai", "--calls-per-minute", "nan"], "'nan' must be a finite number above 0"),
        (["limits", "set", "openai", "--calls-per-minute", "inf"], "'inf' must be a finite number above 0"),
        (["limits", "set", "openai", "--calls-per-minute", "1e308"], "'1e308' must be a finite number above 0"),
        (["limits", "set", "openai", "--calls-per-minute", "60", "--burst", "nan"], "'nan' must be a finite"),
        (
            ["agents", "request", "--agent", "campaign_brief", "--campaign", "spring-launch", "--as", "ana",
             "--max-run-seconds", "99999999999999999999"],
            "Invalid value for '--max-run-seconds'",
        ),
        (
            ["agents", "request", "--agent", "campaign_brief", "--campaign", "spring-launch", "--as", "ana",
             "--input", '{"stage": NaN}'],
            "--input is not valid JSON: NaN is not a JSON number",
        ),
    ],
)  # fmt: skip
def test_out_of_range_numbers_are_one_line_and_change_nothing(
    ready_db: Path, cli: Cli, args: list[str], message: str
) -> None:
    result = cli(*args)
    assert result.exit_code in (1, 2) and message in result.output and "Traceback" not in result.output
    limits = json.loads(cli("limits", "show", "--json").output.split("\nagent_runs pool")[0])
    calls = {row["provider"]: row["per_minute"] for row in limits if row["unit"] == "requests"}
    assert calls["openai"] == 60


def test_read_only_commands_never_create_a_database(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent" / "dir" / "x.db"
    run = cli_for(f"sqlite:///{missing}")
    for args in (["executions", "list"], ["db", "current"], ["agents", "list"], ["limits", "show"]):
        result = run(*args)
        assert result.exit_code == 1
        assert result.output.strip() == (
            f"Error: no SQLite database at {missing}: run `marketing-pipelines db upgrade` to create it"
        )
    assert not missing.parent.exists()
    assert run("db", "upgrade").exit_code == 0 and missing.exists()  # the one command that creates it


def test_bad_campaign_and_duplicate(ready_db: Path, cli: Cli) -> None:
    dup = cli("campaigns", "add", "spring-launch", "--name", "x", "--owner", "y")
    assert dup.exit_code == 1 and "already exists" in dup.output
    bad = cli("campaigns", "add", "Bad Id", "--name", "x", "--owner", "y")
    assert bad.exit_code == 1 and "'Bad Id' must be" in bad.output
    repo = cli("campaigns", "add", "ok", "--name", "x", "--owner", "y", "--github-repo", "nope")
    assert repo.exit_code == 1 and "owner/name" in repo.output


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--pypi-package", "bad name", "is not a PyPI project name"),
        ("--pypi-package", "-leading", "is not a PyPI project name"),
        ("--pypi-package", "x" * 215, "is not a PyPI project name"),
        ("--npm-package", "Upper", "is not an npm package name"),
        ("--npm-package", "@scope/a/b", "is not an npm package name"),
        ("--npm-package", "a" * 215, "is not an npm package name"),
        ("--npm-package", "=HYPERLINK(x)", "is not an npm package name"),
    ],
)
def test_a_campaigns_package_names_are_checked_in_one_line(
    ready_db: Path, cli: Cli, option: str, value: str, says: str
) -> None:
    bad = cli("campaigns", "add", "pkg", "--name", "x", "--owner", "y", option, value)
    assert bad.exit_code == 1 and says in bad.output and len(bad.output.strip().splitlines()) == 1


def test_a_campaign_maps_its_packages(ready_db: Path, cli: Cli) -> None:
    added = cli(
        "campaigns",
        "add",
        "pkg",
        "--name",
        "x",
        "--owner",
        "y",
        "--pypi-package",
        "dagster-postgres",
        "--npm-package",
        "@acme/widget",
    )
    assert added.exit_code == 0, added.output
    [listed] = [c for c in json.loads(cli("campaigns", "list", "--json").output) if c["id"] == "pkg"]
    assert (listed["pypi_package"], listed["npm_package"]) == ("dagster-postgres", "@acme/widget")


def test_unreachable_postgres_is_one_clear_line() -> None:
    run = cli_for("postgresql://nobody@127.0.0.1:1/nothing")
    result = run("db", "upgrade")
    assert result.exit_code == 1
    assert "cannot connect to postgresql+psycopg2://nobody@127.0.0.1:1/nothing" in result.output
    assert "Traceback" not in result.output


def test_a_role_without_the_rights_gets_one_line_naming_what_was_refused(pg_url: str) -> None:
    # Deployed, the CLI connects as an application role (deploy/provision.sh). One that lacks a right
    # (here: any right at all on the tables) gets PostgreSQL's reason in one line, not a traceback.
    role = f"mp_norights_{uuid.uuid4().hex[:8]}"
    admin = get_engine(pg_url)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE ROLE "{role}" LOGIN'))
    try:
        url = sa.engine.make_url(pg_url).set(username=role, password=None).render_as_string(hide_password=False)
        result = cli_for(url)("executions", "list")
        assert result.exit_code == 1, result.output
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
        assert "the database refused this command: permission denied for table" in result.output
        assert "deploy/provision.sh" in result.output
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP ROLE "{role}"'))


@pytest.mark.parametrize(
    ("env", "value", "message"),
    [
        (
            "MARKETING_SENSOR_BATCH_SIZE",
            "0",
            "MARKETING_SENSOR_BATCH_SIZE='0' is not valid: must be between 1 and 10000",
        ),
        (
            "MARKETING_EXECUTIONS_PER_RUN",
            "5000",
            "MARKETING_EXECUTIONS_PER_RUN='5000' is not valid: must be between 1 and 1000",
        ),
        (
            "MARKETING_RETRY_BACKOFF_SECONDS",
            "nan",
            "MARKETING_RETRY_BACKOFF_SECONDS='nan' is not valid: must be between",
        ),
        ("MARKETING_WEBHOOK_ALLOW_NETWORKS", "10.0.0.0/8,nope", "'nope' is not an IP network"),
        ("MARKETING_MODEL_PROVIDER", "gpt", "MARKETING_MODEL_PROVIDER='gpt' is not valid: is not a provider"),
        ("MARKETING_MEASUREMENT_START_DATE", "2026-02-30", "MARKETING_MEASUREMENT_START_DATE='2026-02-30'"),
        ("MARKETING_DATABASE_URL", "mysql://x/y", "unsupported database 'mysql'"),
        ("MARKETING_DATABASE_URL", "::::", "is not a database URL"),
    ],
)
def test_bad_settings_are_named(env: str, value: str, message: str) -> None:
    result = invoke({env: value}, "db", "current")
    assert result.exit_code == 1 and message in result.output


def test_every_command_has_help_with_an_example() -> None:
    def walk(group, path):  # type: ignore[no-untyped-def]
        ctx = click.Context(group)
        for name in group.list_commands(ctx):  # the root group loads its commands when asked
            command = group.get_command(ctx, name)
            yield [*path, name], command
            if hasattr(command, "commands"):
                yield from walk(command, [*path, name])

    for path, command in walk(main, []):
        if hasattr(command, "commands"):
            continue
        text = run(*path, "--help").output
        assert "Example" in text, f"`{' '.join(path)} --help` has no example"


def test_executions_show_prints_each_attempt_with_its_run_and_the_last_error(ready_db: Path) -> None:
    import dagster as dg

    from marketing_pipelines.executions.resources import ExecutionSettings
    from marketing_pipelines_tests.built import due_executions_sensor
    from marketing_pipelines_tests.executions.runs import perform, sensor_requests

    url = f"sqlite:///{ready_db}"
    cli = cli_for(url, MARKETING_WEBHOOK_ALLOW_NETWORKS="127.0.0.1/32")
    no_backoff = ExecutionSettings(retry_backoff_seconds=0)
    # Nothing listens on port 9 of 127.0.0.1: each attempt fails with "unreachable".
    payload = '{"url": "http://127.0.0.1:9/hook"}'
    args = ["executions", "schedule", "--campaign", "spring-launch", "--stage", "launch", "--action", "webhook"]
    execution_id = int(cli(*args, "--due", "now", "--payload", payload, "--max-attempts", "2").output)
    run_ids = []
    with dg.instance_for_test() as instance:
        for _ in range(2):
            [request] = sensor_requests(due_executions_sensor, url, instance, no_backoff)
            run_ids.append(perform(request, url, instance, settings=no_backoff).run_id)
    shown = cli("executions", "show", str(execution_id))
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert any(line.split() == ["status:", "FAILED"] for line in lines)
    # The URL's scheme and host only: a path may be the secret (a Slack webhook's is).
    assert any(line.strip().startswith("last_error: webhook http://127.0.0.1:9") for line in lines)
    assert "/hook" not in shown.output
    assert "marketing/execution_id" not in shown.output  # no run tag per execution any more
    attempt_lines = [line.split() for line in lines if line.split()[:1] in (["1"], ["2"])]
    assert [(cells[0], cells[1], cells[4]) for cells in attempt_lines] == [
        ("1", run_ids[0], "RESCHEDULED"),
        ("2", run_ids[1], "FAILED"),
    ]
    as_json = json.loads(cli("executions", "show", str(execution_id), "--json").output)
    assert [a["run_id"] for a in as_json["attempts"]] == run_ids


def test_executions_show_of_an_unknown_id_is_one_line(ready_db: Path, cli: Cli) -> None:
    result = cli("executions", "show", "999")
    assert result.exit_code == 1
    assert result.output.strip() == "Error: execution 999 does not exist; see marketing-pipelines executions list"


def test_limits_show_rounds_and_report_names_days_outside_the_partitions(ready_db: Path, cli: Cli) -> None:
    from marketing_pipelines.db import token_bucket
    from marketing_pipelines.db.engine import get_engine

    cli("limits", "show")  # creates the buckets
    with get_engine(f"sqlite:///{ready_db}").begin() as conn:
        assert token_bucket.try_acquire(conn, "openai")  # leaves a refilling fraction, e.g. 59.0058...
    listed = json.loads(cli("limits", "show", "--json").output.split("\nagent_runs pool")[0])
    openai = next(row for row in listed if row["provider"] == "openai")
    assert 59 <= openai["available"] <= 60 and round(openai["available"], 2) == openai["available"]
    result = cli("report", "--campaign", "spring-launch", "--from", "2025-01-01", "--to", "2025-01-31")
    assert result.exit_code == 0
    assert "note: days before 2026-01-01 are outside the measurement partitions" in result.output


def test_limits_show_reads_the_bucket_as_it_is_now_not_as_last_written(ready_db: Path, cli: Cli) -> None:
    from marketing_pipelines.db import token_bucket
    from marketing_pipelines.db.engine import get_engine

    assert cli("limits", "set", "offline", "--calls-per-minute", "60", "--burst", "3").exit_code == 0
    with get_engine(f"sqlite:///{ready_db}").begin() as conn:
        assert token_bucket.try_acquire(conn, "offline", 3)  # stored: 0 left
    time.sleep(1.5)  # one call a second refills; nothing is written meanwhile
    listed = json.loads(cli("limits", "show", "--json").output)
    offline = next(row for row in listed if row["provider"] == "offline")
    # The old `limits show` printed the stored 0 until the next call wrote the refill.
    assert offline["available"] >= 1.0


def test_loading_the_definitions_prints_no_beta_warning_about_sensor_owners() -> None:
    import subprocess
    import sys

    code = "import marketing_pipelines.definitions as d; d.defs().get_repository_def()"
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "owners" not in done.stderr


def test_ui_gives_its_dagster_dev_its_own_url_for_run_links_and_says_how_to_export_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    started: list[tuple[list[str], dict[str, str]]] = []

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        # dagster dev would replace the test process: record what it would have started with, and where.
        started.append((argv, {**env, "cwd": os.getcwd()}))
        raise SystemExit(0)

    monkeypatch.setattr(os, "execve", execve)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dagster.yaml").write_text("telemetry: {enabled: false}\n")  # as in the repository's root
    result = invoke({"MARKETING_DATABASE_URL": f"sqlite:///{tmp_path / 'ui.db'}"}, "ui", "--port", "3111")
    assert result.exit_code == 0, result.output
    [(argv, env)] = started
    assert argv[-2:] == ["-p", "3111"] and env["MARKETING_DAGSTER_UI_URL"] == "http://127.0.0.1:3111"
    assert "export MARKETING_DAGSTER_UI_URL=http://127.0.0.1:3111" in result.stderr
    # Started from its instance's folder, so another dagster.yaml where the user stands draws no warning.
    assert env["cwd"] == env["DAGSTER_HOME"]
    assert env["MARKETING_DATABASE_URL"] == f"sqlite:///{tmp_path / 'ui.db'}"


def _analysts_example_range() -> tuple[str, str]:
    """The partition range docs/ANALYSTS.md's "Backfills in the UI" tells an analyst to select."""
    import re

    text = (Path(__file__).parents[1] / "docs" / "ANALYSTS.md").read_text()
    section = text[text.index("## Backfills in the UI") :]
    found = re.search(r"\(for example (\d{4}-\d{2}-\d{2}) to\s+(\d{4}-\d{2}-\d{2})\)", section)
    assert found is not None, "ANALYSTS.md's backfill example names no range"
    return found[1], found[2]


@pytest.mark.parametrize("chosen", [None, "2026-02-01"])
def test_the_partitions_start_at_the_setting_whatever_ran_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chosen: str | None
) -> None:
    import os
    from datetime import UTC, datetime

    import dagster as dg

    from marketing_pipelines.db.migrate import upgrade
    from marketing_pipelines.definitions import build_defs
    from marketing_pipelines.local_dagster import local_environment
    from marketing_pipelines.measurement.events.write import record_events
    from marketing_pipelines.settings import load_settings
    from marketing_pipelines_tests.factories import add_campaign

    db_url = f"sqlite:///{tmp_path / 'ui.db'}"
    started: list[dict[str, str]] = []

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        started.append(env)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execve", execve)
    monkeypatch.chdir(tmp_path)
    env = {"MARKETING_DATABASE_URL": db_url, "MARKETING_MEASUREMENT_START_DATE": chosen or ""}
    # `ui` before the database exists, then after the demo's events are in it (they start on 2026-11-29).
    assert invoke(env, "ui").exit_code == 0
    engine = get_engine(db_url)
    upgrade(engine)
    add_campaign(engine)
    event = {"campaign_id": "spring-launch", "stage": "awareness", "event_type": "page_view", "actor_id": "a"}
    with engine.begin() as conn:
        for n, day in enumerate((29, 30)):
            occurred = datetime(2026, 11, day, 23, 30, tzinfo=UTC).isoformat()
            record_events(conn, [{**event, "event_id": f"e{n}", "occurred_at": occurred}])
    assert invoke(env, "ui").exit_code == 0
    # The demo's code server gets the variable as the demo's shell had it, whatever the database holds.
    chosen_start = {"measurement_start_date": chosen} if chosen else {}
    demo = local_environment(load_settings(database_url=db_url, **chosen_start), tmp_path)
    assert demo.get("MARKETING_MEASUREMENT_START_DATE") == os.environ.get("MARKETING_MEASUREMENT_START_DATE")
    first, last = _analysts_example_range()
    firsts = set()
    for started_env in started:
        start = started_env.get("MARKETING_MEASUREMENT_START_DATE")
        settings = load_settings(database_url=db_url, **({"measurement_start_date": start} if start else {}))
        rollup = build_defs(settings).resolve_assets_def(dg.AssetKey("measurement_daily_rollup"))
        assert rollup.partitions_def is not None
        firsts.add(rollup.partitions_def.get_first_partition_key())
        keys = rollup.partitions_def.get_partition_keys()
        assert first in keys and last in keys, (first, last, keys[0])
    assert firsts == {chosen or "2026-01-01"}
