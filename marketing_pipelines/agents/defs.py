"""The agents domain's Dagster definitions: its job, its claiming and reconciling sensors, its resources."""

import dagster as dg

from marketing_pipelines.agents.assets import build_model_cost_asset
from marketing_pipelines.agents.jobs import agent_run_job
from marketing_pipelines.agents.models import model_resources
from marketing_pipelines.agents.resources import AgentSettings
from marketing_pipelines.agents.sensors import (
    agent_run_canceled_sensor,
    agent_run_failure_sensor,
    build_queued_agent_runs_sensor,
)
from marketing_pipelines.settings import Settings, resource_from_settings


def build_defs(settings: Settings) -> dg.Definitions:
    """The domain's definitions as ``settings`` shape them: the claiming sensor's interval and the resources."""
    return dg.Definitions(
        assets=[build_model_cost_asset(settings)],
        jobs=[agent_run_job],
        sensors=[
            build_queued_agent_runs_sensor(settings.sensor_interval_seconds),
            agent_run_failure_sensor,
            agent_run_canceled_sensor,
        ],
        resources={
            # Each provider under its resource key (offline_model, anthropic_model, openai_model).
            **model_resources(settings),
            "agent_settings": resource_from_settings(AgentSettings, settings),
        },
    )
