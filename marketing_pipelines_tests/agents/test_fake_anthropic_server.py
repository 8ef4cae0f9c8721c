"""The fake Anthropic server itself: its buckets admit up to the limit and answer 429 above it, output is reserved
as max_tokens and settled at the answer, prompt caching reads and writes as documented, lowered limits show in the
next answer's headers, and its counters reach another process."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import httpx
import pytest

from marketing_pipelines.agents.providers.anthropic import AnthropicModel
from marketing_pipelines.agents.providers.types import ToolSpec
from marketing_pipelines.http import RateLimited
from marketing_pipelines_tests.agents.agent_processes import in_new_process
from marketing_pipelines_tests.agents.fake_anthropic_server import (
    API_KEY,
    FakeAnthropic,
    Limits,
    remote_stats,
    scripted_answer,
    tokens_of,
)

MODEL = "claude-sonnet-4-5"
HEADERS = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01", "content-type": "application/json"}


class Clock:
    """A clock that moves only when told: no refill between two requests unless the test advances it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@contextmanager
def _serve(fake: FakeAnthropic) -> Iterator[httpx.Client]:
    with fake.running(), httpx.Client(base_url=fake.base_url, headers=HEADERS, trust_env=False, timeout=30) as client:
        yield client


def _text(chars: int, seed: str = "x") -> str:
    return (seed * chars)[:chars]


def _body(
    user: str, *, system: Any = None, tools: list[dict] | None = None, max_tokens: int = 10, **extra: Any
) -> dict:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, "messages": [{"role": "user", "content": user}]}
    if system is not None:
        body["system"] = system
    if tools is not None:
        body["tools"] = tools
    return {**body, **extra}


def _end_turn(_: dict) -> dict:
    return {"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn"}


def test_input_bucket_admits_up_to_the_limit_and_answers_429_above_it(clock: Clock) -> None:
    fake = FakeAnthropic(
        limits=Limits(requests=100, input_tokens=1000, output_tokens=10_000), answer=_end_turn, clock=clock
    )
    with _serve(fake) as client:
        # Four requests of exactly 250 tokens each (1,000 characters) spend the whole bucket, none refused.
        for _ in range(4):
            assert client.post("/v1/messages", json=_body(_text(1000))).status_code == 200
        refused = client.post("/v1/messages", json=_body(_text(4)))
        assert refused.status_code == 429
        assert refused.json()["type"] == "error" and refused.json()["error"]["type"] == "rate_limit_error"
        # One token lacks; the bucket refills 1,000/60 a second: whole seconds, at least 1.
        assert refused.headers["retry-after"] == "1"
        assert refused.headers["anthropic-ratelimit-input-tokens-remaining"] == "0"
        # A refused request took nothing: after 15 s (250 tokens refilled) a 250-token request fits exactly.
        clock.now += 15
        assert client.post("/v1/messages", json=_body(_text(1000))).status_code == 200
        assert client.post("/v1/messages", json=_body(_text(4))).status_code == 429
    assert fake.stats()["answers"] == {"200": 5, "429": 2}
    assert [tokens for _, tokens in fake.stats()["admitted"]] == [250] * 5


def test_requests_bucket_binds_on_its_own(clock: Clock) -> None:
    fake = FakeAnthropic(
        limits=Limits(requests=3, input_tokens=100_000, output_tokens=100_000), answer=_end_turn, clock=clock
    )
    with _serve(fake) as client:
        statuses = [client.post("/v1/messages", json=_body("hi")).status_code for _ in range(4)]
        assert statuses == [200, 200, 200, 429]
        # 3 a minute: one request back after 20 s.
        clock.now += 20
        assert client.post("/v1/messages", json=_body("hi")).status_code == 200


def test_output_is_reserved_as_max_tokens_until_the_answer_then_settled(clock: Clock) -> None:
    release, admitted = threading.Event(), threading.Event()

    def held(body: dict) -> dict:
        admitted.set()
        assert release.wait(30)
        return _end_turn(body)

    fake = FakeAnthropic(
        limits=Limits(requests=100, input_tokens=100_000, output_tokens=1000), answer=held, clock=clock
    )
    with _serve(fake) as client:
        first: list[httpx.Response] = []
        thread = threading.Thread(
            target=lambda: first.append(client.post("/v1/messages", json=_body("a", max_tokens=600)))
        )
        thread.start()
        assert admitted.wait(30)
        # 600 of 1,000 reserved while the first is in flight: 600 more do not fit.
        second = client.post("/v1/messages", json=_body("b", max_tokens=600))
        assert second.status_code == 429
        release.set()
        thread.join(30)
        assert first[0].status_code == 200 and first[0].json()["usage"]["output_tokens"] == 1
        # The answer gave back what it did not use (599): 999 left, so 600 fit again.
        assert client.post("/v1/messages", json=_body("c", max_tokens=600)).status_code == 200
        # More than the limit can never fit: the longest wait the fake states (60 s).
        never = client.post("/v1/messages", json=_body("d", max_tokens=1001))
        assert never.status_code == 429 and never.headers["retry-after"] == "60"


