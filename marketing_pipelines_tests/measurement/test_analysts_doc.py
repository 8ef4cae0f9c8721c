"""docs/ANALYSTS.md runs as written: its sql, python and CLI blocks against a seeded database, on both databases.

Python blocks run in a new interpreter whose MARKETING_DATABASE_URL points at the seeded test database, as
an analyst's notebook would have it. Blocks marked ``# needs: definitions`` load
``marketing_pipelines.definitions``.
"""

import csv
import io
import os
import pickle
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from marketing_pipelines.cli import main
from marketing_pipelines.measurement.frames import ReportFrames, rollup_frame
from marketing_pipelines.measurement.rollup import replace_rollup_day
from marketing_pipelines_tests.measurement.test_frames import (
    DAYS,
    UTM,
    add_pageviews,
    generated,
    seed_events,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "ANALYSTS.md"
FENCED = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
NEEDS_DEFINITIONS = "# needs: definitions"
DEFINITIONS_IMPORT = "from marketing_pipelines.definitions import defs\n"
# Off until measurement_daily_rollup uses io_manager_key "rollup_frames" in marketing_pipelines.definitions.
CAMPAIGN, FIRST, LAST = "spring-launch", DAYS[0], DAYS[-1]


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCED.findall(DOC.read_text(encoding="utf-8")) if lang == language]


SQL = blocks("sql")
PYTHON = blocks("python")
PYTHON_PLAIN = [b for b in PYTHON if NEEDS_DEFINITIONS not in b]
PYTHON_DEFINITIONS = [b for b in PYTHON if NEEDS_DEFINITIONS in b]
CLI = [line[2:] for b in blocks("console") for line in b.splitlines() if line.startswith("$ marketing-pipelines ")]


def block_id(body: str) -> str:
    return next(line for line in body.splitlines() if line.strip() and not line.startswith("# needs"))[:60]


@pytest.fixture
def seeded(engine: sa.Engine) -> sa.Engine:
    seed_events(engine, generated(), UTM)
    add_pageviews(engine, DAYS)
    for day in DAYS:
        replace_rollup_day(engine, day)
    return engine


def test_the_doc_has_every_kind_of_block() -> None:
    assert len(SQL) >= 2 and len(PYTHON_PLAIN) >= 2 and len(PYTHON_DEFINITIONS) >= 2 and len(CLI) >= 1
    # The examples must name what the seeded database holds, or they would pass on empty results.
    for body in [*SQL, *PYTHON, *CLI]:
        assert CAMPAIGN in body or "defs." in body, body


@pytest.mark.parametrize("sql", SQL, ids=block_id)
def test_sql_block(seeded: sa.Engine, sql: str) -> None:
    with seeded.connect() as conn:
        result = conn.execute(sa.text(sql))
        columns, rows = list(result.keys()), result.all()
    assert rows, "the example returns nothing on the seeded database"
    frame = rollup_frame(seeded, campaign_id=CAMPAIGN, start=FIRST, end=LAST)
    if "unique_actors" in columns:
        expected = [
            (r.day.date().isoformat(), r.source, r.stage, r.event_type, r.raw_count, as_int(r.unique_actors))
            for r in frame.itertuples()
        ]
        got = [(str(r.day), r.source, r.stage, r.event_type, r.raw_count, r.unique_actors) for r in rows]
        assert sorted(got, key=str) == sorted(expected, key=str)
    else:
        first_party = frame[frame["source"] == "first_party"]
        sums = first_party.groupby(["stage", "event_type"])["raw_count"].sum()
        assert {(r.stage, r.event_type): int(r.events) for r in rows} == {k: int(v) for k, v in sums.items()}


@pytest.mark.parametrize("source", PYTHON_PLAIN, ids=block_id)
def test_python_block(seeded: sa.Engine, db_url: str, tmp_path: Path, source: str) -> None:
    namespace = run(source, db_url, tmp_path)
    check_results(namespace)


@pytest.mark.parametrize("source", PYTHON_DEFINITIONS, ids=block_id)
def test_python_block_with_the_real_definitions(seeded: sa.Engine, db_url: str, tmp_path: Path, source: str) -> None:
    # The code location's own defs: measurement_daily_rollup is loaded through RollupFrameIOManager.
    assert DEFINITIONS_IMPORT in source
    frame = run(source, db_url, tmp_path)["rollup"]
    days = sorted({d.date() for d in frame["day"]})
    assert days, "the block loaded no rows"
    pd.testing.assert_frame_equal(frame, rollup_frame(seeded, start=days[0], end=days[-1]))


@pytest.mark.parametrize("command", CLI)
def test_cli_line(seeded: sa.Engine, db_url: str, command: str) -> None:
    args = shlex.split(command)
    args = args[1 : args.index(">")] if ">" in args else args[1:]
    result = CliRunner(env={"MARKETING_DATABASE_URL": db_url}).invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    if "csv" in args:
        rows = list(csv.DictReader(io.StringIO(result.output)))
        assert {r["section"] for r in rows} == {"total", "daily", "funnel"}
        daily = rollup_frame(seeded, campaign_id=CAMPAIGN, start=FIRST, end=LAST)
        assert sum(int(r["raw_count"]) for r in rows if r["section"] == "daily") == daily["raw_count"].sum()


# Runs in the new interpreter: execs the block, then keeps the tables it left behind for the checks.
RUNNER = """
import pickle, sys
import pandas as pd
from marketing_pipelines.measurement.frames import ReportFrames
source, out = sys.stdin.read(), sys.argv[1]
namespace = {}
exec(compile(source, "<docs/ANALYSTS.md block>", "exec"), namespace)
kept = {k: v for k, v in namespace.items() if isinstance(v, pd.DataFrame | pd.Series | ReportFrames)}
with open(out, "wb") as f:
    pickle.dump(kept, f)
"""


def run(source: str, db_url: str, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "namespace.pickle"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARKETING_")}
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(out)],
        input=source,
        env={**env, "MARKETING_DATABASE_URL": db_url},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        # pytrace=False: the block and its plain traceback say it all.
        pytest.fail(f"this docs/ANALYSTS.md block fails:\n{source}\n{done.stderr[-4000:]}", pytrace=False)
    return pickle.loads(out.read_bytes())


def check_results(namespace: dict[str, Any]) -> None:
    """Every DataFrame (or Series) the block left behind holds seeded data, and only the example's campaign."""
    values = [v for v in namespace.values() if isinstance(v, pd.DataFrame | pd.Series | ReportFrames)]
    assert values, "the block leaves no DataFrame behind"
    for value in values:
        parts = [value.totals, value.daily, value.funnel] if isinstance(value, ReportFrames) else [value]
        for part in parts:
            assert not part.empty
            if isinstance(part, pd.DataFrame) and "campaign_id" in part.columns:
                assert set(part["campaign_id"]) == {CAMPAIGN}
            if isinstance(part, pd.DataFrame) and "day" in part.columns:
                assert {d.date() for d in part["day"]} <= set(DAYS)


def as_int(value: Any) -> int | None:
    return None if pd.isna(value) else int(value)
