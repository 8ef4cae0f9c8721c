"""The agent loop: model turn, authorised tool calls within the agent's budget, transcript, limits.

Provider-neutral and Dagster-free, so tests drive it directly; ``agents/jobs.py`` wraps it in
the pooled op. Every model call is admitted by a ``ModelGate`` first and settled after it.

The transcript is the run's checkpoint: an attempt (or a step Dagster retried after a rate limit)
rebuilds the conversation from every step recorded so far and continues from the last completed
model turn, so no model call is paid twice and no tool whose result is recorded runs twice.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import jsonschema
import sqlalchemy as sa

from marketing_pipelines.agents.catalog import TOOLS, AgentDefinition, Refusal, ToolCallContext
from marketing_pipelines.agents.providers.types import ModelProvider, ModelTurn, ToolCall
from marketing_pipelines.agents.queue import Transcript, json_safe
from marketing_pipelines.agents.users import Grant, authorize
from marketing_pipelines.egress import EgressPolicy
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.sealing import KeySource

MAX_TOOL_RESULT_CHARS = 8_000
# The steps that answer a tool call, one per call, in the order of the turn's calls.
OUTCOMES = ("tool_result", "denial", "tool_error")


class AgentStopped(RuntimeError):
    """The loop stopped for a reason that retrying the same run would not fix."""


class LeaseLost(RuntimeError):
    """The row is no longer ours (cancelled, or reclaimed after expiry); stop without writing."""


class ModelGate(Protocol):
    """What every model call passes: admitted before it (may wait within the run's deadline, or raise), settled after.

    ``settle`` runs in the transaction that records the turn (``turn`` None when the call raised), so what it
    accounts (a cost, a budget) and the transcript agree; it returns JSON-safe fields for the turn's record.
    """

    def admit(self, estimate: dict[str, int]) -> object: ...

    def settle(self, conn: sa.Connection, admission: object, turn: ModelTurn | None) -> dict[str, Any]: ...


@dataclass(frozen=True)
class CallsGate:
    """A ``ModelGate`` that only takes one call token before each call (``acquire`` blocks or raises)."""

    acquire: Callable[[], None]

    def admit(self, estimate: dict[str, int]) -> object:
        self.acquire()
        return None

    def settle(self, conn: sa.Connection, admission: object, turn: ModelTurn | None) -> dict[str, Any]:
        return {}


@dataclass
class RunLimits:
    max_steps: int  # model turns of the run, over all its attempts
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
    """What the run spent of the agent's budget over its attempts: tool calls made, calls refused for the budget."""

    calls: int = 0
    over_budget: int = 0


@dataclass
class _Conversation:
    """The run so far, as the model sees it and as the budget counts it, rebuilt from its transcript."""

    messages: list[dict[str, Any]]
    turns: int = 0  # completed model turns, every attempt's
    pending: list[tuple[int, ToolCall]] = field(default_factory=list)  # the last turn's unanswered calls
    final: str | None = None  # the last turn's text when it called no tool: the run's answer
    spent: _Spent = field(default_factory=_Spent)
    tool_calls: int = 0
    denials: int = 0

    def answer(self, call: ToolCall, kind: str, content: dict[str, Any]) -> None:
        """Append the answer to the next pending call, as recorded in a step of ``kind``."""
        text, is_error = _answer_text(kind, content)
        self.messages.append(
            {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": text, "is_error": is_error}
        )
        self.tool_calls += 1
        self.denials += kind == "denial"
        self.spent.over_budget += bool(kind == "denial" and content.get("over_budget"))

    def add_turn(self, text: str, calls: Sequence[ToolCall]) -> None:
        # What goes back to the provider must be JSON (a NaN the model sent is echoed as text).
        self.messages.append(
            {"role": "assistant", "content": text, "tool_calls": json_safe([c.__dict__ for c in calls])}
        )
        self.turns += 1
        self.pending = list(enumerate(calls))
        self.final = None if calls else text

    def result(self) -> AgentResult:
        assert self.final is not None
        return AgentResult(self.final, self.turns, self.tool_calls, self.denials, self.spent.over_budget)


def run_agent_loop(
    *,
    engine: sa.Engine,
    definition: AgentDefinition,
    run: sa.RowMapping,
    provider: ModelProvider,
    transcript: Transcript,
    limits: RunLimits,
    gate: ModelGate,
    egress: EgressPolicy,
    sealing_keys: Callable[[], KeySource] | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> AgentResult:
    own_tools = frozenset(definition.tools)
    specs = [TOOLS[name].spec for name in definition.tools]
    # Captured on the run's campaign only when requested (grants_on_campaign); rows queued before that were
    # narrowed once by migration 0009.
    captured = frozenset(Grant.from_json(g) for g in run["permissions"])
    scope = _Scope(run, captured, own_tools, egress, definition, sealing_keys)
    conversation = _resume(transcript.steps(), definition)
    if conversation is None:
        task = definition.task(run["campaign_id"], dict(run["input"]))
        transcript.add("task", None, task)
        conversation = _Conversation([{"role": "user", "content": _as_text(task)}])
    elif conversation.turns:
        log(f"Agent {definition.name} resumes after {conversation.turns} recorded model turn(s).")
    while True:
        if conversation.final is not None:
            log(f"Agent {definition.name} finished after {conversation.turns} model turn(s).")
            if conversation.spent.over_budget:
                log(f"Agent {definition.name}: {conversation.spent.over_budget} tool call(s) refused over its budget.")
            return conversation.result()
        while conversation.pending:
            index, call = conversation.pending[0]
            _check_limits(limits)
            # Counted here, outside the model: a call over the budget is answered as refused and never made.
            over = definition.budget.over(index, conversation.spent.calls)
            if over is None:
                conversation.spent.calls += 1
            kind, content = _call_tool(engine, call, scope, transcript, log, over)
            conversation.pending.pop(0)
            conversation.answer(call, kind, content)
        if conversation.turns >= limits.max_steps:
            raise AgentStopped(f"stopped at the step limit ({limits.max_steps} model turns) without a final answer")
        _check_limits(limits)
        admission, turn = _model_turn(engine, provider, gate, definition.system, conversation.messages, specs, limits)
        recorded = {
            "text": turn.text,
            "tool_calls": [c.__dict__ for c in turn.tool_calls],
            "stop_reason": turn.stop_reason,
            "usage": turn.usage,
            "model": turn.model,
        }
        # Recorded in the transaction that settles the call: the turn's cost and its record agree, and a
        # turn recorded is a turn no later attempt asks for again.
        with engine.begin() as conn:
            accounting = gate.settle(conn, admission, turn)
            transcript.add("model_turn", provider.name, {**accounting, **recorded}, conn=conn)
        conversation.add_turn(turn.text, turn.tool_calls)


def _model_turn(
    engine: sa.Engine,
    provider: ModelProvider,
    gate: ModelGate,
    system: str,
    messages: list[dict[str, Any]],
    specs: list[Any],
    limits: RunLimits,
) -> tuple[object, ModelTurn]:
    """One model call through ``gate``: admitted, made, and settled with nothing when it raised."""
    admission = gate.admit(provider.estimate(system, messages, specs))
    try:
        # The admission may have waited: a run cancelled or out of time meanwhile does not make the call.
        _check_limits(limits)
        turn = provider.complete(system, messages, specs)
    except BaseException:
        with engine.begin() as conn:
            gate.settle(conn, admission, None)
        raise
    return admission, turn


def _resume(steps: Sequence[Any], definition: AgentDefinition) -> _Conversation | None:
    """The conversation the recorded ``steps`` (every attempt's, in order) hold, or None when there is no task yet.

    A model turn is the assistant message; each outcome step answers the next of its calls (outcomes are
    recorded in the order of the calls); a call without an outcome never committed its transaction and is
    pending. ``error`` and ``tool_call`` steps are not part of the conversation. A second ``task`` step is
    an attempt of a version that restarted the run: the conversation begins again there.
    """
    conversation: _Conversation | None = None
    for step in steps:
        kind, content = step["kind"], step["content"] if isinstance(step["content"], dict) else {}
        if kind == "task":
            conversation = _Conversation([{"role": "user", "content": _as_text(content)}])
        elif conversation is None:
            continue
        elif kind == "model_turn":
            if conversation.pending:
                raise AgentStopped(
                    f"the transcript cannot be resumed: model turn {conversation.turns + 1} follows "
                    f"{len(conversation.pending)} unanswered tool call(s)"
                )
            calls = content.get("tool_calls") or []
            conversation.add_turn(str(content.get("text") or ""), [_call_of(c) for c in calls])
        elif kind in OUTCOMES and conversation.pending:
            index, call = conversation.pending.pop(0)
            # The budget is replayed as the loop counted it when the call was answered.
            if definition.budget.over(index, conversation.spent.calls) is None:
                conversation.spent.calls += 1
            conversation.answer(call, kind, content)
    return conversation


def _call_of(recorded: Any) -> ToolCall:
    call = recorded if isinstance(recorded, dict) else {}
    arguments = call.get("arguments")
    return ToolCall(
        id=str(call.get("id", "")),
        name=str(call.get("name", "")),
        arguments=arguments if isinstance(arguments, dict) else {},
        problem=call.get("problem") if isinstance(call.get("problem"), str) else None,
    )


def _as_text(value: Any) -> str:
    """``value`` (a task, a tool's result) as the JSON text the model is sent.

    From a record on PostgreSQL the keys come back in JSONB's order, not the tool's: a resumed conversation says
    the same in another order, and its first call may miss the provider's cache of the messages (not of the
    system prompt and tools, cached before them).
    """
    return json.dumps(value, default=str)


def _answer_text(kind: str, content: dict[str, Any]) -> tuple[str, bool]:
    """What the model is told of a call's outcome step: (content, is_error)."""
    if kind == "tool_result":
        return _as_text(content.get("result"))[:MAX_TOOL_RESULT_CHARS], False
    if kind == "denial":
        return str(content.get("reason", "")), True
    return f"error: {content.get('error', '')}", True


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
    over_budget: str | None,
) -> tuple[str, dict[str, Any]]:
    """Run one tool call as the requester. Returns its outcome as recorded: (step kind, content).

    The model's output is untrusted (a prompt-injected model asks for whatever it was told to):
    only calls within the agent's budget and of its own tools may run, with arguments that fit the
    tool's JSON schema, then only what the requester may do and the tool lets an agent do. Every
    refusal is recorded and answered to the model.
    """
    run, own_tools = scope.run, scope.own_tools
    transcript.add("tool_call", call.name, {"id": call.id, "arguments": call.arguments})
    if over_budget is not None:
        return _refuse(transcript, call, f"{over_budget} ({scope.definition.name}'s budget)", log, over_budget=True)
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
    # Decide, act and record the result in one transaction: a call whose result is recorded made its
    # writes, and one without made none (its transaction never committed), so a resumed run runs it
    # again or never, and a tool acts exactly once. Refusals and errors wrote nothing to keep with them.
    ctx = scope.context(campaign_id)
    refusal: Refusal | None = None
    outcome: dict[str, Any] | None = None
    try:
        with engine.begin() as conn:
            decision = authorize(conn, run["requested_by"], scope.captured, tool.permission, campaign_id)
            if decision.allowed and tool.refusal is not None:
                refusal = tool.refusal(conn, dict(call.arguments), ctx)
            if decision.allowed and refusal is None:
                outcome = {"id": call.id, "result": tool.run(conn, dict(call.arguments), ctx)}
                transcript.add("tool_result", call.name, outcome, conn=conn)
    except (InvalidInput, ValueError) as exc:  # the tool's own validation; its writes rolled back
        return _error(transcript, call, str(exc))
    if not decision.allowed:
        return _refuse(transcript, call, f"permission {tool.permission} denied: {decision.reason}", log)
    if refusal is not None:
        return _refuse(transcript, call, refusal.reason, log, over_budget=refusal.over_budget)
    assert outcome is not None
    return "tool_result", outcome


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


def _refuse(
    transcript: Transcript, call: ToolCall, reason: str, log: Callable[[str], None], over_budget: bool = False
) -> tuple[str, dict[str, Any]]:
    # A denial is an answer to the model, not a crash: it may continue without that tool. Whether the budget
    # refused it is recorded, so a resumed run counts it again.
    content = {"id": call.id, "reason": reason, "over_budget": over_budget}
    transcript.add("denial", call.name, content)
    log(f"Tool call {call.name} refused: {reason}")
    return "denial", content


def _error(transcript: Transcript, call: ToolCall, message: str) -> tuple[str, dict[str, Any]]:
    content = {"id": call.id, "error": message}
    transcript.add("tool_error", call.name, content)
    return "tool_error", content
