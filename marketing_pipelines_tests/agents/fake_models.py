"""Fakes of the model APIs for agent tests: the real Anthropic and OpenAI providers with their HTTP answered
in-process by httpx.MockTransport. ``Script`` answers with canned responses in order and records what was sent
and slept (``scripted_anthropic``, ``scripted_openai``, with the payload builders ``anthropic_message`` and
``openai_completion``, whole answers with the providers' headers ``anthropic_ok`` and ``openai_ok``, and their
error answers: ``anthropic_rate_limited`` (429), ``anthropic_overloaded`` (529), ``anthropic_spend_limit``,
``openai_rate_limited`` and ``openai_insufficient_quota``). Shapes as the providers document them (checked
2026-12-07): platform.claude.com/docs/en/api/errors and /api/rate-limits, the SDKs' ``Usage`` and
``CompletionUsage``, help.openai.com's 429 article. ``unconfigured_models`` are the provider resources a
deployment without keys has; ``anthropic_models`` are those with the Anthropic provider answered by a function
of the call number and request body (``text_turn``, ``tool_turn``, and ``flood_turn``: a hostile turn asking for
hundreds of calls at once).
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


def anthropic_message(content: list[dict], stop_reason: str = "end_turn", **usage: object) -> dict:
    """A Messages API response (``POST /v1/messages``), as the Anthropic SDK's ``Message`` type has it.

    ``usage`` overrides the counts; ``input_tokens`` is the input after the last cache marker, the cached
    prefix counted as ``cache_read_input_tokens`` (a hit) or ``cache_creation_input_tokens`` (a write)."""
    counts: dict[str, object] = {
        "input_tokens": 120,
        "output_tokens": 35,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    } | usage
    written = counts["cache_creation_input_tokens"]
    return {
        "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": counts
        | {
            "cache_creation": {"ephemeral_5m_input_tokens": written, "ephemeral_1h_input_tokens": 0},
            "server_tool_use": None,
            "service_tier": "standard",
        },
    }


def openai_completion(
    message: dict,
    finish_reason: str = "stop",
    *,
    prompt_tokens: object = 80,
    cached_tokens: object = 0,
    completion_tokens: object = 12,
) -> dict:
    """A Chat Completions response, as the OpenAI SDK's ``ChatCompletion`` has it; ``prompt_tokens`` includes
    the ``cached_tokens`` (``prompt_tokens_details``)."""
    total = (
        prompt_tokens + completion_tokens
        if isinstance(prompt_tokens, int) and isinstance(completion_tokens, int)
        else 0
    )
    return {
        "id": "chatcmpl-abc123",
        "object": "chat.completion",
        "created": 1735689600,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": total,
            "prompt_tokens_details": {"cached_tokens": cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        },
        "service_tier": "default",
        "system_fingerprint": "fp_0ba0d124f1",
    }


ANTHROPIC_TEXT = anthropic_message([{"type": "text", "text": "Campaign 7 got 42 signups."}])
OPENAI_TEXT = openai_completion({"role": "assistant", "content": "Campaign 7 got 42 signups.", "refusal": None})

# --- the providers' headers and error answers -------------------------------------------------------

# A tier-1 Claude Sonnet organisation's limits per minute (platform.claude.com/docs/en/api/rate-limits).
ANTHROPIC_LIMITS = {"requests": 50, "input_tokens": 30_000, "output_tokens": 8_000}
OPENAI_LIMITS = {"requests": 500, "tokens": 200_000}
_RESET = "2026-12-07T10:00:30Z"


def anthropic_limit_headers(
    requests: object = ANTHROPIC_LIMITS["requests"],
    input_tokens: object = ANTHROPIC_LIMITS["input_tokens"],
    output_tokens: object = ANTHROPIC_LIMITS["output_tokens"],
    *,
    exhausted: bool = False,
) -> dict[str, str]:
    """``anthropic-ratelimit-*`` headers as every Messages answer carries them (the combined ``tokens`` ones too),
    remaining 0 when ``exhausted``; a value is sent as given, so a test may send a hostile one."""
    headers = {"request-id": "req_011CSHoEeqs5C35K2UUqR7Fy"}
    for unit, limit in (("requests", requests), ("input-tokens", input_tokens), ("output-tokens", output_tokens)):
        headers[f"anthropic-ratelimit-{unit}-limit"] = str(limit)
        headers[f"anthropic-ratelimit-{unit}-remaining"] = "0" if exhausted else str(limit)
        headers[f"anthropic-ratelimit-{unit}-reset"] = _RESET
    total = input_tokens + output_tokens if isinstance(input_tokens, int) and isinstance(output_tokens, int) else 0
    headers["anthropic-ratelimit-tokens-limit"] = str(total)
    headers["anthropic-ratelimit-tokens-remaining"] = "0" if exhausted else str(total)
    headers["anthropic-ratelimit-tokens-reset"] = _RESET
    return headers


def openai_limit_headers(
    requests: object = OPENAI_LIMITS["requests"], tokens: object = OPENAI_LIMITS["tokens"], *, exhausted: bool = False
) -> dict[str, str]:
    """``x-ratelimit-*`` headers as OpenAI sends them, resets as durations."""
    return {
        "x-request-id": "req_8f1e2a7c9b",
        "x-ratelimit-limit-requests": str(requests),
        "x-ratelimit-limit-tokens": str(tokens),
        "x-ratelimit-remaining-requests": "0" if exhausted else "499",
        "x-ratelimit-remaining-tokens": "0" if exhausted else "199880",
        "x-ratelimit-reset-requests": "120ms",
        "x-ratelimit-reset-tokens": "6m0s" if exhausted else "36ms",
    }


def anthropic_ok(payload: dict | None = None, **limits: object) -> httpx.Response:
    """A 200 Messages answer with its rate-limit headers (``limits`` override ``ANTHROPIC_LIMITS``)."""
    return httpx.Response(200, json=payload or ANTHROPIC_TEXT, headers=anthropic_limit_headers(**limits))


def openai_ok(payload: dict | None = None, **limits: object) -> httpx.Response:
    return httpx.Response(200, json=payload or OPENAI_TEXT, headers=openai_limit_headers(**limits))


def _anthropic_error(status: int, kind: str, message: str, headers: dict[str, str], **extra: object) -> httpx.Response:
    body = {"type": "error", "error": {"type": kind, "message": message, **extra}, "request_id": headers["request-id"]}
    return httpx.Response(status, json=body, headers=headers)


def anthropic_rate_limited(retry_after: str | None = "12", **limits: object) -> httpx.Response:
    """Anthropic's 429 rate_limit_error: ``retry-after`` in seconds and the limits with nothing remaining."""
    headers = anthropic_limit_headers(**limits, exhausted=True)
    if retry_after is not None:
        headers["retry-after"] = retry_after
    message = (
        "This request would exceed the rate limit for your organization of 30,000 input tokens per minute. "
        "For details, refer to: https://docs.claude.com/en/api/rate-limits."
    )
    return _anthropic_error(429, "rate_limit_error", message, headers)


