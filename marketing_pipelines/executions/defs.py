"""The executions domain's Dagster definitions (its sensors live in marketing_pipelines/work.py)."""

import dagster as dg

from marketing_pipelines.executions.actions import WebhookClient
from marketing_pipelines.executions.jobs import marketing_execution_job
from marketing_pipelines.settings import Settings

defs = dg.Definitions(
    jobs=[marketing_execution_job],
    resources={"webhook": WebhookClient(timeout_s=Settings.from_env().webhook_timeout_seconds)},
)
