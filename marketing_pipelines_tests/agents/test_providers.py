"""Tests for the model providers: wire formats against MockTransport, retries, errors, and the offline model's rules."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from marketing_pipelines.agents.providers.anthropic import AnthropicModel
from marketing_pipelines.agents.providers.offline import OfflineModel
from marketing_pipelines.agents.providers.openai import OpenAIModel
from marketing_pipelines.agents.providers.types import ModelProvider, ModelTurn, ToolCall, ToolSpec, usage_of
from marketing_pipelines.http import RateLimited, ServiceError, server_wait_hint
from marketing_pipelines.settings import MODEL_PROVIDERS
from marketing_pipelines_tests.agents.fake_models import (
    ANTHROPIC_TEXT,
    COUNT_SIGNUPS,
    OPENAI_TEXT,
    SYSTEM,
    Script,
    anthropic_message,
    complete_once,
    openai_completion,
    scripted_anthropic,
    scripted_openai,
)

SEND_EMAIL = ToolSpec(
    name="send_email",
    description="Send an email to a segment.",
    input_schema={
        "type": "object",
        "properties": {"segment": {"type": "string"}, "subject": {"type": "string"}},
        "required": ["segment", "subject"],
    },
)
PUBLISH_POST = ToolSpec(
    name="publish_post",
    description="Publish a post.",
    input_schema={"type": "object", "properties": {"channel": {"type": "string"}}, "required": ["channel"]},
)

# A conversation after one assistant turn that called two tools, one of which was refused.
CONVERSATION_WITH_TOOL_RESULTS: list[dict] = [
    {"role": "user", "content": "How many signups did campaign 7 get?"},
    {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            {"id": "toolu_01", "name": "count_signups", "arguments": {"campaign_id": 7}},
            {"id": "toolu_02", "name": "send_email", "arguments": {"segment": "all", "subject": "Hi"}},
        ],
    },
    {"role": "tool", "tool_call_id": "toolu_01", "name": "count_signups", "content": "42", "is_error": False},
    {"role": "tool", "tool_call_id": "toolu_02", "name": "send_email", "content": "not permitted", "is_error": True},
]


ProviderFactory = Callable[[Script], AnthropicModel | OpenAIModel]

# (factory, a successful payload, the env var its 401 must name, a 400 body in that API's shape)
PROVIDERS = [
    pytest.param(
        scripted_anthropic,
        ANTHROPIC_TEXT,
        "ANTHROPIC_API_KEY",
        {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: must be positive"}},
        id="anthropic",
    ),
    pytest.param(
        scripted_openai,
        OPENAI_TEXT,
        "OPENAI_API_KEY",
        {"error": {"message": "max_tokens: must be positive", "type": "invalid_request_error", "param": None}},
        id="openai",
    ),
]


def test_every_provider_satisfies_the_protocol_and_is_named() -> None:
    providers = [OfflineModel(), AnthropicModel(api_key="k"), OpenAIModel(api_key="k")]
    assert all(isinstance(provider, ModelProvider) for provider in providers)
    assert tuple(provider.name for provider in providers) == MODEL_PROVIDERS


@pytest.mark.parametrize(("factory", "ok_payload", "env_var", "bad_request"), PROVIDERS)
def test_calls_share_one_client_until_close(
    factory: ProviderFactory, ok_payload: dict, env_var: str, bad_request: dict
) -> None:
    script = Script(*(httpx.Response(200, json=ok_payload) for _ in range(3)))
    provider = factory(script)

    complete_once(provider)
    client = provider.http_client()
    complete_once(provider)
    assert provider.http_client() is client
    provider.close()

    assert client.is_closed
    complete_once(provider)  # a closed provider builds a fresh client rather than failing
    assert provider.http_client() is not client
    assert len(script.requests) == 3


# --- Anthropic wire format ---------------------------------------------------------------------


def test_anthropic_sends_tool_history_as_content_blocks() -> None:
    script = Script(httpx.Response(200, json=ANTHROPIC_TEXT))
    scripted_anthropic(script).complete(SYSTEM, CONVERSATION_WITH_TOOL_RESULTS, [COUNT_SIGNUPS, SEND_EMAIL])

    request = script.requests[0]
    assert request.method == "POST"
    assert str(request.url) == "https://api.anthropic.com/v1/messages"
    assert request.headers["x-api-key"] == "sk-ant-test"
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert request.headers["content-type"] == "application/json"
    cached = {"cache_control": {"type": "ephemeral"}}
    assert script.body() == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1024,
        # Prompt caching (on by default): the system prompt as a cacheable block, and the last tool marked.
        "system": [{"type": "text", "text": SYSTEM, **cached}],
        "messages": [
            {"role": "user", "content": "How many signups did campaign 7 get?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "id": "toolu_01", "name": "count_signups", "input": {"campaign_id": 7}},
                    {
                        "type": "tool_use",
                        "id": "toolu_02",
                        "name": "send_email",
                        "input": {"segment": "all", "subject": "Hi"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01", "content": "42", "is_error": False},
                    {"type": "tool_result", "tool_use_id": "toolu_02", "content": "not permitted", "is_error": True},
                ],
            },
        ],
        "tools": [
            {
                "name": COUNT_SIGNUPS.name,
                "description": COUNT_SIGNUPS.description,
                "input_schema": COUNT_SIGNUPS.input_schema,
            },
            {"name": SEND_EMAIL.name, "description": SEND_EMAIL.description, "input_schema": SEND_EMAIL.input_schema}
            | cached,
        ],
    }


def test_anthropic_keeps_roles_alternating_when_user_text_follows_tool_results() -> None:
    script = Script(httpx.Response(200, json=ANTHROPIC_TEXT))
    nudge = {"role": "user", "content": "Keep it short."}
    scripted_anthropic(script).complete(SYSTEM, [*CONVERSATION_WITH_TOOL_RESULTS, nudge], [])

    sent = script.body()
    assert [message["role"] for message in sent["messages"]] == ["user", "assistant", "user"]
    assert sent["messages"][-1]["content"][-1] == {"type": "text", "text": "Keep it short."}
    # An empty tools list is left out rather than sent as [].
    assert "tools" not in sent


def test_anthropic_parses_tool_use_response() -> None:
    payload = anthropic_message(
        [
            {"type": "text", "text": "I'll count them."},
            {
                "type": "tool_use",
                "id": "toolu_01A09q90qw90lq917835lq9",
                "name": "count_signups",
                "input": {"campaign_id": 7},
            },
        ],
        stop_reason="tool_use",
    )
    script = Script(httpx.Response(200, json=payload))

    turn = complete_once(scripted_anthropic(script))

    assert turn == ModelTurn(
        text="I'll count them.",
        tool_calls=(ToolCall(id="toolu_01A09q90qw90lq917835lq9", name="count_signups", arguments={"campaign_id": 7}),),
        stop_reason="tool_use",
        usage=usage_of(input_tokens=120, output_tokens=35),
        model="claude-sonnet-4-5",
    )


# --- OpenAI wire format ------------------------------------------------------------------------


def test_openai_sends_tool_history_as_chat_messages() -> None:
    script = Script(httpx.Response(200, json=OPENAI_TEXT))
    provider = scripted_openai(script, base_url="http://llm.internal:8000/v1/")
    provider.complete(SYSTEM, CONVERSATION_WITH_TOOL_RESULTS, [COUNT_SIGNUPS, SEND_EMAIL])

    request = script.requests[0]
    assert request.method == "POST"
    assert str(request.url) == "http://llm.internal:8000/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-openai-test"
    assert request.headers["content-type"] == "application/json"
    sent = script.body()
    assistant_calls = sent["messages"][2]["tool_calls"]
    assert [json.loads(call["function"]["arguments"]) for call in assistant_calls] == [
        {"campaign_id": 7},
        {"segment": "all", "subject": "Hi"},
    ]
    for call in assistant_calls:
        call["function"]["arguments"] = "<checked above>"
    assert sent == {
        "model": "gpt-4o-mini",
        "max_completion_tokens": 1024,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "How many signups did campaign 7 get?"},
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [
                    {
                        "id": "toolu_01",
                        "type": "function",
                        "function": {"name": "count_signups", "arguments": "<checked above>"},
                    },
                    {
                        "id": "toolu_02",
                        "type": "function",
                        "function": {"name": "send_email", "arguments": "<checked above>"},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_01", "content": "42"},
            {"role": "tool", "tool_call_id": "toolu_02", "content": "ERROR: not permitted"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {"name": spec.name, "description": spec.description, "parameters": spec.input_schema},
            }
            for spec in (COUNT_SIGNUPS, SEND_EMAIL)
        ],
    }


def test_openai_can_send_legacy_max_tokens_for_older_compatible_servers() -> None:
    script = Script(httpx.Response(200, json=OPENAI_TEXT))
    complete_once(scripted_openai(script, max_tokens_field="max_tokens", max_tokens=64))

    sent = script.body()
    assert sent["max_tokens"] == 64
    assert "max_completion_tokens" not in sent


def test_openai_parses_tool_calls_with_null_content() -> None:
    payload = openai_completion(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "count_signups", "arguments": '{"campaign_id": 7}'},
                },
                {"id": "call_def", "type": "function", "function": {"name": "send_email", "arguments": ""}},
            ],
        },
        finish_reason="tool_calls",
    )
    script = Script(httpx.Response(200, json=payload))

    turn = complete_once(scripted_openai(script))

    assert turn == ModelTurn(
        text="",
        tool_calls=(
            ToolCall(id="call_abc", name="count_signups", arguments={"campaign_id": 7}),
            ToolCall(id="call_def", name="send_email", arguments={}),
        ),
        stop_reason="tool_calls",
        usage=usage_of(input_tokens=80, output_tokens=12),
        model="gpt-4o-mini-2024-07-18",
    )


def test_openai_invalid_tool_arguments_are_a_problem_of_the_call_not_an_error() -> None:
    payload = openai_completion(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_abc", "type": "function", "function": {"name": "count_signups", "arguments": '{"campaign'}}
            ],
        },
        finish_reason="tool_calls",
    )
    script = Script(httpx.Response(200, json=payload))

    # Not an error that fails the run: the loop refuses the call, records it and tells the model.
    [call] = complete_once(scripted_openai(script)).tool_calls
    assert (call.name, call.arguments) == ("count_signups", {})
    assert call.problem is not None and call.problem.startswith("invalid JSON arguments")


# --- retries and errors, same contract for both HTTP providers ---------------------------------


@pytest.mark.parametrize(("factory", "ok_payload", "env_var", "bad_request"), PROVIDERS)
def test_429_raises_rate_limited_with_retry_after_at_once(
    factory: ProviderFactory, ok_payload: dict, env_var: str, bad_request: dict
) -> None:
    # Not slept in this process: the caller shares the wait with every replica through the database.
    script = Script(
        httpx.Response(429, headers={"retry-after": "7"}, json={"error": {"message": "slow down"}}),
        httpx.Response(200, json=ok_payload),
    )

    with pytest.raises(RateLimited) as raised:
        complete_once(factory(script))

    assert raised.value.retry_after_s == 7.0
    assert "slow down" in str(raised.value)
    assert script.sleeps == []
    assert len(script.requests) == 1


NOW = 1_800_000_000.0
# No header makes a wait longer than a day.
A_DAY = 24 * 3600.0


@pytest.mark.parametrize(("factory", "ok_payload", "env_var", "bad_request"), PROVIDERS)
def test_429_prefers_retry_after_ms_over_retry_after(
    factory: ProviderFactory, ok_payload: dict, env_var: str, bad_request: dict
) -> None:
    # Both APIs send the precise retry-after-ms next to a whole-second retry-after; their SDKs read it first.
    headers = {"retry-after-ms": "1500", "retry-after": "2", "x-request-id": "req_01"}
    script = Script(
        httpx.Response(429, headers=headers, json={"error": {"type": "rate_limit_error", "message": "slow down"}}),
        httpx.Response(200, json=ok_payload),
    )

    with pytest.raises(RateLimited) as raised:
        complete_once(factory(script))

    assert raised.value.retry_after_s == 1.5
    assert script.sleeps == []
    assert len(script.requests) == 1


@pytest.mark.parametrize(("factory", "ok_payload", "env_var", "bad_request"), PROVIDERS)
def test_an_absurd_retry_after_is_capped_at_a_day(
    factory: ProviderFactory, ok_payload: dict, env_var: str, bad_request: dict
) -> None:
    script = Script(httpx.Response(429, headers={"retry-after": "1e400"}, json={"error": {"message": "slow down"}}))

    with pytest.raises(RateLimited) as raised:
        complete_once(factory(script))

    assert raised.value.retry_after_s == A_DAY
    assert script.sleeps == []


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        pytest.param(429, {"retry-after-ms": "250"}, 0.25, id="ms"),
        pytest.param(429, {"retry-after-ms": "250", "retry-after": "9"}, 0.25, id="ms-wins"),
        pytest.param(429, {"retry-after-ms": "soon", "retry-after": "9"}, 9.0, id="bad-ms-falls-back"),
        pytest.param(429, {"retry-after-ms": "NaN", "retry-after": "9"}, 9.0, id="nan-ms-falls-back"),
        pytest.param(429, {"retry-after-ms": "-40"}, 0.0, id="negative-ms"),
        pytest.param(429, {"retry-after-ms": "inf"}, A_DAY, id="infinite-ms"),
        pytest.param(429, {"retry-after": "-5"}, 0.0, id="negative"),
        pytest.param(429, {"retry-after": "nan"}, None, id="nan-is-no-hint"),
        pytest.param(429, {"retry-after": "99999999999"}, A_DAY, id="absurd"),
        pytest.param(429, {"retry-after": "Fri, 31 Dec 9999 23:59:59 GMT"}, A_DAY, id="far-date"),
        pytest.param(429, {"retry-after": "Sat, 01 Jan 10000 00:00:00 GMT"}, None, id="unreadable-date"),
        pytest.param(403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(NOW + 30)}, 30.0, id="reset"),
        pytest.param(403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "1e30"}, A_DAY, id="far-reset"),
        pytest.param(403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "nan"}, None, id="nan-reset"),
        pytest.param(403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(NOW - 30)}, 0.0, id="past-reset"),
        # A reset with quota left is the primary window's, not a wait for this answer (GitHub secondary limits).
        pytest.param(429, {"x-ratelimit-remaining": "12", "x-ratelimit-reset": str(NOW + 900)}, None, id="quota-left"),
    ],
)
def test_server_wait_hint_is_bounded(status: int, headers: dict[str, str], expected: float | None) -> None:
    assert server_wait_hint(httpx.Response(status, headers=headers), now=NOW) == expected


@pytest.mark.parametrize(("factory", "ok_payload", "env_var", "bad_request"), PROVIDERS)
def test_500_is_retried_then_succeeds(
    factory: ProviderFactory, ok_payload: dict, env_var: str, bad_request: dict
) -> None:
    script = Script(httpx.Response(500, text="internal error"), httpx.Response(200, json=ok_payload))

    turn = complete_once(factory(script))

    assert turn.text == "Campaign 7 got 42 signups."
    assert len(script.sleeps) == 1
    assert len(script.requests) == 2


@pytest.mark.parametrize(("factory", "ok_payload", "env_var", "bad_request"), PROVIDERS)
def test_long_retry_after_raises_rate_limited_without_sleeping(
    factory: ProviderFactory, ok_payload: dict, env_var: str, bad_request: dict
) -> None:
    script = Script(httpx.Response(429, headers={"retry-after": "3600"}))

    with pytest.raises(RateLimited) as raised:
        complete_once(factory(script))

    assert raised.value.retry_after_s == 3600.0
    assert script.sleeps == []


@pytest.mark.parametrize(("factory", "ok_payload", "env_var", "bad_request"), PROVIDERS)
def test_401_names_the_env_var_and_is_not_retried(
    factory: ProviderFactory, ok_payload: dict, env_var: str, bad_request: dict
) -> None:
    script = Script(httpx.Response(401, json={"error": {"message": "invalid x-api-key"}}))

    with pytest.raises(ServiceError, match=env_var) as raised:
        complete_once(factory(script))

    assert raised.value.status == 401
    assert len(script.requests) == 1


@pytest.mark.parametrize(("factory", "ok_payload", "env_var", "bad_request"), PROVIDERS)
def test_400_quotes_the_api_error_message(
    factory: ProviderFactory, ok_payload: dict, env_var: str, bad_request: dict
) -> None:
    script = Script(httpx.Response(400, json=bad_request))

    with pytest.raises(ServiceError, match=r"API error \(HTTP 400\): max_tokens: must be positive$") as raised:
        complete_once(factory(script))

    assert raised.value.status == 400
    assert len(script.requests) == 1


@pytest.mark.parametrize(("factory", "ok_payload", "env_var", "bad_request"), PROVIDERS)
def test_truncated_json_body_is_a_service_error(
    factory: ProviderFactory, ok_payload: dict, env_var: str, bad_request: dict
) -> None:
    truncated = json.dumps(ok_payload)[:40]
    script = Script(httpx.Response(200, text=truncated, headers={"content-type": "application/json"}))

    with pytest.raises(ServiceError, match="not valid JSON"):
        complete_once(factory(script))


@pytest.mark.parametrize(("factory", "ok_payload", "env_var", "bad_request"), PROVIDERS)
def test_empty_api_key_fails_before_any_request(
    factory: ProviderFactory, ok_payload: dict, env_var: str, bad_request: dict
) -> None:
    script = Script()
    provider = factory(script).model_copy(update={"api_key": ""})

    with pytest.raises(ServiceError, match=env_var):
        complete_once(provider)

    assert script.requests == []


# --- offline model -----------------------------------------------------------------------------


def run_offline(task: object, tools: list[ToolSpec], results: dict[str, tuple[str, bool]]) -> list[ModelTurn]:
    """Drive OfflineModel like the agent loop would, answering each call from ``results``; return every turn."""
    model = OfflineModel()
    content = task if isinstance(task, str) else json.dumps(task)
    messages: list[dict] = [{"role": "user", "content": content}]
    turns: list[ModelTurn] = []
    for _ in range(len(tools) + 1):
        turn = model.complete(SYSTEM, messages, tools)
        turns.append(turn)
        if not turn.tool_calls:
            return turns
        messages.append(
            {
                "role": "assistant",
                "content": turn.text,
                "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in turn.tool_calls],
            }
        )
        for call in turn.tool_calls:
            output, is_error = results[call.name]
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": output, "is_error": is_error}
            )
    raise AssertionError(f"offline model did not finish within {len(tools) + 1} turns: {turns}")


def test_offline_calls_two_tools_one_per_turn_then_summarises() -> None:
    task = {"campaign_id": 7, "since": "2025-01-01", "segment": "trial", "subject": "Welcome"}
    long_result = "x" * 250

    turns = run_offline(
        task, [COUNT_SIGNUPS, SEND_EMAIL], {"count_signups": ("42", False), "send_email": (long_result, False)}
    )

    assert [turn.tool_calls for turn in turns] == [
        (ToolCall(id="offline-1", name="count_signups", arguments={"campaign_id": 7, "since": "2025-01-01"}),),
        (ToolCall(id="offline-2", name="send_email", arguments={"segment": "trial", "subject": "Welcome"}),),
        (),
    ]
    final = turns[-1]
    assert final.stop_reason == "end_turn"
    assert final.text == f"count_signups: 42\nsend_email: {'x' * 250}"
    assert all(turn.usage == usage_of() for turn in turns)
    assert all(turn.model == "offline" for turn in turns)


def test_offline_skips_a_tool_whose_required_arguments_are_missing() -> None:
    # No "subject", so send_email cannot be called; publish_post after it still can.
    task = {"campaign_id": 7, "segment": "trial", "channel": "blog"}

    turns = run_offline(
        task,
        [COUNT_SIGNUPS, SEND_EMAIL, PUBLISH_POST],
        {"count_signups": ("42", False), "publish_post": ("published", False)},
    )

    assert [call.name for turn in turns for call in turn.tool_calls] == ["count_signups", "publish_post"]
    assert turns[1].tool_calls[0].arguments == {"channel": "blog"}
    assert turns[-1].text == "count_signups: 42\npublish_post: published"


def test_offline_reports_a_refused_tool() -> None:
    refusal = "send_email is not allowed for agent identity 'intern': " + "r" * 250

    turns = run_offline(
        {"campaign_id": 7, "segment": "all", "subject": "Sale"},
        [COUNT_SIGNUPS, SEND_EMAIL],
        {"count_signups": ("42", False), "send_email": (refusal, True)},
    )

    assert turns[-1].text == f"count_signups: 42\nsend_email was refused: {refusal}"


@pytest.mark.parametrize(
    "task",
    [
        "Count the signups for campaign 7, please.",  # prose, not JSON
        "[7]",  # JSON, but not an object
        {"unrelated": True},  # an object with none of the required keys
    ],
)
def test_offline_without_usable_task_answers_without_calling_tools(task: object) -> None:
    turns = run_offline(task, [COUNT_SIGNUPS, SEND_EMAIL], {})

    assert len(turns) == 1
    assert turns[0].tool_calls == ()
    assert turns[0].text == "No tools were called, so there is nothing to report."
