"""``ModelGateway``: the one resource through which agent runs reach a model provider, and ``model_resources``.

The provider resources (``OfflineModel``, ``AnthropicModel``, ``OpenAIModel``) are registered in the
agents ``Definitions`` under their own keys and nested in the gateway (the same instances), so each
provider's config (model, base URL, timeout; the key as an env var) shows under its resource in the
Dagster UI. Each agent run records its provider at request time; the job asks the gateway for it
by name. API keys are ``dg.EnvVar``s bound only when the variable is set when the code location
loads, so a deployment without a key still loads and says "not configured" when a run needs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from marketing_pipelines.agents.providers.anthropic import AnthropicModel
from marketing_pipelines.agents.providers.offline import OfflineModel
from marketing_pipelines.agents.providers.openai import OpenAIModel
from marketing_pipelines.agents.providers.registry import PROVIDERS, provider_resources, provider_spec
from marketing_pipelines.agents.providers.types import ModelProvider
from marketing_pipelines.http import ServiceError
from marketing_pipelines.settings import Settings, shown_in_ui

MODELS_RESOURCE_KEY = "models"


@shown_in_ui
class ModelGateway(dg.ConfigurableResource):
    """Hands an agent run the provider it asked for, or a ServiceError saying why it cannot.

    One field per provider, named as in the registry. A bare ``ModelGateway()`` (tests, the demo)
    holds unconfigured providers: offline works, the others say "not configured".
    """

    offline: OfflineModel
    anthropic: AnthropicModel
    openai: OpenAIModel

    def __init__(self, **data: Any) -> None:
        for spec in PROVIDERS:
            data.setdefault(spec.name, spec.resource_class())
        super().__init__(**data)

    def provider(self, name: str) -> ModelProvider:
        spec = provider_spec(name)
        if spec is None:
            raise ServiceError(name, "unknown model provider")
        resource = getattr(self, spec.name)
        if not resource.is_configured():
            # The key is bound when the code location loads (dg.EnvVar, only if set): setting it
            # afterwards changes nothing until a reload.
            raise ServiceError(
                name,
                f"not configured: set {spec.api_key_env} where the code location loads and the runs execute, "
                "then reload the code location",
            )
        return resource


def model_resources(settings: Settings, environ: Mapping[str, str] | None = None) -> dict[str, dg.ConfigurableResource]:
    """The agents domain's model resources: each provider under its registry key, and the gateway holding them.

    ``environ`` (default: os.environ, where the code location loads) decides which keys are bound as EnvVars.
    """
    providers = provider_resources(settings, environ)
    gateway = ModelGateway(**providers)
    return {MODELS_RESOURCE_KEY: gateway, **{spec.resource_key: providers[spec.name] for spec in PROVIDERS}}
