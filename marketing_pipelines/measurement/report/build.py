"""``measurement_report``: one campaign's totals, daily series and funnel over a range, from the report's reads."""

from __future__ import annotations

from collections import defaultdict
from datetime import date

import sqlalchemy as sa

from marketing_pipelines.db.campaigns import require_campaign
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.measurement import sketches
from marketing_pipelines.measurement.funnel import funnel_steps
from marketing_pipelines.measurement.range_sums import Key, KeyRange, Sketch, range_uniques
from marketing_pipelines.measurement.report.model import MeasurementReport, RangeTotal
from marketing_pipelines.measurement.report.queries import range_sketches, read_days
from marketing_pipelines.measurement.rollup import FIRST_PARTY


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
        funnel=funnel_steps(stages, ranges, unions, stage_order),
    )


def _range_total(key: Key, kr: KeyRange, union: Sketch | None) -> RangeTotal:
    unique, exact = range_uniques(kr.days, kr.last_unique, union)
    return RangeTotal(*key, raw_count=kr.raw_count, unique_actors=unique, unique_actors_exact=exact)
