"""``HealthSettings``: the WARN and ERROR thresholds of the queue health checks, as resource config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import dagster as dg

from marketing_pipelines.monitoring.health import QueueHealth
from marketing_pipelines.settings import setting_field, shown_in_ui

Queue = Literal["executions", "agent_runs"]
CheckName = Literal["due_lag", "failed_last_hour"]


@dataclass(frozen=True)
class CheckVerdict:
    """One queue health check's outcome: the value against its thresholds, and the severity it earns."""

    queue: Queue
    check: CheckName
    value: float
    warn_at: float
    error_at: float
    severity: dg.AssetCheckSeverity | None  # None: passed

    @property
    def passed(self) -> bool:
        return self.severity is None


def severity_of(value: float, warn_at: float, error_at: float) -> dg.AssetCheckSeverity | None:
    """ERROR at or above ``error_at``, else WARN at or above ``warn_at``, else None (passed)."""
    if value >= error_at:
        return dg.AssetCheckSeverity.ERROR
    if value >= warn_at:
        return dg.AssetCheckSeverity.WARN
    return None


@shown_in_ui
class HealthSettings(dg.ConfigurableResource):
    """Thresholds of the queue checks; each field is a MARKETING_* setting and shows its env var in the UI."""

    due_lag_warn_seconds: float = setting_field("health_due_lag_warn_seconds")
    due_lag_error_seconds: float = setting_field("health_due_lag_error_seconds")
    failed_last_hour_warn: int = setting_field("health_failed_last_hour_warn")
    failed_last_hour_error: int = setting_field("health_failed_last_hour_error")

    def due_lag(self, queue: Queue, seconds: float | None) -> CheckVerdict:
        # Nothing waiting is no lag at all.
        value = seconds or 0.0
        return CheckVerdict(
            queue,
            "due_lag",
            value,
            self.due_lag_warn_seconds,
            self.due_lag_error_seconds,
            severity_of(value, self.due_lag_warn_seconds, self.due_lag_error_seconds),
        )

    def failed_last_hour(self, queue: Queue, failed: int) -> CheckVerdict:
        return CheckVerdict(
            queue,
            "failed_last_hour",
            failed,
            self.failed_last_hour_warn,
            self.failed_last_hour_error,
            severity_of(failed, self.failed_last_hour_warn, self.failed_last_hour_error),
        )

    def verdicts(self, health: QueueHealth) -> list[CheckVerdict]:
        """The four checks (due lag and failures in the last hour, of each queue) of one reading."""
        e, a = health.executions, health.agent_runs
        return [
            self.due_lag("executions", e.oldest_due_seconds),
            self.failed_last_hour("executions", e.failed_last_hour),
            self.due_lag("agent_runs", a.oldest_queued_seconds),
            self.failed_last_hour("agent_runs", a.failed_last_hour),
        ]
