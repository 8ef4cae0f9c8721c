"""Hostile text is inert wherever a person reads it: CLI tables, shown fields, error lines and the report's CSV.

Values carrying ESC, an OSC 52 clipboard write, the C1 CSI and a bidi override are stored through the CLI or the
package's own functions, on both databases; every table then shows them escaped, every CSV cell a spreadsheet
would evaluate starts with ``'``, and ``--json`` round-trips them unchanged (json.dumps escapes them itself).
"""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import date
from pathlib import Path

import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.agents.queue import cancel_agent_run
from marketing_pipelines.executions.queue import EXECUTIONS, cancel_execution, start_attempts
from marketing_pipelines.leasing.lease import claim_batch
from marketing_pipelines.measurement.report.model import DailyPoint, FunnelStep, MeasurementReport, RangeTotal
from marketing_pipelines.measurement.report.rendering import render
from marketing_pipelines.redact import spreadsheet_safe, visible_controls
from marketing_pipelines_tests.cli_runner import Cli, cli_for
from marketing_pipelines_tests.factories import replace_rollup_day

# The test's own list, not redact.CONTROL_CHARACTERS: C0 but tab and newline, DEL, C1, LRM/RLM, bidi overrides.
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")

ESC = "\x1b[2J"  # erases the screen
OSC52 = "\x1b]52;c;b3duZWQ=\x07"  # writes "owned" to the reader's clipboard
C1_CSI = "\x9b31m"  # the 8-bit form of ESC [
BIDI = "\u202etxt.exe"  # shows what follows reversed
# Short enough that a table's 60-character cut keeps every part of it.
HOSTILE = f"=1+1 {ESC} {OSC52} {C1_CSI} {BIDI}"
HOSTILE_SHOWN = r"=1+1 \x1b[2J \x1b]52;c;b3duZWQ=\x07 \x9b31m \u202etxt.exe"

REPORT_DAY = date(2026, 3, 3)
# Loaded stages, one per formula prefix, each with a control character.
HOSTILE_STAGES = (
    f'=HYPERLINK("http://e.example"){ESC}',  # formula
    f"+1{C1_CSI}",  # plus
    f"-2+3{BIDI}",  # minus that is not a number
    f"@SUM(A1){OSC52}",  # at
    "\tcmd",  # tab (some spreadsheets strip it and evaluate the rest)
    "\r=1",  # carriage return
)


def assert_inert(text: str) -> None:
    found = RAW_CONTROL.findall(text)
    assert not found, f"raw control characters shown: {found!r}"


def assert_json_round_trips(raw: str) -> object:
    assert_inert(raw)
    return json.loads(raw)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("=1+1", "'=1+1"),  # formula
        ("+1", "'+1"),  # plus
        ("-3", "'-3"),  # text that looks like a number is still text: only int/float cells stay unquoted
        ("@SUM(A1)", "'@SUM(A1)"),  # at
        ("\tx", "'\tx"),  # tab kept (the csv module quotes it), prefixed
        ("\r=1", "'\\x0d=1"),  # carriage return prefixed, then written visibly
        ("a=b", "a=b"),  # a prefix only counts at the start
        (f"{ESC}=1", "\\x1b[2J=1"),  # ESC first: written visibly, so the cell starts with a backslash
        (BIDI, "\\u202etxt.exe"),  # bidi override
        ("", ""),  # empty
    ],
)
def test_spreadsheet_safe(text: str, expected: str) -> None:
    assert spreadsheet_safe(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (OSC52, "\\x1b]52;c;b3duZWQ=\\x07"),  # OSC 52 with its BEL terminator
        (C1_CSI, "\\x9b31m"),  # C1
        ("\u2066x\u2069", "\\u2066x\\u2069"),  # bidi isolates
        ("a\tb\nc https://u:pw@h.example/?t=1", "a\tb\nc https://u:pw@h.example/?t=1"),  # tab, newline, URLs kept
    ],
)
def test_visible_controls(text: str, expected: str) -> None:
    assert visible_controls(text) == expected


def test_csv_keeps_numbers_numbers_and_neutralises_text() -> None:
    report = MeasurementReport(
        campaign_id="c",
        start=REPORT_DAY,
        end=REPORT_DAY,
        totals=(RangeTotal("first_party", "=cmd", "-x", -3, None, False),),
        daily=(DailyPoint(REPORT_DAY, "first_party", "@a", "+b", -4, 2),),
        funnel=(FunnelStep("\tstage", 2, True, 5, -0.5, None),),
    )
    rows = list(csv.DictReader(io.StringIO(render(report, "csv"))))
    assert [(r["stage"], r["event_type"], r["raw_count"]) for r in rows] == [
        ("'=cmd", "'-x", "-3"),
        ("'@a", "'+b", "-4"),
        ("'\tstage", "", "5"),
    ]
    assert rows[2]["from_previous"] == "-0.5"


@pytest.fixture
def cli(db_url: str) -> Cli:
    cli = cli_for(db_url)
    assert cli("campaigns", "add", "spring", "--name", HOSTILE, "--owner", f"-{OSC52}").exit_code == 0
    return cli


def test_campaign_and_user_tables(cli: Cli, engine: sa.Engine) -> None:
    assert cli("users", "add", "ana", "--name", HOSTILE).exit_code == 0
    for args in (["campaigns", "list"], ["users", "list"]):
        shown = cli(*args)
        assert shown.exit_code == 0, shown.output
        assert_inert(shown.output)
        assert HOSTILE_SHOWN in shown.output
    [campaign] = assert_json_round_trips(cli("campaigns", "list", "--json").output)
    assert (campaign["name"], campaign["owner"]) == (HOSTILE, f"-{OSC52}")
    [user] = assert_json_round_trips(cli("users", "list", "--json").output)
    assert user["display_name"] == HOSTILE


