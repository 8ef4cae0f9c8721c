"""The provider registry: every model provider's record, and the one place their env vars are read.

Each record (``ProviderSpec``) gives a provider's name, resource class, resource key in
``Definitions``, API-key env var, model env var, base-URL env var and default model:

    ============  ==============  =================  ===============  ==================
    name          resource        API key            model            base URL
    ============  ==============  =================  ===============  ==================
    offline       OfflineModel    (none)             (none)           (none)
    anthropic     AnthropicModel  ANTHROPIC_API_KEY  ANTHROPIC_MODEL  ANTHROPIC_BASE_URL
    openai        OpenAIModel     OPENAI_API_KEY     OPENAI_MODEL     OPENAI_BASE_URL
    ============  ==============  =================  ===============  ==================

The records themselves sit next to each resource class (``offline.py``, ``anthropic.py``,
``openai.py``); this module is the index every other module reads. ``PROVIDER_NAMES`` is the
source of ``settings.MODEL_PROVIDERS`` (settings may not import agents, so a test holds the two
equal).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from marketing_pipelines.agents.providers.anthropic import ANTHROPIC, AnthropicModel
from marketing_pipelines.agents.providers.base import ProviderSpec
from marketing_pipelines.agents.providers.offline import OFFLINE, OfflineModel
from marketing_pipelines.agents.providers.openai import OPENAI, OpenAIModel

ProviderResource = OfflineModel | AnthropicModel | OpenAIModel

PROVIDERS: tuple[ProviderSpec, ...] = (OFFLINE, ANTHROPIC, OPENAI)
PROVIDER_NAMES: tuple[str, ...] = tuple(spec.name for spec in PROVIDERS)
_BY_NAME = {spec.name: spec for spec in PROVIDERS}


def provider_spec(name: str) -> ProviderSpec | None:
    return _BY_NAME.get(name)


def provider_resources_from_env(environ: Mapping[str, str] | None = None) -> dict[str, ProviderResource]:
    """One resource per provider, keyed by provider name, configured from ``environ`` (default: os.environ).

    Read where the code location loads. Model names and base URLs are plain config (they show in
    the UI); API keys are ``dg.EnvVar``s bound only when set (see ``ProviderSpec.resource_from_env``).
    """
    env = os.environ if environ is None else environ
    return {spec.name: spec.resource_from_env(env) for spec in PROVIDERS}
