"""The report as text: a table for the terminal, one CSV with a section column, or JSON."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, replace
from typing import Any

from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.measurement.funnel import format_pct, format_unique
from marketing_pipelines.measurement.report.model import MeasurementReport
from marketing_pipelines.measurement.rollup import FIRST_PARTY
from marketing_pipelines.redact import spreadsheet_safe, visible_controls

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
    lines = [f"Campaign {visible_controls(report.campaign_id)}, {span} (UTC days)", ""]
    if not report.daily:
        lines.append("No rollup rows in this range: materialize measurement_daily_rollup for these days.")
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
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    # Stages, event types and sources are loaded text: their controls are written visibly, as in every CLI table.
    cells = [header, *[[visible_controls(str(c)) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    numeric = {
        i for i in range(len(header)) if header[i] in ("raw_count", "unique_actors", "from_previous", "from_first")
    }
    return [
        "  ".join(c.rjust(widths[i]) if i in numeric else c.ljust(widths[i]) for i, c in enumerate(row)).rstrip()
        for row in cells
    ]
