"""The campaign measurement report, read from ``measurement_daily_rollup`` only (never the raw events).

Counts over a range are sums of daily counts. Unique actors over a range are the union of the
rows' HLL sketches: an estimate (about 1.6 % standard error, exact for a few hundred actors),
marked ``unique_actors_exact=False`` whenever it merges more than one row.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from datetime import date
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.db.campaigns import InvalidInput, require_campaign
from marketing_pipelines.db.schema import measurement_daily_rollup
from marketing_pipelines.measurement import sketches
from marketing_pipelines.measurement.rollup import FIRST_PARTY

FORMATS = ("table", "csv", "json")


@dataclass(frozen=True)
class RangeTotal:
    """One (source, stage, event type) over the whole range."""

    source: str
    stage: str
    event_type: str
    raw_count: int
    unique_actors: int | None
    unique_actors_exact: bool


@dataclass(frozen=True)
class DailyPoint:
    """One (day, source, stage, event type) as rolled up; its unique_actors is exact."""

    day: date
    source: str
    stage: str
    event_type: str
    raw_count: int
    unique_actors: int | None


@dataclass(frozen=True)
class FunnelStep:
    """Distinct actors of one first-party stage over the range, and the ratio to the previous and first step.

    Stage sizes, not a cohort: an actor counts in every stage they reached, whether or not they
    were seen in the previous one (following actors across stages needs the raw events).
    """

    stage: str
    unique_actors: int
    unique_actors_exact: bool
    raw_count: int
    from_previous: float | None
    from_first: float | None


@dataclass(frozen=True)
class MeasurementReport:
    campaign_id: str
    start: date | None
    end: date | None
    totals: tuple[RangeTotal, ...]
    daily: tuple[DailyPoint, ...]
    funnel: tuple[FunnelStep, ...]


def parse_day(value: str, option: str) -> date:
    try:
        return date.fromisoformat(value.strip())
    except ValueError:
        raise InvalidInput(f"{option} {value!r} is not a day like 2026-11-26") from None


def measurement_report(
    conn: sa.Connection,
    campaign_id: str,
    start: date | None = None,
    end: date | None = None,
    stage_order: list[str] | None = None,
) -> MeasurementReport:
    """Totals per stage and event type, a daily series and the stage funnel of one campaign over [start, end].

    Without ``start``/``end`` the range is every rolled-up day of the campaign. The funnel follows
    ``stage_order`` when given, else stages by unique actors, largest first.
    """
    require_campaign(conn, campaign_id)
    if start and end and start > end:
        raise InvalidInput(f"--from {start} is after --to {end}")
    r = measurement_daily_rollup
    query = (
        sa.select(r.c.day, r.c.source, r.c.stage, r.c.event_type, r.c.raw_count, r.c.unique_actors, r.c.actors_hll)
        .where(r.c.campaign_id == campaign_id)
        .order_by(r.c.day, r.c.source, r.c.stage, r.c.event_type)
    )
    if start:
        query = query.where(r.c.day >= start)
    if end:
        query = query.where(r.c.day <= end)
    rows = conn.execute(query).all()

    daily = tuple(
        DailyPoint(row.day, row.source, row.stage, row.event_type, row.raw_count, row.unique_actors) for row in rows
    )
    groups: dict[tuple[str, str, str], list[sa.Row[Any]]] = defaultdict(list)
    for row in rows:
        groups[(row.source, row.stage, row.event_type)].append(row)
    # Each row's sketch is deserialized once, into its group's union; the funnel then unions the
    # few group sketches of a stage instead of every row's sketch again.
    unions = {key: _union(members) for key, members in groups.items()}
    totals = tuple(_range_total(key, members, unions[key]) for key, members in sorted(groups.items()))

    stages: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for key in groups:
        if key[0] == FIRST_PARTY:
            stages[key[1]].append(key)
    return MeasurementReport(
        campaign_id=campaign_id,
        start=start or (rows[0].day if rows else None),
        end=end or (rows[-1].day if rows else None),
        totals=totals,
        daily=daily,
        funnel=_funnel(stages, groups, unions, stage_order),
    )


def _union(members: list[sa.Row[Any]]) -> sketches.datasketches.hll_sketch | None:
    """The union of a group's daily sketches, or None when some day's uniques are unknown."""
    if any(m.unique_actors is None for m in members):
        return None
    return sketches.merge(m.actors_hll for m in members)


def _uniques(members: list[sa.Row[Any]], union: sketches.datasketches.hll_sketch | None) -> tuple[int | None, bool]:
    if union is None:
        return None, False
    if len(members) == 1:
        return members[0].unique_actors, True
    return sketches.estimate(union), False


def _range_total(
    key: tuple[str, str, str], members: list[sa.Row[Any]], union: sketches.datasketches.hll_sketch | None
) -> RangeTotal:
    unique, exact = _uniques(members, union)
    return RangeTotal(
        *key, raw_count=sum(m.raw_count for m in members), unique_actors=unique, unique_actors_exact=exact
    )


def _funnel(
    stages: dict[str, list[tuple[str, str, str]]],
    groups: dict[tuple[str, str, str], list[sa.Row[Any]]],
    unions: dict[tuple[str, str, str], sketches.datasketches.hll_sketch | None],
    stage_order: list[str] | None,
) -> tuple[FunnelStep, ...]:
    sized: dict[str, tuple[int, bool, int]] = {}
    for stage, keys in stages.items():
        members = [m for key in keys for m in groups[key]]
        parts = [unions[key] for key in keys]
        union = None if any(p is None for p in parts) else sketches.union_of(p for p in parts if p is not None)
        unique, exact = _uniques(members, union)
        sized[stage] = (unique or 0, exact, sum(m.raw_count for m in members))
    order = stage_order or sorted(sized, key=lambda s: (-sized[s][0], -sized[s][2], s))
    steps: list[FunnelStep] = []
    for stage in order:
        unique, exact, raw = sized.get(stage, (0, True, 0))
        first = steps[0].unique_actors if steps else None
        previous = steps[-1].unique_actors if steps else None
        steps.append(
            FunnelStep(
                stage=stage,
                unique_actors=unique,
                unique_actors_exact=exact,
                raw_count=raw,
                from_previous=_ratio(unique, previous),
                from_first=_ratio(unique, first),
            )
        )
    return tuple(steps)


def _ratio(part: int, whole: int | None) -> float | None:
    if whole is None or whole == 0:
        return None
    return round(part / whole, 4)


# --- rendering ----------------------------------------------------------------------------------------

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
    return json.loads(json.dumps(asdict(report), default=str))


def render(report: MeasurementReport, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report_as_dict(report), indent=2)
    if fmt == "csv":
        return render_csv(report)
    if fmt == "table":
        return render_table(report)
    raise InvalidInput(f"format {fmt!r} is not one of {', '.join(FORMATS)}")


def render_csv(report: MeasurementReport) -> str:
    """One CSV with a ``section`` column (total, daily, funnel), so a spreadsheet filter splits it."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for t in report.totals:
        writer.writerow({"section": "total", **_without(asdict(t))})
    for d in report.daily:
        writer.writerow({"section": "daily", **_without(asdict(d))})
    for f in report.funnel:
        writer.writerow({"section": "funnel", "source": FIRST_PARTY, **_without(asdict(f))})
    return out.getvalue()


