"""docs/ANALYSTS.md runs as written on the data a newcomer has: every sql, python and console block after
``marketing-pipelines demo``, on both databases, and each returns rows.

On SQLite the blocks run in the folder where the demo ran, without MARKETING_DATABASE_URL: the embedded
default a newcomer has. On PostgreSQL the demo and the blocks get MARKETING_DATABASE_URL. Python blocks run
in a new interpreter, as an analyst's notebook would; blocks marked ``# needs: definitions`` load
``marketing_pipelines.definitions``. Console lines run through bash, so their ``$(date ...)`` and ``>`` are
the shell's. A sql block whose first line names a database (``-- PostgreSQL:``, ``-- SQLite:``) runs on that
one only: the two write "seven days ago" differently.

The demo runs once per database for the module (it takes seconds); on PostgreSQL in the session's
database, emptied first as the ``pg_url`` fixture does, since ``pg_url`` lives for one test only.
"""

import csv
import io
import os
import pickle
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import metadata
from marketing_pipelines.demo import run_demo
from marketing_pipelines.measurement.assets import ROLLUP_IO_MANAGER
from marketing_pipelines.measurement.report.build import measurement_report
from marketing_pipelines.measurement.report.frames import (
    ReportFrames,
    RollupFrameIOManager,
    report_frames,
    rollup_frame,
)
from marketing_pipelines.settings import load_settings
from marketing_pipelines_tests.built import measurement_assets, unconfigured_importers
from marketing_pipelines_tests.measurement.test_report_charts import Page

DOC = Path(__file__).resolve().parents[2] / "docs" / "ANALYSTS.md"
FENCED = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
NEEDS_DEFINITIONS = "# needs: definitions"
DEFINITIONS_IMPORT = "from marketing_pipelines.definitions import defs\n"
CAMPAIGN = "spring-launch"
DIALECTS = {"PostgreSQL": "postgres", "SQLite": "sqlite"}
ONLY_ON = re.compile(r"^-- (PostgreSQL|SQLite):")
A_DAY = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCED.findall(DOC.read_text(encoding="utf-8")) if lang == language]


SQL = blocks("sql")
PYTHON = blocks("python")
PYTHON_PLAIN = [b for b in PYTHON if NEEDS_DEFINITIONS not in b]
PYTHON_DEFINITIONS = [b for b in PYTHON if NEEDS_DEFINITIONS in b]
CLI = [line[2:] for b in blocks("console") for line in b.splitlines() if line.startswith("$ marketing-pipelines ")]


def block_id(body: str) -> str:
    # A python block's last line names what it leaves behind; its first lines are the same imports.
    return body.strip().splitlines()[-1].strip()[:60]


def dialects(sql: str) -> list[str]:
    only = ONLY_ON.match(sql)
    return [DIALECTS[only.group(1)]] if only else list(DIALECTS.values())


# (database, block): each sql block, by its place in the doc, on the database it is written for.
SQL_CASES = [pytest.param(dialect, sql, id=f"{dialect}-{n}") for n, sql in enumerate(SQL) for dialect in dialects(sql)]


def doc_window(today: date | None = None) -> tuple[date, date]:
    """The doc's days: the last seven complete UTC days before today, the ones the demo seeds."""
    today = today or datetime.now(UTC).date()
    return today - timedelta(days=7), today - timedelta(days=1)


@dataclass(frozen=True)
class Demo:
    """The database ``marketing-pipelines demo`` filled, and how a block reaches it."""

    url: str
    folder: Path  # where the demo ran: its Dagster home, and on SQLite its embedded database
    env: dict[str, str] = field(default_factory=dict)  # the MARKETING_ variables a block sees

    @property
    def engine(self) -> sa.Engine:
        return get_engine(self.url)


