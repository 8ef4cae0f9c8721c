"""The executions domain's Dagster definitions: its job, its claiming and reconciling sensors, its resources."""

import dagster as dg

from marketing_pipelines.executions.jobs import marketing_execution_job
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.executions.sensors import (
    due_executions_sensor,
    execution_run_canceled_sensor,
    execution_run_failure_sensor,
)
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.settings import current_settings, resource_from_settings

defs = dg.Definitions(
    jobs=[marketing_execution_job],
    sensors=[due_executions_sensor, execution_run_failure_sensor, execution_run_canceled_sensor],
    resources={
        "webhook": WebhookClient.from_settings(current_settings()),
        "execution_settings": resource_from_settings(ExecutionSettings, current_settings()),
    },
)
