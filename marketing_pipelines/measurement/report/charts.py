"""The report as one self-contained HTML page: the funnel and each source's daily totals as inline SVG charts,
each above a plain table of the same numbers (``render_html``); and one day's funnels as pictures in Markdown, for
the rollup asset's metadata (``funnel_chart_markdown``).

The page makes no request of any kind: no script, no stylesheet, font or image from elsewhere, no link. Its
Content-Security-Policy forbids all of them anyway (``PAGE_CSP``), so a page someone edited cannot fetch either.
Campaign ids, stages, event types and sources are anyone's text (loaded event files): each is written by
``shown``, its controls visible and HTML-escaped, so no name can open an element or an attribute.

Drawn here rather than with a plotting library: two bar charts are a few dozen lines of SVG, and the page
must not pull a charting library's JavaScript or fonts in.
"""

from __future__ import annotations

import base64
import html
from collections import defaultdict
from collections.abc import Sequence
from datetime import date, timedelta

import sqlalchemy as sa

from marketing_pipelines.measurement.report.build import day_funnels
from marketing_pipelines.measurement.report.model import FunnelStep, MeasurementReport
from marketing_pipelines.measurement.report.rendering import format_pct, format_unique, md_cell
from marketing_pipelines.measurement.rollup.daily import (
    FIRST_PARTY,
    GITHUB_RELEASES,
    SITE_ANALYTICS,
    SOURCE_COUNT_NOUNS,
)
from marketing_pipelines.redact import visible_cell

PAGE_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
# Sources charted even without a row in the range (a flat line says "none", which is worth seeing); any other
# source the rollup holds is charted after them.
KNOWN_SOURCES = (FIRST_PARTY, SITE_ANALYTICS, GITHUB_RELEASES)
NOT_ROLLED_UP = "not rolled up"

CHART_WIDTH = 720
LABEL_WIDTH = 180
BAR_HEIGHT = 16
TREND_HEIGHT = 160
# A long range keeps bars this wide at least; the chart grows (and scrolls) instead.
MIN_BAR_WIDTH = 2
ACTORS_COLOUR, EVENTS_COLOUR = "#3b6ea5", "#a9c4e2"

STYLE = """
body { font-family: sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 2em; }
th, td { border: 1px solid #ccc; padding: 2px 8px; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 0; overflow-x: auto; }
"""


def shown(text: str) -> str:
    """Loaded text as the page shows it: controls and line breaks written out (``\\x1b``), then HTML-escaped,
    quotes too, so it is safe as element text and as an attribute value."""
    return html.escape(visible_cell(text), quote=True)


def render_html(report: MeasurementReport) -> str:
    """The whole page: heading, the funnel chart and table, then one chart and table per source."""
    campaign = shown(report.campaign_id)
    span = f"{report.start} .. {report.end} (UTC days)" if report.start else "no rolled-up days"
    parts = [f"<h1>Campaign {campaign}</h1>", f"<p>{span}</p>", *_days_left_out(report)]
    parts += _funnel_section(report.funnel)
    days = report_days(report)
    for source, totals in source_daily_totals(report, days).items():
        parts += _trend_section(source, totals)
    body = "\n".join(parts)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n'
        # First in <head>: the policy applies to what follows it.
        f'<meta http-equiv="Content-Security-Policy" content="{PAGE_CSP}">\n'
        '<meta charset="utf-8">\n<meta name="referrer" content="no-referrer">\n'
        f"<title>Campaign {campaign}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def _days_left_out(report: MeasurementReport) -> list[str]:
    notes = []
    if report.built_without_rows:
        notes.append(f"<p>Rolled up, nothing of this campaign (counts are 0): {_spans(report.built_without_rows)}</p>")
    if report.not_built:
        notes.append(f"<p>Never rolled up (materialize these days): {_spans(report.not_built)}</p>")
    return notes


def _spans(spans: Sequence[tuple[date, date]]) -> str:
    return ", ".join(str(first) if first == last else f"{first}..{last}" for first, last in spans)


def report_days(report: MeasurementReport) -> list[date]:
    return [] if report.start is None or report.end is None else _each_day(report.start, report.end)


