"""The report's HTML page: the same numbers as its JSON, loaded names as inert text, nothing fetched, and the
charts drawn by a real browser."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from marketing_pipelines.cli import main
from marketing_pipelines.db.schema import github_release_download_daily, site_analytics_daily
from marketing_pipelines.measurement.events.write import record_events
from marketing_pipelines.measurement.report.build import measurement_report
from marketing_pipelines.measurement.report.charts import PAGE_CSP, render_html
from marketing_pipelines.measurement.report.model import MeasurementReport
from marketing_pipelines.measurement.report.rendering import format_pct, render
from marketing_pipelines_tests.factories import add_campaign, replace_rollup_day
from marketing_pipelines_tests.machine import require_or_skip
from marketing_pipelines_tests.measurement.generated import DAYS, generated_events

# The report's range: the rolled-up DAYS and one day after them that was never rolled up.
FIRST, LAST = DAYS[0], DAYS[-1] + timedelta(days=1)
PAGEVIEWS = {DAYS[0]: 40, DAYS[2]: 7}
DOWNLOADS = {DAYS[1]: 12}
# Names as anyone's event file may carry them.
HOSTILE = (
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(2)>',
    '=HYPERLINK("http://evil.example","x")',
    "esc\x1b[2Jape",
    "\u202eright-to-left",
    "<a href='javascript:alert(3)'>x</a>",
)
# What the page itself is made of; an element or attribute beyond these came from the data.
PAGE_TAGS = {
    "html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "figure", "svg", "rect", "line", "text",
    "table", "caption", "thead", "tbody", "tr", "th", "td",
}  # fmt: skip
PAGE_ATTRIBUTES = {
    "lang", "http-equiv", "content", "charset", "name", "xmlns", "width", "height", "role", "font-size",
    "font-family", "x", "y", "x1", "y1", "x2", "y2", "fill", "stroke", "text-anchor", "scope", "class",
}  # fmt: skip
CHROMIUM = Path("/usr/bin/chromium")


class Page(HTMLParser):
    """The parsed page: every element with its attributes, every table's rows as text, and all text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.tables: dict[str, list[list[str]]] = {}
        self.text: list[str] = []
        self._caption: str | None = None
        self._table: list[list[str]] | None = None
        self._cell: list[str] | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, attrs))
        if tag == "table":
            self._table = []
        elif tag == "caption":
            self._caption = ""
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._table is not None:
            self._table[-1].append("".join(self._cell))
            self._cell = None
        elif tag == "table" and self._table is not None:
            self.tables[self._caption or ""] = self._table[1:]  # without the header row
            self._table, self._caption = None, None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)
        elif self._caption is not None and self._table is not None and not self._table:
            self._caption += data


@pytest.fixture
def charted(engine: sa.Engine) -> None:
    """Campaign alpha over DAYS: generated first-party events, pageviews on two days, downloads on one."""
    add_campaign(engine, "alpha", utm_campaign="alpha-utm", github_repo="acme/alpha")
    events = [e for e in generated_events(per_day=40) if e["campaign_id"] == "alpha"]
    now = datetime.now(UTC)
    with engine.begin() as conn:
        record_events(conn, events, source="test")
        conn.execute(
            sa.insert(site_analytics_daily),
            [
                {"day": d, "utm_campaign": "alpha-utm", "page": "/", "visitors": 3, "pageviews": n, "fetched_at": now}
                for d, n in PAGEVIEWS.items()
            ],
        )
        conn.execute(sa.insert(github_release_download_daily), [download_row(d, n) for d, n in DOWNLOADS.items()])
    for day in DAYS:
        replace_rollup_day(engine, day)


def download_row(day: date, downloads: int) -> dict[str, Any]:
    return {
        "day": day,
        "asset_id": 1,
        "repo": "acme/alpha",
        "release_tag": "v1",
        "asset_name": "alpha.tar.gz",
        "download_count": 100 + downloads,
        "downloads": downloads,
        "raw_delta": downloads,
        "baseline": False,
        "negative_clamped": False,
    }


def report_of(engine: sa.Engine, campaign: str = "alpha") -> MeasurementReport:
    with engine.connect() as conn:
        return measurement_report(conn, campaign, FIRST, LAST)


def expected_tables(data: dict[str, Any]) -> dict[str, list[list[str]]]:
    """The page's tables as the report's JSON gives their numbers: the funnel, and each source's daily totals
    (0 on a day rolled up without its rows, "not rolled up" on a day never rolled up)."""
    funnel = [
        [
            f["stage"],
            str(f["unique_actors"]) if f["unique_actors_exact"] else f"~{f['unique_actors']}",
            str(f["raw_count"]),
            format_pct(f["from_previous"]),
            format_pct(f["from_first"]),
        ]
        for f in data["funnel"]
    ]
    sums: defaultdict[str, defaultdict[str, int]] = defaultdict(lambda: defaultdict(int))
    for point in data["daily"]:
        sums[point["source"]][point["day"]] += point["raw_count"]
    never = {day for first, last in data["not_built"] for day in iso_days(first, last)}
    days = iso_days(data["start"], data["end"])
    tables = {"funnel": funnel}
    for source in ("first_party", "site_analytics", "github_releases", *sorted(set(sums) - {"first_party"})):
        tables[f"daily {source}"] = [[d, "not rolled up" if d in never else str(sums[source][d])] for d in days]
    return tables


def iso_days(first: str, last: str) -> list[str]:
    start, end = date.fromisoformat(first), date.fromisoformat(last)
    return [(start + timedelta(days=n)).isoformat() for n in range((end - start).days + 1)]


