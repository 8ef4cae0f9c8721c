"""Running what the execution sensor requests, the way the tests of several modules need it."""

from __future__ import annotations

import dagster as dg

from marketing_pipelines.agents.resources import AgentSettings
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.executions.jobs import OP_NAME, marketing_execution_job
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.executions.webhook import WebhookClient

LOCAL = ["127.0.0.1/32"]  # the test receivers' address, allowed as an operator would allow it


def sensor_requests(
    sensor: dg.SensorDefinition,
    db_url: str,
    instance: dg.DagsterInstance,
    settings: ExecutionSettings | None = None,
) -> list[dg.RunRequest]:
    """One evaluation of ``sensor``; the run requests it returned (none when it skipped)."""
    context = dg.build_sensor_context(
        instance=instance,
        # Both domains' settings, so one helper evaluates either claiming sensor.
        resources={
            "app_db": AppDatabase(url=db_url),
            "execution_settings": settings or ExecutionSettings(),
            "agent_settings": AgentSettings(),
        },
    )
    result = sensor(context)
    return list(result.run_requests or []) if isinstance(result, dg.SensorResult) else []


def perform(
    request: dg.RunRequest,
    db_url: str,
    instance: dg.DagsterInstance,
    webhook: WebhookClient | None = None,
    app_db: AppDatabase | None = None,
    settings: ExecutionSettings | None = None,
) -> dg.ExecuteInProcessResult:
    """Run one requested marketing_execution_job on ``instance``, as a launched run would."""
    return marketing_execution_job.execute_in_process(
        run_config=request.run_config,
        tags=request.tags,
        instance=instance,
        resources={
            "app_db": app_db or AppDatabase(url=db_url),
            "webhook": webhook or WebhookClient(timeout_s=5, allow_networks=LOCAL),
            "execution_settings": settings or ExecutionSettings(),
        },
        raise_on_error=False,
    )


def outcome_metadata(result: dg.ExecuteInProcessResult) -> dict[str, dg.MetadataValue]:
    """The op's metadata as the UI shows it: on its output, or on its failure when an execution FAILED."""
    for event in result.all_node_events:
        if event.step_key != OP_NAME:
            continue
        if event.event_type_value == "STEP_OUTPUT":
            return dict(event.step_output_data.metadata)
        if event.event_type_value == "STEP_FAILURE":
            failure = event.step_failure_data.user_failure_data
            assert failure is not None, "the op failed without recording its outcomes"
            return dict(failure.metadata)
    raise AssertionError("the op neither produced an output nor failed")


def outcomes(result: dg.ExecuteInProcessResult) -> dict[int, str]:
    """The run's outcome table, as {execution_id: outcome}: what the UI shows for the run."""
    table = outcome_metadata(result)["executions"]
    return {record.data["execution_id"]: record.data["outcome"] for record in table.records}
