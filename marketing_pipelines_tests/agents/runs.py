"""Running one queued agent run in-process, the way the tests of several modules need it: ``run_one`` ticks
the queued-agent-runs sensor and executes the one run it requests with the given provider resources, and
``output_metadata`` reads the metadata of that run's successful output.
"""

from __future__ import annotations

from typing import Any

import dagster as dg

from marketing_pipelines.agents.jobs import agent_run_job
from marketing_pipelines.agents.providers.registry import ProviderResource
from marketing_pipelines.agents.resources import AgentSettings
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines_tests.built import queued_agent_runs_sensor

# What agent_run_job needs beside the database and the model providers: its settings, and the webhook client
# whose destination policy bounds what its schedule_execution tool may schedule.
AGENT_RESOURCES = {"agent_settings": AgentSettings(), "webhook": WebhookClient()}


def run_one(
    db_url: str,
    instance: dg.DagsterInstance,
    models: dict[str, ProviderResource],
    settings: AgentSettings | None = None,
) -> dg.ExecuteInProcessResult:
    settings = settings or AgentSettings()
    context = dg.build_sensor_context(
        instance=instance,
        resources={"app_db": AppDatabase(url=db_url), "agent_settings": settings},
    )
    result = queued_agent_runs_sensor(context)
    assert isinstance(result, dg.SensorResult)
    [request] = result.run_requests or []
    return agent_run_job.execute_in_process(
        run_config=request.run_config,
        tags=request.tags,
        instance=instance,
        resources={"app_db": AppDatabase(url=db_url), **models, "webhook": WebhookClient(), "agent_settings": settings},
        raise_on_error=False,
    )


def output_metadata(result: dg.ExecuteInProcessResult) -> dict[str, Any]:
    [output] = [e for e in result.events_for_node("run_agent") if e.is_successful_output]
    return {k: v.value for k, v in output.step_output_data.metadata.items()}