def source_daily_totals(report: MeasurementReport, days: Sequence[date]) -> dict[str, dict[date, int | None]]:
    """Each source's raw_count per day of ``days``: summed over its stages and event types, 0 on a day rolled up
    without a row of it, None on a day never rolled up (no number is known)."""
    sums: dict[str, defaultdict[date, int]] = defaultdict(lambda: defaultdict(int))
    for point in report.daily:
        sums[point.source][point.day] += point.raw_count
    built = {point.day for point in report.daily}
    built |= {day for first, last in report.built_without_rows for day in _each_day(first, last)}
    sources = [*KNOWN_SOURCES, *sorted(set(sums) - set(KNOWN_SOURCES))]
    return {s: {day: (sums[s][day] if day in built else None) for day in days} for s in sources}


def _each_day(first: date, last: date) -> list[date]:
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]


# --- the funnel -------------------------------------------------------------------------------------------


def _funnel_section(steps: Sequence[FunnelStep]) -> list[str]:
    heading = "<h2>Funnel (first-party stages)</h2>"
    if not steps:
        return [heading, "<p>No first-party rows in the range.</p>"]
    note = (
        "<p>Unique actors (dark) and events (light) per stage; ~ marks unique actors estimated from HLL sketches. "
        "Stage sizes, not a cohort: an actor counts in every stage they reached.</p>"
    )
    rows = [
        [
            shown(s.stage),
            format_unique(s.unique_actors, s.unique_actors_exact),
            str(s.raw_count),
            format_pct(s.from_previous),
            format_pct(s.from_first),
        ]
        for s in steps
    ]
    table = _table(["stage", "unique_actors", "raw_count", "from_previous", "from_first"], rows, "funnel")
    return [heading, note, f"<figure>{funnel_svg(steps)}</figure>", table]


def funnel_svg(steps: Sequence[FunnelStep]) -> str:
    """Two horizontal bars per stage, unique actors over events, on one scale, each labelled with its numbers
    and the step's percentages as the report's table gives them."""
    scale = max([1, *(s.unique_actors for s in steps), *(s.raw_count for s in steps)])
    room = CHART_WIDTH - LABEL_WIDTH - 220
    row = 3 * BAR_HEIGHT
    shapes = []
    for n, step in enumerate(steps):
        y = 8 + n * row
        actors = format_unique(step.unique_actors, step.unique_actors_exact)
        sizes = f"{actors} actors, {step.raw_count} events"
        ratios = f"{format_pct(step.from_previous)} of previous, {format_pct(step.from_first)} of first"
        shapes += [
            f'<text x="{LABEL_WIDTH - 6}" y="{y + BAR_HEIGHT}" text-anchor="end">{_clipped(step.stage)}</text>',
            _bar(LABEL_WIDTH, y, room * step.unique_actors / scale, BAR_HEIGHT, ACTORS_COLOUR),
            _bar(LABEL_WIDTH, y + BAR_HEIGHT, room * step.raw_count / scale, BAR_HEIGHT / 2, EVENTS_COLOUR),
            f'<text x="{LABEL_WIDTH + room + 6}" y="{y + 12}">{html.escape(sizes)}</text>',
            f'<text x="{LABEL_WIDTH + room + 6}" y="{y + 27}">{html.escape(ratios)}</text>',
        ]
    return _svg(CHART_WIDTH, 16 + len(steps) * row, "Funnel: unique actors and events per stage", shapes)


# The rollup asset's funnel pictures: the day's campaigns with the most events, one picture each. Few: the event log
# keeps every materialization's metadata (a picture is about 2 kB), and the table in ``funnel`` lists 50 campaigns.
MAX_FUNNEL_CHARTS = 5


