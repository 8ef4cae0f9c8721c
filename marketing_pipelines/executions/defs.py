"""The executions domain's Dagster definitions."""

import dagster as dg

from marketing_pipelines.executions.actions import WebhookClient
from marketing_pipelines.executions.jobs import marketing_execution_job
from marketing_pipelines.executions.sensors import due_work_sensor, work_run_canceled_sensor, work_run_failure_sensor
from marketing_pipelines.settings import Settings

defs = dg.Definitions(
    jobs=[marketing_execution_job],
    sensors=[due_work_sensor, work_run_failure_sensor, work_run_canceled_sensor],
    resources={"webhook": WebhookClient(timeout_s=Settings.from_env().webhook_timeout_seconds)},
)
