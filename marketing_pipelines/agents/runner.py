"""The agent loop: model turn, authorised tool calls within the agent's budget, transcript, limits.

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

from marketing_pipelines.agents.catalog import TOOLS, AgentDefinition, Refusal, ToolCallContext
from marketing_pipelines.agents.providers.types import ModelProvider, ToolCall
from marketing_pipelines.agents.queue import Transcript, json_safe
from marketing_pipelines.agents.users import Grant, authorize
from marketing_pipelines.egress import EgressPolicy
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.sealing import KeySource

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
    # Of the denials, the calls refused for exceeding the agent's budget (AgentBudget): a model that asked
    # for far more than its task needs, e.g. one steered by injected text.
    over_budget: int = 0


@dataclass
class _Spent:
    """What this attempt spent of the agent's budget: tool calls made, calls refused for the budget."""

    calls: int = 0
    over_budget: int = 0


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
    sealing_keys: Callable[[], KeySource] | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> AgentResult:
    own_tools = frozenset(definition.tools)
    specs = [TOOLS[name].spec for name in definition.tools]
    # Captured on the run's campaign only when requested (grants_on_campaign); rows queued before that were
    # narrowed once by migration 0009.
    captured = frozenset(Grant.from_json(g) for g in run["permissions"])
    task = definition.task(run["campaign_id"], dict(run["input"]))
    scope = _Scope(run, captured, own_tools, egress, definition, sealing_keys)
    spent = _Spent()
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
            if spent.over_budget:
                log(f"Agent {definition.name}: {spent.over_budget} tool call(s) refused over its budget.")
            return AgentResult(turn.text, step, transcript.tool_calls, transcript.denials, spent.over_budget)
        for index, call in enumerate(turn.tool_calls):
            _check_limits(limits)
            # Counted here, outside the model: a call over the budget is answered as refused and never made.
            over = definition.budget.over(index, spent.calls)
            if over is None:
                spent.calls += 1
            content, is_error = _call_tool(engine, call, scope, transcript, log, spent, over)
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content, "is_error": is_error}
            )
    raise AgentStopped(f"stopped at the step limit ({limits.max_steps} model turns) without a final answer")


def _check_limits(limits: RunLimits) -> None:
    if limits.is_cancelled():
        raise LeaseLost("the agent run was cancelled or reclaimed; stopping")
    if time.monotonic() > limits.deadline:
        raise AgentStopped("stopped at the time limit (max_run_seconds)")


@dataclass(frozen=True)
class _Scope:
    """What every tool call of one run is checked against: the run, its captured grants, its agent's tools."""

    run: sa.RowMapping
    captured: frozenset[Grant]
    own_tools: frozenset[str]
    egress: EgressPolicy
    definition: AgentDefinition
    sealing_keys: Callable[[], KeySource] | None

    def context(self, campaign_id: str) -> ToolCallContext:
        given = dict(self.run["input"])
        return ToolCallContext(
            self.run["id"],
            self.run["requested_by"],
            campaign_id,
            self.egress,
            proposal=given.get("propose"),
            executions_allowed=self.definition.executions_allowed(given),
            sealing_keys=self.sealing_keys,
        )


def _call_tool(
    engine: sa.Engine,
    call: ToolCall,
    scope: _Scope,
    transcript: Transcript,
    log: Callable[[str], None],
    spent: _Spent,
    over_budget: str | None,
) -> tuple[str, bool]:
    """Run one tool call as the requester. Returns (content for the model, is_error).

    The model's output is untrusted (a prompt-injected model asks for whatever it was told to):
    only calls within the agent's budget and of its own tools may run, with arguments that fit the
    tool's JSON schema, then only what the requester may do and the tool lets an agent do. Every
    refusal is recorded and answered to the model.
    """
    run, own_tools = scope.run, scope.own_tools
    transcript.add("tool_call", call.name, {"id": call.id, "arguments": call.arguments})
    if over_budget is not None:
        spent.over_budget += 1
        return _refuse(transcript, call, f"{over_budget} ({scope.definition.name}'s budget)", log)
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
    ctx = scope.context(campaign_id)
    refusal: Refusal | None = None
    try:
        with engine.begin() as conn:
            decision = authorize(conn, run["requested_by"], scope.captured, tool.permission, campaign_id)
            if decision.allowed and tool.refusal is not None:
                refusal = tool.refusal(conn, dict(call.arguments), ctx)
            result = tool.run(conn, dict(call.arguments), ctx) if decision.allowed and refusal is None else None
    except (InvalidInput, ValueError) as exc:  # the tool's own validation; its writes rolled back
        return _error(transcript, call, str(exc))
    if not decision.allowed:
        return _refuse(transcript, call, f"permission {tool.permission} denied: {decision.reason}", log)
    if refusal is not None:
        spent.over_budget += refusal.over_budget
        return _refuse(transcript, call, refusal.reason, log)
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
