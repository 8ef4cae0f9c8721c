"""The definitions' settings-shaped parts as the default settings build them, for tests that evaluate one
directly (a sensor with ``build_sensor_context``, the measurement assets with ``dg.materialize``).

Built by the same factories ``build_defs`` calls; a test that needs another setting calls the factory
with its own ``Settings`` (``factories.settings_from``, ``load_settings(...)``).
"""

import dagster as dg

from marketing_pipelines.agents.sensors import build_queued_agent_runs_sensor
from marketing_pipelines.definitions import build_defs
from marketing_pipelines.executions.sensors import build_due_executions_sensor
from marketing_pipelines.measurement.assets import build_measurement_assets
from marketing_pipelines.measurement.defs import IMPORTER_RESOURCES
from marketing_pipelines.measurement.freshness import build_today_is_current
from marketing_pipelines.measurement.schedules import build_measurement_daily_schedule
from marketing_pipelines.measurement.sensors import build_late_events_sensor
from marketing_pipelines_tests.factories import settings_from

DEFAULTS = settings_from({})

due_executions_sensor = build_due_executions_sensor(DEFAULTS.sensor_interval_seconds)
queued_agent_runs_sensor = build_queued_agent_runs_sensor(DEFAULTS.sensor_interval_seconds)
# Every importer in, as a deployment with both configured has them (build_defs leaves out the unconfigured).
measurement_assets = build_measurement_assets(DEFAULTS)
measurement_daily_schedule = build_measurement_daily_schedule(DEFAULTS)
measurement_late_events_sensor = build_late_events_sensor(DEFAULTS)
today_is_current = build_today_is_current(DEFAULTS)


def unconfigured_importers() -> dict[str, dg.ConfigurableResource]:
    """Every importer's client with no credentials: the resources ``measurement_assets`` need besides a test's own."""
    return {key: cls() for key, cls in IMPORTER_RESOURCES.items()}


# The whole code location as build_defs makes it from those settings: what `defs()` loads where no
# MARKETING_ variable is set.
DEFS = build_defs(DEFAULTS)
