"""The campaign measurement report, read from ``measurement_daily_rollup`` only (never the raw events).

Counts over a range are sums of daily counts. Unique actors over a range are the union of the
rows' HLL sketches: an estimate (about 1.6 % standard error, exact for a few hundred actors),
marked ``unique_actors_exact=False`` whenever it merges more than one row. Whole weeks of the range
are merged from ``measurement_weekly_sketch`` (one sketch instead of seven) while their fingerprint
matches the daily rows, which keeps a long range's latency bounded by weeks, not days.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from datetime import date, timedelta
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.db.campaigns import InvalidInput, require_campaign
from marketing_pipelines.db.schema import measurement_daily_rollup, measurement_weekly_sketch
from marketing_pipelines.measurement import sketches
from marketing_pipelines.measurement.rollup import FIRST_PARTY, week_start, week_start_sql

FORMATS = ("table", "csv", "json")
Key = tuple[str, str, str]  # source, stage, event_type


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
    span = whole_week_span(start, end)
    # Days outside the whole weeks can only be merged from their daily sketch: read it with the row.
    edge = sa.or_(
        *([r.c.day < span[0]] if span[0] else []),
        *([r.c.day > span[1]] if span[1] else []),
        sa.false(),
    )
    query = (
        sa.select(
            r.c.day,
            r.c.source,
            r.c.stage,
            r.c.event_type,
            r.c.raw_count,
            r.c.unique_actors,
            sa.case((edge, r.c.actors_hll), else_=sa.null()).label("edge_hll"),
        )
        .where(r.c.campaign_id == campaign_id)
        .order_by(r.c.day, r.c.source, r.c.stage, r.c.event_type)
    )
    if start:
        query = query.where(r.c.day >= start)
    if end:
        query = query.where(r.c.day <= end)
    rows = conn.execute(query).all()

    daily: list[DailyPoint] = []
    groups: dict[Key, list[sa.Row[Any]]] = defaultdict(list)
    for row in rows:
        day, source, stage, event_type, raw_count, unique_actors, _ = row
        daily.append(DailyPoint(day, source, stage, event_type, raw_count, unique_actors))
        groups[(source, stage, event_type)].append(row)
    parts = range_sketches(conn, campaign_id, groups, start, end, span)
    unions = {key: _union(members, parts[key]) for key, members in groups.items()}
    totals = tuple(_range_total(key, members, unions[key]) for key, members in sorted(groups.items()))

    stages: dict[str, list[Key]] = defaultdict(list)
    for key in groups:
        if key[0] == FIRST_PARTY:
            stages[key[1]].append(key)
    return MeasurementReport(
        campaign_id=campaign_id,
        start=start or (rows[0].day if rows else None),
        end=end or (rows[-1].day if rows else None),
        totals=totals,
        daily=tuple(daily),
        funnel=_funnel(stages, groups, unions, stage_order),
    )


@dataclass(frozen=True)
class SketchPlan:
    """Which sketches make up each key's range union: weekly rows where they are whole and fresh, else daily rows."""

    weeks: dict[Key, list[date]]  # week_start of each weekly sketch to use
    days: dict[Key, list[date]]  # days whose daily sketch to use


def plan_sketches(groups: dict[Key, list[sa.Row[Any]]], fresh_weeks: set[tuple[date, Key]]) -> SketchPlan:
    """Use a week's weekly sketch where ``fresh_weeks`` has it, the daily sketches of every other day."""
    weeks: dict[Key, list[date]] = defaultdict(list)
    days: dict[Key, list[date]] = defaultdict(list)
    monday_of: dict[date, date] = {}
    for key, members in groups.items():
        if any(m.unique_actors is None for m in members):
            continue  # the union is unknown anyway; no sketch is read
        for m in members:
            monday = monday_of.get(m.day)
            if monday is None:
                monday = monday_of[m.day] = week_start(m.day)
            if (monday, key) not in fresh_weeks:
                days[key].append(m.day)
            elif not weeks[key] or weeks[key][-1] != monday:  # members come in day order
                weeks[key].append(monday)
    return SketchPlan(weeks={k: v for k, v in weeks.items() if v}, days=dict(days))


