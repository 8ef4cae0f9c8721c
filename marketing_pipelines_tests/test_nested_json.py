"""JSON nested deeper than MAX_JSON_DEPTH is refused in one line, wherever it comes in: never a RecursionError.

Python's json parses and encodes by recursion, so ``"[" * 100000`` (and, deeper in a call stack, far less)
raised RecursionError, which no ``except ValueError`` catches: a traceback in the CLI, a crashed agent run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.agents.catalog import TOOLS, ToolCallContext, get_agent
from marketing_pipelines.agents.providers.offline import OfflineModel
from marketing_pipelines.agents.queue import Transcript, get_agent_run, request_agent_run, transcript
from marketing_pipelines.agents.runner import CallsGate, RunLimits, run_agent_loop
from marketing_pipelines.db.schema import agent_run, marketing_execution
from marketing_pipelines.egress import EgressPolicy
from marketing_pipelines.http import ServiceError
from marketing_pipelines.strict_json import MAX_JSON_DEPTH, check_depth, loads_json
from marketing_pipelines_tests.agents.fake_models import (
    COUNT_SIGNUPS,
    SYSTEM,
    Script,
    anthropic_message,
    complete_once,
    openai_completion,
    scripted_anthropic,
    scripted_openai,
)
from marketing_pipelines_tests.cli_runner import cli_for
from marketing_pipelines_tests.factories import add_campaign, settings_from

HOSTILE = "[" * 100_000  # RecursionError in json.loads, whatever the stack
TOO_DEEP = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)  # parses without error, yet too deep
DEPTH_MESSAGE = f"nested deeper than {MAX_JSON_DEPTH} levels"


def _nested(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def _executions(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(marketing_execution)).scalar_one()


# --- strict_json ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "refused"),
    [
        (json.dumps(_nested(MAX_JSON_DEPTH)), False),  # exactly the limit
        (json.dumps({"a": _nested(MAX_JSON_DEPTH - 1)}), False),  # an object counts as a level too
        (TOO_DEEP, True),  # one past it, well inside what json.loads reads
        (HOSTILE, True),  # unterminated, far past json.loads's recursion
        (json.dumps({"k": "[" * 1000}), False),  # brackets inside a string are text
        (json.dumps(['\\"[' * 1000]), False),  # escaped quotes do not end that string
    ],
)
def test_loads_json_refuses_nesting_past_the_limit(text: str, refused: bool) -> None:
    if refused:
        with pytest.raises(ValueError, match=DEPTH_MESSAGE):
            loads_json(text)
    else:
        assert loads_json(text) == json.loads(text)


@pytest.mark.parametrize(
    ("value", "refused"),
    [
        (_nested(MAX_JSON_DEPTH), False),  # exactly the limit
        ({"a": {"b": _nested(MAX_JSON_DEPTH - 1)}}, True),  # one past it, through dicts
        (_nested(900), True),  # as deep as an HTTP client's json() still parses
        ({"a": 1, "b": ["x", {"c": None}]}, False),  # an ordinary payload
    ],
)
def test_check_depth_bounds_already_parsed_values(value: Any, refused: bool) -> None:
    if refused:
        with pytest.raises(ValueError, match=DEPTH_MESSAGE):
            check_depth(value)
    else:
        check_depth(value)


# --- the command line ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        HOSTILE,  # was a 50-line RecursionError traceback
        TOO_DEEP,  # parsed, then stored as it was
        '{"body": ' * (MAX_JSON_DEPTH + 1) + "{}" + "}" * (MAX_JSON_DEPTH + 1),  # objects, the same
    ],
)
def test_a_too_deep_payload_is_one_line_and_schedules_nothing(db_url: str, engine: sa.Engine, payload: str) -> None:
    add_campaign(engine)
    cli = cli_for(db_url)
    result = cli(
        "executions", "schedule", "--campaign", "spring-launch", "--stage", "launch", "--action", "log",
        "--due", "now", "--payload", payload,
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.output == f"Error: payload is not valid JSON: {DEPTH_MESSAGE}\n"
    assert _executions(engine) == 0


def test_a_payload_at_the_limit_is_scheduled(db_url: str, engine: sa.Engine) -> None:
    add_campaign(engine)
    payload = {"message": "hi", "data": _nested(MAX_JSON_DEPTH - 1)}
    result = cli_for(db_url)(
        "executions", "schedule", "--campaign", "spring-launch", "--stage", "launch", "--action", "log",
        "--due", "now", "--payload", json.dumps(payload),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert _executions(engine) == 1


def test_a_too_deep_agent_input_is_one_line_and_queues_nothing(db_url: str, engine: sa.Engine) -> None:
    add_campaign(engine)
    result = cli_for(db_url)(
        "agents", "request", "--agent", "measurement_analyst", "--campaign", "spring-launch", "--as", "ana",
        "--input", '{"propose": ' + HOSTILE,
    )  # fmt: skip
    assert result.exit_code == 1
    assert result.output == f"Error: --input is not valid JSON: {DEPTH_MESSAGE}\n"
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(agent_run)).scalar_one() == 0


def test_a_too_deep_line_of_a_schedule_file_costs_only_itself(db_url: str, engine: sa.Engine, tmp_path: Path) -> None:
    add_campaign(engine)
    good = {"campaign": "spring-launch", "stage": "launch", "action": "log", "due": "now"}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(good)[:-1] + ', "payload": ' + HOSTILE + "\n")
    result = cli_for(db_url)("executions", "schedule", "--file", str(path))
    assert result.exit_code == 1
    assert result.stderr == f"line 2: is not valid JSON: {DEPTH_MESSAGE}\n"
    assert result.stdout == "scheduled 1 new, 0 already scheduled by dedupe key, 1 rejected\n"
    assert _executions(engine) == 1


# --- model responses -----------------------------------------------------------------------------


def _openai_tool_call(arguments: object) -> httpx.Response:
    message = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "count_signups", "arguments": arguments}}
        ],
    }
    return httpx.Response(200, json=openai_completion(message, finish_reason="tool_calls"))


def _anthropic_tool_use(tool_input: object) -> httpx.Response:
    block = {"type": "tool_use", "id": "toolu_01", "name": "count_signups", "input": tool_input}
    return httpx.Response(200, json=anthropic_message([block], stop_reason="tool_use"))


def _raw_json(text: str) -> httpx.Response:
    return httpx.Response(200, content=text.encode(), headers={"content-type": "application/json"})


@pytest.mark.parametrize(
    ("provider", "response", "problem"),
    [
        # Chat Completions carries arguments as a JSON string: json.loads recursed on it.
        (scripted_openai, _openai_tool_call(HOSTILE), f"invalid JSON arguments ({DEPTH_MESSAGE})"),
        (scripted_openai, _openai_tool_call(TOO_DEEP), f"invalid JSON arguments ({DEPTH_MESSAGE})"),
        # Some compatible servers send the arguments as an object, parsed with the response.
        (scripted_openai, _openai_tool_call({"a": _nested(MAX_JSON_DEPTH)}), f"arguments {DEPTH_MESSAGE}"),
        # Anthropic sends tool input as an object.
        (scripted_anthropic, _anthropic_tool_use({"a": _nested(MAX_JSON_DEPTH)}), f"input {DEPTH_MESSAGE}"),
    ],
)
def test_a_too_deep_tool_call_is_a_problem_of_that_call(provider: Any, response: httpx.Response, problem: str) -> None:
    # The loop refuses a call with a problem and answers the model (see the recorded-denial test below).
    [call] = complete_once(provider(Script(response))).tool_calls
    assert (call.name, call.arguments, call.problem) == ("count_signups", {}, problem)


def test_a_response_nested_too_deep_elsewhere_is_a_service_error_not_a_recursion_error() -> None:
    # Deep anywhere else in the response: str() and json.dumps of it recursed as well.
    response = _raw_json('{"content": [{"type": "text", "text": ' + json.dumps(_nested(600)) + "}]}")
    with pytest.raises(ServiceError, match="nested deeper than 128 levels") as raised:
        complete_once(scripted_anthropic(Script(response)))
    assert len(str(raised.value)) < 600


@pytest.mark.parametrize("provider", [scripted_openai, scripted_anthropic])
def test_a_response_body_nested_past_the_parser_is_a_service_error(provider: Any) -> None:
    with pytest.raises(ServiceError, match="nested deeper than"):
        complete_once(provider(Script(_raw_json(HOSTILE))))


def test_the_offline_model_reads_a_too_deep_task_as_no_task() -> None:
    turn = OfflineModel().complete(SYSTEM, [{"role": "user", "content": HOSTILE}], [COUNT_SIGNUPS])
    assert (turn.tool_calls, turn.text) == ((), "No tools were called, so there is nothing to report.")


def test_the_schedule_tool_refuses_a_too_deep_payload_text(engine: sa.Engine) -> None:
    add_campaign(engine)
    args = {"campaign_id": "spring-launch", "stage": "launch", "action": "log", "due": "now", "payload": HOSTILE}
    with pytest.raises(ValueError, match=DEPTH_MESSAGE), engine.begin() as conn:
        TOOLS["schedule_execution"].run(
            conn,
            args,
            ToolCallContext(agent_run_id=1, user_id="ana", campaign_id="spring-launch", egress=EgressPolicy()),
        )
    assert _executions(engine) == 0


def test_a_too_deep_tool_call_is_a_recorded_denial_and_the_run_goes_on(engine: sa.Engine) -> None:
    add_campaign(engine)
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        users.grant(conn, "ana", "campaign:read")
        users.grant(conn, "ana", "measurement:read")
        run_id = request_agent_run(
            conn,
            agent="campaign_brief",
            campaign_id="spring-launch",
            requested_by="ana",
            input={"stage": "launch"},
            provider="openai",
            settings=settings_from({"OPENAI_API_KEY": "sk-openai-test"}),
        )
    with engine.connect() as conn:
        row = get_agent_run(conn, run_id)
    assert row is not None
    message = {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read_campaign", "arguments": HOSTILE}}
        ],
    }
    final = openai_completion({"role": "assistant", "content": "Done.", "refusal": None})
    script = Script(
        httpx.Response(200, json=openai_completion(message, finish_reason="tool_calls")),
        httpx.Response(200, json=final),
    )
    result = run_agent_loop(
        engine=engine,
        definition=get_agent("campaign_brief"),
        run=row,
        provider=scripted_openai(script),
        transcript=Transcript(engine, run_id, 1),
        limits=RunLimits(max_steps=4, deadline=time.monotonic() + 60),
        gate=CallsGate(lambda: None),
        egress=EgressPolicy(),
    )
    assert (result.text, result.denials) == ("Done.", 1)
    with engine.connect() as conn:
        [denial] = [s for s in transcript(conn, run_id) if s["kind"] == "denial"]
    assert DEPTH_MESSAGE in denial["content"]["reason"]
