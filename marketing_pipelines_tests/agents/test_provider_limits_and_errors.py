"""The providers read the usage, the limits and the errors the real APIs answer with, and estimate a call's cost.

Answers are shaped as the providers document them (``fake_models``); hostile numbers in them are not believed.
"""

from __future__ import annotations

import json
import math
import re

import httpx
import pytest

from marketing_pipelines.agents.providers.anthropic import AnthropicModel
from marketing_pipelines.agents.providers.base import RequestRejected, SpendLimitReached
from marketing_pipelines.agents.providers.offline import OfflineModel
from marketing_pipelines.agents.providers.openai import OpenAIModel
from marketing_pipelines.agents.providers.types import LIMIT_UNITS, USAGE_KEYS, ToolSpec, usage_of
from marketing_pipelines.http import RateLimited, ServiceError
from marketing_pipelines_tests.agents.fake_models import (
    ANTHROPIC_SPEND_KINDS,
    ANTHROPIC_TEXT,
    COUNT_SIGNUPS,
    OPENAI_TEXT,
    SYSTEM,
    Script,
    anthropic_limit_headers,
    anthropic_message,
    anthropic_ok,
    anthropic_overloaded,
    anthropic_rate_limited,
    anthropic_spend_limit,
    complete_once,
    openai_completion,
    openai_insufficient_quota,
    openai_ok,
    openai_rate_limited,
    scripted_anthropic,
    scripted_openai,
)

SEND_EMAIL = ToolSpec(
    name="send_email",
    description="Send an email to a segment.",
    input_schema={"type": "object", "properties": {"segment": {"type": "string"}}, "required": ["segment"]},
)
TEXT = {"role": "assistant", "content": "Campaign 7 got 42 signups.", "refusal": None}

# --- usage and the model that answered ----------------------------------------------------------


def test_anthropic_usage_counts_cache_reads_and_writes_apart() -> None:
    payload = anthropic_message(
        [{"type": "text", "text": "ok"}],
        input_tokens=21,
        output_tokens=393,
        cache_read_input_tokens=1800,
        cache_creation_input_tokens=250,
    )
    turn = complete_once(scripted_anthropic(Script(anthropic_ok(payload))))

    assert turn.usage == {
        "input_tokens": 21,
        "output_tokens": 393,
        "cache_read_input_tokens": 1800,
        "cache_creation_input_tokens": 250,
    }
    assert turn.model == "claude-sonnet-4-5"


def test_openai_usage_splits_cached_prompt_tokens_from_full_price_ones() -> None:
    payload = openai_completion(TEXT, prompt_tokens=2006, cached_tokens=1920, completion_tokens=300)
    turn = complete_once(scripted_openai(Script(openai_ok(payload))))

    # prompt_tokens includes the cached ones: only the rest is input at the full price.
    assert turn.usage == usage_of(input_tokens=86, cache_read_input_tokens=1920, output_tokens=300)
    assert turn.model == "gpt-4o-mini-2024-07-18"


def test_an_answer_without_usage_or_model_counts_zero_and_names_the_model_asked_for() -> None:
    anthropic_payload = {key: value for key, value in ANTHROPIC_TEXT.items() if key not in ("usage", "model")}
    openai_payload = {key: value for key, value in OPENAI_TEXT.items() if key not in ("usage", "model")}

    anthropic = complete_once(scripted_anthropic(Script(httpx.Response(200, json=anthropic_payload))))
    openai = complete_once(scripted_openai(Script(httpx.Response(200, json=openai_payload))))

    assert anthropic.usage == openai.usage == usage_of()
    assert set(anthropic.usage) == set(USAGE_KEYS)
    assert (anthropic.model, openai.model) == ("claude-sonnet-4-5", "gpt-4o-mini")


HOSTILE_COUNTS = [
    pytest.param("true", id="bool"),
    pytest.param("12.5", id="float"),
    pytest.param("-40", id="negative"),
    pytest.param("NaN", id="nan"),
    pytest.param("Infinity", id="infinity"),
    pytest.param('"120"', id="string"),
    pytest.param("1000000000", id="a-billion"),
    pytest.param("1e400", id="overflow"),
    pytest.param("null", id="null"),
    pytest.param("[1]", id="list"),
]


def _raw(payload: dict, path: tuple[str, ...], literal: str) -> httpx.Response:
    """``payload`` with the value at ``path`` replaced by ``literal`` as written (NaN is no JSON a library sends)."""
    marker = "__HOSTILE__"
    node = payload = json.loads(json.dumps(payload))
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = marker
    return httpx.Response(200, content=json.dumps(payload).replace(f'"{marker}"', literal).encode())


