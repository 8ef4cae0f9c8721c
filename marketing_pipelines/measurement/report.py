"""The campaign measurement report, read from ``measurement_daily_rollup`` only (never the raw events).

Counts over a range are sums of daily counts. Unique actors over a range are the union of the
rows' HLL sketches: an estimate (about 1.6 % standard error, exact for a few hundred actors),
marked ``unique_actors_exact=False`` whenever it merges more than one row. Whole weeks of the range
are merged from ``measurement_weekly_sketch`` (one sketch instead of seven) while their fingerprint
matches the daily rows, which keeps a long range's latency bounded by weeks, not days.

The report is read in at most three statements whatever the range: the daily rows (with the
sketches of the days outside whole weeks), the weekly sketches, and only when some week is stale the
daily sketches of that week. Each daily row is touched once in Python, where it is also summed into
its key's range and its week's fingerprint; docs/PERFORMANCE.md has the measured costs.
"""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from collections.abc import Container
from dataclasses import asdict, dataclass, field, replace
from datetime import date, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

import sqlalchemy as sa

from marketing_pipelines.db.campaigns import require_campaign
from marketing_pipelines.db.fetch import fetch_tuples
from marketing_pipelines.db.schema import measurement_daily_rollup, measurement_weekly_sketch
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.measurement import sketches
from marketing_pipelines.measurement.rollup import FIRST_PARTY, week_start

if TYPE_CHECKING:
    from marketing_pipelines.measurement.frames import ReportFrames

FORMATS = ("table", "csv", "json")
Key = tuple[str, str, str]  # source, stage, event_type
Sketch = sketches.datasketches.hll_sketch
Blob = bytes | memoryview  # psycopg2 returns bytea as a memoryview


@dataclass(frozen=True)
class RangeTotal:
    """One (source, stage, event type) over the whole range."""

    source: str
    stage: str
    event_type: str
    raw_count: int
    unique_actors: int | None
    unique_actors_exact: bool


class DailyPoint(NamedTuple):
    """One (day, source, stage, event type) as rolled up; its unique_actors is exact.

    A named tuple, not a frozen dataclass: a 90-day series of a busy campaign has thousands of
    points, and a frozen dataclass costs ten times as much to build (docs/PERFORMANCE.md).
    """

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

    def to_frames(self) -> ReportFrames:
        """The totals, daily points and funnel as pandas DataFrames (measurement/frames.py has the dtypes)."""
        # Imported here: frames.py imports this module, and the CLI's report need not load pandas.
        from marketing_pipelines.measurement.frames import report_frames

        return report_frames(self)


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
    daily, ranges = read_days(conn, campaign_id, start, end)
    parts = range_sketches(conn, campaign_id, ranges, start, end)
    unions = {key: None if kr.unknown else sketches.merge(parts[key]) for key, kr in ranges.items()}
    totals = tuple(_range_total(key, ranges[key], unions[key]) for key in sorted(ranges))
    stages: dict[str, list[Key]] = defaultdict(list)
    for key in ranges:
        if key[0] == FIRST_PARTY:
            stages[key[1]].append(key)
    return MeasurementReport(
        campaign_id=campaign_id,
        start=start or (daily[0].day if daily else None),
        end=end or (daily[-1].day if daily else None),
        totals=totals,
        daily=tuple(daily),
        funnel=_funnel(stages, ranges, unions, stage_order),
    )


@dataclass(slots=True)
class WeekSums:
    """One key's daily rows of one whole week as they stand now: the fingerprint its weekly row must match."""

    rows: int
    raw_count: int
    rolled_up_at: Any  # latest, as ``instant_sql`` reads it
    days: list[date]

    def matches(self, days: int, raw_count: int, daily_rolled_up_at: Any) -> bool:
        """Whether a weekly row built from (days, raw_count, daily_rolled_up_at) still holds these days."""
        return self.rows == days and self.raw_count == raw_count and self.rolled_up_at == daily_rolled_up_at


@dataclass(slots=True)
class KeyRange:
    """One key's daily rows over the range, summed while they are read."""

    raw_count: int = 0
    days: int = 0
    last_unique: int | None = None  # the uniques of the latest day: exact for the range when days == 1
    unknown: bool = False  # some day's uniques are unknown (no sketch), so the range's are too
    edge_sketches: list[Blob | None] = field(default_factory=list)  # days outside the range's whole weeks
    weeks: dict[date, WeekSums] = field(default_factory=dict)  # by Monday, whole weeks only


