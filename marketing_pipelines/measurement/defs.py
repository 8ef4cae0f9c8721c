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
from marketing_pipelines.measurement.importers.ga4 import GA4Client
from marketing_pipelines.measurement.importers.github import GitHubReleasesClient
from marketing_pipelines.measurement.importers.github_traffic import GitHubTrafficClient
from marketing_pipelines.measurement.importers.packages import NpmDownloadsClient, PyPIStatsClient
from marketing_pipelines.measurement.importers.plausible import PlausibleClient
from marketing_pipelines.measurement.importers.posthog import PostHogClient
from marketing_pipelines.measurement.keys import ROLLUP_KEY
from marketing_pipelines.measurement.report.frames import RollupFrameIOManager
from marketing_pipelines.measurement.retention import build_retention_check, sources_with_retention
from marketing_pipelines.measurement.schedules import build_measurement_daily_schedule
from marketing_pipelines.measurement.sensors import build_late_events_sensor
from marketing_pipelines.measurement.sources import SOURCES
from marketing_pipelines.settings import Settings, resource_from_settings

# Each source's importer resource, by its Source.resource_key (sources.py).
IMPORTER_RESOURCES: dict[str, type[dg.ConfigurableResource]] = {
    "plausible": PlausibleClient,
    "github": GitHubReleasesClient,
    "posthog": PostHogClient,
    "github_traffic": GitHubTrafficClient,
    "pypistats": PyPIStatsClient,
    "npm_downloads": NpmDownloadsClient,
    "ga4": GA4Client,
}


def importer_resources(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> dict[str, dg.ConfigurableResource]:
    """The importers' clients as ``settings`` configure them; a credential is an EnvVar when its variable is set."""
    return {key: resource_from_settings(cls, settings, environ=environ) for key, cls in IMPORTER_RESOURCES.items()}


# Evaluates the rollup's automation condition (assets.ROLLUP_AUTOMATION); Dagster's default sensor for it starts
# stopped, and a revised day would then never reach the rollup.
measurement_automation_sensor = dg.AutomationConditionSensorDefinition(
    "measurement_automation_sensor",
    target=dg.AssetSelection.assets(ROLLUP_KEY),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=30,
    description=(
        "Rebuilds a day of measurement_daily_rollup once a day of an importer it reads was materialized without it "
        "(a source's revised day, an importer's partition re-run or backfilled). Several days at once become one "
        "backfill, so the run queue's backfill limit applies."
    ),
)


def build_defs(settings: Settings) -> dg.Definitions:
    """The domain's definitions as ``settings`` shape them: partitions, backfill policy, intervals, resources."""
    left_out = left_out_importers(settings)
    # The configured importers whose source forgets days: each gets within_retention (retention.py).
    configured = [s for s in SOURCES if dg.AssetKey(s.asset) not in left_out]
    forgetting = sources_with_retention(configured)
    first = settings.measurement_start_date
    return dg.Definitions(
        assets=[observe_marketing_event, *build_measurement_assets(settings, left_out=left_out)],
        jobs=[measurement_daily_job, measurement_rollup_job],
        schedules=[build_measurement_daily_schedule(settings, configured)],
        asset_checks=[build_today_is_current(settings), *(build_retention_check(s, first) for s in forgetting)],
        sensors=[
            measurement_automation_sensor,
            build_late_events_sensor(settings),
            build_freshness_sensor(settings, retention_sources=forgetting),
        ],
        resources={
            **importer_resources(settings),
            ROLLUP_IO_MANAGER: resource_from_settings(RollupFrameIOManager, settings),
        },
    )
