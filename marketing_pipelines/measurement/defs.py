"""The measurement domain's Dagster definitions (assets, checks, schedules, sensors), built from settings."""

from collections.abc import Mapping

import dagster as dg

from marketing_pipelines.measurement.assets import (
    ROLLUP_IO_MANAGER,
    build_measurement_assets,
    left_out_importers,
    measurement_daily_job,
    measurement_rollup_job,
    observe_marketing_event,
)
from marketing_pipelines.measurement.freshness import build_freshness_sensor, build_today_is_current
from marketing_pipelines.measurement.importers.github import GitHubReleasesClient
from marketing_pipelines.measurement.importers.plausible import PlausibleClient
from marketing_pipelines.measurement.report.frames import RollupFrameIOManager
from marketing_pipelines.measurement.schedules import build_measurement_daily_schedule
from marketing_pipelines.measurement.sensors import build_late_events_sensor
from marketing_pipelines.settings import Settings, resource_from_settings


def importer_resources(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> dict[str, dg.ConfigurableResource]:
    """The importers' clients as ``settings`` configure them; a credential is an EnvVar when its variable is set."""
    return {
        "plausible": resource_from_settings(PlausibleClient, settings, environ=environ),
        "github": resource_from_settings(GitHubReleasesClient, settings, environ=environ),
    }


def build_defs(settings: Settings) -> dg.Definitions:
    """The domain's definitions as ``settings`` shape them: partitions, backfill policy, intervals, resources."""
    return dg.Definitions(
        assets=[observe_marketing_event, *build_measurement_assets(settings, left_out=left_out_importers(settings))],
        jobs=[measurement_daily_job, measurement_rollup_job],
        schedules=[build_measurement_daily_schedule(settings)],
        asset_checks=[build_today_is_current(settings)],
        sensors=[build_late_events_sensor(settings), build_freshness_sensor(settings)],
        resources={
            **importer_resources(settings),
            ROLLUP_IO_MANAGER: resource_from_settings(RollupFrameIOManager, settings),
        },
    )
