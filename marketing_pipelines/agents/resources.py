"""``AgentSettings``: how agent runs are claimed, limited and leased, as resource config."""

from __future__ import annotations

from typing import Any

import dagster as dg
from pydantic import field_validator

from marketing_pipelines.settings import model_limits_of, parse_model_prices, setting_field, shown_in_ui


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

    @field_validator("model_prices", mode="before")
    @classmethod
    def _prices(cls, value: Any) -> dict[str, dict[str, float]]:
        # Run config given in the launchpad reaches the resource without Settings' check: the same check, so a
        # negative, non-finite, absurd or misspelt price fails the run at its start naming the model and key,
        # instead of costing runs wrongly (parse_model_prices keeps the defaults under what is given).
        return parse_model_prices(value)

    def default_limits(self) -> dict[str, int]:
        """Each unit's per-minute limit for every model of a provider, as ``Settings.default_model_limits``."""
        return model_limits_of(self)

    lease_grace_seconds: int = setting_field("agent_lease_grace_seconds")
