"""Input that used to crash is refused in one line naming what was wrong, and costs nothing already accepted.

Issue 44, items 8 (text that is not valid UTF-8 or holds a lone surrogate), 9 (days at the ends of the
calendar), 10 (a connection lost mid-command, a named pipe, 64 MiB of blank lines, user info in a raw
webhook URL) and 13 (usage errors, the local receiver's address, examples that name files, a past due time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result

from marketing_pipelines.agents import users
from marketing_pipelines.agents.catalog import get_agent
from marketing_pipelines.agents.queue import Transcript, get_agent_run, request_agent_run, transcript
from marketing_pipelines.agents.runner import CallsGate, RunLimits, run_agent_loop
from marketing_pipelines.cli import main
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import agent_run, campaign, marketing_execution
from marketing_pipelines.egress import EgressPolicy
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.executions.queue import MAX_FILE_BYTES
from marketing_pipelines.strict_json import parse_json_object, without_lone_surrogates
from marketing_pipelines_tests.agents.fake_models import Script, openai_completion, scripted_openai
from marketing_pipelines_tests.cli_runner import Cli, cli_for
from marketing_pipelines_tests.factories import add_campaign, replace_rollup_day, settings_from
from marketing_pipelines_tests.measurement.generated import DAYS, generated_events, seed
from marketing_pipelines_tests.test_doc_recipes import newcomer_environment
from marketing_pipelines_tests.test_help_examples import BASE, WITH_EXAMPLES

SCHEDULE = ("executions", "schedule", "--campaign", "spring-launch", "--stage", "launch")
README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture
def cli(db_url: str) -> Cli:
    add_campaign(get_engine(db_url), "spring-launch")
    return cli_for(db_url)


def one_line_error(result: Result) -> str:
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


def executions(url: str) -> list[dict]:
    with get_engine(url).connect() as conn:
        return [dict(r) for r in conn.execute(sa.select(marketing_execution)).mappings()]


# --- item 8: text that is not valid UTF-8, lone surrogates ---------------------------------------------------


@pytest.mark.parametrize(
    ("args", "option"),
    [
        # Python reads the byte 0xff of a command line as U+DCFF.
        (("campaigns", "add", "autumn", "--name", "Au\udcfftumn", "--owner", "ana"), "'--name'"),
        ((*SCHEDULE[:5], "\udcff", "--action", "log", "--due", "now"), "'--stage'"),
        (
            ("executions", "schedule", "--campaign", "\udcff", "--stage", "s", "--action", "log", "--due", "now"),
            "'--campaign'",
        ),
        (("executions", "list", "--campaign", "\udcff"), "'--campaign'"),
        (("report", "--campaign", "spring-launch", "--from", "\udcff"), "'--from'"),
    ],
)
def test_arguments_that_are_not_utf8_are_refused_in_one_line_naming_the_option(
    cli: Cli, db_url: str, args: tuple[str, ...], option: str
) -> None:
    result = cli(*args)
    line = one_line_error(result)
    assert result.exit_code == 2
    assert f"Invalid value for {option}" in line and "\\xff" in line
    assert executions(db_url) == []
    with get_engine(db_url).connect() as conn:
        assert conn.execute(sa.select(campaign.c.id)).scalars().all() == ["spring-launch"]


@pytest.mark.parametrize(
    "args",
    [
        (*SCHEDULE, "--action", "log", "--due", "now", "--payload", '{"message": "\\ud800"}'),
        (*SCHEDULE, "--action", "log", "--due", "now", "--payload", '{"\\udfff": 1}'),
        (*SCHEDULE, "--action", "log", "--due", "now", "--dedupe-key", "k\udcff"),
    ],
)
def test_a_lone_surrogate_escaped_in_json_is_refused_before_any_write(
    cli: Cli, db_url: str, args: tuple[str, ...]
) -> None:
    # PostgreSQL's jsonb refused "\ud800" with a DataError traceback; SQLite stored it for later crashes.
    result = cli(*args)
    assert result.exit_code in (1, 2)
    line = one_line_error(result)
    assert "\\ud800" in line or "\\udfff" in line or "\\xff" in line
    assert executions(db_url) == []


def test_an_agent_input_with_a_lone_surrogate_is_refused(cli: Cli, db_url: str) -> None:
    with get_engine(db_url).begin() as conn:
        users.add_user(conn, "ana")
        users.grant(conn, "ana", "campaign:read")
    args = ("agents", "request", "--agent", "campaign_brief", "--campaign", "spring-launch", "--as", "ana")
    result = cli(*args, "--input", '{"stage": "\\ud800"}')
    assert result.exit_code == 1
    assert one_line_error(result) == (
        "Error: --input holds text that is not valid Unicode (a lone surrogate): '\\ud800'"
    )
    assert cli(*args, "--input", '{"stage": "launch"}').exit_code == 0


def test_a_python_callers_agent_input_with_a_lone_surrogate_is_refused_before_any_write(engine: sa.Engine) -> None:
    # On PostgreSQL the insert itself failed (DataError) before; now both databases refuse it in one line.
    add_campaign(engine)
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        users.grant(conn, "ana", "campaign:read")
    with engine.begin() as conn, pytest.raises(InvalidInput, match=r"^input holds text that is not valid Unicode"):
        request_agent_run(
            conn,
            agent="campaign_brief",
            campaign_id="spring-launch",
            requested_by="ana",
            input={"stage": "launch \ud800"},
            settings=settings_from({}),
        )
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(agent_run)).scalar_one() == 0


def test_a_schedule_file_line_with_a_lone_surrogate_costs_only_itself(cli: Cli, db_url: str, tmp_path: Path) -> None:
    good = {"campaign": "spring-launch", "stage": "launch", "action": "log", "due": "now"}
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "\n".join(
            [
                json.dumps(good),
                json.dumps({**good, "stage": "\udcff"}),  # json.dumps writes it as the escape "\udcff"
                json.dumps({**good, "payload": {"message": "\ud800"}}),
                json.dumps({**good, "campaign": "\ud800"}),
                json.dumps({**good, "stage": "follow-up"}),
            ]
        )
    )
    result = cli("executions", "schedule", "--file", str(rows))
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "line 2: stage holds text that is not valid Unicode (a lone surrogate): '\\udcff'",
        "line 3: payload holds text that is not valid Unicode (a lone surrogate): '\\ud800'",
        "line 4: campaign holds text that is not valid Unicode (a lone surrogate): '\\ud800'",
    ]
    assert sorted(r["stage"] for r in executions(db_url)) == ["follow-up", "launch"]


def test_a_lone_surrogate_stored_before_is_shown_escaped(sqlite_url: str) -> None:
    # SQLite kept what older versions let in; showing it must not stop the command.
    engine = get_engine(sqlite_url)
    add_campaign(engine, "spring-launch")
    now = datetime.now(UTC)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(marketing_execution).values(
                campaign_id="spring-launch", stage="launch", action="log", payload={"message": "\ud800"},
                due_at=now, status="SCHEDULED", attempts=0, max_attempts=3, created_at=now, updated_at=now,
            )
        )  # fmt: skip
    result = cli_for(sqlite_url)("executions", "show", "1")
    assert result.exit_code == 0
    assert '"message": "\\ud800"' in result.stdout


def test_a_model_reply_can_be_kept_without_its_lone_surrogates() -> None:
    # What the agent loop would store of a model's reply (docs/OPERATIONS.md, "Security").
    assert without_lone_surrogates({"te\udcffxt": ["a\ud800", 1, None]}) == {"te\ufffdxt": ["a\ufffd", 1, None]}
    with pytest.raises(InvalidInput, match=r"^--input holds text that is not valid Unicode"):
        parse_json_object('{"a": {"b": ["\\ud800"]}}', "--input")
    # A pair escaped in JSON is one character, not a lone surrogate.
    assert parse_json_object('{"a": "\\ud83d\\ude00"}', "--input") == {"a": "\U0001f600"}


# --- item 9: days at the ends of the calendar ---------------------------------------------------------------


@pytest.fixture
def rolled_up(db_url: str) -> str:
    engine = get_engine(db_url)
    seed(engine, generated_events(per_day=30))
    for day in DAYS:
        replace_rollup_day(engine, day)
    return db_url


@pytest.mark.parametrize(
    ("bounds", "has_rows"),
    [
        (("--to", "0001-01-01"), False),
        (("--from", "9999-12-31"), False),
        (("--from", "0001-01-01", "--to", "0001-01-03"), False),  # no week ends before 0001-01-07
        (("--from", "9999-12-28", "--to", "9999-12-31"), False),  # nor starts after 9999-12-27
        (("--from", "0001-01-01", "--to", "9999-12-31"), True),
    ],
)
def test_a_report_reaches_the_ends_of_the_calendar(rolled_up: str, bounds: tuple[str, ...], has_rows: bool) -> None:
    cli = cli_for(rolled_up)
    whole = json.loads(cli("report", "--campaign", "alpha", "--format", "json").stdout)
    result = cli("report", "--campaign", "alpha", *bounds, "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["totals"], report["funnel"]) == ((whole["totals"], whole["funnel"]) if has_rows else ([], []))


def test_an_agents_read_measurement_at_9999_12_31_answers_the_model(db_url: str) -> None:
    engine = get_engine(db_url)
    add_campaign(engine, "spring-launch")
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        for permission in ("campaign:read", "measurement:read"):
            users.grant(conn, "ana", permission)
        run_id = request_agent_run(
            conn, agent="campaign_brief", campaign_id="spring-launch", requested_by="ana", input={"stage": "launch"},
            provider="openai", settings=settings_from({"OPENAI_API_KEY": "sk-openai-test"}),
        )  # fmt: skip
        row = get_agent_run(conn, run_id)
    assert row is not None
    arguments = json.dumps({"campaign_id": "spring-launch", "from": "9999-12-31", "to": "9999-12-31"})
    call = {"id": "call_1", "type": "function", "function": {"name": "read_measurement", "arguments": arguments}}
    script = Script(
        httpx.Response(
            200,
            json=openai_completion(
                {"role": "assistant", "content": None, "refusal": None, "tool_calls": [call]},
                finish_reason="tool_calls",
            ),
        ),
        httpx.Response(200, json=openai_completion({"role": "assistant", "content": "Done.", "refusal": None})),
    )
    run_agent_loop(
        engine=engine,
        definition=get_agent("campaign_brief"),
        run=row,
        provider=scripted_openai(script),
        transcript=Transcript(engine, run_id, 1),
        limits=RunLimits(max_steps=4, deadline=time.monotonic() + 60),
        gate=CallsGate(lambda: None),
        egress=EgressPolicy(),
    )
    with engine.connect() as conn:
        steps = [dict(s) for s in transcript(conn, run_id)]
    [result] = [s for s in steps if s["kind"] == "tool_result"]
    assert result["content"]["result"]["status"] == "no measurement yet"
    assert not [s for s in steps if s["kind"] == "tool_error"]


# --- item 10: a connection lost mid-command, pipes, blank lines, user info -----------------------------------


def test_a_connection_lost_mid_command_is_one_line_and_writes_nothing(pg_url: str) -> None:
    add_campaign(get_engine(pg_url), "spring-launch")
    cli_for(pg_url)(*SCHEDULE, "--action", "log", "--due", "now")  # accepted before: must stay
    name = f"hostile-{os.getpid()}"
    url = sa.engine.make_url(pg_url).update_query_dict({"application_name": name}).render_as_string(False)
    admin = sa.create_engine(get_engine(pg_url).url, isolation_level="AUTOCOMMIT")
    with get_engine(pg_url).connect() as locker:
        locker.execute(sa.text("LOCK TABLE marketing_execution IN ACCESS EXCLUSIVE MODE"))
        command = subprocess.Popen(
            [sys.executable, "-m", "marketing_pipelines.cli", *SCHEDULE, "--action", "log", "--due", "now"],
            env={**os.environ, "MARKETING_DATABASE_URL": url},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        waiting = "SELECT pid FROM pg_stat_activity WHERE application_name = :name AND wait_event_type = 'Lock'"
        with admin.connect() as conn:
            deadline = time.monotonic() + 30
            while not (pids := conn.execute(sa.text(waiting), {"name": name}).scalars().all()):
                assert time.monotonic() < deadline and command.poll() is None, command.communicate()
                time.sleep(0.1)
            # What a server restart does to each session (pg_ctl restart -m fast): terminated.
            conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pids[0]})
        out, err = command.communicate(timeout=30)
        locker.rollback()
    admin.dispose()
    assert command.returncode == 1 and out == ""
    # The driver's first line: "server closed the connection unexpectedly" or "terminating connection ...".
    [line] = err.splitlines()
    assert line.startswith("Error: the database failed during this command: ") and "connection" in line
    assert line.endswith(
        ". What it had not committed was rolled back; run it again once the database answers (MARKETING_DATABASE_URL)."
    )
    assert len(executions(pg_url)) == 1


def test_a_named_pipe_as_the_schedule_file_is_refused_at_once(sqlite_url: str, tmp_path: Path) -> None:
    add_campaign(get_engine(sqlite_url), "spring-launch")
    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    command = [sys.executable, "-m", "marketing_pipelines.cli", "executions", "schedule", "--file", str(fifo)]
    # Opening a pipe for reading waits for a writer: before, the command never returned.
    done = subprocess.run(
        command, env={**os.environ, "MARKETING_DATABASE_URL": sqlite_url}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(
        f"Error: Invalid value for '--file': '{fifo}' is not a regular file (a named pipe or a device); give a "
        "file, or pipe the rows to --file -; see '"
    )


def test_64_mib_of_blank_lines_are_read_in_seconds(sqlite_url: str, tmp_path: Path) -> None:
    add_campaign(get_engine(sqlite_url), "spring-launch")
    cli = cli_for(sqlite_url)
    line = b'{"campaign": "spring-launch", "stage": "launch", "action": "log", "due": "now"}'
    rows = tmp_path / "rows.jsonl"
    blank = MAX_FILE_BYTES - len(line) - 4
    rows.write_bytes(b"\n" * (blank // 2) + b" \n\t" + b"\n" * (blank - blank // 2) + line)
    started = time.monotonic()
    scheduled = cli("executions", "schedule", "--file", str(rows))
    assert scheduled.exit_code == 0, scheduled.output
    with rows.open("ab") as more:
        more.write(b"\n" * 2)  # one byte past the limit
    refused = cli("executions", "schedule", "--file", str(rows))
    on_stdin = CliRunner(env={"MARKETING_DATABASE_URL": sqlite_url}).invoke(
        main, ["executions", "schedule", "--file", "-"], input=rows.read_bytes(), catch_exceptions=False
    )
    elapsed = time.monotonic() - started
    assert scheduled.stdout == "scheduled 1 new, 0 already scheduled by dedupe key, 0 rejected\n"
    for result in (refused, on_stdin):
        assert result.exit_code == 1
        assert one_line_error(result) == "Error: file is larger than 64 MiB; split it (nothing was scheduled)"
    assert len(executions(sqlite_url)) == 1
    assert elapsed < 30, f"{elapsed:.1f} s"  # 103 s for the refusal alone, a line at a time


def test_a_line_number_counts_blank_lines(sqlite_url: str, tmp_path: Path) -> None:
    add_campaign(get_engine(sqlite_url), "spring-launch")
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(b'\n \n{"campaign": "spring-launch"}\r\n\n\n{"x": 1}' + b"\n" * 3 + b"[" + b" " * 200_000)
    result = cli_for(sqlite_url)("executions", "schedule", "--file", str(rows))
    assert result.stderr.splitlines() == [
        "line 3: missing key 'stage'; missing key 'action'; missing key 'due'",
        "line 6: missing key 'campaign'; missing key 'stage'; missing key 'action'",
        "line 9: is longer than 128 KiB",
    ]


@pytest.mark.parametrize("url", ["https://ana:pw-4242@hooks.example.com/launch", "https://token@hooks.example.com/"])
def test_a_raw_webhook_url_with_user_info_is_refused_when_scheduled(
    cli: Cli, db_url: str, tmp_path: Path, url: str
) -> None:
    payload = json.dumps({"url": url, "body": {"text": "We launched"}})
    result = cli(*SCHEDULE, "--action", "webhook", "--due", "now", "--payload", payload)
    assert result.exit_code == 1
    assert one_line_error(result) == (
        "Error: webhook 'url' https://hooks.example.com holds user info (user:password@), which deliveries never "
        "send; put the credential in the URL's path or query, or in a header of the payload"
    )
    rows = tmp_path / "rows.jsonl"
    line = {"campaign": "spring-launch", "stage": "launch", "action": "webhook", "due": "now"}
    rows.write_text(json.dumps({**line, "payload": {"url": url}}) + "\n")
    assert cli("executions", "schedule", "--file", str(rows)).exit_code == 1
    assert executions(db_url) == []


# --- item 13: usage errors, the local receiver, examples, a past due time ------------------------------------


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("executions", "schedule", "--campaign", "spring-launch"), "Missing option --stage, --action, --due"),
        (("executions", "list", "--status", "LOST"), "Invalid value for '--status'"),
        (("executions", "retry", "1", "--max-attempts", "many"), "Invalid value for '--max-attempts'"),
        (("executions", "cancel", "0"), "Invalid value for 'EXECUTION_ID'"),
        (("executions", "schedule", "--file", "missing.jsonl"), "Invalid value for '--file'"),
        (("executions", "launch"), "No such command 'launch'"),
        (("campaigns", "add", "autumn"), "Missing option '--name'"),
        (("report",), "Missing option '--campaign'"),
        (("--verbose",), "No such option '--verbose'"),
        (("report", "--campaign", "x", "--format", "xml\x1b[2J"), "'xml\\x1b[2J' is not one of"),
    ],
)
def test_a_usage_error_is_one_line(sqlite_url: str, args: tuple[str, ...], named: str) -> None:
    result = cli_for(sqlite_url)(*args)
    assert result.exit_code == 2
    line = one_line_error(result)
    assert named in line and line.endswith("--help'"), line


def test_help_still_shows_for_a_group_without_a_command() -> None:
    result = CliRunner().invoke(main, ["executions"])
    assert result.exit_code == 2 and "Commands:" in result.output


def _embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str, **env: str | None) -> Result:
    """The command as a newcomer runs it: the embedded database under the current folder, no MARKETING_* set."""
    monkeypatch.chdir(tmp_path)
    unset = dict.fromkeys(k for k in os.environ if k.startswith("MARKETING_"))
    return CliRunner(env={**unset, **env}).invoke(main, list(args), catch_exceptions=False)


def test_the_command_line_on_the_embedded_database_allows_the_local_uis_receiver_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _embedded(tmp_path, monkeypatch, "db", "upgrade").exit_code == 0
    assert (
        _embedded(tmp_path, monkeypatch, "campaigns", "add", "spring-launch", "--name", "S", "--owner", "a").exit_code
        == 0
    )
    webhook = (*SCHEDULE, "--action", "webhook", "--due", "now", "--payload")
    to_receiver = json.dumps({"url": "http://127.0.0.2:8123/hook"})
    assert _embedded(tmp_path, monkeypatch, *webhook, to_receiver).stdout == "1\n"
    # Not the UI itself on 127.0.0.1, nor any other loopback address.
    for url in ("http://127.0.0.1:3000/graphql", "http://127.0.0.3/"):
        refused = _embedded(tmp_path, monkeypatch, *webhook, json.dumps({"url": url}))
        assert refused.exit_code == 1 and "MARKETING_WEBHOOK_ALLOW_NETWORKS" in one_line_error(refused)
    # A deployment's database: its own setting decides, as its runs' does.
    named = {"MARKETING_DATABASE_URL": f"sqlite:///{tmp_path / '.marketing' / 'marketing.db'}"}
    assert _embedded(tmp_path, monkeypatch, *webhook, to_receiver, **named).exit_code == 1
    allowed = {**named, "MARKETING_WEBHOOK_ALLOW_NETWORKS": "127.0.0.2/32"}
    assert _embedded(tmp_path, monkeypatch, *webhook, to_receiver, **allowed).stdout == "2\n"


@pytest.mark.parametrize("name", ["executions schedule", "events load"])
def test_help_examples_that_name_files_run_in_a_fresh_folder(name: str, tmp_path: Path) -> None:
    # BASE alone: no file made for the example beforehand (test_help_examples.py's SETUP makes them).
    shown = "\n".join(WITH_EXAMPLES[name])
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", BASE + shown + "\n"],
        cwd=tmp_path,
        env=newcomer_environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{shown}\n{done.stdout}\n{done.stderr}"


def test_a_due_time_in_the_past_is_accepted_with_a_note(cli: Cli, db_url: str) -> None:
    due = (datetime.now(UTC) - timedelta(days=6, hours=1)).isoformat(timespec="seconds")
    result = cli(*SCHEDULE, "--action", "log", "--due", due)
    assert result.exit_code == 0
    assert result.stdout == "1\n"
    assert result.stderr == f"note: --due {due} is 6 days in the past: the execution is due now\n"
    assert cli(*SCHEDULE, "--action", "log", "--due", "now").stderr == ""
    future = (datetime.now(UTC) + timedelta(minutes=5)).isoformat()
    assert cli(*SCHEDULE, "--action", "log", "--due", future).stderr == ""


def test_the_readmes_due_times_are_in_the_future() -> None:
    text = README.read_text(encoding="utf-8")
    dues = [word.split()[0] for word in text.split("--due ")[1:]]
    assert dues and all(datetime.fromisoformat(d) > datetime.now(UTC) for d in dues if d != "now"), dues
