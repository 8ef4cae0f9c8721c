"""The provider registry: every model provider's record.

Each record (``ProviderSpec``) gives a provider's name, resource class, resource key in
``Definitions`` and the settings that configure it, each read from the service's own variable:

    ============  ==============  =================  ===============  ==================
    name          resource        API key            model            base URL
    ============  ==============  =================  ===============  ==================
    offline       OfflineModel    (none)             (none)           (none)
    anthropic     AnthropicModel  ANTHROPIC_API_KEY  ANTHROPIC_MODEL  ANTHROPIC_BASE_URL
    openai        OpenAIModel     OPENAI_API_KEY     OPENAI_MODEL     OPENAI_BASE_URL
    ============  ==============  =================  ===============  ==================

The records themselves sit next to each resource class (``offline.py``, ``anthropic.py``,
``openai.py``); this module is the index every other module reads, in the order of
``settings.MODEL_PROVIDERS``, the one list of providers' names (the settings and the command line
read it without loading any provider).
"""

from __future__ import annotations

from marketing_pipelines.agents.providers.anthropic import ANTHROPIC, AnthropicModel
from marketing_pipelines.agents.providers.base import ProviderSpec
from marketing_pipelines.agents.providers.offline import OFFLINE, OfflineModel
from marketing_pipelines.agents.providers.openai import OPENAI, OpenAIModel
from marketing_pipelines.settings import MODEL_PROVIDERS

ProviderResource = OfflineModel | AnthropicModel | OpenAIModel

_BY_NAME = {spec.name: spec for spec in (OFFLINE, ANTHROPIC, OPENAI)}
if set(_BY_NAME) != set(MODEL_PROVIDERS):
    # A provider added on one side only: fail where the code loads, naming both sides.
    raise ImportError(f"providers with a record {sorted(_BY_NAME)} != settings.MODEL_PROVIDERS {list(MODEL_PROVIDERS)}")
PROVIDERS: tuple[ProviderSpec, ...] = tuple(_BY_NAME[name] for name in MODEL_PROVIDERS)


def provider_spec(name: str) -> ProviderSpec | None:
    return _BY_NAME.get(name)