def test_answers_are_shaped_as_the_messages_api_with_every_limit_header() -> None:
    fake = FakeAnthropic(limits=Limits(requests=50, input_tokens=20_000, output_tokens=8_000))
    task = {"campaign_id": "spring", "from": "2026-11-01", "to": "2026-11-28"}
    tools = [
        {
            "name": "read_campaign",
            "description": "d",
            "input_schema": {"type": "object", "properties": {"campaign_id": {}}, "required": ["campaign_id"]},
        },
        {
            "name": "needs_stage",
            "description": "d",
            "input_schema": {"type": "object", "properties": {"stage": {}}, "required": ["stage"]},
        },
    ]
    with _serve(fake) as client:
        first = client.post("/v1/messages", json=_body(json.dumps(task), tools=tools))
    message = first.json()
    assert set(message) >= {"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"}
    assert message["type"] == "message" and message["role"] == "assistant" and message["model"] == MODEL
    # The one tool whose required arguments the task supplies is called, with them.
    assert message["stop_reason"] == "tool_use"
    assert [(b["type"], b["name"], b["input"]) for b in message["content"]] == [
        ("tool_use", "read_campaign", {"campaign_id": "spring"})
    ]
    assert set(message["usage"]) >= {
        "input_tokens",
        "output_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "cache_creation",
    }
    assert first.headers["request-id"].startswith("req_")
    for unit in ("requests", "input-tokens", "output-tokens", "tokens"):
        for part in ("limit", "remaining", "reset"):
            assert f"anthropic-ratelimit-{unit}-{part}" in first.headers
        datetime.fromisoformat(first.headers[f"anthropic-ratelimit-{unit}-reset"].replace("Z", "+00:00"))
    assert first.headers["anthropic-ratelimit-input-tokens-limit"] == "20000"
    assert first.headers["anthropic-ratelimit-tokens-limit"] == "28000"
    assert first.headers["anthropic-ratelimit-requests-remaining"] == "49"
    # Token counts remaining are rounded to the nearest thousand, as documented.
    assert int(first.headers["anthropic-ratelimit-input-tokens-remaining"]) % 1000 == 0


def test_scripted_conversation_calls_each_tool_then_ends() -> None:
    task = json.dumps({"campaign_id": "c", "from": "2026-11-01", "to": "2026-11-02"})
    tools = [
        {
            "name": name,
            "description": "",
            "input_schema": {"type": "object", "properties": {"campaign_id": {}}, "required": ["campaign_id"]},
        }
        for name in ("one", "two")
    ]
    messages: list[dict] = [{"role": "user", "content": task}]
    names = []
    for _ in range(3):
        turn = scripted_answer({"messages": messages, "tools": tools})
        names.append(turn["stop_reason"])
        messages.append({"role": "assistant", "content": turn["content"]})
        if turn["stop_reason"] == "tool_use":
            messages.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": turn["content"][0]["id"], "content": "{}"}],
                }
            )
    assert names == ["tool_use", "tool_use", "end_turn"]
    assistant = [m["content"][0] for m in messages if m["role"] == "assistant"]
    assert [(b["type"], b.get("name")) for b in assistant] == [("tool_use", "one"), ("tool_use", "two"), ("text", None)]


@pytest.mark.parametrize(
    ("system_chars", "cached"),
    [
        (4096, True),  # 1,024 tokens: exactly the minimum, cached
        (4092, False),  # 1,023 tokens: below it, processed without caching
    ],
)
def test_cache_minimum_length(clock: Clock, system_chars: int, cached: bool) -> None:
    fake = FakeAnthropic(limits=Limits(100, 1_000_000, 100_000), answer=_end_turn, clock=clock)
    system = [{"type": "text", "text": _text(system_chars), "cache_control": {"type": "ephemeral"}}]
    with _serve(fake) as client:
        usages = [client.post("/v1/messages", json=_body("hi", system=system)).json()["usage"] for _ in range(2)]
    tokens = system_chars // 4
    if cached:
        assert (usages[0]["cache_creation_input_tokens"], usages[0]["cache_read_input_tokens"]) == (tokens, 0)
        assert (usages[1]["cache_creation_input_tokens"], usages[1]["cache_read_input_tokens"]) == (0, tokens)
        assert usages[1]["input_tokens"] == 1  # "hi"
    else:
        assert all(u["cache_creation_input_tokens"] == u["cache_read_input_tokens"] == 0 for u in usages)
        assert all(u["input_tokens"] == tokens + 1 for u in usages)


