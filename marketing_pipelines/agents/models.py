"""The model providers as resources: ``model_resources`` builds one per provider, ``pick_provider`` hands an
agent run the one it asked for.

Each provider resource (``OfflineModel``, ``AnthropicModel``, ``OpenAIModel``) is registered once, under
its registry key (``offline_model``...), so its config (model, base URL, timeout; the key as an env
var) shows under its own resource in the Dagster UI and ``agent_run_job`` lists it among the resources
it uses. Each agent run records its provider at request time; the op picks that provider's resource.
API keys are ``dg.EnvVar``s bound only when the variable is set when the code location loads, so a
deployment without a key still loads and says "not configured" when a run needs it.
"""

from __future__ import annotations

from collections.abc import Mapping

from marketing_pipelines.agents.providers.registry import PROVIDERS, ProviderResource, provider_spec
from marketing_pipelines.agents.providers.types import ModelProvider
from marketing_pipelines.http import ServiceError
from marketing_pipelines.settings import Settings, resource_from_settings


def model_resources(settings: Settings, environ: Mapping[str, str] | None = None) -> dict[str, ProviderResource]:
    """One resource per provider, under its resource key, as ``settings`` configure it.

    Model names are plain config (they show in the UI); API keys and base URLs (a base URL may carry a
    credential) are ``dg.EnvVar``s bound only when their variable is set in ``environ`` (default:
    os.environ, where the code location loads), so a deployment without a key still loads and the
    public default base URL shows as it is.
    """
    return {
        spec.resource_key: resource_from_settings(spec.resource_class, settings, environ=environ) for spec in PROVIDERS
    }


def pick_provider(name: str, providers: Mapping[str, ProviderResource]) -> ModelProvider:
    """The resource of provider ``name`` among ``providers`` (by resource key), or a ServiceError saying why not."""
    spec = provider_spec(name)
    if spec is None:
        raise ServiceError(name, "unknown model provider")
    resource = providers[spec.resource_key]
    if not resource.is_configured():
        # The key is bound when the code location loads (dg.EnvVar, only if set): setting it
        # afterwards changes nothing until a reload.
        raise ServiceError(
            name,
            f"not configured: set {spec.api_key_env} where the code location loads and the runs execute, "
            "then reload the code location",
        )
    return resource
