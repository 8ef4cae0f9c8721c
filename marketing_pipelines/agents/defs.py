"""The agents domain's Dagster definitions: its job, its claiming and reconciling sensors, its model gateway."""

import dagster as dg

from marketing_pipelines.agents.jobs import agent_run_job
from marketing_pipelines.agents.models import model_gateway_from_env
from marketing_pipelines.agents.sensors import (
    agent_run_canceled_sensor,
    agent_run_failure_sensor,
    queued_agent_runs_sensor,
)

defs = dg.Definitions(
    jobs=[agent_run_job],
    sensors=[queued_agent_runs_sensor, agent_run_failure_sensor, agent_run_canceled_sensor],
    resources={"models": model_gateway_from_env()},
)