@pytest.mark.parametrize("literal", HOSTILE_COUNTS)
@pytest.mark.parametrize(
    "key", ["input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"]
)
def test_a_hostile_anthropic_count_is_zero_and_costs_only_itself(literal: str, key: str) -> None:
    payload = anthropic_message(
        [{"type": "text", "text": "ok"}],
        input_tokens=10,
        output_tokens=20,
        cache_read_input_tokens=30,
        cache_creation_input_tokens=40,
    )
    turn = complete_once(scripted_anthropic(Script(_raw(payload, ("usage", key), literal))))

    expected = {
        "input_tokens": 10,
        "output_tokens": 20,
        "cache_read_input_tokens": 30,
        "cache_creation_input_tokens": 40,
    }
    assert turn.usage == expected | {key: 0}


@pytest.mark.parametrize("literal", HOSTILE_COUNTS)
@pytest.mark.parametrize(
    ("path", "expected"),
    [
        # A bad prompt count leaves nothing for input or cache (the cached tokens are part of the prompt).
        (("usage", "prompt_tokens"), usage_of(output_tokens=300)),
        (("usage", "completion_tokens"), usage_of(input_tokens=86, cache_read_input_tokens=1920)),
        (("usage", "prompt_tokens_details", "cached_tokens"), usage_of(input_tokens=2006, output_tokens=300)),
        (("usage", "prompt_tokens_details"), usage_of(input_tokens=2006, output_tokens=300)),
    ],
)
def test_a_hostile_openai_count_is_zero_and_costs_only_itself(
    literal: str, path: tuple[str, ...], expected: dict
) -> None:
    payload = openai_completion(TEXT, prompt_tokens=2006, cached_tokens=1920, completion_tokens=300)
    turn = complete_once(scripted_openai(Script(_raw(payload, path, literal))))

    assert turn.usage == expected


def test_openai_cached_tokens_above_the_prompt_count_are_not_believed_past_it() -> None:
    payload = openai_completion(TEXT, prompt_tokens=100, cached_tokens=5000, completion_tokens=3)
    turn = complete_once(scripted_openai(Script(openai_ok(payload))))

    assert turn.usage == usage_of(input_tokens=0, cache_read_input_tokens=100, output_tokens=3)


@pytest.mark.parametrize(
    ("answered", "shown"),
    [
        ("claude-\x1b[31mopus\n\u2028-4\x00", "claude-[31mopus-4"),  # control and separator characters dropped
        ("m" * 500, "m" * 100),  # cut to 100 characters
        ("\x07\x08", "claude-sonnet-4-5"),  # nothing printable: the model asked for
        (12, "claude-sonnet-4-5"),  # not a string: the model asked for
    ],
)
def test_the_answered_model_name_is_bounded_and_printable(answered: object, shown: str) -> None:
    payload = ANTHROPIC_TEXT | {"model": answered}
    turn = complete_once(scripted_anthropic(Script(anthropic_ok(payload)), model="claude-sonnet-4-5"))

    assert turn.model == shown


# --- limits from the headers --------------------------------------------------------------------


def test_anthropic_limits_come_from_the_per_unit_headers_not_the_combined_one() -> None:
    turn = complete_once(scripted_anthropic(Script(anthropic_ok(requests=50, input_tokens=30000, output_tokens=8000))))

    assert turn.rate_limits == {"requests": 50.0, "input_tokens": 30000.0, "output_tokens": 8000.0}
    assert set(turn.rate_limits) <= set(LIMIT_UNITS)


def test_openai_limits_are_requests_and_tokens() -> None:
    turn = complete_once(scripted_openai(Script(openai_ok(requests=5000, tokens=4_000_000))))

    assert turn.rate_limits == {"requests": 5000.0, "tokens": 4_000_000.0}


def test_an_answer_without_limit_headers_has_no_limits() -> None:
    turn = complete_once(scripted_anthropic(Script(httpx.Response(200, json=ANTHROPIC_TEXT))))

    assert turn.rate_limits == {}


@pytest.mark.parametrize(
    "value",
    ["NaN", "nan", "inf", "-Infinity", "-5", "0", "1e12", "1000000001", "fifty", "", "0x10", "5" * 5000],
)
def test_a_hostile_limit_header_is_ignored_alone(value: str) -> None:
    anthropic = complete_once(scripted_anthropic(Script(anthropic_ok(input_tokens=value))))
    openai = complete_once(scripted_openai(Script(openai_ok(tokens=value))))

    assert anthropic.rate_limits == {"requests": 50.0, "output_tokens": 8000.0}
    assert openai.rate_limits == {"requests": 500.0}


