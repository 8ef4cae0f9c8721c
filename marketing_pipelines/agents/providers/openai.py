"""``OpenAIModel``: the Chat Completions API of OpenAI or any OpenAI-compatible server, and its registry record."""

from __future__ import annotations

import json
from typing import Any, Literal

from marketing_pipelines.agents.providers.base import HTTPModel, ProviderSpec, int_or_zero
from marketing_pipelines.agents.providers.types import ModelTurn, ToolCall, ToolSpec
from marketing_pipelines.http import ServiceError
from marketing_pipelines.settings import setting_field, shown_in_ui
from marketing_pipelines.strict_json import MAX_ENVELOPE_DEPTH, check_depth, check_text_depth, without_lone_surrogates


@shown_in_ui
class OpenAIModel(HTTPModel):
    """A model behind the Chat Completions API: OpenAI itself or any OpenAI-compatible server.

    Requests go to ``POST {base_url}/chat/completions``.
    """

    api_key: str | None = setting_field("openai_api_key")
    model: str = setting_field("openai_model")
    base_url: str = setting_field("openai_base_url")
    # OpenAI deprecated "max_tokens" and its reasoning and newer models reject it, while some
    # OpenAI-compatible servers only understand "max_tokens"; the body key is therefore configurable.
    max_tokens_field: Literal["max_completion_tokens", "max_tokens"] = "max_completion_tokens"

    @property
    def name(self) -> str:
        return OPENAI.name

    def complete(self, system: str, messages: list[dict], tools: list[ToolSpec]) -> ModelTurn:
        body: dict[str, Any] = {
            "model": self.model,
            self.max_tokens_field: self.max_tokens,
            "messages": _openai_messages(system, messages),
        }
        # The API rejects an empty tools array.
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": tool.name, "description": tool.description, "parameters": tool.input_schema},
                }
                for tool in tools
            ]
        headers = {"authorization": f"Bearer {self.api_key or ''}", "content-type": "application/json"}
        payload = self._post(OPENAI, f"{self.base_url.rstrip('/')}/chat/completions", headers, body)
        return _parse_openai(payload, self.name)


OPENAI = ProviderSpec(
    name="openai",
    resource_class=OpenAIModel,
)


def _openai_messages(system: str, messages: list[dict]) -> list[dict]:
    converted: list[dict] = [{"role": "system", "content": system}] if system else []
    for message in messages:
        role = message.get("role")
        if role == "user":
            converted.append({"role": "user", "content": str(message.get("content", ""))})
        elif role == "assistant":
            calls = message.get("tool_calls") or []
            assistant: dict[str, Any] = {"role": "assistant", "content": message.get("content") or None}
            # The API rejects an empty tool_calls array, so a text-only turn omits the key.
            if calls:
                assistant["tool_calls"] = [
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
                    }
                    for call in calls
                ]
            converted.append(assistant)
        elif role == "tool":
            content = str(message.get("content", ""))
            # Chat Completions has no is_error flag; without this prefix a refusal reads like a result.
            if message.get("is_error"):
                content = f"ERROR: {content}"
            converted.append({"role": "tool", "tool_call_id": message["tool_call_id"], "content": content})
        else:
            raise ValueError(f"unknown message role {role!r}")
    return converted


def _parse_openai_arguments(raw: object) -> tuple[dict, str | None]:
    """The call's arguments, or ({}, why they cannot be read): a model's bad call is refused and
    answered to the model (recorded as a denial), not an error that fails the run."""
    # Some OpenAI-compatible servers send an object instead of a JSON string, or "" for no arguments.
    if isinstance(raw, dict):
        try:
            check_depth(raw)
        except ValueError as exc:
            return {}, f"arguments {exc}"
        return without_lone_surrogates(raw), None
    if raw is None or raw == "":
        return {}, None
    if not isinstance(raw, str):
        return {}, f"arguments are a JSON {type(raw).__name__}, not an object"
    try:
        # Depth first: json.loads recurses per level and raises RecursionError, not ValueError, on
        # "[" * 10**5. Not loads_json: a NaN is left for the loop to refuse, in an answer the model gets.
        check_text_depth(raw)
        # Arguments are JSON inside a JSON string: \ud800 in them survives the envelope's cleaning.
        parsed = without_lone_surrogates(json.loads(raw))
    except ValueError as exc:  # json.JSONDecodeError, or the depth
        return {}, f"invalid JSON arguments ({str(exc)[:200]})"
    if not isinstance(parsed, dict):
        return {}, "arguments are not a JSON object"
    return parsed, None


def _parse_openai(payload: dict[str, Any], service: str) -> ModelTurn:
    try:  # before anything below recurses over it (json.dumps, str of a nested list)
        check_depth(payload, MAX_ENVELOPE_DEPTH)
    except ValueError as exc:
        raise ServiceError(service, f"response is {exc}") from None
    choices = payload.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ServiceError(service, f"response has no choices: {json.dumps(payload)[:200]}")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise ServiceError(service, "response choice has no message")
    calls: list[ToolCall] = []
    for raw_call in message.get("tool_calls") or []:
        function = raw_call.get("function") if isinstance(raw_call, dict) else None
        if not isinstance(function, dict) or not isinstance(raw_call.get("id"), str):
            raise ServiceError(service, f"malformed tool call: {json.dumps(raw_call)[:200]}")
        tool_name = str(function.get("name", ""))
        arguments, problem = _parse_openai_arguments(function.get("arguments"))
        calls.append(ToolCall(id=raw_call["id"], name=tool_name, arguments=arguments, problem=problem))
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
    return ModelTurn(
        # A refusal arrives in its own field with content null; surface it rather than an empty turn.
        text=str(message.get("content") or message.get("refusal") or ""),
        tool_calls=tuple(calls),
        stop_reason=str(choices[0].get("finish_reason") or ""),
        usage={
            "input_tokens": int_or_zero(usage.get("prompt_tokens")),
            "output_tokens": int_or_zero(usage.get("completion_tokens")),
        },
    )