def test_cache_reads_do_not_count_against_the_input_limit(clock: Clock) -> None:
    # 1,500 tokens of system: the first call counts 1,500 + 1 (a write counts); later ones only the uncached 1.
    fake = FakeAnthropic(limits=Limits(100, 2000, 100_000), answer=_end_turn, clock=clock)
    system = [{"type": "text", "text": _text(6000), "cache_control": {"type": "ephemeral"}}]
    with _serve(fake) as client:
        statuses = [client.post("/v1/messages", json=_body("hi", system=system)).status_code for _ in range(20)]
    assert statuses == [200] * 20
    assert [tokens for _, tokens in fake.stats()["admitted"]] == [1501] + [1] * 19


def test_cache_prefix_order_expiry_refresh_and_lookback(clock: Clock) -> None:
    fake = FakeAnthropic(limits=Limits(1000, 10_000_000, 1_000_000), answer=_end_turn, clock=clock)
    tool = {"name": "t", "description": _text(2000), "input_schema": {"type": "object"}}
    system = [{"type": "text", "text": _text(4000), "cache_control": {"type": "ephemeral"}}]
    tool_tokens, system_tokens = tokens_of(tool), 1000

    def usage(client: httpx.Client, body: dict) -> dict:
        response = client.post("/v1/messages", json=body)
        assert response.status_code == 200, response.text
        return response.json()["usage"]

    with _serve(fake) as client:
        # A breakpoint on the system caches tools + system (the prefix order is tools, system, messages).
        assert (
            usage(client, _body("hi", system=system, tools=[tool]))["cache_creation_input_tokens"]
            == tool_tokens + system_tokens
        )
        # Another tool definition is another prefix: nothing read.
        other = {**tool, "description": _text(2000, "y")}
        assert usage(client, _body("hi", system=system, tools=[other]))["cache_read_input_tokens"] == 0
        # Read at 4 min refreshes the entry: still there at 8 min, gone 5 min after the last read.
        clock.now += 240
        assert (
            usage(client, _body("hi", system=system, tools=[tool]))["cache_read_input_tokens"]
            == tool_tokens + system_tokens
        )
        clock.now += 240
        assert (
            usage(client, _body("hi", system=system, tools=[tool]))["cache_read_input_tokens"]
            == tool_tokens + system_tokens
        )
        clock.now += 301
        expired = usage(client, _body("hi", system=system, tools=[tool]))
        assert (expired["cache_read_input_tokens"], expired["cache_creation_input_tokens"]) == (
            0,
            tool_tokens + system_tokens,
        )
        # A breakpoint at the end of the conversation; the next turn's breakpoint is further on, and the look-back
        # over earlier block boundaries finds the previous turn's prefix.
        turn1 = [
            {"role": "user", "content": [{"type": "text", "text": _text(400), "cache_control": {"type": "ephemeral"}}]}
        ]
        first = usage(client, {"model": MODEL, "max_tokens": 10, "system": system, "tools": [tool], "messages": turn1})
        assert first["cache_read_input_tokens"] == tool_tokens + system_tokens
        assert first["cache_creation_input_tokens"] == 100
        plain = [{"role": "user", "content": [{"type": "text", "text": _text(400)}]}]
        turn2 = [
            *plain,
            {"role": "assistant", "content": [{"type": "text", "text": _text(40)}]},
            {"role": "user", "content": [{"type": "text", "text": _text(80), "cache_control": {"type": "ephemeral"}}]},
        ]
        second = usage(client, {"model": MODEL, "max_tokens": 10, "system": system, "tools": [tool], "messages": turn2})
        assert second["cache_read_input_tokens"] == tool_tokens + system_tokens + 100
        assert second["cache_creation_input_tokens"] == 10 + 20
        # A one-hour breakpoint is reported under ephemeral_1h_input_tokens.
        hour = [{"type": "text", "text": _text(8000, "z"), "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
        response = client.post("/v1/messages", json=_body("hi", system=hour)).json()["usage"]
        assert response["cache_creation"] == {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 2000}
        clock.now += 3000
        assert usage(client, _body("hi", system=hour))["cache_read_input_tokens"] == 2000


def test_more_than_four_breakpoints_is_an_invalid_request() -> None:
    fake = FakeAnthropic(answer=_end_turn)
    system = [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}} for _ in range(5)]
    with _serve(fake) as client:
        response = client.post("/v1/messages", json=_body("hi", system=system))
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("headers", "status", "error_type"),
    [
        ({"x-api-key": "wrong", "anthropic-version": "2023-06-01"}, 401, "authentication_error"),  # bad key
        ({"x-api-key": API_KEY}, 400, "invalid_request_error"),  # no anthropic-version
    ],
)
def test_requests_without_credentials_or_version_are_refused(headers: dict, status: int, error_type: str) -> None:
    fake = FakeAnthropic(answer=_end_turn)
    with fake.running():
        response = httpx.post(f"{fake.base_url}/v1/messages", json=_body("hi"), headers=headers, trust_env=False)
    assert response.status_code == status and response.json()["error"]["type"] == error_type
    assert fake.stats()["answers"] == {}


