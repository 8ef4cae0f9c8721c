"""``measurement_report``: one campaign's totals, daily series and funnel over a range, from the report's reads.

``funnel_steps`` sizes the first-party stages of a range (the report) or of one day (``day_funnels``, which the rollup
asset's ``rendering.funnel_markdown`` and ``charts.funnel_chart_markdown`` show).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, date, datetime, timedelta

import sqlalchemy as sa

from marketing_pipelines.db.campaigns import require_campaign
from marketing_pipelines.db.schema import measurement_rollup_day
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.measurement import sketches
from marketing_pipelines.measurement.report.model import DaySpan, FunnelStep, MeasurementReport, RangeTotal
from marketing_pipelines.measurement.report.reads import (
    Key,
    KeyRange,
    Sketch,
    first_party_events_by_campaign,
    first_party_rows_by_campaign,
    range_sketches,
    read_days,
)
from marketing_pipelines.measurement.rollup.daily import FIRST_PARTY


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
    first, last = start or (daily[0].day if daily else None), end or (daily[-1].day if daily else None)
    without_rows, not_built, days_built = _days_left_out(conn, first, last, {point.day for point in daily})
    return MeasurementReport(
        campaign_id=campaign_id,
        start=first,
        end=last,
        totals=totals,
        daily=tuple(daily),
        funnel=funnel_steps(stages, ranges, unions, stage_order),
        built_without_rows=without_rows,
        not_built=not_built,
        days_built=days_built,
    )


def _days_left_out(
    conn: sa.Connection, first: date | None, last: date | None, with_rows: set[date]
) -> tuple[tuple[DaySpan, ...], tuple[DaySpan, ...], int]:
    """The days of first..last (up to today, UTC) without a row of the campaign: those the rollup built (nothing of
    the campaign to count) and those it never built; and how many days it built at all."""
    built = measurement_rollup_day
    days_built = conn.execute(sa.select(sa.func.count()).select_from(built)).scalar_one()
    if first is None or last is None:
        return (), (), days_built
    last = min(last, datetime.now(UTC).date())
    built_days = set(conn.execute(sa.select(built.c.day).where(built.c.day >= first, built.c.day <= last)).scalars())
    days = [first + timedelta(days=n) for n in range((last - first).days + 1)]
    empty = [day for day in days if day not in with_rows and day in built_days]
    missing = [day for day in days if day not in with_rows and day not in built_days]
    return day_spans(empty), day_spans(missing), days_built


def day_spans(days: list[date]) -> tuple[DaySpan, ...]:
    """Sorted days as runs of consecutive days."""
    spans: list[DaySpan] = []
    for day in days:
        if spans and day == spans[-1][1] + timedelta(days=1):
            spans[-1] = (spans[-1][0], day)
        else:
            spans.append((day, day))
    return tuple(spans)


def _range_total(key: Key, kr: KeyRange, union: Sketch | None) -> RangeTotal:
    unique, exact = range_uniques(kr.days, kr.last_unique, union)
    return RangeTotal(*key, raw_count=kr.raw_count, unique_actors=unique, unique_actors_exact=exact)


def range_uniques(days: int, last_unique: int | None, union: Sketch | None) -> tuple[int | None, bool]:
    """(unique actors, exact) over ``days`` days: the day's own count for one day, else the union's estimate."""
    if union is None:
        return None, False
    if days == 1:
        return last_unique, True
    return sketches.estimate(union), False


def funnel_steps(
    stages: dict[str, list[Key]],
    ranges: dict[Key, KeyRange],
    unions: dict[Key, Sketch | None],
    stage_order: list[str] | None,
) -> tuple[FunnelStep, ...]:
    """The funnel of ``stages`` (stage: its keys), in ``stage_order`` or by unique actors, largest first.

    A stage with several keys takes the union of their sketches; a key without a sketch leaves the stage's
    uniques unknown, given as 0 and not exact.
    """
    sized: dict[str, tuple[int, bool, int]] = {}
    for stage, keys in stages.items():
        parts = [unions[key] for key in keys]
        union = None if any(p is None for p in parts) else sketches.union_of(p for p in parts if p is not None)
        days = sum(ranges[key].days for key in keys)
        unique, exact = range_uniques(days, ranges[keys[0]].last_unique, union)
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


def day_funnels(conn: sa.Connection, day: date, limit: int) -> tuple[dict[str, int], dict[str, tuple[FunnelStep, ...]]]:
    """The first-party events of each campaign on one UTC day, and the funnels of the ``limit`` campaigns with the
    most events, in that order (ties by id).

    Each funnel is ``funnel_steps`` of the day's rows: stages by unique actors, largest first; a stage with several
    event types takes the union of their sketches (an estimate, not exact).
    """
    events = first_party_events_by_campaign(conn, day)
    shown = sorted(events, key=lambda cid: (-events[cid], cid))[:limit]
    by_campaign = first_party_rows_by_campaign(conn, day, shown)
    funnels = {}
    for campaign_id in shown:
        ranges: dict[Key, KeyRange] = {}
        unions: dict[Key, Sketch | None] = {}
        stages: dict[str, list[Key]] = defaultdict(list)
        for row in by_campaign[campaign_id]:
            key = (FIRST_PARTY, row.stage, row.event_type)
            unknown = row.unique_actors is None
            ranges[key] = KeyRange(raw_count=row.raw_count, days=1, last_unique=row.unique_actors, unknown=unknown)
            unions[key] = None if unknown else sketches.merge([row.actors_hll])
            stages[row.stage].append(key)
        funnels[campaign_id] = funnel_steps(stages, ranges, unions, None)
    return events, funnels
