"""The executions domain's Dagster definitions: its job, its claiming and reconciling sensors, its webhook client."""

import dagster as dg

from marketing_pipelines.executions.actions import WebhookClient
from marketing_pipelines.executions.jobs import marketing_execution_job
from marketing_pipelines.executions.sensors import (
    due_executions_sensor,
    execution_run_canceled_sensor,
    execution_run_failure_sensor,
)
from marketing_pipelines.settings import Settings

_settings = Settings.from_env()

defs = dg.Definitions(
    jobs=[marketing_execution_job],
    sensors=[due_executions_sensor, execution_run_failure_sensor, execution_run_canceled_sensor],
    resources={
        "webhook": WebhookClient(
            timeout_s=_settings.webhook_timeout_seconds, allow_networks=list(_settings.webhook_allow_networks)
        )
    },
)
