"""What a measurement report holds: totals over the range, the daily series and the funnel."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING, NamedTuple

from marketing_pipelines.measurement.funnel import FunnelStep

if TYPE_CHECKING:
    from marketing_pipelines.measurement.frames import ReportFrames


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
class MeasurementReport:
    campaign_id: str
    start: date | None
    end: date | None
    totals: tuple[RangeTotal, ...]
    daily: tuple[DailyPoint, ...]
    funnel: tuple[FunnelStep, ...]

    def to_frames(self) -> ReportFrames:
        """The totals, daily points and funnel as pandas DataFrames (measurement/frames.py has the dtypes)."""
        # Imported here: the CLI's report need not load pandas.
        from marketing_pipelines.measurement.frames import report_frames

        return report_frames(self)
