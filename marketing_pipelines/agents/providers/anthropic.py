"""``AnthropicModel``: Claude through the Anthropic Messages API (``POST /v1/messages``), and its registry record."""

from __future__ import annotations

import json
from typing import Any

from marketing_pipelines.agents.providers.base import HTTPModel, ProviderSpec, int_or_zero
from marketing_pipelines.agents.providers.types import ModelTurn, ToolCall, ToolSpec
from marketing_pipelines.http import ServiceError
from marketing_pipelines.settings import setting_field, shown_in_ui
from marketing_pipelines.strict_json import MAX_ENVELOPE_DEPTH, check_depth

ANTHROPIC_VERSION = "2023-06-01"


@shown_in_ui
class AnthropicModel(HTTPModel):
    """Claude through the Anthropic Messages API."""

    api_key: str | None = setting_field("anthropic_api_key")
    model: str = setting_field("anthropic_model")
    base_url: str = setting_field("anthropic_base_url")

    @property
    def name(self) -> str:
        return ANTHROPIC.name

    def complete(self, system: str, messages: list[dict], tools: list[ToolSpec]) -> ModelTurn:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": _anthropic_messages(messages),
        }
        if system:
            body["system"] = system
        if tools:
            body["tools"] = [
                {"name": tool.name, "description": tool.description, "input_schema": tool.input_schema}
                for tool in tools
            ]
        headers = {
            "x-api-key": self.api_key or "",
            "anthropic-version": ANTHROPIC_VERSION,
            "content-type": "application/json",
        }
        payload = self._post(ANTHROPIC, f"{self.base_url.rstrip('/')}/v1/messages", headers, body)
        return _parse_anthropic(payload, self.name)


ANTHROPIC = ProviderSpec(
    name="anthropic",
    resource_class=AnthropicModel,
)


def _anthropic_messages(messages: list[dict]) -> list[dict]:
    converted: list[dict] = []
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            blocks: list[dict] = []
            # The API rejects empty text blocks, so a tool-only turn carries none.
            if message.get("content"):
                blocks.append({"type": "text", "text": message["content"]})
            for call in message.get("tool_calls") or []:
                blocks.append({"type": "tool_use", "id": call["id"], "name": call["name"], "input": call["arguments"]})
            converted.append({"role": "assistant", "content": blocks or message.get("content", "")})
        elif role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": message["tool_call_id"],
                "content": str(message.get("content", "")),
                "is_error": bool(message.get("is_error", False)),
            }
            # Every tool_result answering one assistant turn must sit in the single user message after it.
            if converted and converted[-1]["role"] == "user" and _is_tool_result_message(converted[-1]):
                converted[-1]["content"].append(block)
            else:
                converted.append({"role": "user", "content": [block]})
        elif role == "user":
            # Text may follow tool results in the same user message, never precede them; merging keeps
            # the roles alternating.
            if converted and converted[-1]["role"] == "user" and _is_tool_result_message(converted[-1]):
                converted[-1]["content"].append({"type": "text", "text": str(message.get("content", ""))})
            else:
                converted.append({"role": "user", "content": message.get("content", "")})
        else:
            raise ValueError(f"unknown message role {role!r}")
    return converted


def _is_tool_result_message(message: dict) -> bool:
    content = message.get("content")
    return isinstance(content, list) and any(block.get("type") == "tool_result" for block in content)


def _parse_anthropic(payload: dict[str, Any], service: str) -> ModelTurn:
    try:  # before anything below recurses over it (json.dumps, str of a nested list)
        check_depth(payload, MAX_ENVELOPE_DEPTH)
    except ValueError as exc:
        raise ServiceError(service, f"response is {exc}") from None
    content = payload.get("content")
    if not isinstance(content, list):
        raise ServiceError(service, f"response has no content list: {json.dumps(payload)[:200]}")
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            texts.append(str(block.get("text", "")))
        elif block.get("type") == "tool_use":
            tool_input = block.get("input")
            if not isinstance(block.get("id"), str) or not isinstance(tool_input, dict):
                raise ServiceError(service, f"malformed tool_use block for tool {block.get('name')!r}")
            problem = None
            try:  # the same bound as every other JSON the agents take in; refused and answered to the model
                check_depth(tool_input)
            except ValueError as exc:
                tool_input, problem = {}, f"input {exc}"
            calls.append(ToolCall(block["id"], str(block.get("name", "")), tool_input, problem))
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
    return ModelTurn(
        text="".join(texts),
        tool_calls=tuple(calls),
        stop_reason=str(payload.get("stop_reason") or ""),
        usage={
            "input_tokens": int_or_zero(usage.get("input_tokens")),
            "output_tokens": int_or_zero(usage.get("output_tokens")),
        },
    )
