"""The measurement domain's Dagster definitions (assets, checks, schedules, sensors)."""

import os

import dagster as dg

from marketing_pipelines.measurement.assets import (
    ROLLUP_IO_MANAGER,
    marketing_event_asset,
    measurement_daily,
    measurement_daily_job,
    measurement_rollup_job,
)
from marketing_pipelines.measurement.frames import RollupFrameIOManager
from marketing_pipelines.measurement.importers.github import TOKEN_ENV, GitHubReleasesClient
from marketing_pipelines.measurement.importers.plausible import API_KEY_ENV, SITE_ID_ENV, PlausibleClient
from marketing_pipelines.measurement.schedules import measurement_daily_schedule
from marketing_pipelines.measurement.sensors import measurement_late_events_sensor

PLAUSIBLE_BASE_URL_ENV = "PLAUSIBLE_BASE_URL"
GITHUB_API_URL_ENV = "GITHUB_API_URL"


def env_or_none(name: str) -> dg.EnvVar | None:
    """``dg.EnvVar(name)`` when the variable is set where the code location loads, else None.

    An EnvVar keeps the secret out of the run config shown in the UI, but one that is unset in the
    run process fails resource initialisation and with it the whole run. An importer without
    credentials must instead report "not configured" and let the rest of the job run, so an unset
    variable becomes None. Setting it later takes a reload of the code location, which is also
    when Dagster picks up any other change to the environment.
    """
    return dg.EnvVar(name) if os.environ.get(name) else None


def _plausible() -> PlausibleClient:
    base_url = env_or_none(PLAUSIBLE_BASE_URL_ENV)
    return PlausibleClient(
        api_key=env_or_none(API_KEY_ENV),
        site_id=env_or_none(SITE_ID_ENV),
        **({"base_url": base_url} if base_url else {}),
    )


def _github() -> GitHubReleasesClient:
    base_url = env_or_none(GITHUB_API_URL_ENV)
    return GitHubReleasesClient(token=env_or_none(TOKEN_ENV), **({"base_url": base_url} if base_url else {}))


defs = dg.Definitions(
    assets=[marketing_event_asset, measurement_daily],
    jobs=[measurement_daily_job, measurement_rollup_job],
    schedules=[measurement_daily_schedule],
    sensors=[measurement_late_events_sensor],
    resources={"plausible": _plausible(), "github": _github(), ROLLUP_IO_MANAGER: RollupFrameIOManager()},
)
