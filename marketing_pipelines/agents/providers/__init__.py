"""Model providers for the agent loop: neutral records, a shared base, three implementations, one registry.

- ``offline.OfflineModel``: deterministic and networkless (the default).
- ``anthropic.AnthropicModel``: the Anthropic Messages API.
- ``openai.OpenAIModel``: the Chat Completions API of OpenAI or any OpenAI-compatible server.
- ``types``: the neutral records (no Dagster, no httpx: the catalog and the CLI use them).
- ``registry``: each provider's name, resource class and env vars, and where those are read.
"""

# Nothing is re-exported: each name is imported from the module that defines it, and importing
# this package loads no provider (the command line needs none).
