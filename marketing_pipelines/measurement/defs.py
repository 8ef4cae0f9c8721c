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
from marketing_pipelines.measurement.importers.github import TOKEN_ENV, GitHubReleasesClient
from marketing_pipelines.measurement.importers.plausible import API_KEY_ENV, SITE_ID_ENV, PlausibleClient
from marketing_pipelines.measurement.report.frames import RollupFrameIOManager
from marketing_pipelines.measurement.schedules import measurement_daily_schedule
from marketing_pipelines.measurement.sensors import measurement_late_events_sensor
from marketing_pipelines.measurement.sources import SOURCES, missing_variables
from marketing_pipelines.settings import current_settings, env_var_if_set, resource_from_settings

PLAUSIBLE_BASE_URL_ENV = "PLAUSIBLE_BASE_URL"
GITHUB_API_URL_ENV = "GITHUB_API_URL"


def importer_resources(environ: Mapping[str, str] | None = None) -> dict[str, dg.ConfigurableResource]:
    """The importers' clients, each credential an EnvVar bound only when set (``environ``: os.environ)."""

    def env(name: str) -> dg.EnvVar | None:
        return env_var_if_set(name, environ)

    plausible_url, github_url = env(PLAUSIBLE_BASE_URL_ENV), env(GITHUB_API_URL_ENV)
    return {
        "plausible": PlausibleClient(
            api_key=env(API_KEY_ENV),
            site_id=env(SITE_ID_ENV),
            **({"base_url": plausible_url} if plausible_url else {}),
        ),
        "github": GitHubReleasesClient(token=env(TOKEN_ENV), **({"base_url": github_url} if github_url else {})),
    }


def left_out_importers(environ: Mapping[str, str] | None = None) -> dict[dg.AssetKey, str]:
    """The importer assets whose source is not configured, each with what turns it on."""
    missing = missing_variables(environ)
    return {
        dg.AssetKey(source.asset): f"set {' and '.join(missing[source.name])}"
        for source in SOURCES
        if source.name in missing
    }


defs = dg.Definitions(
    assets=[marketing_event_asset, build_measurement_daily(left_out=left_out_importers())],
    jobs=[measurement_daily_job, measurement_rollup_job],
    schedules=[measurement_daily_schedule],
    asset_checks=[today_is_current],
    sensors=[measurement_late_events_sensor, measurement_freshness_sensor],
    resources={
        **importer_resources(),
        ROLLUP_IO_MANAGER: resource_from_settings(RollupFrameIOManager, current_settings()),
    },
)
