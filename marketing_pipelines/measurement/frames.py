"""The measurement rollup as pandas DataFrames for analysts, its day's funnel as Markdown, and an IO manager.

``rollup_frame`` reads ``measurement_daily_rollup`` (never the sketch bytes), ``report_frames`` turns a
``MeasurementReport`` into DataFrames, ``funnel_markdown`` writes one day's first-party funnel for
materialization metadata, and ``RollupFrameIOManager`` makes ``defs.load_asset_value(...)`` and
downstream assets receive the rollup of their partitions as a DataFrame.

Dtypes, the same for an empty frame: ``day`` is ``datetime64[ns]`` at midnight of the UTC day, without a
time zone, so ``.dt``, ``resample`` and joins on a day work (a datetime rather than ``date`` objects, whose
column would be ``object``; the unit is fixed because pandas 3 infers ``s`` from dates where pandas 2 gave
``ns``); ``rolled_up_at`` is ``datetime64[ns, UTC]``; counts are ``int64`` and ``unique_actors`` is the nullable
``Int64`` (``<NA>``: unknown, as for imported rows); text is pandas' default string dtype; exactness flags
are ``bool``. A day's ``unique_actors`` cannot be summed over days: an actor seen on two days is one actor.
Unique actors over a range come from the report's merged sketches (``report_frames``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any, NamedTuple

import dagster as dg
import pandas as pd
import sqlalchemy as sa

from marketing_pipelines.db.campaigns import require_campaign
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import measurement_daily_rollup
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.measurement import sketches
from marketing_pipelines.measurement.report import (
    Key,
    KeyRange,
    MeasurementReport,
    Sketch,
    _funnel,
    _pct,
    _unique,
)
from marketing_pipelines.measurement.rollup import FIRST_PARTY

DAY = "datetime64[ns]"
INSTANT = "datetime64[ns, UTC]"
TEXT = "str"  # pandas' default string dtype (``str`` in pandas 3, object in pandas 2)

ROLLUP_DTYPES: dict[str, str] = {
    "day": DAY,
    "campaign_id": TEXT,
    "source": TEXT,
    "stage": TEXT,
    "event_type": TEXT,
    "raw_count": "int64",
    "unique_actors": "Int64",
    "rolled_up_at": INSTANT,
}
ROLLUP_ORDER = ["day", "campaign_id", "source", "stage", "event_type"]
TOTALS_DTYPES: dict[str, str] = {
    "campaign_id": TEXT,
    "source": TEXT,
    "stage": TEXT,
    "event_type": TEXT,
    "raw_count": "int64",
    "unique_actors": "Int64",
    "unique_actors_exact": "bool",
}
DAILY_DTYPES: dict[str, str] = {
    "campaign_id": TEXT,
    "day": DAY,
    "source": TEXT,
    "stage": TEXT,
    "event_type": TEXT,
    "raw_count": "int64",
    "unique_actors": "Int64",
}
FUNNEL_DTYPES: dict[str, str] = {
    "campaign_id": TEXT,
    "stage": TEXT,
    "unique_actors": "int64",
    "unique_actors_exact": "bool",
    "raw_count": "int64",
    "from_previous": "float64",  # NaN: first step, or the previous step had no actors
    "from_first": "float64",
}
# funnel_markdown lists the largest campaigns of the day; metadata stays readable and small.
MAX_FUNNEL_CAMPAIGNS = 50


def typed_frame(rows: Sequence[Sequence[Any]], dtypes: dict[str, str]) -> pd.DataFrame:
    """A DataFrame of ``rows`` with exactly these columns and dtypes, also when ``rows`` is empty."""
    frame = pd.DataFrame.from_records(list(rows), columns=list(dtypes))
    columns: dict[str, pd.Series] = {}
    for column, dtype in dtypes.items():
        values = frame[column]
        if dtype == DAY:
            values = pd.to_datetime(values)
        elif dtype == INSTANT:
            values = pd.to_datetime(values, utc=True)
        elif dtype == "float64":
            # None marks "no ratio"; as float64 it is NaN rather than an object column.
            values = pd.to_numeric(values, errors="raise")
        columns[column] = values.astype(dtype)
    return pd.DataFrame(columns, columns=list(dtypes))


# --- the rollup ---------------------------------------------------------------------------------------


def rollup_query(
    campaign_id: str | None, start: date | None, end: date | None, days: Sequence[date] | None
) -> sa.Select[Any]:
    """The rollup rows of a campaign (or all) within [start, end] and ``days``; every filter is optional."""
    r = measurement_daily_rollup
    query = sa.select(*(r.c[column] for column in ROLLUP_DTYPES))
    if campaign_id is not None:
        query = query.where(r.c.campaign_id == campaign_id)
    if start is not None:
        query = query.where(r.c.day >= start)
    if end is not None:
        query = query.where(r.c.day <= end)
    if days is not None:
        query = query.where(r.c.day.in_(sorted(set(days))))
    return query


def rollup_frame(
    conn_or_engine: sa.Connection | sa.Engine,
    *,
    campaign_id: str | None = None,
    start: date | None = None,
    end: date | None = None,
    days: Sequence[date] | None = None,
) -> pd.DataFrame:
    """``measurement_daily_rollup`` rows as a DataFrame: one row per (day, campaign_id, source, stage, event_type).

    Filters combine: a campaign (an unknown one raises InvalidInput, as the report does), the
    inclusive range [start, end], and a set of ``days``. Sorted by day, campaign, source, stage and
    event type, by code point on both databases (pandas sorts, not the server's collation). No sketch
    bytes: unique actors over several days come from ``measurement_report(...).to_frames()``.
    """
    if start is not None and end is not None and start > end:
        raise InvalidInput(f"start {start} is after end {end}")
    if days is not None and not days:
        return typed_frame([], ROLLUP_DTYPES)
    if isinstance(conn_or_engine, sa.Engine):
        with conn_or_engine.connect() as conn:
            return rollup_frame(conn, campaign_id=campaign_id, start=start, end=end, days=days)
    conn = conn_or_engine
    if campaign_id is not None:
        require_campaign(conn, campaign_id)
    rows = conn.execute(rollup_query(campaign_id, start, end, days)).all()
    return typed_frame(rows, ROLLUP_DTYPES).sort_values(ROLLUP_ORDER, kind="stable", ignore_index=True)


# --- the report ---------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)  # eq=False: DataFrames do not compare to a single bool
class ReportFrames:
    """A MeasurementReport as DataFrames; each has a campaign_id column so several campaigns concatenate."""

    totals: pd.DataFrame  # one row per (source, stage, event_type) over the range
    daily: pd.DataFrame  # one row per (day, source, stage, event_type); unique_actors exact for that day
    funnel: pd.DataFrame  # first-party stages in funnel order


def report_frames(report: MeasurementReport) -> ReportFrames:
    """The report's totals, daily points and funnel as DataFrames, with the report's numbers unchanged."""
    cid = report.campaign_id
    return ReportFrames(
        totals=typed_frame(
            [
                (cid, t.source, t.stage, t.event_type, t.raw_count, t.unique_actors, t.unique_actors_exact)
                for t in report.totals
            ],
            TOTALS_DTYPES,
        ),
        daily=typed_frame([(cid, *point) for point in report.daily], DAILY_DTYPES),
        funnel=typed_frame(
            [
                (cid, f.stage, f.unique_actors, f.unique_actors_exact, f.raw_count, f.from_previous, f.from_first)
                for f in report.funnel
            ],
            FUNNEL_DTYPES,
        ),
    )


# --- the day's funnel as Markdown ------------------------------------------------------------------------


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

    Computed from the day's rollup rows with the report's own funnel (``_funnel``: stage sizes, stages by
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
        for step in _funnel(stages, ranges, unions, None):
            cells = [
                _md_cell(campaign_id),
                _md_cell(step.stage),
                str(step.raw_count),
                _unique(step.unique_actors, step.unique_actors_exact),
                _pct(step.from_previous),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    if rest:
        lines += ["", f"… and {len(rest)} more campaigns ({sum(events[cid] for cid in rest)} events)."]
    return "\n".join(lines)


_MARKDOWN_SPECIAL = str.maketrans({c: f"\\{c}" for c in "\\|`*_[]<>#~"})


def _md_cell(text: str) -> str:
    # Stage names come from event files: keep them from breaking the table or adding markup.
    return " ".join(text.split()).translate(_MARKDOWN_SPECIAL)


# --- the IO manager -------------------------------------------------------------------------------------


class RollupFrameIOManager(dg.ConfigurableIOManager):
    """Loads ``measurement_daily_rollup`` as a DataFrame (``rollup_frame``) for the partitions asked for.

    The asset writes its own table, so storing does nothing. Loading reads the rollup rows of the
    input's partition keys: one day for ``defs.load_asset_value(..., partition_key=...)``, a range for a
    downstream asset with a range partition mapping or ``get_asset_value_loader().load_asset_value(...,
    partition_key_range=...)``, the whole table when no partition is given.

    ``url`` works as ``AppDatabase.url`` does (and goes through it): left empty, it is resolved from
    MARKETING_DATABASE_URL in the process that loads, so it is the database the assets write and no
    password shows in run config. A plain field rather than a nested ``AppDatabase`` resource: Dagster
    1.13.27 warns (DeprecationWarning, InitResourceContext.dagster_run) on every run that builds a nested one.
    """

    url: str | None = None

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        if obj is not None:
            raise TypeError(
                f"RollupFrameIOManager stores nothing: {context.asset_key.to_user_string()} writes its own table "
                f"and must return None or a MaterializeResult, not {type(obj).__name__}"
            )

    def load_input(self, context: dg.InputContext) -> pd.DataFrame:
        engine = AppDatabase(url=self.url).ready_engine()
        if not context.has_asset_partitions:
            return rollup_frame(engine)
        days = sorted({date.fromisoformat(key) for key in context.asset_partition_keys})
        if days and (days[-1] - days[0]).days + 1 == len(days):
            return rollup_frame(engine, start=days[0], end=days[-1])  # contiguous: a range scan, not a long IN
        return rollup_frame(engine, days=days)