def _without(row: dict[str, Any]) -> dict[str, Any]:
    return {k: ("" if v is None else v) for k, v in row.items()}


def render_table(report: MeasurementReport) -> str:
    span = f"{report.start} .. {report.end}" if report.start else "no rolled-up days"
    lines = [f"Campaign {report.campaign_id}, {span} (UTC days)", ""]
    if not report.daily:
        lines.append("No rollup rows in this range: materialize measurement_daily_rollup for these days.")
        return "\n".join(lines)
    lines += ["Totals (~ marks unique actors estimated from HLL sketches)"]
    lines += _table(
        ["source", "stage", "event_type", "raw_count", "unique_actors"],
        [
            [t.source, t.stage, t.event_type, t.raw_count, _unique(t.unique_actors, t.unique_actors_exact)]
            for t in report.totals
        ],
    )
    lines += ["", "Funnel (first-party stages)"]
    lines += _table(
        ["stage", "unique_actors", "raw_count", "from_previous", "from_first"],
        [
            [
                f.stage,
                _unique(f.unique_actors, f.unique_actors_exact),
                f.raw_count,
                _pct(f.from_previous),
                _pct(f.from_first),
            ]
            for f in report.funnel
        ],
    )
    lines += ["", "Daily"]
    lines += _table(
        ["day", "source", "stage", "event_type", "raw_count", "unique_actors"],
        [[d.day, d.source, d.stage, d.event_type, d.raw_count, _unique(d.unique_actors, True)] for d in report.daily],
    )
    return "\n".join(lines)


def _unique(value: int | None, exact: bool) -> str:
    if value is None:
        return "unknown"
    return str(value) if exact else f"~{value}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    cells = [header, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    numeric = {
        i for i in range(len(header)) if header[i] in ("raw_count", "unique_actors", "from_previous", "from_first")
    }
    return [
        "  ".join(c.rjust(widths[i]) if i in numeric else c.ljust(widths[i]) for i, c in enumerate(row)).rstrip()
        for row in cells
    ]