def anthropic_overloaded() -> httpx.Response:
    """Anthropic's 529 overloaded_error: the API is short of capacity for everyone, not a limit of ours."""
    return _anthropic_error(529, "overloaded_error", "Overloaded", {"request-id": "req_011CSHoEeqs5C35K2UUqR7Fz"})


ANTHROPIC_SPEND_KINDS = ("credit", "spend_limit", "workspace_limit", "tier_cap", "billing")


def anthropic_spend_limit(kind: str = "credit") -> httpx.Response:
    """Anthropic's answers when money ran out, none fixed by a retry (platform.claude.com/docs/en/api/errors):
    ``credit`` an empty prepaid balance (400), ``spend_limit``/``workspace_limit`` a limit the organization or
    workspace set (400), ``tier_cap`` the usage tier's monthly cap (429 without retry-after), ``billing`` 402."""
    headers = {"request-id": "req_011CbrFTcXhtiMzr3s6EocF7"}
    if kind == "credit":
        message = (
            "Your credit balance is too low to access the Anthropic API. "
            "Please go to Plans & Billing to upgrade or purchase credits."
        )
        return _anthropic_error(400, "invalid_request_error", message, headers)
    if kind in ("spend_limit", "workspace_limit"):
        scope = "workspace " if kind == "workspace_limit" else ""
        message = (
            f"You have reached your specified {scope}API usage limits. "
            "You will regain access on 2027-01-01 at 00:00 UTC."
        )
        return _anthropic_error(400, "invalid_request_error", message, headers)
    if kind == "tier_cap":
        message = "Your organization has reached its monthly usage limit for its usage tier."
        details = {"error_code": "enforced_spend_limit_reached"}
        return _anthropic_error(429, "rate_limit_error", message, anthropic_limit_headers() | headers, details=details)
    if kind == "billing":
        message = "There is an issue with your billing or payment information."
        return _anthropic_error(402, "billing_error", message, headers)
    raise ValueError(f"unknown spend error {kind!r}; one of {ANTHROPIC_SPEND_KINDS}")


