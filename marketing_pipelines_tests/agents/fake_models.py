"""Fakes of the model APIs for agent tests: the real Anthropic and OpenAI providers with their HTTP answered
in-process by httpx.MockTransport. ``Script`` answers with canned responses in order and records what was sent
and slept (``scripted_anthropic``, ``scripted_openai``, with the payload builders ``anthropic_message`` and
``openai_completion``). ``unconfigured_models`` are the provider resources a deployment without keys has;
``anthropic_models`` are those with the Anthropic provider answered by a function of the call number and request
body (``text_turn``, ``tool_turn``, and ``flood_turn``: a hostile turn asking for hundreds of calls at once).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import httpx

from marketing_pipelines.agents.models import model_resources
from marketing_pipelines.agents.providers.anthropic import AnthropicModel
from marketing_pipelines.agents.providers.openai import OpenAIModel
from marketing_pipelines.agents.providers.registry import ProviderResource
from marketing_pipelines.agents.providers.types import ModelTurn, ToolSpec
from marketing_pipelines_tests.factories import settings_from

SYSTEM = "You run marketing campaigns."

COUNT_SIGNUPS = ToolSpec(
    name="count_signups",
    description="Count signups for a campaign.",
    input_schema={
        "type": "object",
        "properties": {"campaign_id": {"type": "integer"}, "since": {"type": "string"}},
        "required": ["campaign_id"],
    },
)


# --- canned responses in order (Script) ---------------------------------------------------------


class Script:
    """Answers requests with canned responses in order and records what the provider sent and slept."""

    def __init__(self, *responses: httpx.Response) -> None:
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []
        self.sleeps: list[float] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return self.responses.pop(0)

    def body(self, index: int = 0) -> dict:
        return json.loads(self.requests[index].content)


_Provider = TypeVar("_Provider", AnthropicModel, OpenAIModel)


def _scripted(provider_class: type[_Provider], script: Script, api_key: str, **fields: object) -> _Provider:
    """The real provider class, its HTTP answered by ``script`` and its retry waits recorded, not slept."""

    class Scripted(provider_class):  # type: ignore[valid-type,misc]
        def _client(self) -> httpx.Client:
            return httpx.Client(transport=httpx.MockTransport(script.handle))

        def _sleep(self, seconds: float) -> None:
            script.sleeps.append(seconds)

    return Scripted(api_key=api_key, **fields)


def scripted_anthropic(script: Script, **fields: object) -> AnthropicModel:
    return _scripted(AnthropicModel, script, "sk-ant-test", **fields)


def scripted_openai(script: Script, **fields: object) -> OpenAIModel:
    return _scripted(OpenAIModel, script, "sk-openai-test", **fields)


def anthropic_message(content: list[dict], stop_reason: str = "end_turn", **usage: int) -> dict:
    """A Messages API response (``POST /v1/messages``), as the Anthropic SDK's ``Message`` type has it."""
    return {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 120, "output_tokens": 35, "cache_read_input_tokens": 0} | usage,
    }


def openai_completion(message: dict, finish_reason: str = "stop") -> dict:
    return {
        "id": "chatcmpl-abc123",
        "object": "chat.completion",
        "created": 1735689600,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 80, "completion_tokens": 12, "total_tokens": 92},
    }


ANTHROPIC_TEXT = anthropic_message([{"type": "text", "text": "Campaign 7 got 42 signups."}])
OPENAI_TEXT = openai_completion({"role": "assistant", "content": "Campaign 7 got 42 signups.", "refusal": None})


def complete_once(provider: AnthropicModel | OpenAIModel) -> ModelTurn:
    return provider.complete(SYSTEM, [{"role": "user", "content": "hello"}], [COUNT_SIGNUPS])


# --- provider resources, Anthropic answered by a function of the call (anthropic_models) ----------

Answer = Callable[[int, dict[str, Any]], httpx.Response]


def text_turn(text: str) -> httpx.Response:
    return httpx.Response(200, json=anthropic_message([{"type": "text", "text": text}], "end_turn"))


def tool_turn(text: str, tool: str, arguments: dict[str, Any], call_id: str = "toolu_01") -> httpx.Response:
    content = [{"type": "text", "text": text}, {"type": "tool_use", "id": call_id, "name": tool, "input": arguments}]
    return httpx.Response(200, json=anthropic_message(content, "tool_use"))


def flood_turn(tool: str, arguments: Callable[[int], dict[str, Any]], count: int) -> httpx.Response:
    """One model turn asking for ``count`` calls of ``tool`` at once, call ``i`` (from 1) with ``arguments(i)``:
    what a prompt-injected model sends when told to flood the queue."""
    calls = [
        {"type": "tool_use", "id": f"toolu_{i:04d}", "name": tool, "input": arguments(i)} for i in range(1, count + 1)
    ]
    return httpx.Response(200, json=anthropic_message([{"type": "text", "text": "On it."}, *calls], "tool_use"))


def unconfigured_models() -> dict[str, ProviderResource]:
    """The provider resources of a deployment without API keys: offline works, the others are not configured."""
    return model_resources(settings_from({}), environ={})


def anthropic_models(answer: Answer, api_key: str = "test-key") -> dict[str, ProviderResource]:
    """The provider resources, the real Anthropic provider's HTTP answered by ``answer(call number, request body)``."""
    calls = [0]

    def handle(request: httpx.Request) -> httpx.Response:
        calls[0] += 1
        return answer(calls[0], json.loads(request.content))

    class Mocked(AnthropicModel):
        def _client(self) -> httpx.Client:
            return httpx.Client(base_url=self.base_url, transport=httpx.MockTransport(handle))

    return {**unconfigured_models(), "anthropic_model": Mocked(api_key=api_key)}


# --- a provider that rejects its key, quoting it (rejecting_models) ------------------------------


def openai_invalid_key(key: str) -> httpx.Response:
    """OpenAI's 401 for a wrong key, its message quoting the key as sent (older keys were quoted whole)."""
    error = {
        "message": f"Incorrect API key provided: {key}. You can find your API key at https://platform.openai.com/account/api-keys.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
    return httpx.Response(401, json={"error": error})


def anthropic_invalid_key(key: str) -> httpx.Response:
    """Anthropic's 401 shape (``authentication_error``), its message quoting the key as a proxy in front may."""
    error = {"type": "authentication_error", "message": f"invalid x-api-key ({key})"}
    return httpx.Response(
        401, json={"type": "error", "error": error}, headers={"request-id": "req_011CSHoEeqs5C35K2UUqR7Fy"}
    )


def rejecting_models(provider: str, key: str) -> dict[str, ProviderResource]:
    """The provider resources, ``provider`` ("openai" or "anthropic") the real one holding ``key``, its HTTP
    answered with that API's 401 quoting the key."""
    provider_class, answer = {
        "openai": (OpenAIModel, openai_invalid_key),
        "anthropic": (AnthropicModel, anthropic_invalid_key),
    }[provider]

    class Rejecting(provider_class):  # type: ignore[valid-type,misc]
        def _client(self) -> httpx.Client:
            return httpx.Client(transport=httpx.MockTransport(lambda request: answer(key)))

    return {**unconfigured_models(), f"{provider}_model": Rejecting(api_key=key)}
