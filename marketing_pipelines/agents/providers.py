"""Model providers for the agent loop: one neutral interface, three implementations.

The agent loop speaks in neutral records (``ToolSpec``, ``ToolCall``, ``ModelTurn``) and neutral
message dicts; each provider translates them to and from one wire format:

- ``OfflineModel``: deterministic and networkless (the default). It still calls tools, one per
  turn, so the whole agent path runs in tests and on machines without an API key.
- ``AnthropicModel``: the Anthropic Messages API (``POST /v1/messages``).
- ``OpenAIModel``: the Chat Completions API (``POST {base_url}/chat/completions``) of OpenAI or
  any OpenAI-compatible server.

Neutral messages::

    {"role": "user", "content": str}
    {"role": "assistant", "content": str, "tool_calls": [{"id", "name", "arguments"}, ...]}
    {"role": "tool", "tool_call_id": str, "name": str, "content": str, "is_error": bool}

``ModelTurn.usage`` is always ``{"input_tokens": int, "output_tokens": int}`` whatever the provider
calls them, so the caller's token bucket reads one shape. ``ModelTurn.stop_reason`` is the
provider's own value ("end_turn"/"tool_use" for Anthropic and offline, "stop"/"tool_calls" for
OpenAI); the loop should decide whether to continue from ``tool_calls``, not from it.

Retries (429/5xx, ``Retry-After``) live in ``marketing_pipelines.http``; rate limiting is the
caller's job.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import dagster as dg
import httpx

from marketing_pipelines.http import ServiceError, describe_error_response, send_with_retries

PROVIDER_NAMES = ("offline", "anthropic", "openai")

ANTHROPIC_VERSION = "2023-06-01"
OFFLINE_RESULT_PREVIEW_CHARS = 200


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


# --- offline -----------------------------------------------------------------------------------


def _first_user_object(messages: list[dict]) -> dict:
    for message in messages:
        if message.get("role") == "user":
            content = message.get("content")
            try:
                parsed = json.loads(content) if isinstance(content, str) else None
            except json.JSONDecodeError:
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


class OfflineModel(dg.ConfigurableResource):
    """Deterministic stand-in for a model: calls each tool whose required inputs the task provides, then summarises.

    The task is the first user message, read as a JSON object. Tools are tried in the order given;
    each is called at most once per conversation, one per turn.
    """

    @property
    def name(self) -> str:
        return "offline"

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


# --- shared HTTP plumbing ----------------------------------------------------------------------


def _api_error_message(response: httpx.Response) -> str | None:
    # Both APIs answer errors with {"error": {"message": ...}} (Anthropic adds a top-level "type").
    try:
        payload = response.json()
    except ValueError:
        return None
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    if isinstance(error, str):
        return error
    return None


def _post_json(
    client: httpx.Client,
    url: str,
    headers: dict[str, str],
    body: dict[str, Any],
    *,
    service: str,
    credential_env_var: str,
    sleep: Callable[[float], None],
) -> dict[str, Any]:
    request = client.build_request("POST", url, headers=headers, json=body)
    response = send_with_retries(client, request, service=service, sleep=sleep)
    if response.status_code in (401, 403):
        raise describe_error_response(service, response, credential_hint=credential_env_var)
    if response.status_code >= 400:
        api_message = _api_error_message(response)
        if api_message is None:
            raise describe_error_response(service, response)
        raise ServiceError(service, f"API error (HTTP {response.status_code}): {api_message}", response.status_code)
    try:
        payload = response.json()
    except ValueError as exc:
        raise ServiceError(service, f"response was not valid JSON ({exc}): {response.text[:200]!r}") from exc
    if not isinstance(payload, dict):
        raise ServiceError(service, f"expected a JSON object, got {type(payload).__name__}")
    return payload


def _require_key(api_key: str, service: str, env_var: str) -> None:
    if not api_key.strip():
        raise ServiceError(service, f"no API key; set {env_var}")


def _int_or_zero(value: object) -> int:
    return value if isinstance(value, int) else 0


# --- Anthropic ---------------------------------------------------------------------------------


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
            calls.append(ToolCall(id=block["id"], name=str(block.get("name", "")), arguments=tool_input))
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
    return ModelTurn(
        text="".join(texts),
        tool_calls=tuple(calls),
        stop_reason=str(payload.get("stop_reason") or ""),
        usage={
            "input_tokens": _int_or_zero(usage.get("input_tokens")),
            "output_tokens": _int_or_zero(usage.get("output_tokens")),
        },
    )


class AnthropicModel(dg.ConfigurableResource):
    """Claude through the Anthropic Messages API."""

    api_key: str
    model: str = "claude-sonnet-4-5"
    base_url: str = "https://api.anthropic.com"
    timeout_s: float = 60.0
    max_tokens: int = 1024

    @property
    def name(self) -> str:
        return "anthropic"

    def _client(self) -> httpx.Client:
        return httpx.Client(timeout=self.timeout_s)

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def complete(self, system: str, messages: list[dict], tools: list[ToolSpec]) -> ModelTurn:
        _require_key(self.api_key, self.name, "ANTHROPIC_API_KEY")
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
            "x-api-key": self.api_key,
            "anthropic-version": ANTHROPIC_VERSION,
            "content-type": "application/json",
        }
        with self._client() as client:
            payload = _post_json(
                client,
                f"{self.base_url.rstrip('/')}/v1/messages",
                headers,
                body,
                service=self.name,
                credential_env_var="ANTHROPIC_API_KEY",
                sleep=self._sleep,
            )
        return _parse_anthropic(payload, self.name)


# --- OpenAI ------------------------------------------------------------------------------------


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


def _parse_openai_arguments(raw: object, tool_name: str, service: str) -> dict:
    # Some OpenAI-compatible servers send an object instead of a JSON string, or "" for no arguments.
    if isinstance(raw, dict):
        return raw
    if raw is None or raw == "":
        return {}
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else None
    except json.JSONDecodeError as exc:
        raise ServiceError(
            service, f"tool call {tool_name!r} has invalid JSON arguments ({exc}): {raw!r:.200}"
        ) from exc
    if not isinstance(parsed, dict):
        raise ServiceError(service, f"tool call {tool_name!r} arguments are not a JSON object: {raw!r:.200}")
    return parsed


def _parse_openai(payload: dict[str, Any], service: str) -> ModelTurn:
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
        arguments = _parse_openai_arguments(function.get("arguments"), tool_name, service)
        calls.append(ToolCall(id=raw_call["id"], name=tool_name, arguments=arguments))
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
    return ModelTurn(
        # A refusal arrives in its own field with content null; surface it rather than an empty turn.
        text=str(message.get("content") or message.get("refusal") or ""),
        tool_calls=tuple(calls),
        stop_reason=str(choices[0].get("finish_reason") or ""),
        usage={
            "input_tokens": _int_or_zero(usage.get("prompt_tokens")),
            "output_tokens": _int_or_zero(usage.get("completion_tokens")),
        },
    )


class OpenAIModel(dg.ConfigurableResource):
    """A model behind the Chat Completions API: OpenAI itself or any OpenAI-compatible server."""

    api_key: str
    model: str = "gpt-4o-mini"
    base_url: str = "https://api.openai.com/v1"
    timeout_s: float = 60.0
    max_tokens: int = 1024
    # OpenAI deprecated "max_tokens" and its reasoning and newer models reject it, while some
    # OpenAI-compatible servers only understand "max_tokens"; the body key is therefore configurable.
    max_tokens_field: Literal["max_completion_tokens", "max_tokens"] = "max_completion_tokens"

    @property
    def name(self) -> str:
        return "openai"

    def _client(self) -> httpx.Client:
        return httpx.Client(timeout=self.timeout_s)

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def complete(self, system: str, messages: list[dict], tools: list[ToolSpec]) -> ModelTurn:
        _require_key(self.api_key, self.name, "OPENAI_API_KEY")
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
        headers = {"authorization": f"Bearer {self.api_key}", "content-type": "application/json"}
        with self._client() as client:
            payload = _post_json(
                client,
                f"{self.base_url.rstrip('/')}/chat/completions",
                headers,
                body,
                service=self.name,
                credential_env_var="OPENAI_API_KEY",
                sleep=self._sleep,
            )
        return _parse_openai(payload, self.name)
