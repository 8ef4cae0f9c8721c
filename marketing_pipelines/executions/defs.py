"""The executions domain's Dagster definitions: its job, its claiming and reconciling sensors, its resources."""

import dagster as dg

from marketing_pipelines.executions.jobs import marketing_execution_job
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.executions.sensors import (
    build_due_executions_sensor,
    execution_run_canceled_sensor,
    execution_run_failure_sensor,
)
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.settings import Settings, resource_from_settings


def build_defs(settings: Settings) -> dg.Definitions:
    """The domain's definitions as ``settings`` shape them: the claiming sensor's interval and the resources."""
    return dg.Definitions(
        jobs=[marketing_execution_job],
        sensors=[
            build_due_executions_sensor(settings.sensor_interval_seconds),
            execution_run_failure_sensor,
            execution_run_canceled_sensor,
        ],
        resources={
            "webhook": WebhookClient.from_settings(settings),
            "execution_settings": resource_from_settings(ExecutionSettings, settings),
        },
    )
