"""The measurement rollup and report as pandas DataFrames for analysts, and an IO manager that loads them.

``rollup_frame`` reads ``measurement_daily_rollup`` (never the sketch bytes), ``report_frames`` turns a
``MeasurementReport`` into DataFrames, and ``RollupFrameIOManager`` makes ``defs.load_asset_value(...)`` and
downstream assets receive the rollup of their partitions as a DataFrame.

Dtypes, the same for an empty frame: ``day`` is ``datetime64[ns]`` at midnight of the UTC day, without a
time zone, so ``.dt``, ``resample`` and joins on a day work (a datetime rather than ``date`` objects, whose
column would be ``object``; the unit is fixed because pandas 3 infers ``s`` from dates where pandas 2 gave
``ns``); ``rolled_up_at`` is ``datetime64[ns, UTC]``; every count (``raw_count``, ``unique_actors``) is the
nullable ``Int64`` (``<NA>``: unknown, as for imported rows' actors), one integer dtype in every frame, so a
rollup row and a report row compare and concatenate without a cast, and a merge that leaves a row out gives
``<NA>`` rather than turning the column into floats; text is pandas' default string dtype; exactness flags
are ``bool``. Columns come in one order: day, campaign, then source, stage and event type, then the counts,
each frame keeping only the ones it has. A day's ``unique_actors`` cannot be summed over days: an actor
seen on two days is one actor. Unique actors over a range come from the report's merged sketches
(``report_frames``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

import dagster as dg
import pandas as pd
import sqlalchemy as sa

from marketing_pipelines.db.campaigns import require_campaign
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import measurement_daily_rollup
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.measurement.report.model import MeasurementReport
from marketing_pipelines.settings import setting_field, shown_in_ui

DAY = "datetime64[ns]"
INSTANT = "datetime64[ns, UTC]"
TEXT = "str"  # pandas' default string dtype (``str`` in pandas 3, object in pandas 2)
COUNT = "Int64"

ROLLUP_DTYPES: dict[str, str] = {
    "day": DAY,
    "campaign_id": TEXT,
    "source": TEXT,
    "stage": TEXT,
    "event_type": TEXT,
    "raw_count": COUNT,
    "unique_actors": COUNT,
    "rolled_up_at": INSTANT,
}
ROLLUP_ORDER = ["day", "campaign_id", "source", "stage", "event_type"]
TOTALS_DTYPES: dict[str, str] = {
    "campaign_id": TEXT,
    "source": TEXT,
    "stage": TEXT,
    "event_type": TEXT,
    "raw_count": COUNT,
    "unique_actors": COUNT,
    "unique_actors_exact": "bool",
}
# The rollup's columns less rolled_up_at, in its order: report.daily and rollup_frame(...) line up.
DAILY_DTYPES: dict[str, str] = {column: dtype for column, dtype in ROLLUP_DTYPES.items() if column != "rolled_up_at"}
FUNNEL_DTYPES: dict[str, str] = {
    "campaign_id": TEXT,
    "stage": TEXT,
    "raw_count": COUNT,
    "unique_actors": COUNT,
    "unique_actors_exact": "bool",
    "from_previous": "float64",  # NaN: first step, or the previous step had no actors
    "from_first": "float64",
}


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
    bytes: unique actors over several days come from ``report_frames(measurement_report(...))``.
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
        daily=typed_frame([(d, cid, *rest) for d, *rest in report.daily], DAILY_DTYPES),
        funnel=typed_frame(
            [
                (cid, f.stage, f.raw_count, f.unique_actors, f.unique_actors_exact, f.from_previous, f.from_first)
                for f in report.funnel
            ],
            FUNNEL_DTYPES,
        ),
    )


# --- the IO manager -------------------------------------------------------------------------------------


@shown_in_ui
class RollupFrameIOManager(dg.ConfigurableIOManager):
    """Loads ``measurement_daily_rollup`` as a DataFrame (``rollup_frame``) for the partitions asked for.

    The asset writes its own table, so storing does nothing. Loading reads the rollup rows of the
    input's partition keys: one day for ``defs.load_asset_value(..., partition_key=...)``, a range for a
    downstream asset with a range partition mapping or ``get_asset_value_loader().load_asset_value(...,
    partition_key_range=...)``, the whole table when no partition is given.

    ``url`` is wired as ``AppDatabase.url`` is (``dg.EnvVar("MARKETING_DATABASE_URL")`` when set, so no
    password shows in run config; empty: the embedded default), so it reads the database the assets
    write. A plain field rather than a nested ``AppDatabase`` resource: Dagster
    1.13.27 warns (DeprecationWarning, InitResourceContext.dagster_run) on every run that builds a nested one.
    """

    url: str | None = setting_field("database_url")

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
