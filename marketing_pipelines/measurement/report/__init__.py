"""The campaign measurement report, read from ``measurement_daily_rollup`` only (never the raw events).

Counts over a range are sums of daily counts. Unique actors over a range are the union of the
rows' HLL sketches: an estimate (about 1.6 % standard error, exact for a few hundred actors),
marked ``unique_actors_exact=False`` whenever it merges more than one row. Whole weeks of the range
are merged from ``measurement_weekly_sketch`` (one sketch instead of seven) while their fingerprint
matches the daily rows, which keeps a long range's latency bounded by weeks, not days.

The report is read in at most three statements whatever the range: the daily rows (with the
sketches of the days outside whole weeks), the weekly sketches, and only when some week is stale the
daily sketches of that week. Each daily row is touched once in Python, where it is also summed into
its key's range and its week's fingerprint; docs/PERFORMANCE.md has the measured costs.

One module per concern; this package re-exports their public names:

- ``build``: ``measurement_report``, which assembles the report from the reads below;
- ``model``: what the report holds (``MeasurementReport``, ``RangeTotal``, ``DailyPoint``);
- ``queries``: the statements that read the daily rows and the weekly and daily sketches;
- ``sketch_plan``: which weekly or daily sketches make up each key's range union;
- ``dates``: the CLI's day parsing and the whole ISO weeks of a range;
- ``rendering``: the report as a table, CSV or JSON.

The per-key range sums (``measurement/range_sums.py``) and the funnel (``measurement/funnel.py``) live
beside this package: the rollup asset's day funnel uses them too, without loading the report.
"""

from marketing_pipelines.measurement.funnel import FunnelStep
from marketing_pipelines.measurement.range_sums import Blob, Key, KeyRange, Sketch, WeekSums
from marketing_pipelines.measurement.report.build import measurement_report
from marketing_pipelines.measurement.report.dates import parse_day, whole_week_span
from marketing_pipelines.measurement.report.model import DailyPoint, MeasurementReport, RangeTotal
from marketing_pipelines.measurement.report.queries import fresh_weekly_sketches, instant_sql, range_sketches, read_days
from marketing_pipelines.measurement.report.rendering import (
    CSV_COLUMNS,
    FORMATS,
    render,
    render_csv,
    render_table,
    report_as_dict,
)
from marketing_pipelines.measurement.report.sketch_plan import SketchPlan, plan_sketches

__all__ = [
    "CSV_COLUMNS",
    "FORMATS",
    "Blob",
    "DailyPoint",
    "FunnelStep",
    "Key",
    "KeyRange",
    "MeasurementReport",
    "RangeTotal",
    "Sketch",
    "SketchPlan",
    "WeekSums",
    "fresh_weekly_sketches",
    "instant_sql",
    "measurement_report",
    "parse_day",
    "plan_sketches",
    "range_sketches",
    "read_days",
    "render",
    "render_csv",
    "render_table",
    "report_as_dict",
    "whole_week_span",
]