def emptied(url: str) -> str:
    # What the pg_url fixture does before each test: the session's database is shared by every module.
    tables = ", ".join(f'"{t.name}"' for t in metadata.sorted_tables)
    with get_engine(url).begin() as conn:
        conn.execute(sa.text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    return url


def demo_in(folder: Path, found: Demo) -> Iterator[Demo]:
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # the demo's Dagster home is .marketing/dagster_home under the current directory
        run_demo(load_settings(database_url=found.url), echo=lambda line: None)
    yield found
    found.engine.dispose()


@pytest.fixture(scope="module")
def sqlite_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    folder = tmp_path_factory.mktemp("demo-sqlite")
    # The embedded default of this folder: the blocks run here without MARKETING_DATABASE_URL.
    yield from demo_in(folder, Demo(f"sqlite:///{folder / '.marketing' / 'marketing.db'}", folder))


@pytest.fixture(scope="module")
def postgres_demo(pg_database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    folder, url = tmp_path_factory.mktemp("demo-postgres"), emptied(pg_database)
    yield from demo_in(folder, Demo(url, folder, {"MARKETING_DATABASE_URL": url}))


@pytest.fixture(params=list(DIALECTS.values()))
def demo(request: pytest.FixtureRequest) -> Demo:
    """A test on both databases (as ``db_url``), each demo run once for the module."""
    return request.getfixturevalue(f"{request.param}_demo")


def test_the_doc_has_every_kind_of_block() -> None:
    assert len(SQL) >= 2 and len(PYTHON_PLAIN) >= 2 and len(PYTHON_DEFINITIONS) >= 2 and len(CLI) >= 2
    # Every sql example exists for both databases.
    assert sorted(d for sql in SQL for d in dialects(sql)) == sorted([*DIALECTS.values()] * (len(SQL) // 2))
    for body in [*SQL, *PYTHON, *CLI]:
        # The examples name what the demo seeds, or they would pass on empty results.
        assert CAMPAIGN in body or "defs()." in body, body
        # Days follow today, as the demo's do: a written day would fall out of the demo's week.
        assert not A_DAY.search(body), body


@pytest.mark.slow
@pytest.mark.parametrize(("demo", "sql"), SQL_CASES, indirect=["demo"])
def test_sql_block(demo: Demo, sql: str) -> None:
    with demo.engine.connect() as conn:
        # Today as the example's database counts it (PostgreSQL: in the session's time zone).
        today = date.fromisoformat(str(conn.execute(sa.text("SELECT CURRENT_DATE")).scalar_one()))
        result = conn.execute(sa.text(sql))
        columns, rows = list(result.keys()), result.all()
    assert rows, "the example returns nothing after the demo"
    first, last = doc_window(today)
    frame = rollup_frame(demo.engine, campaign_id=CAMPAIGN, start=first, end=last)
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


@pytest.mark.slow
@pytest.mark.parametrize("source", PYTHON_PLAIN, ids=block_id)
def test_python_block(demo: Demo, tmp_path: Path, source: str) -> None:
    check_results(run(source, demo, tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("source", PYTHON_DEFINITIONS, ids=block_id)
def test_python_block_with_the_real_definitions(demo: Demo, tmp_path: Path, source: str) -> None:
    # The code location's own defs: measurement_daily_rollup is loaded through RollupFrameIOManager.
    assert DEFINITIONS_IMPORT in source
    frame = run(source, demo, tmp_path)["rollup"]
    assert not frame.empty, "the block loaded no rows"
    days = sorted({d.date() for d in frame["day"]})
    first, last = doc_window()
    assert first <= days[0] and days[-1] <= last
    pd.testing.assert_frame_equal(frame, rollup_frame(demo.engine, start=days[0], end=days[-1]))


@pytest.mark.slow
@pytest.mark.parametrize(
    "command", CLI, ids=lambda command: next((f for f in ("csv", "html") if f" {f}" in command), "table")
)
def test_cli_line(demo: Demo, command: str) -> None:
    args = shlex.split(command)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARKETING_")}
    env = {**env, **demo.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}
    # Through bash, as typed: the line's $(date ...) and > are the shell's.
    done = subprocess.run(
        ["bash", "-c", command], cwd=demo.folder, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    output = (demo.folder / args[args.index(">") + 1]).read_text() if ">" in args else done.stdout
    if "csv" in args:
        frame = rollup_frame(demo.engine, campaign_id=CAMPAIGN, start=doc_window()[0], end=doc_window()[1])
        rows = list(csv.DictReader(io.StringIO(output)))
        assert {r["section"] for r in rows} == {"total", "daily", "funnel"}
        daily = [r for r in rows if r["section"] == "daily"]
        assert daily, "the CSV has no daily rows after the demo"
        assert {date.fromisoformat(r["day"]) for r in daily} == {d.date() for d in frame["day"]}
        assert sum(int(r["raw_count"]) for r in daily) == frame["raw_count"].sum()
    elif "html" in args:
        # The page without --from/--to: each source's days as the rollup holds them, in the tables under the charts.
        frame = rollup_frame(demo.engine, campaign_id=CAMPAIGN)
        page = Page(output)
        assert "svg" in {tag for tag, _ in page.elements}, output
        for source, rows in frame.groupby("source"):
            counts = [n for _, n in page.tables[f"daily {source}"] if n != "not rolled up"]
            assert sum(int(n) for n in counts) == rows["raw_count"].sum() > 0, source
    else:
        # The table without --from/--to: every rolled-up day of the campaign, one line per daily row.
        frame = rollup_frame(demo.engine, campaign_id=CAMPAIGN)
        first, last = frame["day"].min().date(), frame["day"].max().date()
        lines = output.splitlines()
        assert "No rollup rows" not in output, output
        assert lines[0] == f"Campaign {CAMPAIGN}, {first} .. {last} (UTC days)", output
        assert len(lines) - lines.index("Daily") - 2 == len(frame) > 0, output


@pytest.mark.slow
def test_the_three_frames_agree_after_the_demo(demo: Demo) -> None:
    # One campaign and day, three ways: rollup_frame, the report's frames and the asset's load.
    day = doc_window()[1]
    direct = rollup_frame(demo.engine, campaign_id=CAMPAIGN, start=day, end=day)
    assert not direct.empty
    with demo.engine.connect() as conn:
        report = report_frames(measurement_report(conn, CAMPAIGN, day, day))
    resources = {
        "app_db": AppDatabase(url=demo.url),
        **unconfigured_importers(),
        ROLLUP_IO_MANAGER: RollupFrameIOManager(url=demo.url),
    }
    defs = dg.Definitions(assets=measurement_assets, resources=resources)
    loaded = defs.load_asset_value("measurement_daily_rollup", partition_key=day.isoformat())
    loaded = loaded[loaded["campaign_id"] == CAMPAIGN].reset_index(drop=True)

    pd.testing.assert_frame_equal(loaded, direct)
    # Same columns in the same order with the same dtypes and values; the report's has no rolled_up_at.
    pd.testing.assert_frame_equal(report.daily, direct.drop(columns="rolled_up_at"))
    # Every count of every frame is the one nullable integer dtype.
    for frame in (direct, report.totals, report.daily, report.funnel):
        assert {str(frame[c].dtype) for c in ("raw_count", "unique_actors")} == {"Int64"}


# Runs in the new interpreter: execs the block, then keeps the tables it left behind for the checks.
RUNNER = """
import pickle, sys
import pandas as pd
from marketing_pipelines.measurement.report.frames import ReportFrames
source, out = sys.stdin.read(), sys.argv[1]
namespace = {}
exec(compile(source, "<docs/ANALYSTS.md block>", "exec"), namespace)
kept = {k: v for k, v in namespace.items() if isinstance(v, pd.DataFrame | pd.Series | ReportFrames)}
with open(out, "wb") as f:
    pickle.dump(kept, f)
"""


def run(source: str, demo: Demo, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / "namespace.pickle"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARKETING_")}
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(out)],
        input=source,
        cwd=demo.folder,
        env={**env, **demo.env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        # pytrace=False: the block and its plain traceback say it all.
        pytest.fail(f"this docs/ANALYSTS.md block fails:\n{source}\n{done.stderr[-4000:]}", pytrace=False)
    return pickle.loads(out.read_bytes())


def check_results(namespace: dict[str, Any]) -> None:
    """Every DataFrame (or Series) the block left behind holds the demo's rows of the doc's days and campaign."""
    values = [v for v in namespace.values() if isinstance(v, pd.DataFrame | pd.Series | ReportFrames)]
    assert values, "the block leaves no DataFrame behind"
    first, last = doc_window()
    for value in values:
        parts = [value.totals, value.daily, value.funnel] if isinstance(value, ReportFrames) else [value]
        for part in parts:
            assert not part.empty, "the block's frame is empty after the demo"
            if isinstance(part, pd.DataFrame) and "campaign_id" in part.columns:
                assert set(part["campaign_id"]) == {CAMPAIGN}
            if isinstance(part, pd.DataFrame) and "day" in part.columns:
                assert all(first <= d.date() <= last for d in part["day"])


def as_int(value: Any) -> int | None:
    return None if pd.isna(value) else int(value)
