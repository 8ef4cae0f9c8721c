"""``ModelGateway``: the one resource through which agent runs reach a model provider.

Each agent run records its provider at request time; the gateway builds that provider here.
API keys are ``dg.EnvVar``s, bound only when the variable is set when the code location loads,
so a deployment without a key still loads and says "not configured" instead of failing.
"""

import os

import dagster as dg

from marketing_pipelines.agents.providers import AnthropicModel, ModelProvider, OfflineModel, OpenAIModel
from marketing_pipelines.http import ServiceError


class ModelGateway(dg.ConfigurableResource):
    anthropic_api_key: str | None = None
    anthropic_model: str = "claude-sonnet-4-5"
    anthropic_base_url: str = "https://api.anthropic.com"
    openai_api_key: str | None = None
    openai_model: str = "gpt-4o-mini"
    openai_base_url: str = "https://api.openai.com/v1"
    timeout_s: float = 60.0

    def provider(self, name: str) -> ModelProvider:
        if name == "offline":
            return OfflineModel()
        if name == "anthropic":
            if not self.anthropic_api_key:
                raise ServiceError("anthropic", "not configured: set ANTHROPIC_API_KEY where the runs execute")
            return AnthropicModel(
                api_key=self.anthropic_api_key,
                model=self.anthropic_model,
                base_url=self.anthropic_base_url,
                timeout_s=self.timeout_s,
            )
        if name == "openai":
            if not self.openai_api_key:
                raise ServiceError("openai", "not configured: set OPENAI_API_KEY where the runs execute")
            return OpenAIModel(
                api_key=self.openai_api_key,
                model=self.openai_model,
                base_url=self.openai_base_url,
                timeout_s=self.timeout_s,
            )
        raise ServiceError(name, "unknown model provider")


def _env_or_none(name: str) -> dg.EnvVar | None:
    return dg.EnvVar(name) if os.environ.get(name) else None


def model_gateway_from_env() -> ModelGateway:
    return ModelGateway(
        anthropic_api_key=_env_or_none("ANTHROPIC_API_KEY"),
        anthropic_model=os.environ.get("ANTHROPIC_MODEL", "claude-sonnet-4-5"),
        openai_api_key=_env_or_none("OPENAI_API_KEY"),
        openai_model=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
        openai_base_url=os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1"),
    )
