"""The report's days: a day given on the command line, and the whole ISO weeks inside a range."""

from __future__ import annotations

from datetime import date, timedelta

from marketing_pipelines.errors import InvalidInput


def parse_day(value: str, option: str) -> date:
    try:
        return date.fromisoformat(value.strip())
    except ValueError:
        raise InvalidInput(f"{option} {value!r} is not a day like 2026-11-26") from None


def whole_week_span(start: date | None, end: date | None) -> tuple[date | None, date | None]:
    """The first Monday and last Sunday of the whole ISO weeks in [start, end] (None: unbounded)."""
    first = start + timedelta(days=(7 - start.weekday()) % 7) if start else None
    last = end - timedelta(days=(end.weekday() + 1) % 7) if end else None
    return first, last
