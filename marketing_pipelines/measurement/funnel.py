"""The first-party stage funnel: its steps as the report has them, how its numbers show, and one day's as Markdown.

``funnel_steps`` sizes the stages of a range (the report) or of one day (``funnel_markdown``, the rollup's
materialization metadata); the report's table and the Markdown show its numbers alike.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import NamedTuple

import sqlalchemy as sa

from marketing_pipelines.db.schema import measurement_daily_rollup
from marketing_pipelines.measurement import sketches
from marketing_pipelines.measurement.range_sums import Key, KeyRange, Sketch, range_uniques
from marketing_pipelines.measurement.rollup import FIRST_PARTY
from marketing_pipelines.redact import visible_controls


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


def format_unique(value: int | None, exact: bool) -> str:
    """Unique actors as shown: ``~`` before an estimate, ``unknown`` when there is no sketch."""
    if value is None:
        return "unknown"
    return str(value) if exact else f"~{value}"


def format_pct(value: float | None) -> str:
    """A funnel ratio as a percentage with one decimal, ``-`` when there is none."""
    return "-" if value is None else f"{value * 100:.1f}%"


# --- the day's funnel as Markdown ------------------------------------------------------------------------

# funnel_markdown lists the largest campaigns of the day; metadata stays readable and small.
MAX_FUNNEL_CAMPAIGNS = 50


def first_party_events_by_campaign(conn: sa.Connection, day: date) -> dict[str, int]:
    """First-party events per campaign on ``day``, from the rollup (no sketches read)."""
    r = measurement_daily_rollup
    query = (
        sa.select(r.c.campaign_id, sa.func.sum(r.c.raw_count))
        .where(r.c.day == day, r.c.source == FIRST_PARTY)
        .group_by(r.c.campaign_id)
    )
    return {campaign_id: int(events) for campaign_id, events in conn.execute(query)}


class FunnelRow(NamedTuple):
    """One first-party rollup row of a day, as the funnel needs it."""

    stage: str
    event_type: str
    raw_count: int
    unique_actors: int | None
    actors_hll: bytes | memoryview | None  # psycopg2 returns bytea as a memoryview


def first_party_rows_by_campaign(
    conn: sa.Connection, day: date, campaign_ids: Sequence[str]
) -> dict[str, list[FunnelRow]]:
    """These campaigns' first-party rollup rows of ``day``, with their sketches."""
    r = measurement_daily_rollup
    query = sa.select(r.c.campaign_id, r.c.stage, r.c.event_type, r.c.raw_count, r.c.unique_actors, r.c.actors_hll)
    query = query.where(r.c.day == day, r.c.source == FIRST_PARTY, r.c.campaign_id.in_(list(campaign_ids)))
    rows: dict[str, list[FunnelRow]] = defaultdict(list)
    for campaign_id, *fields in conn.execute(query):
        rows[campaign_id].append(FunnelRow(*fields))
    return rows


def funnel_markdown(conn: sa.Connection, day: date) -> str:
    """The first-party funnel of every campaign on one UTC day, as a Markdown table for ``dg.MetadataValue.md``.

    Computed from the day's rollup rows with the report's own funnel (``funnel_steps``: stage sizes, stages by
    unique actors, largest first). A stage with several event types takes the union of their sketches,
    marked ``~`` as an estimate. At most MAX_FUNNEL_CAMPAIGNS campaigns, those with the most events first;
    the rest are counted in one closing line.
    """
    events = first_party_events_by_campaign(conn, day)
    if not events:
        return f"No first-party rollup rows on {day} (UTC)."
    ranked = sorted(events, key=lambda cid: (-events[cid], cid))
    shown, rest = ranked[:MAX_FUNNEL_CAMPAIGNS], ranked[MAX_FUNNEL_CAMPAIGNS:]
    by_campaign = first_party_rows_by_campaign(conn, day, shown)

    lines = [
        f"**First-party funnel of {day} (UTC)**: {len(events)} campaigns, most events first; "
        "`~` marks unique actors estimated from HLL sketches.",
        "",
        "| campaign | stage | events | unique actors | from previous stage |",
        "|---|---|---:|---:|---:|",
    ]
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
        for step in funnel_steps(stages, ranges, unions, None):
            cells = [
                _md_cell(campaign_id),
                _md_cell(step.stage),
                str(step.raw_count),
                format_unique(step.unique_actors, step.unique_actors_exact),
                format_pct(step.from_previous),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    if rest:
        lines += ["", f"… and {len(rest)} more campaigns ({sum(events[cid] for cid in rest)} events)."]
    return "\n".join(lines)


_MARKDOWN_SPECIAL = str.maketrans({c: f"\\{c}" for c in "\\|`*_[]<>#~"})


def _md_cell(text: str) -> str:
    # Stage names come from event files: keep them from breaking the table or adding markup, and their
    # control characters visible (written \\xNN before the escaping, so the backslash shows too).
    return visible_controls(" ".join(text.split())).translate(_MARKDOWN_SPECIAL)