# --- answers classified -------------------------------------------------------------------------


def test_anthropic_429_is_rate_limited_at_once_with_its_hint_and_limits() -> None:
    script = Script(anthropic_rate_limited(retry_after="12", input_tokens=20000), anthropic_ok())

    with pytest.raises(RateLimited) as raised:
        complete_once(scripted_anthropic(script))

    assert len(script.requests) == 1 and script.sleeps == []  # no second request, no sleep in this process
    assert raised.value.retry_after_s == 12.0
    assert raised.value.rate_limits == {"requests": 50.0, "input_tokens": 20000.0, "output_tokens": 8000.0}
    assert "30,000 input tokens per minute" in str(raised.value)  # the service's words
    assert not isinstance(raised.value, SpendLimitReached)


def test_a_429_without_a_readable_hint_asks_for_five_seconds() -> None:
    anthropic = Script(anthropic_rate_limited(retry_after="soon"))
    openai = Script(openai_rate_limited(tokens=90000))

    with pytest.raises(RateLimited) as from_anthropic:
        complete_once(scripted_anthropic(anthropic))
    with pytest.raises(RateLimited) as from_openai:
        complete_once(scripted_openai(openai))

    assert from_anthropic.value.retry_after_s == from_openai.value.retry_after_s == 5.0
    assert from_openai.value.rate_limits == {"requests": 500.0, "tokens": 90000.0}
    assert len(anthropic.requests) == len(openai.requests) == 1


@pytest.mark.parametrize(
    "code",
    [
        "insufficient_quota",
        "credit_balance_exhausted",
        "organization_usage_limit_exceeded",
        "organization_spend_limit_exceeded",
        "project_spend_limit_exceeded",
    ],
)
def test_openai_insufficient_quota_is_a_spend_limit_not_retried(code: str) -> None:
    script = Script(openai_insufficient_quota(code), openai_ok())

    with pytest.raises(SpendLimitReached) as raised:
        complete_once(scripted_openai(script))

    assert len(script.requests) == 1 and script.sleeps == []
    assert not isinstance(raised.value, RateLimited)
    assert raised.value.status == 429 and not raised.value.transient
    assert "You exceeded your current quota" in str(raised.value)


@pytest.mark.parametrize("code", [[], {"a": 1}, None, 7, "rate_limit_exceeded"])
def test_an_openai_429_with_another_or_hostile_code_is_a_rate_limit(code: object) -> None:
    body = {"error": {"message": "slow down", "type": code, "param": None, "code": code}}
    script = Script(httpx.Response(429, json=body))

    with pytest.raises(RateLimited):
        complete_once(scripted_openai(script))

    assert len(script.requests) == 1


@pytest.mark.parametrize("kind", ANTHROPIC_SPEND_KINDS)
def test_anthropic_spend_errors_are_a_spend_limit_not_retried(kind: str) -> None:
    answer = anthropic_spend_limit(kind)
    said = answer.json()["error"]["message"]
    script = Script(answer, anthropic_ok())

    with pytest.raises(SpendLimitReached) as raised:
        complete_once(scripted_anthropic(script))

    assert len(script.requests) == 1 and script.sleeps == []
    assert not isinstance(raised.value, RateLimited | RequestRejected)
    assert said in str(raised.value)


def test_a_spend_error_quoting_the_key_shows_it_redacted() -> None:
    error = {"type": "billing_error", "message": "billing problem for key sk-ant-test"}
    script = Script(httpx.Response(402, json={"type": "error", "error": error}))

    with pytest.raises(SpendLimitReached) as raised:
        complete_once(scripted_anthropic(script))

    assert "sk-ant-test" not in str(raised.value)


def test_anthropic_529_is_retried_then_succeeds() -> None:
    script = Script(anthropic_overloaded(), anthropic_overloaded(), anthropic_ok())

    turn = complete_once(scripted_anthropic(script))

    assert turn.text == "Campaign 7 got 42 signups."
    assert len(script.requests) == 3 and len(script.sleeps) == 2


def test_anthropic_529_past_every_try_is_a_transient_error() -> None:
    script = Script(*(anthropic_overloaded() for _ in range(5)))

    with pytest.raises(ServiceError) as raised:
        complete_once(scripted_anthropic(script))

    assert raised.value.transient and not isinstance(raised.value, RateLimited | SpendLimitReached)
    assert "Overloaded" in str(raised.value)
    assert len(script.requests) == 5


