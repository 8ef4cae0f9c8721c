"""``AnthropicModel``: Claude through the Anthropic Messages API (``POST /v1/messages``), and its registry record.

Prompt caching: the system prompt goes as one text block and it and the last tool definition carry
``cache_control: {"type": "ephemeral"}`` (the Messages API caches the prefix up to each marked block: tools,
then system), so an agent's turns after the first read that prefix at about a tenth of the input price.
Prompts under the model's minimum (about 1,024 tokens) are simply not cached; the markers cost nothing.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from marketing_pipelines.agents.providers.base import HTTPModel, ProviderSpec, model_name, neutral_tools, token_count
from marketing_pipelines.agents.providers.types import ModelTurn, ToolCall, ToolSpec, usage_of
from marketing_pipelines.http import ServiceError
from marketing_pipelines.settings import setting_field, shown_in_ui
from marketing_pipelines.strict_json import MAX_ENVELOPE_DEPTH, check_depth

ANTHROPIC_VERSION = "2023-06-01"
# Above the largest tool-use system prompt Anthropic lists for its current models (313 to 346 tokens).
TOOL_USE_SYSTEM_TOKENS = 400


@shown_in_ui
class AnthropicModel(HTTPModel):
    """Claude through the Anthropic Messages API."""

    api_key: str | None = setting_field("anthropic_api_key")
    model: str = setting_field("anthropic_model")
    base_url: str = setting_field("anthropic_base_url")
    # Mark the system prompt and the tool definitions cacheable (module docstring); off to measure without.
    prompt_caching: bool = True

    @property
    def name(self) -> str:
        return ANTHROPIC.name

    def complete(self, system: str, messages: list[dict], tools: list[ToolSpec]) -> ModelTurn:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            **self._prompt(system, messages, tools),
        }
        headers = {
            "x-api-key": self.api_key or "",
            "anthropic-version": ANTHROPIC_VERSION,
            "content-type": "application/json",
        }
        answer = self._post(ANTHROPIC, f"{self.base_url.rstrip('/')}/v1/messages", headers, body)
        turn = _parse_anthropic(answer.payload, self.name)
        return dataclasses.replace(
            turn, model=model_name(answer.payload.get("model"), self.model), rate_limits=answer.rate_limits
        )

    def estimate(self, system: str, messages: list[dict], tools: list[ToolSpec]) -> dict[str, int]:
        needs = super().estimate(system, messages, tools)
        if tools:
            # The tool-use system prompt the API adds when tools are given (346 tokens on Claude Sonnet 4.5 with
            # tool_choice auto in the tool-use pricing table of Anthropic's docs): in the count, not in the body.
            needs = {**needs, "input_tokens": needs["input_tokens"] + TOOL_USE_SYSTEM_TOKENS}
            needs["tokens"] = needs["input_tokens"] + needs["output_tokens"]
        return needs

    def _estimated_parts(self, system: str, messages: list[dict], tools: list[ToolSpec]) -> dict[str, Any]:
        return self._prompt(system, messages, tools)

    def _prompt(self, system: str, messages: list[dict], tools: list[ToolSpec]) -> dict[str, Any]:
        """The body's system, messages and tools, the cache markers included when ``prompt_caching``."""
        cache = {"cache_control": {"type": "ephemeral"}} if self.prompt_caching else {}
        prompt: dict[str, Any] = {"messages": _anthropic_messages(messages)}
        if system:
            prompt["system"] = [{"type": "text", "text": system, **cache}] if cache else system
        if tools:
            definitions = neutral_tools(tools)
            # One marker on the last definition caches them all (the prefix up to it).
            definitions[-1] = {**definitions[-1], **cache}
            prompt["tools"] = definitions
        return prompt


# A spend limit the organization or workspace set answers 400 invalid_request_error in these words; an empty
# prepaid balance answers 400 "Your credit balance is too low to access the Anthropic API" (errors docs).
_SPEND_WORDS = re.compile(r"credit balance is too low|reached your specified (workspace )?api usage limits", re.I)


def _anthropic_spend_error(status: int, error: Mapping[str, Any]) -> bool:
    """Anthropic's answers that no retry fixes until someone pays (platform.claude.com/docs/en/api/errors):
    402 billing_error, a 429 whose ``error.details.error_code`` is enforced_spend_limit_reached (the tier's
    monthly cap; no retry-after), and the 400s above."""
    if status == 402 or error.get("type") == "billing_error":
        return True
    details = error.get("details")
    if status == 429 and isinstance(details, dict) and details.get("error_code") == "enforced_spend_limit_reached":
        return True
    message = error.get("message")
    return status == 400 and isinstance(message, str) and _SPEND_WORDS.search(message[:1000]) is not None


ANTHROPIC = ProviderSpec(
    name="anthropic",
    resource_class=AnthropicModel,
    # The combined anthropic-ratelimit-tokens-* headers are left out: they are the most restrictive of the two
    # below, and cached input counts against neither (rate-limits docs).
    limit_headers={
        "anthropic-ratelimit-requests-limit": "requests",
        "anthropic-ratelimit-input-tokens-limit": "input_tokens",
        "anthropic-ratelimit-output-tokens-limit": "output_tokens",
    },
    is_spend_error=_anthropic_spend_error,
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
        # input_tokens is the input after the last cache marker; the cached prefix is counted apart.
        usage=usage_of(
            input_tokens=token_count(usage.get("input_tokens")),
            output_tokens=token_count(usage.get("output_tokens")),
            cache_read_input_tokens=token_count(usage.get("cache_read_input_tokens")),
            cache_creation_input_tokens=token_count(usage.get("cache_creation_input_tokens")),
        ),
    )