def whole_week_span(start: date | None, end: date | None) -> tuple[date | None, date | None]:
    """The first Monday and last Sunday of the whole ISO weeks in [start, end] (None: unbounded)."""
    first = start + timedelta(days=(7 - start.weekday()) % 7) if start else None
    last = end - timedelta(days=(end.weekday() + 1) % 7) if end else None
    return first, last


def instant_sql(column: sa.ColumnElement[Any], dialect: sa.Dialect) -> sa.ColumnElement[Any]:
    """A timestamp column as a value that compares and orders like it but costs nothing to fetch.

    PostgreSQL: whole microseconds since the epoch (a bigint; psycopg2 builds an aware datetime per
    timestamptz, which took longer than the rest of the row). SQLite: the stored text, which is
    fixed-width UTC (``YYYY-MM-DD HH:MM:SS.ffffff``), so it orders as the instants do.
    """
    if dialect.name == "postgresql":
        return sa.cast(sa.extract("epoch", column) * 1_000_000, sa.BigInteger)
    return sa.type_coerce(column, sa.String)


def read_days(
    conn: sa.Connection, campaign_id: str, start: date | None, end: date | None
) -> tuple[list[DailyPoint], dict[Key, KeyRange]]:
    """The campaign's daily points over [start, end] in (day, source, stage, event type) order, and per key
    their range sums, weekly fingerprints and the sketches of the days outside whole weeks."""
    r = measurement_daily_rollup
    first, last = whole_week_span(start, end)
    # Days outside the whole weeks can only be merged from their daily sketch: read it with the row.
    edge = sa.or_(*([r.c.day < first] if first else []), *([r.c.day > last] if last else []), sa.false())
    query = sa.select(
        r.c.day,
        r.c.source,
        r.c.stage,
        r.c.event_type,
        r.c.raw_count,
        r.c.unique_actors,
        instant_sql(r.c.rolled_up_at, conn.dialect),
        sa.case((edge, r.c.actors_hll), else_=sa.null()),
    ).where(r.c.campaign_id == campaign_id)
    if start:
        query = query.where(r.c.day >= start)
    if end:
        query = query.where(r.c.day <= end)

    daily: list[DailyPoint] = []
    ranges: dict[Key, KeyRange] = {}
    mondays: dict[date, date | None] = {}  # None: an edge day
    for day, source, stage, event_type, raw_count, unique_actors, rolled_up_at, edge_hll in fetch_tuples(conn, query):
        daily.append(DailyPoint(day, source, stage, event_type, raw_count, unique_actors))
        key = (source, stage, event_type)
        kr = ranges.get(key)
        if kr is None:
            kr = ranges[key] = KeyRange()
        kr.raw_count += raw_count
        kr.days += 1
        kr.last_unique = unique_actors
        if unique_actors is None:
            kr.unknown = True
        if day in mondays:
            monday = mondays[day]
        else:
            inside = (first is None or day >= first) and (last is None or day <= last)
            monday = mondays[day] = week_start(day) if inside else None
        if monday is None:
            kr.edge_sketches.append(edge_hll)
            continue
        week = kr.weeks.get(monday)
        if week is None:
            kr.weeks[monday] = WeekSums(1, raw_count, rolled_up_at, [day])
        else:
            week.rows += 1
            week.raw_count += raw_count
            week.rolled_up_at = max(week.rolled_up_at, rolled_up_at)
            week.days.append(day)
    # Sorted here rather than in SQL: Python orders strings by code point on both databases, where
    # ORDER BY would follow the server's collation, and it is cheaper than the server's sort.
    daily.sort()
    return daily, ranges


def fresh_weekly_sketches(
    conn: sa.Connection, campaign_id: str, ranges: dict[Key, KeyRange], start: date | None, end: date | None
) -> dict[tuple[date, Key], Blob | None]:
    """Weekly sketches of the weeks wholly inside [start, end] whose fingerprint matches the daily rows now.

    The fingerprint (rows, summed raw_count, latest rolled_up_at) of each week as the daily rows
    stand now was summed by ``read_days``: a day rebuilt or added after its week was refreshed makes
    the week stale, and a stale week is not returned, so the report merges that week's daily
    sketches instead. Compared in Python: a join in SQL got a plan that depended on fresh table
    statistics (a nested loop re-aggregating per weekly row took 100 ms right after a backfill).
    """
    w = measurement_weekly_sketch
    query = sa.select(
        w.c.week_start,
        w.c.source,
        w.c.stage,
        w.c.event_type,
        w.c.days,
        w.c.raw_count,
        instant_sql(w.c.daily_rolled_up_at, conn.dialect),
        w.c.actors_hll,
    ).where(w.c.campaign_id == campaign_id)
    if start:
        query = query.where(w.c.week_start >= start)
    if end:
        query = query.where(w.c.week_start <= end - timedelta(days=6))
    fresh: dict[tuple[date, Key], Blob | None] = {}
    for monday, source, stage, event_type, days, raw_count, rolled_up_at, actors_hll in fetch_tuples(conn, query):
        key = (source, stage, event_type)
        kr = ranges.get(key)
        week = kr.weeks.get(monday) if kr else None
        if week is not None and week.matches(days, raw_count, rolled_up_at):
            fresh[(monday, key)] = actors_hll
    return fresh