@pytest.mark.parametrize(
    ("status", "kind", "message"),
    [
        (400, "invalid_request_error", "messages: roles must alternate between user and assistant"),
        (400, "invalid_request_error", "prompt is too long: 345320 tokens > 199999 maximum"),
        (404, "not_found_error", "model: claude-nonexistent"),
        (413, "request_too_large", "Request exceeds the maximum allowed number of bytes."),
        (422, "invalid_request_error", "unprocessable"),
    ],
)
def test_a_4xx_no_retry_fixes_is_rejected_at_once(status: int, kind: str, message: str) -> None:
    body = {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_01"}
    script = Script(httpx.Response(status, json=body, headers=anthropic_limit_headers()), anthropic_ok())

    with pytest.raises(RequestRejected) as raised:
        complete_once(scripted_anthropic(script))

    assert len(script.requests) == 1 and script.sleeps == []
    assert raised.value.status == status and not raised.value.transient
    assert str(raised.value).endswith(f"API error (HTTP {status}): {message}")


def test_a_4xx_without_an_error_object_is_rejected_with_its_text() -> None:
    script = Script(httpx.Response(413, text="<html>413 Request Entity Too Large</html>"))

    with pytest.raises(RequestRejected) as raised:
        complete_once(scripted_openai(script))

    assert "HTTP 413 from https://api.openai.com/***: <html>413 Request Entity Too Large" in str(raised.value)
    assert len(script.requests) == 1


@pytest.mark.parametrize("status", [401, 403])
def test_credentials_rejected_stay_a_credential_error(status: int) -> None:
    script = Script(httpx.Response(status, json={"error": {"message": "no"}}))

    with pytest.raises(ServiceError, match="check ANTHROPIC_API_KEY") as raised:
        complete_once(scripted_anthropic(script))

    assert not isinstance(raised.value, RequestRejected | SpendLimitReached)


# --- prompt caching -----------------------------------------------------------------------------


def test_anthropic_marks_the_system_prompt_and_the_last_tool_cacheable() -> None:
    script = Script(anthropic_ok())
    scripted_anthropic(script).complete(SYSTEM, [{"role": "user", "content": "hi"}], [COUNT_SIGNUPS, SEND_EMAIL])

    sent = script.body()
    assert sent["system"] == [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    assert [tool.get("cache_control") for tool in sent["tools"]] == [None, {"type": "ephemeral"}]
    assert "cache_control" not in json.dumps(sent["messages"])


def test_anthropic_without_prompt_caching_sends_no_marker() -> None:
    script = Script(anthropic_ok())
    provider = scripted_anthropic(script, prompt_caching=False)
    provider.complete(SYSTEM, [{"role": "user", "content": "hi"}], [COUNT_SIGNUPS, SEND_EMAIL])

    sent = script.body()
    assert sent["system"] == SYSTEM
    assert "cache_control" not in json.dumps(sent)


def test_anthropic_caching_without_system_or_tools_sends_neither() -> None:
    script = Script(anthropic_ok())
    scripted_anthropic(script).complete("", [{"role": "user", "content": "hi"}], [])

    assert set(script.body()) == {"model", "max_tokens", "messages"}


MEASUREMENT = {
    "campaign_id": "spring-launch",
    "from": "2026-11-01",
    "to": "2026-11-30",
    "totals": [{"source": "web", "stage": "visit", "raw_count": 1200}, {"source": "web", "stage": "signup"}],
    "funnel": [],
    "exact": True,
    "note": "Unique visitors are per range and never summed across days " * 5,
    "window": {"days": 30, "complete": False},
    "sources": ["web", "github", "pypi", "npm", "docker"],
}


# --- estimates ----------------------------------------------------------------------------------


def _generous_tokens(text: str) -> int:
    """At least as many tokens as a BPE tokenizer counts for prose and tool results: every word, every group of
    up to 3 digits, every run of punctuation and every non-ASCII character one token (BPE merges many of
    those), and never fewer than len(text) / 4 (the usual rule of thumb)."""
    pieces = re.findall(r"\d{1,3}|[A-Za-z_]+|[^\sA-Za-z0-9_]+", text)
    counted = sum(1 if piece.isascii() else sum(not char.isascii() for char in piece) + 1 for piece in pieces)
    return max(math.ceil(len(text) / 4), counted)


def _conversation(words: int, filler: str = "signups") -> list[dict]:
    return [
        {"role": "user", "content": f"How many signups did campaign 7 get? {' '.join([filler] * words)}"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [{"id": "t1", "name": "count_signups", "arguments": {"campaign_id": 7}}],
        },
        {"role": "tool", "tool_call_id": "t1", "name": "count_signups", "content": "42", "is_error": False},
    ]


PROVIDERS = [
    pytest.param(lambda: AnthropicModel(api_key="k", max_tokens=1024), id="anthropic"),
    pytest.param(lambda: OpenAIModel(api_key="k", max_tokens=1024), id="openai"),
]


@pytest.mark.parametrize("make", PROVIDERS)
@pytest.mark.parametrize(
    "filler",
    [
        pytest.param("signups", id="english"),
        pytest.param("注册用户", id="cjk"),
        pytest.param("🎉", id="emoji"),
        pytest.param(json.dumps(MEASUREMENT), id="tool-result-json"),
    ],
)
def test_the_estimate_is_above_a_generous_count_of_what_is_sent(make, filler: str) -> None:  # type: ignore[no-untyped-def]
    provider = make()
    messages = _conversation(200, filler)
    tools = [COUNT_SIGNUPS, SEND_EMAIL]
    estimate = provider.estimate(SYSTEM, messages, tools)

    sent = json.dumps(provider._estimated_parts(SYSTEM, messages, tools), ensure_ascii=False)
    assert estimate["input_tokens"] >= _generous_tokens(sent)
    assert estimate == {
        "requests": 1,
        "input_tokens": estimate["input_tokens"],
        "output_tokens": 1024,
        "tokens": estimate["input_tokens"] + 1024,
    }


@pytest.mark.parametrize("make", PROVIDERS)
def test_the_estimate_grows_with_the_messages(make) -> None:  # type: ignore[no-untyped-def]
    provider = make()
    sizes = [
        provider.estimate(SYSTEM, _conversation(words), [COUNT_SIGNUPS])["input_tokens"] for words in (0, 1, 50, 2000)
    ]

    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)


def test_the_anthropic_estimate_counts_what_caching_adds_to_the_body() -> None:
    messages, tools = _conversation(10), [COUNT_SIGNUPS]
    cached = AnthropicModel(api_key="k").estimate(SYSTEM, messages, tools)
    plain = AnthropicModel(api_key="k", prompt_caching=False).estimate(SYSTEM, messages, tools)

    assert cached["input_tokens"] > plain["input_tokens"]


def test_the_offline_estimate_asks_for_no_output_and_its_usage_is_zero() -> None:
    model = OfflineModel()
    estimate = model.estimate(SYSTEM, _conversation(100), [COUNT_SIGNUPS])

    assert model.model == "offline"
    assert estimate["output_tokens"] == 0 and estimate["requests"] == 1
    assert estimate["tokens"] == estimate["input_tokens"] > 100
    assert model.complete(SYSTEM, _conversation(1), [COUNT_SIGNUPS]).usage == usage_of()


# --- the offline brief --------------------------------------------------------------------------


def _brief(*results: tuple[str, str, bool]) -> str:
    messages: list[dict] = [{"role": "user", "content": "{}"}]
    for index, (name, content, is_error) in enumerate(results):
        call = {"id": f"offline-{index}", "name": name, "arguments": {}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append(
            {"role": "tool", "tool_call_id": call["id"], "name": name, "content": content, "is_error": is_error}
        )
    return OfflineModel().complete(SYSTEM, messages, []).text


def test_the_offline_brief_reads_as_lines_of_fields_without_json() -> None:
    brief = _brief(
        ("read_measurement", json.dumps(MEASUREMENT), False),
        ("count_signups", "42", False),
        ("schedule_execution", json.dumps(MEASUREMENT)[:90], False),  # cut short by the loop's bound
        ("send_email", 'not allowed: {"segment": "all"}', True),
    )

    lines = brief.split("\n")
    assert len(lines) == 4
    assert not set("{}[]") & set(brief)
    assert lines[0].startswith("read_measurement: campaign_id: spring-launch; from: 2026-11-01; to: 2026-11-30;")
    assert "totals: 2 items; funnel: none; exact: yes;" in lines[0]
    assert "window: 2 fields (days, complete)" in lines[0]
    assert "sources: web, github, pypi, npm, and 1 more" in lines[0]
    note = re.search(r"note: ([^;]*);", lines[0])
    assert note is not None and note.group(1).endswith("…") and len(note.group(1)) <= 80
    assert note.group(1)[:-1] in MEASUREMENT["note"] and not note.group(1)[:-1].endswith(" ")  # cut at a word
    assert lines[1] == "count_signups: 42"
    assert lines[3].startswith("send_email was refused: not allowed:")
    assert brief == _brief(
        ("read_measurement", json.dumps(MEASUREMENT), False),
        ("count_signups", "42", False),
        ("schedule_execution", json.dumps(MEASUREMENT)[:90], False),
        ("send_email", 'not allowed: {"segment": "all"}', True),
    )