def openai_rate_limited(**limits: object) -> httpx.Response:
    """OpenAI's 429 for a rate (code rate_limit_exceeded): no retry-after, only the x-ratelimit resets."""
    error = {
        "message": (
            "Rate limit reached for gpt-4o-mini in organization org-abc on tokens per min (TPM): Limit 200000, "
            "Used 199500, Requested 900. Please try again in 120ms."
        ),
        "type": "tokens",
        "param": None,
        "code": "rate_limit_exceeded",
    }
    return httpx.Response(429, json={"error": error}, headers=openai_limit_headers(**limits, exhausted=True))


def openai_insufficient_quota(code: str = "insufficient_quota") -> httpx.Response:
    """OpenAI's 429 when quota or credit ran out (type insufficient_quota; newer answers name the billing code)."""
    error = {
        "message": (
            "You exceeded your current quota, please check your plan and billing details. For more information "
            "on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors."
        ),
        "type": "insufficient_quota",
        "param": None,
        "code": code,
    }
    return httpx.Response(429, json={"error": error}, headers=openai_limit_headers())


def complete_once(provider: AnthropicModel | OpenAIModel) -> ModelTurn:
    return provider.complete(SYSTEM, [{"role": "user", "content": "hello"}], [COUNT_SIGNUPS])


# --- provider resources, Anthropic answered by a function of the call (anthropic_models) ----------

Answer = Callable[[int, dict[str, Any]], httpx.Response]


def text_turn(text: str) -> httpx.Response:
    return anthropic_ok(anthropic_message([{"type": "text", "text": text}], "end_turn"))


def tool_turn(text: str, tool: str, arguments: dict[str, Any], call_id: str = "toolu_01") -> httpx.Response:
    content = [{"type": "text", "text": text}, {"type": "tool_use", "id": call_id, "name": tool, "input": arguments}]
    return anthropic_ok(anthropic_message(content, "tool_use"))


def flood_turn(tool: str, arguments: Callable[[int], dict[str, Any]], count: int) -> httpx.Response:
    """One model turn asking for ``count`` calls of ``tool`` at once, call ``i`` (from 1) with ``arguments(i)``:
    what a prompt-injected model sends when told to flood the queue."""
    calls = [
        {"type": "tool_use", "id": f"toolu_{i:04d}", "name": tool, "input": arguments(i)} for i in range(1, count + 1)
    ]
    return anthropic_ok(anthropic_message([{"type": "text", "text": "On it."}, *calls], "tool_use"))


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
