"""Assembles the Dagster definitions from the domains; nothing else lives here."""

from __future__ import annotations

import dagster as dg

from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.executions.actions import WebhookClient
from marketing_pipelines.executions.jobs import marketing_execution_job
from marketing_pipelines.executions.sensors import due_work_sensor, work_run_canceled_sensor, work_run_failure_sensor
from marketing_pipelines.settings import Settings

settings = Settings.from_env()

defs = dg.Definitions(
    jobs=[marketing_execution_job],
    sensors=[due_work_sensor, work_run_failure_sensor, work_run_canceled_sensor],
    resources={
        "app_db": AppDatabase(),
        "webhook": WebhookClient(timeout_s=settings.webhook_timeout_seconds),
    },
)
