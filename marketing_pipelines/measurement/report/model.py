"""What a measurement report holds: totals over the range, the daily series and the funnel.

Plain values: ``reads`` and ``build`` make them, ``rendering`` (text) and ``frames`` (pandas) show them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import NamedTuple


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

    A named tuple, not a frozen dataclass: a long series of a busy campaign has thousands of
    points, and a frozen dataclass is several times costlier to build.
    """

    day: date
    source: str
    stage: str
    event_type: str
    raw_count: int
    unique_actors: int | None


# Consecutive days, first and last (the same day for one).
DaySpan = tuple[date, date]


@dataclass(frozen=True)
class MeasurementReport:
    campaign_id: str
    start: date | None
    end: date | None
    totals: tuple[RangeTotal, ...]
    daily: tuple[DailyPoint, ...]
    funnel: tuple[FunnelStep, ...]
    # Days of the range up to today the rollup built with no row of this campaign (nothing to count)...
    built_without_rows: tuple[DaySpan, ...] = ()
    # ...and days it never built (materialize them); neither is in ``daily``.
    not_built: tuple[DaySpan, ...] = ()
    # How many days the rollup has built at all: 0 means nothing was ever rolled up.
    days_built: int = 0