def test_lowered_limits_show_in_the_next_answers_headers(clock: Clock) -> None:
    fake = FakeAnthropic(limits=Limits(50, 20_000, 8_000), answer=_end_turn, clock=clock)
    with _serve(fake) as client:
        before = client.post("/v1/messages", json=_body("hi")).headers
        fake.set_limits(input_tokens=10_000, requests=20)
        after = client.post("/v1/messages", json=_body("hi")).headers
        # The bucket held ~20,000; cut to the new capacity, it holds at most 10,000.
        refused = client.post("/v1/messages", json=_body(_text(4 * 10_001)))
    assert before["anthropic-ratelimit-input-tokens-limit"] == "20000"
    assert before["anthropic-ratelimit-requests-limit"] == "50"
    assert after["anthropic-ratelimit-input-tokens-limit"] == "10000"
    assert after["anthropic-ratelimit-requests-limit"] == "20"
    assert int(after["anthropic-ratelimit-input-tokens-remaining"]) <= 10_000
    assert after["anthropic-ratelimit-output-tokens-limit"] == "8000"
    assert refused.status_code == 429
    assert fake.stats()["limits"] == {"requests": 20, "input_tokens": 10_000, "output_tokens": 8_000}


def test_queued_error_answers_the_next_request_once() -> None:
    fake = FakeAnthropic(answer=_end_turn)
    fake.queue_error(529, "overloaded_error", "Overloaded")
    with _serve(fake) as client:
        statuses = [client.post("/v1/messages", json=_body("hi")) for _ in range(2)]
    assert statuses[0].status_code == 529 and statuses[0].json()["error"]["type"] == "overloaded_error"
    assert statuses[1].status_code == 200


def test_counters_reach_another_process() -> None:
    fake = FakeAnthropic(limits=Limits(2, 100_000, 100_000), answer=_end_turn)
    with _serve(fake) as client:
        for _ in range(3):
            client.post("/v1/messages", json=_body("hello"))
        stats = in_new_process(remote_stats, fake.base_url)
    assert stats["answers"] == {"200": 2, "429": 1}
    assert stats["rate_limited"] == 1
    assert [tokens for _, tokens in stats["admitted"]] == [2, 2]


def test_the_real_provider_reads_the_fakes_answers_usage_and_limits(clock: Clock) -> None:
    fake = FakeAnthropic(limits=Limits(2, 100_000, 100_000), clock=clock)
    tool = ToolSpec(
        "read_campaign", _text(6000), {"type": "object", "properties": {"campaign_id": {}}, "required": ["campaign_id"]}
    )
    task = json.dumps({"campaign_id": "spring"})
    with fake.running():
        model = AnthropicModel(api_key=API_KEY, base_url=fake.base_url, model=MODEL)
        try:
            first = model.complete("You analyse campaigns.", [{"role": "user", "content": task}], [tool])
            second = model.complete("You analyse campaigns.", [{"role": "user", "content": task}], [tool])
            with pytest.raises(RateLimited) as refused:
                model.complete("You analyse campaigns.", [{"role": "user", "content": task}], [tool])
        finally:
            model.close()
    assert [c.name for c in first.tool_calls] == ["read_campaign"] and first.tool_calls[0].arguments == {
        "campaign_id": "spring"
    }
    # The provider marks the tool definitions cacheable: the first call writes them, the second reads them.
    assert first.usage["cache_creation_input_tokens"] > 1024 and first.usage["cache_read_input_tokens"] == 0
    assert second.usage["cache_read_input_tokens"] == first.usage["cache_creation_input_tokens"]
    assert first.rate_limits == {"requests": 2, "input_tokens": 100_000, "output_tokens": 100_000}
    assert refused.value.retry_after_s == 30
