"""Model providers for the agent loop: one neutral interface (``base``), three implementations, one registry.

- ``offline.OfflineModel``: deterministic and networkless (the default).
- ``anthropic.AnthropicModel``: the Anthropic Messages API.
- ``openai.OpenAIModel``: the Chat Completions API of OpenAI or any OpenAI-compatible server.
- ``registry``: each provider's name, resource class and env vars, and where those are read.
"""

from marketing_pipelines.agents.providers.anthropic import AnthropicModel
from marketing_pipelines.agents.providers.base import ModelProvider, ModelTurn, ProviderSpec, ToolCall, ToolSpec
from marketing_pipelines.agents.providers.offline import OfflineModel
from marketing_pipelines.agents.providers.openai import OpenAIModel
from marketing_pipelines.agents.providers.registry import (
    PROVIDER_NAMES,
    PROVIDERS,
    ProviderResource,
    provider_resources_from_env,
    provider_spec,
)

__all__ = [
    "PROVIDERS",
    "PROVIDER_NAMES",
    "AnthropicModel",
    "ModelProvider",
    "ModelTurn",
    "OfflineModel",
    "OpenAIModel",
    "ProviderResource",
    "ProviderSpec",
    "ToolCall",
    "ToolSpec",
    "provider_resources_from_env",
    "provider_spec",
]
