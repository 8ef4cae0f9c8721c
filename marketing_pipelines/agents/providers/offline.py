"""``OfflineModel``: the deterministic, networkless provider (the default), and its registry record.

It still calls tools, one per turn, so the whole agent path runs in tests and on machines without
an API key. Its brief is one readable line per tool: the result's fields as ``key: value`` pairs, nested
values summarised by size, long text cut at a word. It costs nothing: its usage is all zero and its
estimate asks for no output tokens (its input estimate is still the prompt's, so limits see the same shape).
"""

from __future__ import annotations

from typing import Any

import dagster as dg

from marketing_pipelines.agents.providers.base import ProviderSpec, neutral_tools, request_estimate
from marketing_pipelines.agents.providers.types import ModelTurn, ToolCall, ToolSpec, usage_of
from marketing_pipelines.settings import shown_in_ui
from marketing_pipelines.strict_json import loads_json

OFFLINE_MODEL = "offline"
# The most of one field's text, and of one tool's line, in the brief.
OFFLINE_VALUE_CHARS = 80
OFFLINE_LINE_CHARS = 400
# How many fields of a result the brief names, and how many fields of a nested object.
OFFLINE_FIELDS = 12
OFFLINE_NESTED_NAMES = 4


@shown_in_ui
class OfflineModel(dg.ConfigurableResource):
    """Deterministic stand-in for a model: calls each tool whose required inputs the task provides, then summarises.

    The task is the first user message, read as a JSON object. Tools are tried in the order given;
    each is called at most once per conversation, one per turn.
    """

    @property
    def name(self) -> str:
        return OFFLINE.name

    @property
    def model(self) -> str:
        return OFFLINE_MODEL

    def is_configured(self) -> bool:
        return True

    def estimate(self, system: str, messages: list[dict], tools: list[ToolSpec]) -> dict[str, int]:
        parts = {"system": system, "messages": messages, "tools": neutral_tools(tools)}
        return request_estimate(parts, max_output_tokens=0)

    def complete(self, system: str, messages: list[dict], tools: list[ToolSpec]) -> ModelTurn:
        task = _first_user_object(messages)
        earlier_calls = _earlier_tool_calls(messages)
        already_called = {call.get("name") for call in earlier_calls}
        usage = usage_of()
        for tool in tools:
            if tool.name in already_called:
                continue
            required = list(tool.input_schema.get("required") or [])
            if not all(key in task for key in required):
                continue
            optional = [key for key in tool.input_schema.get("properties") or {} if key not in required]
            arguments = {key: task[key] for key in [*required, *optional] if key in task}
            call = ToolCall(id=f"offline-{len(earlier_calls) + 1}", name=tool.name, arguments=arguments)
            return ModelTurn(text="", tool_calls=(call,), stop_reason="tool_use", usage=usage, model=OFFLINE_MODEL)
        return ModelTurn(
            text=_offline_summary(messages), tool_calls=(), stop_reason="end_turn", usage=usage, model=OFFLINE_MODEL
        )


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
            lines.append(_cut(f"{tool_name} was refused: {_plain(content)}", OFFLINE_LINE_CHARS))
        else:
            lines.append(_cut(f"{tool_name}: {_described(content)}", OFFLINE_LINE_CHARS))
    return "\n".join(lines) if lines else "No tools were called, so there is nothing to report."


def _described(content: str) -> str:
    """A tool's result (the JSON the loop answered with, maybe cut short) in words."""
    try:
        result = loads_json(content)
    except ValueError:  # not JSON, or cut short by the loop's bound: shown as text
        return _plain(content) or "(empty)"
    if isinstance(result, dict):
        pairs = [f"{_plain(str(key))}: {_value(value)}" for key, value in list(result.items())[:OFFLINE_FIELDS]]
        more = len(result) - OFFLINE_FIELDS
        return "; ".join(pairs + ([f"and {more} more fields"] if more > 0 else [])) or "no fields"
    return _value(result)


def _value(value: Any) -> str:
    if isinstance(value, dict):
        names = ", ".join(_plain(str(key)) for key in list(value)[:OFFLINE_NESTED_NAMES])
        etc = ", …" if len(value) > OFFLINE_NESTED_NAMES else ""
        return f"{_count(len(value), 'field')} ({names}{etc})" if value else "no fields"
    if isinstance(value, list):
        if value and all(isinstance(item, str | int | float | bool) or item is None for item in value):
            shown = ", ".join(_value(item) for item in value[:OFFLINE_NESTED_NAMES])
            return (
                f"{shown}, and {len(value) - OFFLINE_NESTED_NAMES} more" if len(value) > OFFLINE_NESTED_NAMES else shown
            )
        return _count(len(value), "item") if value else "none"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return _cut(_plain(str(value)), OFFLINE_VALUE_CHARS)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _plain(text: str) -> str:
    """Text on one line without JSON's brackets: the brief reads as prose, never as a dump."""
    return " ".join(text.translate(_BRACKETS).split())


_BRACKETS = str.maketrans({"{": "(", "}": ")", "[": "(", "]": ")"})


def _cut(text: str, limit: int) -> str:
    """``text`` at most ``limit`` characters, cut at a word with an ellipsis."""
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    space = head.rfind(" ")
    return (head[:space] if space > limit // 2 else head).rstrip(" ,;:") + "…"