@dataclass(frozen=True)
class SketchPlan:
    """Which sketches make up each key's range union: weekly rows where they are whole and fresh, else daily rows."""

    weeks: dict[Key, list[date]]  # week_start of each weekly sketch to use
    days: dict[Key, list[date]]  # days (inside whole weeks) whose daily sketch to use


def plan_sketches(ranges: dict[Key, KeyRange], fresh_weeks: Container[tuple[date, Key]]) -> SketchPlan:
    """Use a week's weekly sketch where ``fresh_weeks`` has it, the daily sketches of every other week's days.

    Edge days (outside whole weeks) are not planned: their sketches came with the daily rows.
    """
    weeks: dict[Key, list[date]] = {}
    days: dict[Key, list[date]] = {}
    for key, kr in ranges.items():
        if kr.unknown:
            continue  # the union is unknown anyway; no sketch is read
        for monday, week in kr.weeks.items():
            if (monday, key) in fresh_weeks:
                weeks.setdefault(key, []).append(monday)
            else:
                days.setdefault(key, []).extend(week.days)
    return SketchPlan(weeks=weeks, days=days)


def range_sketches(
    conn: sa.Connection, campaign_id: str, ranges: dict[Key, KeyRange], start: date | None, end: date | None
) -> dict[Key, list[Blob | None]]:
    """The serialized sketches whose union is each key's range uniques.

    Whole fresh weeks come from measurement_weekly_sketch, edge days from their rows (read with
    them by ``read_days``), and only the days of stale weeks take one more read.
    """
    weekly = fresh_weekly_sketches(conn, campaign_id, ranges, start, end)
    plan = plan_sketches(ranges, weekly)
    parts: dict[Key, list[Blob | None]] = {}
    for key, kr in ranges.items():
        if not kr.unknown:
            parts[key] = [*kr.edge_sketches, *(weekly[(monday, key)] for monday in plan.weeks.get(key, ()))]
    stale = {(day, key) for key, days in plan.days.items() for day in days}
    if stale:
        r = measurement_daily_rollup
        query = sa.select(r.c.day, r.c.source, r.c.stage, r.c.event_type, r.c.actors_hll).where(
            r.c.campaign_id == campaign_id, r.c.day.in_(sorted({day for day, _ in stale}))
        )
        for day, source, stage, event_type, actors_hll in fetch_tuples(conn, query):
            key = (source, stage, event_type)
            if (day, key) in stale:
                parts[key].append(actors_hll)
    return parts


def _uniques(days: int, last_unique: int | None, union: Sketch | None) -> tuple[int | None, bool]:
    if union is None:
        return None, False
    if days == 1:
        return last_unique, True
    return sketches.estimate(union), False


def _range_total(key: Key, kr: KeyRange, union: Sketch | None) -> RangeTotal:
    unique, exact = _uniques(kr.days, kr.last_unique, union)
    return RangeTotal(*key, raw_count=kr.raw_count, unique_actors=unique, unique_actors_exact=exact)


def _funnel(
    stages: dict[str, list[Key]],
    ranges: dict[Key, KeyRange],
    unions: dict[Key, Sketch | None],
    stage_order: list[str] | None,
) -> tuple[FunnelStep, ...]:
    sized: dict[str, tuple[int, bool, int]] = {}
    for stage, keys in stages.items():
        parts = [unions[key] for key in keys]
        union = None if any(p is None for p in parts) else sketches.union_of(p for p in parts if p is not None)
        days = sum(ranges[key].days for key in keys)
        unique, exact = _uniques(days, ranges[keys[0]].last_unique, union)
        sized[stage] = (unique or 0, exact, sum(ranges[key].raw_count for key in keys))
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
    """One CSV with a ``section`` column (total, daily, funnel), so a spreadsheet filter splits it."""
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
