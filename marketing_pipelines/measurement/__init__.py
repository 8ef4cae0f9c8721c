"""Campaign measurement: first-party events, the site-analytics and GitHub-downloads importers, the daily
rollup assets with their checks, schedule and late-events sensor, and the report read from the rollup."""

from marketing_pipelines.measurement.events import LoadCounts, load_events_file, record_events
from marketing_pipelines.measurement.report import MeasurementReport, measurement_report, render

__all__ = ["LoadCounts", "MeasurementReport", "load_events_file", "measurement_report", "record_events", "render"]
