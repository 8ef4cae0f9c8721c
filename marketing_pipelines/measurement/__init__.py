"""Campaign measurement: first-party events, the site-analytics and GitHub-downloads importers, the daily
rollup assets with their checks, schedule and late-events sensor, and the report read from the rollup.

Importing this package loads none of its modules: the Dagster definitions load what they use and no more
(not the report). The names below stay importable from here, for notebooks and older code; each loads
its own module on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from marketing_pipelines.measurement.events import LoadCounts, load_events_file, record_events
    from marketing_pipelines.measurement.report import MeasurementReport, measurement_report, render

_HOMES = {
    "LoadCounts": "marketing_pipelines.measurement.events",
    "load_events_file": "marketing_pipelines.measurement.events",
    "record_events": "marketing_pipelines.measurement.events",
    "MeasurementReport": "marketing_pipelines.measurement.report",
    "measurement_report": "marketing_pipelines.measurement.report",
    "render": "marketing_pipelines.measurement.report",
}

__all__ = ["LoadCounts", "MeasurementReport", "load_events_file", "measurement_report", "record_events", "render"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(home), name)
