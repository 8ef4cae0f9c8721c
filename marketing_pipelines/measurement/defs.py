"""The measurement domain's Dagster definitions (assets, checks, schedules, sensors)."""

from collections.abc import Mapping

import dagster as dg

from marketing_pipelines.measurement.assets import (
    ROLLUP_IO_MANAGER,
    build_measurement_daily,
    marketing_event_asset,
    measurement_daily_job,
    measurement_rollup_job,
)
from marketing_pipelines.measurement.freshness import measurement_freshness_sensor, today_is_current
from marketing_pipelines.measurement.importers.github import GitHubReleasesClient
from marketing_pipelines.measurement.importers.plausible import PlausibleClient
from marketing_pipelines.measurement.report.frames import RollupFrameIOManager
from marketing_pipelines.measurement.schedules import measurement_daily_schedule
from marketing_pipelines.measurement.sensors import measurement_late_events_sensor
from marketing_pipelines.measurement.sources import SOURCES, missing_variables
from marketing_pipelines.settings import Settings, current_settings, resource_from_settings


def importer_resources(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> dict[str, dg.ConfigurableResource]:
    """The importers' clients as ``settings`` configure them; a credential is an EnvVar when its variable is set."""
    return {
        "plausible": resource_from_settings(PlausibleClient, settings, environ=environ),
        "github": resource_from_settings(GitHubReleasesClient, settings, environ=environ),
    }


def left_out_importers(settings: Settings) -> dict[dg.AssetKey, str]:
    """The importer assets whose source ``settings`` leave unconfigured, each with what turns it on."""
    missing = missing_variables(settings)
    return {
        dg.AssetKey(source.asset): f"set {' and '.join(missing[source.name])}"
        for source in SOURCES
        if source.name in missing
    }


defs = dg.Definitions(
    assets=[marketing_event_asset, build_measurement_daily(left_out=left_out_importers(current_settings()))],
    jobs=[measurement_daily_job, measurement_rollup_job],
    schedules=[measurement_daily_schedule],
    asset_checks=[today_is_current],
    sensors=[measurement_late_events_sensor, measurement_freshness_sensor],
    resources={
        **importer_resources(current_settings()),
        ROLLUP_IO_MANAGER: resource_from_settings(RollupFrameIOManager, current_settings()),
    },
)
