"""The report as text: a table for the terminal, one CSV with a section column, or JSON; one day's funnel as Markdown.

Unique actors show ``~`` before an estimate and funnel ratios as percentages, alike in every form.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, replace
from datetime import date
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.measurement.report.build import day_funnels
from marketing_pipelines.measurement.report.model import MeasurementReport
from marketing_pipelines.measurement.rollup.daily import FIRST_PARTY
from marketing_pipelines.redact import spreadsheet_safe, unlinkable, visible_cell, visible_controls

FORMATS = ("table", "csv", "json")
CSV_COLUMNS = (
    "section",
    "day",
    "source",
    "stage",
    "event_type",
    "raw_count",
    "unique_actors",
    "unique_actors_exact",
    "from_previous",
    "from_first",
)


def report_as_dict(report: MeasurementReport) -> dict[str, Any]:
    """The report as JSON-ready data: days as ISO strings, every row an object."""
    # asdict alone would keep the daily points as named tuples, which JSON writes as arrays.
    data = {**asdict(replace(report, daily=())), "daily": [point._asdict() for point in report.daily]}
    return json.loads(json.dumps(data, default=str))


def render(report: MeasurementReport, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report_as_dict(report), indent=2)
    if fmt == "csv":
        return render_csv(report)
    if fmt == "table":
        return render_table(report)
    raise InvalidInput(f"format {fmt!r} is not one of {', '.join(FORMATS)}")


def render_csv(report: MeasurementReport) -> str:
    """One CSV with a ``section`` column (total, daily, funnel), so a spreadsheet filter splits it.

    Stages, event types and sources come from loaded events, anyone's text: each is written by
    ``spreadsheet_safe``, so ``=HYPERLINK(...)`` stays text in a spreadsheet and ESC stays visible.
    """
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for t in report.totals:
        writer.writerow({"section": "total", **_without(asdict(t))})
    for d in report.daily:
        writer.writerow({"section": "daily", **_without(d._asdict())})
    for f in report.funnel:
        writer.writerow({"section": "funnel", "source": FIRST_PARTY, **_without(asdict(f))})
    return out.getvalue()


def _without(row: dict[str, Any]) -> dict[str, Any]:
    # Only str values are neutralised: a count or a ratio is an int or float, and a negative number must
    # stay a number a spreadsheet sums, not the text "'-3".
    return {k: ("" if v is None else spreadsheet_safe(v) if isinstance(v, str) else v) for k, v in row.items()}


def render_table(report: MeasurementReport) -> str:
    span = f"{report.start} .. {report.end}" if report.start else "no rolled-up days"
    lines = [f"Campaign {visible_cell(report.campaign_id)}, {span} (UTC days)", ""]
    if not report.daily:
        lines += _days_left_out(report) or [
            "No rollup rows of this campaign on any rolled-up day."
            if report.days_built
            else "No day has been rolled up yet: materialize measurement_daily_rollup (marketing-pipelines backfill)."
        ]
        return "\n".join(lines)
    lines += ["Totals (~ marks unique actors estimated from HLL sketches)"]
    lines += _table(
        ["source", "stage", "event_type", "raw_count", "unique_actors"],
        [
            [t.source, t.stage, t.event_type, t.raw_count, format_unique(t.unique_actors, t.unique_actors_exact)]
            for t in report.totals
        ],
    )
    lines += ["", "Funnel (first-party stages)"]
    lines += _table(
        ["stage", "unique_actors", "raw_count", "from_previous", "from_first"],
        [
            [
                f.stage,
                format_unique(f.unique_actors, f.unique_actors_exact),
                f.raw_count,
                format_pct(f.from_previous),
                format_pct(f.from_first),
            ]
            for f in report.funnel
        ],
    )
    lines += ["", "Daily"]
    lines += _table(
        ["day", "source", "stage", "event_type", "raw_count", "unique_actors"],
        [
            [d.day, d.source, d.stage, d.event_type, d.raw_count, format_unique(d.unique_actors, True)]
            for d in report.daily
        ],
    )
    left_out = _days_left_out(report)
    return "\n".join([*lines, *([""] if left_out else []), *left_out])


def _spans(spans: tuple[tuple[date, date], ...]) -> str:
    return ", ".join(str(first) if first == last else f"{first}..{last}" for first, last in spans)


def _days_left_out(report: MeasurementReport) -> list[str]:
    """What the report says of the range's days without a row of the campaign: built with nothing, or never built."""
    lines = []
    if report.built_without_rows:
        lines.append(f"Rolled up, nothing of this campaign (counts are 0): {_spans(report.built_without_rows)}")
    if report.not_built:
        lines.append(
            f"Never rolled up: {_spans(report.not_built)}: materialize measurement_daily_rollup for these days "
            "(marketing-pipelines backfill --from ... --to ...)."
        )
    return lines


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    # Stages, event types and sources are loaded text: their controls, tabs and line breaks are written
    # visibly, as in every CLI table, so a stage name cannot add a row.
    cells = [header, *[[visible_cell(str(c)) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    numeric = {
        i for i in range(len(header)) if header[i] in ("raw_count", "unique_actors", "from_previous", "from_first")
    }
    return [
        "  ".join(c.rjust(widths[i]) if i in numeric else c.ljust(widths[i]) for i, c in enumerate(row)).rstrip()
        for row in cells
    ]


def format_unique(value: int | None, exact: bool) -> str:
    """Unique actors as shown: ``~`` before an estimate, ``unknown`` when there is no sketch."""
    if value is None:
        return "unknown"
    return str(value) if exact else f"~{value}"


def format_pct(value: float | None) -> str:
    """A funnel ratio as a percentage with one decimal, ``-`` when there is none."""
    return "-" if value is None else f"{value * 100:.1f}%"


# --- the day's funnel as Markdown ------------------------------------------------------------------------

# funnel_markdown lists the largest campaigns of the day; metadata stays readable and small.
MAX_FUNNEL_CAMPAIGNS = 50


def funnel_markdown(conn: sa.Connection, day: date) -> str:
    """The first-party funnel of every campaign on one UTC day, as a Markdown table for ``dg.MetadataValue.md``.

    Computed from the day's rollup rows with the report's own funnel (``funnel_steps``: stage sizes, stages by
    unique actors, largest first). A stage with several event types takes the union of their sketches,
    marked ``~`` as an estimate. At most MAX_FUNNEL_CAMPAIGNS campaigns, those with the most events first;
    the rest are counted in one closing line.
    """
    events, funnels = day_funnels(conn, day, MAX_FUNNEL_CAMPAIGNS)
    if not events:
        return f"No first-party rollup rows on {day} (UTC)."
    rest = set(events) - set(funnels)
    lines = [
        f"**First-party funnel of {day} (UTC)**: {len(events)} campaigns, most events first; "
        "`~` marks unique actors estimated from HLL sketches.",
        "",
        "| campaign | stage | events | unique actors | from previous stage |",
        "|---|---|---:|---:|---:|",
    ]
    for campaign_id, steps in funnels.items():
        for step in steps:
            cells = [
                md_cell(campaign_id),
                md_cell(step.stage),
                str(step.raw_count),
                format_unique(step.unique_actors, step.unique_actors_exact),
                format_pct(step.from_previous),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    if rest:
        lines += ["", f"… and {len(rest)} more campaigns ({sum(events[cid] for cid in rest)} events)."]
    return "\n".join(lines)


# "&" too: a character reference ("&#46;", "&colon;") would put back what ``unlinkable`` took out.
_MARKDOWN_SPECIAL = str.maketrans({c: f"\\{c}" for c in "\\|`*_[]<>#~&"})


def md_cell(text: str) -> str:
    # Stage and campaign names come from event files: keep them from breaking the table, adding markup or
    # becoming a link (``unlinkable``: the UI's Markdown autolinks "www.", URLs and e-mail addresses), and their
    # control characters visible (written \\xNN before the escaping, so the backslash shows too).
    return unlinkable(visible_controls(" ".join(text.split()))).translate(_MARKDOWN_SPECIAL)
