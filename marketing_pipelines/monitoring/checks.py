"""The queue health checks: due lag and failures in the last hour, on each queue asset.

One reading of the database decides all four (``HealthSettings.verdicts``). ``queue_health_sensor``
records them every minute as check evaluations beside its observations; ``queue_health_checks``
declares them, so the UI lists them under their assets, and computes them afresh when someone
executes them from the UI.
"""

from collections.abc import Iterator, Sequence
from typing import Any

import dagster as dg

from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.monitoring.assets import QUEUE_ASSETS
from marketing_pipelines.monitoring.health import queue_health
from marketing_pipelines.monitoring.resources import CheckName, CheckVerdict, HealthSettings, Queue

DUE_LAG: CheckName = "due_lag"
FAILED_LAST_HOUR: CheckName = "failed_last_hour"

_DESCRIPTIONS: dict[tuple[Queue, CheckName], str] = {
    ("executions", DUE_LAG): "How long the oldest due SCHEDULED execution has waited (0 when none is due).",
    ("executions", FAILED_LAST_HOUR): "Executions that ended FAILED in the last hour.",
    ("agent_runs", DUE_LAG): "How long ago the oldest QUEUED agent run was requested (0 when none waits).",
    ("agent_runs", FAILED_LAST_HOUR): "Agent runs that ended FAILED in the last hour (REFUSED requests do not count).",
}
_THRESHOLDS = " WARN and ERROR at the thresholds of the health_settings resource."

QUEUE_CHECK_SPECS = [
    dg.AssetCheckSpec(check, asset=QUEUE_ASSETS[queue], description=text + _THRESHOLDS)
    for (queue, check), text in _DESCRIPTIONS.items()
]


def check_key(verdict: CheckVerdict) -> dg.AssetCheckKey:
    return dg.AssetCheckKey(QUEUE_ASSETS[verdict.queue], verdict.check)


def _metadata(verdict: CheckVerdict) -> dict[str, dg.MetadataValue]:
    numbers = {"value": verdict.value, "warn_at": verdict.warn_at, "error_at": verdict.error_at}
    if verdict.check == DUE_LAG:
        return {name: dg.MetadataValue.float(float(n)) for name, n in numbers.items()}
    return {name: dg.MetadataValue.int(int(n)) for name, n in numbers.items()}


def _description(verdict: CheckVerdict) -> str:
    unit = " s" if verdict.check == DUE_LAG else ""
    level = "passed" if verdict.severity is None else verdict.severity.value
    # Whole seconds: ":g" would print a lag of days as 1.2e+06.
    return (
        f"{verdict.value:.0f}{unit} ({level}; WARN at {verdict.warn_at:g}{unit}, ERROR at {verdict.error_at:g}{unit})"
    )


def _fields(verdict: CheckVerdict) -> dict[str, Any]:
    """What the sensor's evaluation and a run's result share: Dagster has a class for each."""
    key = check_key(verdict)
    return {
        "asset_key": key.asset_key,
        "check_name": key.name,
        "passed": verdict.passed,
        "metadata": _metadata(verdict),
        "severity": verdict.severity or dg.AssetCheckSeverity.WARN,
        "description": _description(verdict),
    }


def check_evaluation(verdict: CheckVerdict) -> dg.AssetCheckEvaluation:
    """The verdict as the event a sensor records (no run)."""
    return dg.AssetCheckEvaluation(**_fields(verdict))


def check_result(verdict: CheckVerdict) -> dg.AssetCheckResult:
    """The verdict as the result of a check executed in a run."""
    return dg.AssetCheckResult(**_fields(verdict))


def failing_text(verdicts: Sequence[CheckVerdict]) -> str:
    """``executions due_lag ERROR: 2000 s (...)``, one clause per failing verdict."""
    return "; ".join(f"{v.queue} {v.check} {_description(v)}" for v in verdicts if not v.passed)


@dg.multi_asset_check(
    name="queue_health_checks",
    specs=QUEUE_CHECK_SPECS,
    can_subset=True,
    description=(
        "Reads both queues' health once and evaluates the selected checks (queue_health_sensor does so every minute)."
    ),
)
def queue_health_checks(
    context: dg.AssetCheckExecutionContext, app_db: AppDatabase, health_settings: HealthSettings
) -> Iterator[dg.AssetCheckResult]:
    with app_db.ready_engine().connect() as conn:
        health = queue_health(conn)
    selected = context.selected_asset_check_keys
    for verdict in health_settings.verdicts(health):
        if check_key(verdict) in selected:
            yield check_result(verdict)
