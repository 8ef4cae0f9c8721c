"""``AgentSettings``: how agent runs are claimed, limited and leased, as resource config."""

from __future__ import annotations

import dagster as dg

from marketing_pipelines.settings import model_limits_of, setting_field, shown_in_ui


@shown_in_ui
class AgentSettings(dg.ConfigurableResource):
    """The agent queue's tunables; each field is a MARKETING_* setting and shows its env var in the UI."""

    batch_size: int = setting_field("sensor_batch_size")
    max_concurrent_agent_runs: int = setting_field("max_concurrent_agent_runs")
    max_model_calls_per_minute: int = setting_field("max_model_calls_per_minute")
    max_model_input_tokens_per_minute: int | None = setting_field("max_model_input_tokens_per_minute")
    max_model_output_tokens_per_minute: int | None = setting_field("max_model_output_tokens_per_minute")
    max_model_tokens_per_minute: int | None = setting_field("max_model_tokens_per_minute")
    model_prices: dict[str, dict[str, float]] = setting_field("model_prices")

    def default_limits(self) -> dict[str, int]:
        """Each unit's per-minute limit for every model of a provider, as ``Settings.default_model_limits``."""
        return model_limits_of(self)

    lease_grace_seconds: int = setting_field("agent_lease_grace_seconds")
