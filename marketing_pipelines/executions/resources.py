"""``ExecutionSettings``: how the executions queue is claimed, batched, leased and retried, as resource config."""

from __future__ import annotations

import dagster as dg

from marketing_pipelines.settings import setting_field, shown_in_ui

# Exponential backoff is capped so a long-failing webhook is still retried within the hour.
MAX_RETRY_DELAY_SECONDS = 3600.0


@shown_in_ui
class ExecutionSettings(dg.ConfigurableResource):
    """The executions queue's tunables; each field is a MARKETING_* setting and shows its env var in the UI."""

    batch_size: int = setting_field("sensor_batch_size")
    executions_per_run: int = setting_field("executions_per_run")
    lease_seconds: int = setting_field("execution_lease_seconds")
    retry_backoff_seconds: float = setting_field("retry_backoff_seconds")

    def retry_delay_seconds(self, attempt: int) -> float:
        """The wait before the attempt after ``attempt``: the base delay, doubled per attempt, capped."""
        return min(MAX_RETRY_DELAY_SECONDS, self.retry_backoff_seconds * 2 ** max(0, attempt - 1))