def fresh_weekly_sketches(
    conn: sa.Connection, campaign_id: str, start: date | None, end: date | None
) -> dict[tuple[date, Key], bytes | None]:
    """Weekly sketches of the weeks wholly inside [start, end] whose fingerprint matches the daily rows now.

    The fingerprint (rows, summed raw_count, latest rolled_up_at) is recomputed from the daily rollup
    here: a day rebuilt or added after its week was refreshed makes the week stale, and a stale week
    is not returned, so the report uses that week's daily sketches instead. Two small reads compared
    in Python rather than one join: the join's plan depended on fresh table statistics (a nested loop
    re-aggregating per weekly row took 100 ms right after a backfill), these two plans do not.
    """
    w, d = measurement_weekly_sketch, measurement_daily_rollup
    monday = week_start_sql(d.c.day, conn.dialect)
    current_query = (
        sa.select(
            monday,
            d.c.source,
            d.c.stage,
            d.c.event_type,
            sa.func.count(),
            sa.func.sum(d.c.raw_count),
            sa.func.max(d.c.rolled_up_at),
        )
        .where(d.c.campaign_id == campaign_id)
        .group_by(monday, d.c.source, d.c.stage, d.c.event_type)
    )
    weekly_query = sa.select(
        w.c.week_start,
        w.c.source,
        w.c.stage,
        w.c.event_type,
        w.c.days,
        w.c.raw_count,
        w.c.daily_rolled_up_at,
        w.c.actors_hll,
    ).where(w.c.campaign_id == campaign_id)
    if start:
        current_query = current_query.where(d.c.day >= start)
        weekly_query = weekly_query.where(w.c.week_start >= start)
    if end:
        current_query = current_query.where(d.c.day <= end)
        weekly_query = weekly_query.where(w.c.week_start <= end - timedelta(days=6))
    weekly = conn.execute(weekly_query).all()
    if not weekly:
        return {}
    current = {tuple(row[:4]): (row[4], row[5], row[6]) for row in conn.execute(current_query)}
    return {
        (row[0], (row[1], row[2], row[3])): row[7]
        for row in weekly
        if current.get(tuple(row[:4])) == (row[4], row[5], row[6])
    }


def whole_week_span(start: date | None, end: date | None) -> tuple[date | None, date | None]:
    """The first Monday and last Sunday of the whole ISO weeks in [start, end] (None: unbounded)."""
    first = start + timedelta(days=(7 - start.weekday()) % 7) if start else None
    last = end - timedelta(days=(end.weekday() + 1) % 7) if end else None
    return first, last


def range_sketches(
    conn: sa.Connection,
    campaign_id: str,
    groups: dict[Key, list[sa.Row[Any]]],
    start: date | None,
    end: date | None,
    span: tuple[date | None, date | None],
) -> dict[Key, list[bytes | None]]:
    """The serialized sketches whose union is each key's range uniques.

    Whole fresh weeks come from measurement_weekly_sketch, days outside whole weeks from their rows
    (``edge_hll``, read with them), and only the days of stale weeks take one more read. ``span`` is
    ``whole_week_span(start, end)``, which also chose the edge days the rows carry sketches for.
    """
    weekly = fresh_weekly_sketches(conn, campaign_id, start, end)
    plan = plan_sketches(groups, set(weekly))
    first, last = span
    parts: dict[Key, list[bytes | None]] = defaultdict(list)
    for key, mondays in plan.weeks.items():
        parts[key] += [weekly[(monday, key)] for monday in mondays]
    stale: set[tuple[date, Key]] = set()
    for key, days in plan.days.items():
        wanted = set(days)
        for m in groups[key]:
            if m.day not in wanted:
                continue
            if (first and m.day < first) or (last and m.day > last):
                parts[key].append(m.edge_hll)
            else:
                stale.add((m.day, key))
    if stale:
        r = measurement_daily_rollup
        query = sa.select(r.c.day, r.c.source, r.c.stage, r.c.event_type, r.c.actors_hll).where(
            r.c.campaign_id == campaign_id, r.c.day.in_(sorted({day for day, _ in stale}))
        )
        for row in conn.execute(query):
            key = (row.source, row.stage, row.event_type)
            if (row.day, key) in stale:
                parts[key].append(row.actors_hll)
    return parts


def _union(members: list[sa.Row[Any]], parts: list[bytes | None]) -> sketches.datasketches.hll_sketch | None:
    """The union of a key's range sketches, or None when some day's uniques are unknown."""
    if any(m.unique_actors is None for m in members):
        return None
    return sketches.merge(parts)


def _uniques(members: list[sa.Row[Any]], union: sketches.datasketches.hll_sketch | None) -> tuple[int | None, bool]:
    if union is None:
        return None, False
    if len(members) == 1:
        return members[0].unique_actors, True
    return sketches.estimate(union), False


def _range_total(key: Key, members: list[sa.Row[Any]], union: sketches.datasketches.hll_sketch | None) -> RangeTotal:
    unique, exact = _uniques(members, union)
    return RangeTotal(
        *key, raw_count=sum(m.raw_count for m in members), unique_actors=unique, unique_actors_exact=exact
    )


def _funnel(
    stages: dict[str, list[Key]],
    groups: dict[Key, list[sa.Row[Any]]],
    unions: dict[Key, sketches.datasketches.hll_sketch | None],
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
