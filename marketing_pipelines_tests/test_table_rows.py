"""A table row is one line whatever its cells hold: hostile stage names and campaign ids cannot forge rows
in `executions list` or `report`, and ids with a trailing newline are refused (issue 35 item 11).

Every cell writes a line break or tab as its escape (``\\n``, ``\\t``) and other control, line-separator
and invisible characters as ``\\xNN`` / ``\\uNNNN`` (``redact.visible_cell``); rows are counted with
``str.splitlines``, which also breaks at U+2028, U+2029, U+0085 and the C0 separators.
"""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest
import sqlalchemy as sa

from marketing_pipelines.redact import visible_cell, visible_controls
from marketing_pipelines_tests.cli_runner import Cli, cli_for
from marketing_pipelines_tests.factories import replace_rollup_day

DAY = date(2026, 3, 3)
# A stage that, shown raw, would add a row of its own to a table (and columns, with the tabs).
FORGED_ROW = "launch\n999  spring  forged\tSCHEDULED"
# Characters that break a line or take no room on the screen: each must be shown, and none may break a row.
INVISIBLE = {
    "\n": "\\n",  # line feed
    "\t": "\\t",  # tab
    "\r": "\\x0d",  # carriage return
    "\x0b": "\\x0b",  # vertical tab (splitlines breaks there)
    "\x1c": "\\x1c",  # file separator (splitlines breaks there)
    "\x85": "\\x85",  # next line (C1)
    "\u2028": "\\u2028",  # line separator
    "\u2029": "\\u2029",  # paragraph separator
    "\u061c": "\\u061c",  # Arabic letter mark (bidi)
    "\u200b": "\\u200b",  # zero-width space
    "\u200c": "\\u200c",  # zero-width non-joiner
    "\u200d": "\\u200d",  # zero-width joiner
    "\u200e": "\\u200e",  # left-to-right mark
    "\u200f": "\\u200f",  # right-to-left mark
    "\u2060": "\\u2060",  # word joiner
    "\ufeff": "\\ufeff",  # zero-width no-break space (BOM)
    "\U000e0041": "\\U000e0041",  # tag "A": invisible text a model reads
}


@pytest.mark.parametrize(("character", "shown"), INVISIBLE.items())
def test_every_cell_shows_breaks_and_invisible_characters(character: str, shown: str) -> None:
    assert visible_cell(f"a{character}b") == f"a{shown}b"
    assert len(visible_cell(f"a{character}b").splitlines()) == 1


def test_multi_line_text_keeps_its_lines_and_shows_the_rest() -> None:
    # An agent's output or an error shown on its own keeps tab and newline; the invisible ones show.
    assert visible_controls("a\tb\nc\u200bd\u2028e") == "a\tb\nc\\u200bd\\u2028e"


@pytest.fixture
def cli(db_url: str) -> Cli:
    cli = cli_for(db_url)
    assert cli("campaigns", "add", "spring", "--name", "Spring", "--owner", "ana").exit_code == 0
    return cli


def test_a_stage_name_cannot_forge_rows_in_executions_list(cli: Cli) -> None:
    stages = [FORGED_ROW, *(f"s{character}x" for character in INVISIBLE)]
    for stage in stages:
        scheduled = cli(
            "executions", "schedule", "--campaign", "spring", "--stage", stage, "--action", "log", "--due", "now",
        )  # fmt: skip
        assert scheduled.exit_code == 0, scheduled.output
    listed = cli("executions", "list")
    assert listed.exit_code == 0, listed.output
    lines = listed.output.splitlines()
    assert len(lines) == 1 + len(stages), lines  # the header and one line per execution
    assert "launch\\n999  spring  forged\\tSCHEDULED" in listed.output
    assert {row["stage"] for row in json.loads(cli("executions", "list", "--json").output)} == set(stages)


def test_a_stage_name_cannot_forge_rows_in_the_report(cli: Cli, engine: sa.Engine, tmp_path: Path) -> None:
    stages = [FORGED_ROW, "s\u2028x", "s\u200bx"]
    events = tmp_path / "events.jsonl"
    events.write_text(
        "".join(
            json.dumps(
                {
                    "event_id": f"e{i}",
                    "campaign_id": "spring",
                    "stage": stage,
                    "event_type": "t\tx",
                    "actor_id": f"a{i}",
                    "occurred_at": f"{DAY.isoformat()}T12:00:00+00:00",
                }
            )
            + "\n"
            for i, stage in enumerate(stages)
        ),
        encoding="utf-8",
    )
    assert cli("events", "load", str(events)).exit_code == 0
    replace_rollup_day(engine, DAY)
    report = cli("report", "--campaign", "spring", "--from", DAY.isoformat(), "--to", DAY.isoformat())
    assert report.exit_code == 0, report.output
    lines = report.output.splitlines()
    daily = lines[lines.index("Daily") + 1 :]
    assert len(daily) == 1 + len(stages), daily  # its header and one row per stage
    start = lines.index("Totals (~ marks unique actors estimated from HLL sketches)") + 1
    totals = lines[start : lines.index("", start)]
    assert len(totals) == 1 + len(stages), totals
    assert "launch\\n999  spring  forged\\tSCHEDULED" in report.output and "t\\tx" in report.output


@pytest.mark.parametrize(
    "args",
    [
        ["campaigns", "add", "camp-a\n", "--name", "A", "--owner", "ana"],
        ["campaigns", "add", "camp-a\n", "--name", "A", "--owner", "ana", "--github-repo", "o/r"],
        ["users", "add", "ana\n", "--name", "Ana"],
    ],
)
def test_an_id_with_a_trailing_newline_is_refused(cli: Cli, args: list[str]) -> None:
    refused = cli(*args)
    assert refused.exit_code != 0
    listed = json.loads(cli(args[0], "list", "--json").output)
    assert [row["id"] for row in listed] == (["spring"] if args[0] == "campaigns" else [])


def test_a_github_repo_with_a_trailing_newline_is_refused(cli: Cli) -> None:
    refused = cli("campaigns", "add", "camp-b", "--name", "B", "--owner", "ana", "--github-repo", "owner/repo\n")
    assert refused.exit_code != 0
    assert [row["id"] for row in json.loads(cli("campaigns", "list", "--json").output)] == ["spring"]
