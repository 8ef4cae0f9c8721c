"""``OpenAIModel``: the Chat Completions API of OpenAI or any OpenAI-compatible server, and its registry record."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, Literal

from marketing_pipelines.agents.providers.base import HTTPModel, ProviderSpec, model_name, token_count
from marketing_pipelines.agents.providers.types import ModelTurn, ToolCall, ToolSpec, usage_of
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
            **self._estimated_parts(system, messages, tools),
        }
        headers = {"authorization": f"Bearer {self.api_key or ''}", "content-type": "application/json"}
        answer = self._post(OPENAI, f"{self.base_url.rstrip('/')}/chat/completions", headers, body)
        turn = _parse_openai(answer.payload, self.name)
        return dataclasses.replace(
            turn, model=model_name(answer.payload.get("model"), self.model), rate_limits=answer.rate_limits
        )

    def _estimated_parts(self, system: str, messages: list[dict], tools: list[ToolSpec]) -> dict[str, Any]:
        prompt: dict[str, Any] = {"messages": _openai_messages(system, messages)}
        # The API rejects an empty tools array.
        if tools:
            prompt["tools"] = [
                {
                    "type": "function",
                    "function": {"name": tool.name, "description": tool.description, "parameters": tool.input_schema},
                }
                for tool in tools
            ]
        return prompt


# A 429 with these says money ran out, not a rate: error.type insufficient_quota (also the broader type of the
# codes below), or one of the billing codes (help.openai.com "Troubleshooting API rate limits and 429 errors").
_SPEND_CODES = frozenset(
    {
        "insufficient_quota",
        "credit_balance_exhausted",
        "organization_usage_limit_exceeded",
        "organization_spend_limit_exceeded",
        "project_spend_limit_exceeded",
    }
)


def _openai_spend_error(status: int, error: Mapping[str, Any]) -> bool:
    # 402: what OpenAI-compatible servers (OpenRouter and the like) answer when credits ran out.
    if status == 402:
        return True
    # isinstance first: a hostile code ([] or {}) cannot be looked up in a set.
    said = (error.get("type"), error.get("code"))
    return status == 429 and any(isinstance(value, str) and value in _SPEND_CODES for value in said)


OPENAI = ProviderSpec(
    name="openai",
    resource_class=OpenAIModel,
    limit_headers={"x-ratelimit-limit-requests": "requests", "x-ratelimit-limit-tokens": "tokens"},
    is_spend_error=_openai_spend_error,
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
    details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
    # prompt_tokens includes the cached ones (billed at a discount): input_tokens is the rest, full price.
    prompt_tokens = token_count(usage.get("prompt_tokens"))
    cached = min(token_count(details.get("cached_tokens")), prompt_tokens)
    return ModelTurn(
        # A refusal arrives in its own field with content null; surface it rather than an empty turn.
        text=str(message.get("content") or message.get("refusal") or ""),
        tool_calls=tuple(calls),
        stop_reason=str(choices[0].get("finish_reason") or ""),
        usage=usage_of(
            input_tokens=prompt_tokens - cached,
            output_tokens=token_count(usage.get("completion_tokens")),
            cache_read_input_tokens=cached,
        ),
    )
