"""The campaign measurement report, read from ``measurement_daily_rollup`` only (never the raw events).

Counts over a range are sums of daily counts. Unique actors over a range are the union of the
rows' HLL sketches: an estimate (about 1.6 % standard error, exact for a few hundred actors),
marked ``unique_actors_exact=False`` whenever it merges more than one row. Whole weeks of the range
are merged from ``measurement_weekly_sketch`` (one sketch instead of seven) while their fingerprint
matches the daily rows, which keeps a long range's latency bounded by weeks, not days.

Each daily row is touched once in Python, where it is also summed into its key's range and its
week's fingerprint. The modules, each depending only on those listed before it (an import-linter
contract in pyproject.toml holds the order):

- ``model``: what the report holds (``MeasurementReport``, ``RangeTotal``, ``DailyPoint``, ``FunnelStep``);
- ``reads``: the statements, what they fill per key, and which weekly or daily sketches make up a union;
- ``build``: ``measurement_report``, ``funnel_steps`` for a range or a day, and ``day_funnels`` (a day's campaigns);
- ``rendering``: the report as a table, CSV or JSON, and one day's funnel as Markdown (the rollup asset's);
- ``frames``: the report and the rollup as pandas DataFrames, and the IO manager that loads the rollup;
- ``charts``: the report as one self-contained HTML page of SVG charts over their tables, and one day's funnels as
  pictures for the rollup asset's metadata.

Import each name from its module; this package exports nothing.
"""