def funnel_chart_markdown(conn: sa.Connection, day: date) -> str | None:
    """One day's first-party funnels as Markdown images (``data:`` SVG), None on a day without first-party rows.

    Dagster 1.13.27's UI renders a ``data:`` image in Markdown metadata (its sanitizer allows the scheme for
    ``src``): inline under 1000 characters, else behind "Show Markdown". An SVG in an image runs no script and
    loads nothing; the names in it are escaped as on the page.
    """
    events, funnels = day_funnels(conn, day, MAX_FUNNEL_CHARTS)
    if not funnels:
        return None
    shown = f"{len(events)}" if len(funnels) == len(events) else f"the {len(funnels)} of {len(events)}"
    parts = [
        f"**First-party funnels of {day} (UTC)**: {shown} campaigns, most events first; unique actors (dark) and "
        "events (light) per stage."
    ]
    for campaign_id, steps in funnels.items():
        image = base64.b64encode(funnel_svg(steps).encode()).decode("ascii")
        parts += [f"**{md_cell(campaign_id)}**", f"![funnel](data:image/svg+xml;base64,{image})"]
    return "\n\n".join(parts)


# --- each source's days -----------------------------------------------------------------------------------


def _trend_section(source: str, totals: dict[date, int | None]) -> list[str]:
    count = SOURCE_COUNT_NOUNS.get(source, "count")
    heading = f"<h2>{shown(source)}: {count} per day</h2>"
    if not totals:
        return [heading, "<p>No days in the range.</p>"]
    rows = [[str(day), NOT_ROLLED_UP if n is None else str(n)] for day, n in totals.items()]
    table = _table(["day", count], rows, f"daily {shown(source)}")
    note = "<p>A grey mark under the axis instead of a bar: a day never rolled up (no number known).</p>"
    return [
        heading,
        *([note] if None in totals.values() else []),
        f"<figure>{trend_svg(source, totals)}</figure>",
        table,
    ]


def trend_svg(source: str, totals: dict[date, int | None]) -> str:
    """One bar per day; a day never rolled up has no bar and a grey mark under the axis."""
    days = list(totals)
    width = max(CHART_WIDTH, 60 + len(days) * MIN_BAR_WIDTH)
    step = (width - 60) / len(days)
    top = max([1, *(n for n in totals.values() if n is not None)])
    base = TREND_HEIGHT - 24
    shapes = [
        f'<line x1="50" y1="{base}" x2="{width - 10}" y2="{base}" stroke="#888"/>',
        f'<text x="46" y="14" text-anchor="end">{top}</text>',
        f'<text x="46" y="{base}" text-anchor="end">0</text>',
        f'<text x="50" y="{TREND_HEIGHT - 6}">{days[0]}</text>',
        f'<text x="{width - 10}" y="{TREND_HEIGHT - 6}" text-anchor="end">{days[-1]}</text>',
    ]
    for n, (day, value) in enumerate(totals.items()):
        x = 50 + n * step
        if value is None:
            shapes.append(_bar(x, base + 2, max(step - 1, 1), 4, "#bbb", f"{day}: {NOT_ROLLED_UP}"))
        else:
            height = (base - 10) * value / top
            shapes.append(_bar(x, base - height, max(step - 1, 1), height, ACTORS_COLOUR, f"{day}: {value}"))
    return _svg(width, TREND_HEIGHT, f"{visible_cell(source)}: daily totals", shapes)


# --- SVG and table pieces ---------------------------------------------------------------------------------


def _svg(width: float, height: float, title: str, shapes: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" role="img" '
        f'font-size="12" font-family="sans-serif"><title>{html.escape(title)}</title>{"".join(shapes)}</svg>'
    )


def _bar(x: float, y: float, width: float, height: float, colour: str, tooltip: str | None = None) -> str:
    inner = f"<title>{html.escape(tooltip)}</title>" if tooltip else ""
    return f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{height:.1f}" fill="{colour}">{inner}</rect>'


def _clipped(text: str, limit: int = 28) -> str:
    # A long stage name would run into its bar; the table beneath has it whole.
    seen = visible_cell(text)
    return html.escape(seen if len(seen) <= limit else seen[: limit - 1] + "…")


def _table(header: list[str], rows: list[list[str]], caption: str) -> str:
    """A plain table of already-escaped cells; numbers (every column after the first) right-aligned."""
    head = "".join(f'<th scope="col">{h}</th>' for h in header)
    body = "".join(
        "<tr>" + "".join(f'<td class="n">{c}</td>' if i else f"<td>{c}</td>" for i, c in enumerate(row)) + "</tr>"
        for row in rows
    )
    return f"<table><caption>{caption}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