def test_execution_list_and_show(cli: Cli, engine: sa.Engine) -> None:
    scheduled = cli(
        "executions", "schedule", "--campaign", "spring", "--stage", f"@{BIDI}{C1_CSI}", "--action", "log",
        "--due", "now", "--payload", '{"message": "hi"}',
    )  # fmt: skip
    assert scheduled.exit_code == 0, scheduled.output
    execution_id = int(scheduled.output)
    with engine.begin() as conn:
        rows = claim_batch(conn, EXECUTIONS, "test-owner", 10, 60)
        start_attempts(conn, rows, "run-1")
        # A receiver's quoted answer in the reason: stored as is, shown escaped.
        cancel_execution(conn, execution_id, HOSTILE)
    for args in (["executions", "list"], ["executions", "show", str(execution_id)]):
        shown = cli(*args)
        assert shown.exit_code == 0, shown.output
        assert_inert(shown.output)
        assert HOSTILE_SHOWN in shown.output
    [listed] = assert_json_round_trips(cli("executions", "list", "--json").output)
    assert (listed["stage"], listed["last_error"]) == (f"@{BIDI}{C1_CSI}", HOSTILE)
    whole = assert_json_round_trips(cli("executions", "show", str(execution_id), "--json").output)
    assert [a["error"] for a in whole["attempts"]] == [HOSTILE]


def test_agent_run_list_and_show(cli: Cli, engine: sa.Engine) -> None:
    with engine.begin() as conn:
        users.add_user(conn, "ben")
        users.grant(conn, "ben", "campaign:read", "spring")
    requested = cli(
        "agents", "request", "--agent", "campaign_brief", "--campaign", "spring", "--as", "ben",
        "--input", '{"stage": "launch"}',
    )  # fmt: skip
    assert requested.exit_code == 0, requested.output
    with engine.begin() as conn:
        cancel_agent_run(conn, int(requested.output), HOSTILE)
    for args in (["agents", "list"], ["agents", "show", requested.output.strip()]):
        shown = cli(*args)
        assert shown.exit_code == 0, shown.output
        assert_inert(shown.output)
        assert HOSTILE_SHOWN in shown.output
    [listed] = assert_json_round_trips(cli("agents", "list", "--json").output)
    assert listed["error"] == HOSTILE


def test_event_rejects_table_and_load_errors(cli: Cli, tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    good = {
        "event_id": "e1",
        "campaign_id": "spring",
        "stage": "s",
        "event_type": "t",
        "occurred_at": "2026-03-03T12:00:00+00:00",
    }
    # Not JSON: rejected with its raw line (a file without one event line is refused, nothing stored).
    events.write_text(f"{HOSTILE}\n{json.dumps(good)}\n", encoding="utf-8")
    loaded = cli("events", "load", str(events))
    assert_inert(loaded.output)
    shown = cli("events", "rejects")
    assert shown.exit_code == 0, shown.output
    assert_inert(shown.output)
    assert HOSTILE_SHOWN in shown.output
    [reject] = assert_json_round_trips(cli("events", "rejects", "--json").output)
    assert reject["raw"] == HOSTILE
    # An error line naming a file: the name is anyone's too.
    empty = tmp_path / f"{ESC}{BIDI}.jsonl"
    empty.write_bytes(b"")
    refused = cli("events", "load", str(empty))
    assert refused.exit_code == 1
    assert_inert(refused.output)
    assert "\\x1b[2J\\u202etxt.exe.jsonl: no events found" in refused.output


def test_report_table_csv_and_json(cli: Cli, engine: sa.Engine, tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    lines = [
        {
            "event_id": f"e{i}",
            "campaign_id": "spring",
            "stage": stage,
            "event_type": f"-{ESC}",
            "actor_id": f"a{i}",
            "occurred_at": f"{REPORT_DAY.isoformat()}T12:00:00+00:00",
        }
        for i, stage in enumerate(HOSTILE_STAGES)
    ]
    events.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    loaded = cli("events", "load", str(events))
    assert loaded.exit_code == 0 and loaded.output.startswith("loaded 6,"), loaded.output
    replace_rollup_day(engine, REPORT_DAY)
    day = ["--from", REPORT_DAY.isoformat(), "--to", REPORT_DAY.isoformat()]

    table = cli("report", "--campaign", "spring", *day)
    assert table.exit_code == 0, table.output
    assert_inert(table.output)
    assert "\\x1b[2J" in table.output and "\\u202e" in table.output

    exported = cli("report", "--campaign", "spring", *day, "--format", "csv")
    assert exported.exit_code == 0, exported.output
    assert_inert(exported.output)
    rows = list(csv.reader(io.StringIO(exported.output)))
    cells = [cell for row in rows[1:] for cell in row]
    assert not [cell for cell in cells if cell.startswith(FORMULA_PREFIXES) and not _is_number(cell)]
    stages = {row[3] for row in rows[1:]}
    assert stages == {spreadsheet_safe(stage) for stage in HOSTILE_STAGES}
    assert all(row[5].lstrip("-").isdigit() for row in rows[1:])  # raw_count stays a number

    whole = assert_json_round_trips(cli("report", "--campaign", "spring", *day, "--format", "json").output)
    assert {t["stage"] for t in whole["totals"]} == set(HOSTILE_STAGES)


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True
