"""The neutral records the agent loop and every provider speak: tool specs and calls, model turns, the protocol.

Plain dataclasses and a protocol, without Dagster or httpx: the tool catalog and the agent-run
queue (which the command line imports) use them without loading a provider's HTTP resource.
Neutral messages::

    {"role": "user", "content": str}
    {"role": "assistant", "content": str, "tool_calls": [{"id", "name", "arguments"}, ...]}
    {"role": "tool", "tool_call_id": str, "name": str, "content": str, "is_error": bool}

``ModelTurn.usage`` is always the four ``USAGE_KEYS`` whatever the provider calls them, so the limits, the
cost and the budgets read one shape: ``input_tokens`` is input billed at the full price (Anthropic's
``input_tokens``; OpenAI's ``prompt_tokens`` less its cached tokens), ``cache_read_input_tokens`` input read
from the prompt cache, ``cache_creation_input_tokens`` input written to it (Anthropic only), ``output_tokens``
the answer. ``ModelTurn.rate_limits`` is what the answer's headers say the limits are, per minute, by
``LIMIT_UNITS`` name (only the units the headers named). ``ModelTurn.stop_reason`` is the
provider's own value ("end_turn"/"tool_use" for Anthropic and offline, "stop"/"tool_calls" for
OpenAI); the loop should decide whether to continue from ``tool_calls``, not from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict
    # Why the model's arguments could not be read (invalid JSON, nested too deep): the loop refuses the
    # call, records it and answers the model, as for arguments that do not fit the tool's schema.
    problem: str | None = None


USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
# What a provider limits per minute: calls, input tokens and output tokens (Anthropic), or all tokens (OpenAI).
LIMIT_UNITS = ("requests", "input_tokens", "output_tokens", "tokens")


def usage_of(**counts: int) -> dict[str, int]:
    """A usage record with every ``USAGE_KEYS`` key, missing ones 0."""
    return {key: int(counts.get(key, 0)) for key in USAGE_KEYS}


@dataclass(frozen=True)
class ModelTurn:
    text: str
    tool_calls: tuple[ToolCall, ...]
    stop_reason: str
    usage: dict
    # The model that answered (the answer's own "model"), else the one asked for.
    model: str = ""
    # Limits per minute the answer's headers reported, by LIMIT_UNITS name.
    rate_limits: dict = field(default_factory=dict)


@runtime_checkable
class ModelProvider(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def model(self) -> str: ...

    def complete(self, system: str, messages: list[dict], tools: list[ToolSpec]) -> ModelTurn: ...

    def estimate(self, system: str, messages: list[dict], tools: list[ToolSpec]) -> dict[str, int]:
        """What the call would take of each ``LIMIT_UNITS`` at most: 1 request, an input estimate that is not
        below what the provider will count, ``max_tokens`` of output, and their sum as ``tokens``."""
        ...
