"""The agent loop: model turn, authorised tool calls, transcript, limits.

Provider-neutral and Dagster-free, so tests drive it directly; ``agents/jobs.py`` wraps it in
the pooled op. Every model call first takes a token from the provider's database bucket.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import sqlalchemy as sa

from marketing_pipelines.agents.catalog import TOOLS, AgentDefinition, ToolCallContext
from marketing_pipelines.agents.providers.types import ModelProvider, ToolCall
from marketing_pipelines.agents.queue import Transcript, json_safe
from marketing_pipelines.agents.users import Grant, authorize
from marketing_pipelines.egress import EgressPolicy
from marketing_pipelines.errors import InvalidInput

MAX_TOOL_RESULT_CHARS = 8_000


class AgentStopped(RuntimeError):
    """The loop stopped for a reason that retrying the same run would not fix."""


class LeaseLost(RuntimeError):
    """The row is no longer ours (cancelled, or reclaimed after expiry); stop without writing."""


@dataclass
class RunLimits:
    max_steps: int
    deadline: float  # time.monotonic() value
    is_cancelled: Callable[[], bool] = field(default=lambda: False)


@dataclass(frozen=True)
class AgentResult:
    text: str
    steps: int
    tool_calls: int
    denials: int


def run_agent_loop(
    *,
    engine: sa.Engine,
    definition: AgentDefinition,
    run: sa.RowMapping,
    provider: ModelProvider,
    transcript: Transcript,
    limits: RunLimits,
    acquire_model_token: Callable[[], None],
    egress: EgressPolicy,
    log: Callable[[str], None] = lambda _: None,
) -> AgentResult:
    own_tools = frozenset(definition.tools)
    specs = [TOOLS[name].spec for name in definition.tools]
    # Captured on the run's campaign only when requested (grants_on_campaign); rows queued before that were
    # narrowed once by migration 0009.
    captured = frozenset(Grant.from_json(g) for g in run["permissions"])
    task = definition.task(run["campaign_id"], dict(run["input"]))
    messages: list[dict[str, Any]] = [{"role": "user", "content": json.dumps(task)}]
    transcript.add("task", None, task)
    for step in range(1, limits.max_steps + 1):
        _check_limits(limits)
        acquire_model_token()
        turn = provider.complete(definition.system, messages, specs)
        transcript.add(
            "model_turn",
            provider.name,
            {
                "text": turn.text,
                "tool_calls": [c.__dict__ for c in turn.tool_calls],
                "stop_reason": turn.stop_reason,
                "usage": turn.usage,
            },
        )
        # What goes back to the provider must be JSON (a NaN the model sent is echoed as text).
        messages.append(
            {"role": "assistant", "content": turn.text, "tool_calls": json_safe([c.__dict__ for c in turn.tool_calls])}
        )
        if not turn.tool_calls:
            log(f"Agent {definition.name} finished after {step} model turn(s).")
            return AgentResult(turn.text, step, transcript.tool_calls, transcript.denials)
        for call in turn.tool_calls:
            _check_limits(limits)
            content, is_error = _call_tool(engine, call, run, captured, own_tools, transcript, log, egress)
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content, "is_error": is_error}
            )
    raise AgentStopped(f"stopped at the step limit ({limits.max_steps} model turns) without a final answer")


def _check_limits(limits: RunLimits) -> None:
    if limits.is_cancelled():
        raise LeaseLost("the agent run was cancelled or reclaimed; stopping")
    if time.monotonic() > limits.deadline:
        raise AgentStopped("stopped at the time limit (max_run_seconds)")


def _call_tool(
    engine: sa.Engine,
    call: ToolCall,
    run: sa.RowMapping,
    captured: frozenset[Grant],
    own_tools: frozenset[str],
    transcript: Transcript,
    log: Callable[[str], None],
    egress: EgressPolicy,
) -> tuple[str, bool]:
    """Run one tool call as the requester. Returns (content for the model, is_error).

    The model's output is untrusted (a prompt-injected model asks for whatever it was told to):
    only the agent's own tools may run, with arguments that fit the tool's JSON schema, and
    then only what the requester may do. Every refusal is recorded and answered to the model.
    """
    transcript.add("tool_call", call.name, {"id": call.id, "arguments": call.arguments})
    if call.name not in own_tools:
        # Looked up in the agent's own list, never in the registry of every tool a user may use.
        return _refuse(
            transcript, call, f"{call.name!r} is not one of this agent's tools ({', '.join(sorted(own_tools))})", log
        )
    tool = TOOLS[call.name]
    problem = call.problem or _argument_problem(call.name, call.arguments)
    if problem:
        return _refuse(transcript, call, f"invalid arguments: {problem}", log)
    campaign_id = str(call.arguments.get(tool.campaign_arg, run["campaign_id"]))
    if campaign_id != run["campaign_id"]:
        # Text in this campaign's data may steer the model toward another campaign its requester
        # may also touch: a run acts on its own campaign only, for reads as for writes.
        return _refuse(
            transcript,
            call,
            f"campaign {campaign_id[:64]!r} is outside this run: agent run {run['id']} acts only on "
            f"campaign {run['campaign_id']!r}",
            log,
        )
    # Decide and act in one transaction, and write the transcript only after it ends: on
    # SQLite a second transaction opened inside the first would wait on its own lock.
    try:
        with engine.begin() as conn:
            decision = authorize(conn, run["requested_by"], captured, tool.permission, campaign_id)
            result = (
                tool.run(
                    conn, dict(call.arguments), ToolCallContext(run["id"], run["requested_by"], campaign_id, egress)
                )
                if decision.allowed
                else None
            )
    except (InvalidInput, ValueError) as exc:  # the tool's own validation; its writes rolled back
        return _error(transcript, call, str(exc))
    if not decision.allowed:
        return _refuse(transcript, call, f"permission {tool.permission} denied: {decision.reason}", log)
    content = json.dumps(result, default=str)[:MAX_TOOL_RESULT_CHARS]
    transcript.add("tool_result", call.name, {"id": call.id, "result": result})
    return content, False


@functools.cache
def _validator(tool_name: str) -> jsonschema.protocols.Validator:
    schema = TOOLS[tool_name].spec.input_schema
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def _argument_problem(tool_name: str, arguments: Any) -> str | None:
    """Why ``arguments`` do not fit the tool, in one line, or None when they do."""
    if not _all_finite(arguments):
        return "a number is NaN or infinite"
    error = jsonschema.exceptions.best_match(_validator(tool_name).iter_errors(arguments))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "arguments"
    return f"{where}: {error.message}"[:300]


def _all_finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_all_finite(v) for v in value)
    return True


def _refuse(transcript: Transcript, call: ToolCall, reason: str, log: Callable[[str], None]) -> tuple[str, bool]:
    # A denial is an answer to the model, not a crash: it may continue without that tool.
    transcript.add("denial", call.name, {"id": call.id, "reason": reason})
    log(f"Tool call {call.name} refused: {reason}")
    return reason, True


def _error(transcript: Transcript, call: ToolCall, message: str) -> tuple[str, bool]:
    transcript.add("tool_error", call.name, {"id": call.id, "error": message})
    return f"error: {message}", True
