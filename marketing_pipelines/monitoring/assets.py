"""The two work queues as observable source assets, and the observation of each that ``queue_health_sensor`` records.

Nothing materializes them: the tables belong to the queues. An observation is one reading of a
queue's health with numeric metadata, which the asset's page plots over time (one point a minute).
They are observable (``observe_queues``, see ``observable.py``), so the UI shows them as observed.
"""

from collections.abc import Iterator

import dagster as dg

from marketing_pipelines.monitoring.health import QueueHealth, queue_health
from marketing_pipelines.monitoring.resources import Queue
from marketing_pipelines.observable import observable_assets

GROUP = "monitoring"
OWNERS = ["team:marketing-data"]
EXECUTION_QUEUE = dg.AssetKey("execution_queue")
AGENT_RUN_QUEUE = dg.AssetKey("agent_run_queue")
QUEUE_ASSETS: dict[Queue, dg.AssetKey] = {"executions": EXECUTION_QUEUE, "agent_runs": AGENT_RUN_QUEUE}

_THRESHOLDS = (
    "Its checks `due_lag` and `failed_last_hour` turn WARN and ERROR at the thresholds of the "
    "`health_settings` resource (MARKETING_HEALTH_*)."
)

EXECUTION_QUEUE_SPEC = dg.AssetSpec(
    EXECUTION_QUEUE,
    description=(
        "Table `marketing_execution`, the queue `due_executions_sensor` claims from. One observation is one "
        "reading of the queue, about once a minute (`queue_health_sensor`, the same figures as "
        "`marketing-pipelines status`):\n\n"
        "- `due`: SCHEDULED executions whose due time has passed\n"
        "- `oldest_due_seconds`: how long the oldest of them has been due (0 when none is)\n"
        "- `running`: executions claimed by a run\n"
        "- `failed_last_hour` / `succeeded_last_hour`: executions that ended so in the last hour\n\n"
        f"A queue that keeps up shows `due` and `oldest_due_seconds` near 0. {_THRESHOLDS}"
    ),
    group_name=GROUP,
    kinds={"sql"},
    owners=OWNERS,
)
AGENT_RUN_QUEUE_SPEC = dg.AssetSpec(
    AGENT_RUN_QUEUE,
    description=(
        "Table `agent_run`, the queue `queued_agent_runs_sensor` claims from. One observation is one reading of "
        "the queue, about once a minute (`queue_health_sensor`, the same figures as `marketing-pipelines status`):"
        "\n\n"
        "- `queued`: agent runs waiting for a run\n"
        "- `oldest_queued_seconds`: how long ago the oldest of them was requested (0 when none waits)\n"
        "- `running`: agent runs claimed by a run\n"
        "- `failed_last_hour`: agent runs that FAILED in the last hour (REFUSED requests are not failures)\n\n"
        f"A queue that keeps up shows `queued` and `oldest_queued_seconds` near 0. {_THRESHOLDS}"
    ),
    group_name=GROUP,
    kinds={"sql"},
    owners=OWNERS,
)


def queue_observations(health: QueueHealth) -> list[dg.AssetObservation]:
    """One observation per queue asset. An age is 0, not absent, when nothing waits, so the plot has no gaps."""
    e, a = health.executions, health.agent_runs
    return [
        dg.AssetObservation(
            EXECUTION_QUEUE,
            metadata={
                "due": dg.MetadataValue.int(e.due),
                "oldest_due_seconds": dg.MetadataValue.float(e.oldest_due_seconds or 0.0),
                "running": dg.MetadataValue.int(e.running),
                "failed_last_hour": dg.MetadataValue.int(e.failed_last_hour),
                "succeeded_last_hour": dg.MetadataValue.int(e.succeeded_last_hour),
            },
        ),
        dg.AssetObservation(
            AGENT_RUN_QUEUE,
            metadata={
                "queued": dg.MetadataValue.int(a.queued),
                "oldest_queued_seconds": dg.MetadataValue.float(a.oldest_queued_seconds or 0.0),
                "running": dg.MetadataValue.int(a.running),
                "failed_last_hour": dg.MetadataValue.int(a.failed_last_hour),
            },
        ),
    ]


def _observe_queues(context: dg.AssetExecutionContext) -> Iterator[dg.ObserveResult]:
    with context.resources.app_db.ready_engine().connect() as conn:
        health = queue_health(conn)
    for observation in queue_observations(health):
        yield dg.ObserveResult(asset_key=observation.asset_key, metadata=observation.metadata)


observe_queues = observable_assets(
    [EXECUTION_QUEUE_SPEC, AGENT_RUN_QUEUE_SPEC],
    "observe_queues",
    "One reading of both queues' health, as queue_health_sensor records it every minute.",
    _observe_queues,
)
