"""The monitoring domain's Dagster definitions: the queue assets, their checks, the sensor that observes them,
and the alerts sensor with its webhook."""

import dagster as dg

from marketing_pipelines.monitoring.alert_sensor import marketing_alerts_sensor
from marketing_pipelines.monitoring.alerts import AlertWebhook
from marketing_pipelines.monitoring.assets import observe_queues
from marketing_pipelines.monitoring.checks import queue_health_checks
from marketing_pipelines.monitoring.resources import HealthSettings
from marketing_pipelines.monitoring.sensors import queue_health_sensor
from marketing_pipelines.settings import Settings, resource_from_settings


def build_defs(settings: Settings) -> dg.Definitions:
    """The domain's definitions with the resources ``settings`` configure."""
    return dg.Definitions(
        assets=[observe_queues],
        asset_checks=[queue_health_checks],
        sensors=[queue_health_sensor, marketing_alerts_sensor],
        resources={
            "health_settings": resource_from_settings(HealthSettings, settings),
            # The URL is an EnvVar (a Slack webhook's path is its token); the sensor sends through "webhook".
            "alerts": resource_from_settings(AlertWebhook, settings),
        },
    )
