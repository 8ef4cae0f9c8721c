"""A key's rollup rows summed over a range of days (``KeyRange``), and the unique actors that range has.

A key is one (source, stage, event type). The report fills a KeyRange per key while it reads the daily
rows (with each whole week's fingerprint, ``WeekSums``); ``funnel.funnel_markdown`` fills one per row of a day.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from typing import Any

from marketing_pipelines.measurement import sketches

Key = tuple[str, str, str]  # source, stage, event_type
Sketch = sketches.datasketches.hll_sketch
Blob = bytes | memoryview  # psycopg2 returns bytea as a memoryview


@dataclass(slots=True)
class WeekSums:
    """One key's daily rows of one whole week as they stand now: the fingerprint its weekly row must match."""

    rows: int
    raw_count: int
    rolled_up_at: Any  # latest, as ``report.queries.instant_sql`` reads it
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


def range_uniques(days: int, last_unique: int | None, union: Sketch | None) -> tuple[int | None, bool]:
    """(unique actors, exact) over ``days`` days: the day's own count for one day, else the union's estimate."""
    if union is None:
        return None, False
    if days == 1:
        return last_unique, True
    return sketches.estimate(union), False