def test_the_page_carries_the_numbers_of_the_json(engine: sa.Engine, charted: None) -> None:
    report = report_of(engine)
    data = json.loads(render(report, "json"))
    page = Page(render_html(report))

    assert page.tables == expected_tables(data)
    # Every source has numbers on the days it had rows; the day after DAYS was never rolled up.
    assert page.tables["daily site_analytics"][0] == [DAYS[0].isoformat(), "40"]
    assert page.tables["daily github_releases"][1] == [DAYS[1].isoformat(), "12"]
    assert page.tables["daily first_party"][-1] == [LAST.isoformat(), "not rolled up"]
    assert sum(int(n) for _, n in page.tables["daily first_party"][:-1]) == sum(
        t["raw_count"] for t in data["totals"] if t["source"] == "first_party"
    )
    # The charts' bars name the same numbers (each bar's tooltip: "day: count").
    bars = re.findall(r"<title>(\d{4}-\d\d-\d\d): ([^<]+)</title>", render_html(report))
    assert sorted(bars) == sorted(
        (day, n) for source, rows in expected_tables(data).items() if source != "funnel" for day, n in rows
    )


def test_the_page_fetches_nothing_and_runs_nothing(engine: sa.Engine, charted: None) -> None:
    text = render_html(report_of(engine))
    page = Page(text)
    policies = [dict(attrs).get("content") for tag, attrs in page.elements if dict(attrs).get("http-equiv")]
    assert policies == [PAGE_CSP]
    assert page.elements[:3] == [("html", [("lang", "en")]), ("head", []), ("meta", page.elements[2][1])]
    assert not re.search(r"<script|javascript:|@import|url\(", text, re.IGNORECASE)
    assert not [attrs for _, attrs in page.elements for name, _ in attrs if name in ("src", "href", "srcset")]


def test_hostile_names_are_inert_text(engine: sa.Engine) -> None:
    add_campaign(engine, "alpha")
    events = [
        {
            "event_id": f"h-{n}-{m}",
            "campaign_id": "alpha",
            "stage": name,
            "event_type": name,
            "actor_id": f"actor-{m}",
            "occurred_at": f"{DAYS[0]}T1{m}:00:00Z",
        }
        for n, name in enumerate(HOSTILE)
        for m in range(n + 1)
    ]
    with engine.begin() as conn:
        record_events(conn, events, source="test")
    replace_rollup_day(engine, DAYS[0])
    report = report_of(engine)
    # Campaign ids are validated when stored, and the rollup names its own sources; the page does not rely on it.
    hostile_source = report.daily[0]._replace(source=HOSTILE[1])
    report = dataclasses.replace(report, campaign_id=HOSTILE[0], daily=(*report.daily, hostile_source))

    text = render_html(report)
    page = Page(text)
    assert {tag for tag, _ in page.elements} <= PAGE_TAGS
    assert {name for _, attrs in page.elements for name, _ in attrs} <= PAGE_ATTRIBUTES
    values = " ".join(value or "" for _, attrs in page.elements for _, value in attrs)
    assert not [name for name in HOSTILE if name[:6] in values]
    assert "<script" not in text.lower() and "<img" not in text.lower()
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\u202e]", text)
    # Each name reads as written, its controls spelled out, in the funnel table and in the charts.
    visible = {name: name.replace("\x1b", "\\x1b").replace("\u202e", "\\u202e") for name in HOSTILE}
    # Stage n has n + 1 events of n + 1 actors.
    assert {row[0]: row[1:3] for row in page.tables["funnel"]} == {
        visible[name]: [str(n + 1), str(n + 1)] for n, name in enumerate(HOSTILE)
    }
    shown = "".join(page.text)
    assert f"Campaign {HOSTILE[0]}" in shown and f"daily {HOSTILE[1]}" in page.tables


def test_report_command_writes_the_page(db_url: str, charted: None) -> None:
    runner = CliRunner(env={"MARKETING_DATABASE_URL": db_url})
    args = ["report", "--campaign", "alpha", "--from", FIRST.isoformat(), "--to", LAST.isoformat()]
    as_html = runner.invoke(main, [*args, "--format", "html"], catch_exceptions=False)
    as_json = runner.invoke(main, [*args, "--format", "json"], catch_exceptions=False)
    assert as_html.exit_code == 0 and as_json.exit_code == 0, as_html.output + as_json.output
    assert as_html.output.startswith("<!DOCTYPE html>")
    assert Page(as_html.output).tables == expected_tables(json.loads(as_json.output))


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}"]
    return subprocess.run([str(CHROMIUM), *flags, *args], capture_output=True, text=True, timeout=120, check=False)


def test_a_browser_draws_the_charts_with_the_numbers(engine: sa.Engine, charted: None, tmp_path: Path) -> None:
    if not CHROMIUM.exists() or shutil.which(str(CHROMIUM)) is None:
        require_or_skip(f"{CHROMIUM} is not installed (Debian: apt-get install -y chromium)")
    report = report_of(engine)
    page = tmp_path / "alpha.html"
    page.write_text(render_html(report))

    dom = chromium("--dump-dom", page.as_uri(), profile=tmp_path / "profile").stdout
    chromium(
        "--window-size=1400,1000", f"--screenshot={tmp_path / 'alpha.png'}", page.as_uri(), profile=tmp_path / "p2"
    )

    (tmp_path / "dom.html").write_text(dom)
    drawn = Page(dom)
    svgs = [tag for tag, _ in drawn.elements if tag == "svg"]
    assert len(svgs) == 4, f"a funnel and three sources; see {tmp_path / 'dom.html'}"
    assert len([tag for tag, _ in drawn.elements if tag == "rect"]) >= 2 * len(report.funnel) + 3 * len(DAYS)
    assert drawn.tables == expected_tables(json.loads(render(report, "json")))
    assert (tmp_path / "alpha.png").stat().st_size > 0
