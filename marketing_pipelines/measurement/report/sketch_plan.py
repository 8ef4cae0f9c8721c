"""Which sketches make up each key's range union: the weekly sketch of a fresh whole week, else its days' sketches."""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from datetime import date

from marketing_pipelines.measurement.range_sums import Key, KeyRange


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
