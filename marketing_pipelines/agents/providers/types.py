"""The neutral records the agent loop and every provider speak: tool specs and calls, model turns, the protocol.

Plain dataclasses and a protocol, without Dagster or httpx: the tool catalog and the agent-run
queue (which the command line imports) use them without loading a provider's HTTP resource.
Neutral messages::

    {"role": "user", "content": str}
    {"role": "assistant", "content": str, "tool_calls": [{"id", "name", "arguments"}, ...]}
    {"role": "tool", "tool_call_id": str, "name": str, "content": str, "is_error": bool}

``ModelTurn.usage`` is always ``{"input_tokens": int, "output_tokens": int}`` whatever the provider
calls them, so the caller's token bucket reads one shape. ``ModelTurn.stop_reason`` is the
provider's own value ("end_turn"/"tool_use" for Anthropic and offline, "stop"/"tool_calls" for
OpenAI); the loop should decide whether to continue from ``tool_calls``, not from it.
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass(frozen=True)
class ModelTurn:
    text: str
    tool_calls: tuple[ToolCall, ...]
    stop_reason: str
    usage: dict


@runtime_checkable
class ModelProvider(Protocol):
    @property
    def name(self) -> str: ...

    def complete(self, system: str, messages: list[dict], tools: list[ToolSpec]) -> ModelTurn: ...
