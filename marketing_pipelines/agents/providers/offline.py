"""``OfflineModel``: the deterministic, networkless provider (the default), and its registry record.

It still calls tools, one per turn, so the whole agent path runs in tests and on machines without
an API key.
"""

from __future__ import annotations

import dagster as dg

from marketing_pipelines.agents.providers.base import ProviderSpec
from marketing_pipelines.agents.providers.types import ModelTurn, ToolCall, ToolSpec
from marketing_pipelines.settings import shown_in_ui
from marketing_pipelines.strict_json import loads_json

OFFLINE_RESULT_PREVIEW_CHARS = 200


@shown_in_ui
class OfflineModel(dg.ConfigurableResource):
    """Deterministic stand-in for a model: calls each tool whose required inputs the task provides, then summarises.

    The task is the first user message, read as a JSON object. Tools are tried in the order given;
    each is called at most once per conversation, one per turn.
    """

    @property
    def name(self) -> str:
        return OFFLINE.name

    def is_configured(self) -> bool:
        return True

    def complete(self, system: str, messages: list[dict], tools: list[ToolSpec]) -> ModelTurn:
        task = _first_user_object(messages)
        earlier_calls = _earlier_tool_calls(messages)
        already_called = {call.get("name") for call in earlier_calls}
        usage = {"input_tokens": 0, "output_tokens": 0}
        for tool in tools:
            if tool.name in already_called:
                continue
            required = list(tool.input_schema.get("required") or [])
            if not all(key in task for key in required):
                continue
            optional = [key for key in tool.input_schema.get("properties") or {} if key not in required]
            arguments = {key: task[key] for key in [*required, *optional] if key in task}
            call = ToolCall(id=f"offline-{len(earlier_calls) + 1}", name=tool.name, arguments=arguments)
            return ModelTurn(text="", tool_calls=(call,), stop_reason="tool_use", usage=usage)
        return ModelTurn(text=_offline_summary(messages), tool_calls=(), stop_reason="end_turn", usage=usage)


OFFLINE = ProviderSpec(name="offline", resource_class=OfflineModel)


def _first_user_object(messages: list[dict]) -> dict:
    for message in messages:
        if message.get("role") == "user":
            content = message.get("content")
            try:
                parsed = loads_json(content) if isinstance(content, str) else None
            except ValueError:  # not JSON, NaN, or nested deeper than MAX_JSON_DEPTH: no usable task
                parsed = None
            return parsed if isinstance(parsed, dict) else {}
    return {}


def _earlier_tool_calls(messages: list[dict]) -> list[dict]:
    return [call for m in messages if m.get("role") == "assistant" for call in m.get("tool_calls") or []]


def _offline_summary(messages: list[dict]) -> str:
    names_by_call_id = {call.get("id"): call.get("name") for call in _earlier_tool_calls(messages)}
    lines = []
    for message in messages:
        if message.get("role") != "tool":
            continue
        tool_name = message.get("name") or names_by_call_id.get(message.get("tool_call_id")) or "unknown tool"
        content = str(message.get("content", ""))
        if message.get("is_error"):
            lines.append(f"{tool_name} was refused: {content}")
        else:
            lines.append(f"{tool_name}: {content[:OFFLINE_RESULT_PREVIEW_CHARS]}")
    return "\n".join(lines) if lines else "No tools were called, so there is nothing to report."
