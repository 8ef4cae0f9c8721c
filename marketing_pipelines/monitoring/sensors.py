"""``queue_health_sensor``: once a minute, an observation of each queue asset and the four queue checks.

It launches no run: the daemon records what it returns (``SensorResult.asset_events``) without one,
so the queue assets' pages plot the figures and their checks show WARN / ERROR as they happen. The
tick's skip reason says what it read; the sensor logs only when a check starts failing.
"""

import dagster as dg

from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.monitoring.assets import queue_observations
from marketing_pipelines.monitoring.checks import check_evaluation, failing_text
from marketing_pipelines.monitoring.health import QueueHealth, queue_health
from marketing_pipelines.monitoring.resources import CheckVerdict, HealthSettings

INTERVAL_SECONDS = 60


def summary(health: QueueHealth) -> str:
    """One line of the figures, for the tick's history in the UI."""
    e, a = health.executions, health.agent_runs
    return (
        f"executions: {e.due} due{_oldest(e.oldest_due_seconds)}, {e.running} running, "
        f"{e.failed_last_hour} failed / {e.succeeded_last_hour} succeeded in the last hour; "
        f"agent runs: {a.queued} queued{_oldest(a.oldest_queued_seconds)}, {a.running} running, "
        f"{a.failed_last_hour} failed in the last hour"
    )


def _state(verdict: CheckVerdict) -> str:
    """``executions.due_lag:ERROR``: a failing check and its severity, as the cursor keeps it."""
    severity = verdict.severity.value if verdict.severity else "WARN"
    return f"{verdict.queue}.{verdict.check}:{severity}"


def _oldest(seconds: float | None) -> str:
    return "" if seconds is None else f" (oldest {seconds:g} s)"


@dg.sensor(
    name="queue_health_sensor",
    minimum_interval_seconds=INTERVAL_SECONDS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Reads both work queues' health (the figures of `marketing-pipelines status`) about once a minute and "
        "records an observation of execution_queue and agent_run_queue, and their due_lag and failed_last_hour "
        "checks against the health_settings thresholds. Launches no run."
    ),
)
def queue_health_sensor(
    context: dg.SensorEvaluationContext, app_db: AppDatabase, health_settings: HealthSettings
) -> dg.SensorResult | dg.SkipReason:
    engine = app_db.ready_engine_or_skip()
    if isinstance(engine, dg.SkipReason):
        return engine
    with engine.connect() as conn:
        health = queue_health(conn)
    verdicts = health_settings.verdicts(health)
    failing = failing_text(verdicts)
    # The cursor names the checks failing at the last tick (with their severity): the daemon's log gets
    # a line when a check starts failing or changes severity, not one a minute while it stays so.
    now_failing = {_state(v): v for v in verdicts if not v.passed}
    before = set((context.cursor or "").split(",")) - {""}
    newly = [v for state, v in now_failing.items() if state not in before]
    if newly:
        context.log.warning(f"Queue health: {failing_text(newly)}")
    return dg.SensorResult(
        asset_events=[*queue_observations(health), *(check_evaluation(v) for v in verdicts)],
        skip_reason=summary(health) + (f"; failing: {failing}" if failing else "; all checks passed"),
        cursor=",".join(sorted(now_failing)),
    )
