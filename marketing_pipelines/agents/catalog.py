"""The agents, the tools they may call and each agent's budget.

A tool names the permission it needs and the argument that scopes it to a campaign; the loop
refuses any campaign but the run's own, then checks that permission for the requester
(``users.authorize``) before every call. Tools run inside one database transaction each and
return JSON-serialisable results. A tool may also refuse a call its requester could make but its
agent may not (``Tool.refusal``): ``schedule_execution`` from an agent schedules only the
requester's proposal when the input carries one (``propose``), sends webhooks only to an endpoint
registered for the run's campaign (or the proposal's own destination), and no more executions per
run than the agent's ``AgentBudget`` allows. The loop (``runner.py``) counts tool calls per model
turn and per run against the same budget; whatever is over it is refused and recorded as a denial.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.agents.providers.types import ToolSpec
from marketing_pipelines.db.campaigns import get_campaign
from marketing_pipelines.db.schema import marketing_execution, webhook_endpoint
from marketing_pipelines.egress import EgressPolicy
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.executions.queue import (
    execution_with_dedupe_key,
    list_executions,
    parse_due,
    schedule_execution,
)
from marketing_pipelines.sealing import KeySource
from marketing_pipelines.strict_json import loads_json


@dataclass(frozen=True)
class ToolCallContext:
    """Who is calling, for what run and campaign: tools that write record it. ``egress`` is the run's webhook
    destination policy, from the resource that holds it (the run's ``webhook`` resource), never read from the
    worker's environment here."""

    agent_run_id: int
    user_id: str
    campaign_id: str
    egress: EgressPolicy
    # The requester's proposal (the run's ``propose`` input), and how many executions the run may schedule
    # in all (``AgentDefinition.executions_allowed``): what ``Tool.refusal`` holds an agent's writes to.
    proposal: Mapping[str, Any] | None = None
    executions_allowed: int = 0
    # The keys a webhook's header values are sealed with when scheduled (the run's ``WebhookClient.sealing_keys``);
    # None: a payload with headers is refused, as schedule_execution refuses it without keys.
    sealing_keys: Callable[[], KeySource] | None = None


@dataclass(frozen=True)
class Refusal:
    """Why a tool refuses an agent's call before running it; ``over_budget`` when a budget is what it exceeds."""

    reason: str
    over_budget: bool = False


@dataclass(frozen=True)
class Tool:
    spec: ToolSpec
    permission: str
    run: Callable[[sa.Connection, dict[str, Any], ToolCallContext], Any]
    campaign_arg: str = "campaign_id"
    # Checked by the loop in the tool's transaction, after the permission and before ``run``: what an agent
    # may not do even when its requester may. ``run`` stays what the requester's own call does.
    refusal: Callable[[sa.Connection, dict[str, Any], ToolCallContext], Refusal | None] | None = None

    @property
    def name(self) -> str:
        return self.spec.name


def _campaign_id_schema() -> dict[str, Any]:
    return {"type": "string", "description": "Campaign id, e.g. spring-launch"}


def _read_campaign(conn: sa.Connection, args: dict[str, Any], _: ToolCallContext) -> Any:
    campaign = get_campaign(conn, args["campaign_id"])
    return campaign.__dict__ if campaign else {"error": f"no campaign {args['campaign_id']!r}"}


def _parse_day(value: Any, name: str) -> date:
    try:
        return date.fromisoformat(str(value))
    except ValueError:
        raise InvalidInput(f"{name} {value!r} is not a date (YYYY-MM-DD)") from None


def _read_measurement(conn: sa.Connection, args: dict[str, Any], _: ToolCallContext) -> Any:
    start, end = _parse_day(args["from"], "from"), _parse_day(args["to"], "to")
    # Deferred: the rollup's sketches (datasketches) load only for a run that reads them, not for the
    # command line's agent commands, which import this module.
    from marketing_pipelines.agents import measurement_view

    return measurement_view.summarize(conn, args["campaign_id"], start, end)


def _list_executions(conn: sa.Connection, args: dict[str, Any], _: ToolCallContext) -> Any:
    rows = list_executions(conn, status=args.get("status"), campaign_id=args["campaign_id"], limit=50)
    return [
        {
            "id": r["id"],
            "stage": r["stage"],
            "action": r["action"],
            "due_at": r["due_at"].isoformat(),
            "status": r["status"],
            "attempts": r["attempts"],
        }
        for r in rows
    ]


def _payload(args: Mapping[str, Any]) -> dict[str, Any]:
    payload = args.get("payload") or {}
    if isinstance(payload, str):
        payload = loads_json(payload)  # ValueError (not JSON, NaN, too deep): the loop records a tool error
    return payload


def _due_as_keyed(due: Any) -> str:
    """A due time as an execution's key holds it: "now" as written (it resolves anew on every call, so a
    redelivered call still matches), any other time as its UTC ISO form (one instant, one spelling)."""
    due = str(due)
    return "now" if due.strip().lower() == "now" else parse_due(due).isoformat()


def _execution_key(args: Mapping[str, Any], ctx: ToolCallContext) -> str:
    return agent_execution_key(
        ctx.agent_run_id,
        ctx.campaign_id,
        {
            "stage": args["stage"],
            "action": args["action"],
            "due": _due_as_keyed(args["due"]),
            "payload": _payload(args),
        },
    )


def _schedule_execution(conn: sa.Connection, args: dict[str, Any], ctx: ToolCallContext) -> Any:
    payload = _payload(args)
    if args["campaign_id"] != ctx.campaign_id:
        # The loop refuses this before any tool runs; a write checks again rather than trust one caller.
        raise InvalidInput(f"agent run {ctx.agent_run_id} may schedule only for campaign {ctx.campaign_id!r}")
    execution_id = schedule_execution(
        conn,
        campaign_id=ctx.campaign_id,
        stage=args["stage"],
        action=args["action"],
        due_at=parse_due(str(args["due"])),
        payload=payload,
        egress=ctx.egress,
        dedupe_key=_execution_key(args, ctx),
        keys=ctx.sealing_keys,
    )
    return {"scheduled_execution_id": execution_id}


def _canonical(value: Any) -> str:
    # JSON, not Python equality: True == 1 and 1 == 1.0 in Python, never in what a receiver is sent.
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _proposal_differs(proposal: Mapping[str, Any], args: Mapping[str, Any]) -> list[str]:
    """The fields of ``args`` that are not the requester's proposal's (names only: values may hold secrets)."""
    differs = [name for name in ("stage", "action") if args[name] != proposal[name]]
    if _due_as_keyed(args["due"]) != _due_as_keyed(proposal["due"]):
        differs.append("due")
    if _canonical(_payload(args)) != _canonical(proposal.get("payload") or {}):
        differs.append("payload")
    return differs


def _destination_refusal(conn: sa.Connection, payload: Mapping[str, Any], campaign_id: str) -> Refusal | None:
    """Why a webhook the model composed may not go where its payload says: only to an endpoint registered
    for the run's campaign, by name. A URL the model wrote is refused whatever it is (its host, its path and
    the body are the model's choice); so is an endpoint of another campaign or of every campaign."""
    how = f'name an endpoint registered for campaign {campaign_id!r} in the payload ({{"endpoint": "NAME", ...}})'
    if "url" in payload:
        return Refusal(f"an agent may not send a webhook to a URL it wrote; {how}")
    name = payload.get("endpoint")
    if not isinstance(name, str):
        return Refusal(f"a webhook from an agent needs a registered endpoint; {how}")
    registered = conn.execute(
        sa.select(webhook_endpoint.c.campaign_id).where(webhook_endpoint.c.name == name)
    ).one_or_none()
    if registered is None or registered.campaign_id != campaign_id:
        return Refusal(f"webhook endpoint {name[:64]!r} is not registered for campaign {campaign_id!r}; {how}")
    return None


def _schedule_refusal(conn: sa.Connection, args: dict[str, Any], ctx: ToolCallContext) -> Refusal | None:
    """What an agent may not schedule though its requester may: anything but the requester's proposal when
    the input carries one; without one, a webhook to anything but an endpoint of the run's campaign; and a new
    execution past ``ctx.executions_allowed`` for the run (every attempt's count: the rows its key names)."""
    if ctx.proposal is not None:
        differs = _proposal_differs(ctx.proposal, args)
        if differs:
            return Refusal(
                f"this run may schedule only the requester's proposal; the call's {', '.join(differs)} "
                "differ(s) from it"
            )
    elif args["action"] == "webhook":
        refused = _destination_refusal(conn, _payload(args), ctx.campaign_id)
        if refused is not None:
            return refused
    if execution_with_dedupe_key(conn, _execution_key(args, ctx)) is not None:
        return None  # the same call again (a redelivered run) gets the execution it already made
    t = marketing_execution
    scheduled = conn.execute(
        sa.select(sa.func.count()).where(
            t.c.campaign_id == ctx.campaign_id,
            t.c.dedupe_key.startswith(agent_execution_prefix(ctx.agent_run_id, ctx.campaign_id), autoescape=True),
        )
    ).scalar_one()
    if scheduled >= ctx.executions_allowed:
        return Refusal(
            f"over budget: agent run {ctx.agent_run_id} may schedule {ctx.executions_allowed} execution(s) "
            f"and has scheduled {scheduled}",
            over_budget=True,
        )
    return None


def agent_execution_key(agent_run_id: int, campaign_id: str, execution: dict[str, Any]) -> str:
    """The dedupe key of an execution an agent run schedules: its run, its campaign and a hash of what it does.

    The same call made again (a redelivered or retried run) gets the existing execution back; any
    other stage, action, due time or payload in the same run is a different execution and gets its own
    row. Hashed, not spelled out, so the key fits its column whatever the stage or payload, and no
    separator inside them can make two executions' keys meet.
    """
    canonical = json.dumps(execution, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return f"{agent_execution_prefix(agent_run_id, campaign_id)}{hashlib.sha256(canonical.encode()).hexdigest()}"


def agent_execution_prefix(agent_run_id: int, campaign_id: str) -> str:
    """What the dedupe key of every execution one agent run schedules begins with."""
    return f"agent-run:{agent_run_id}:{campaign_id}:"


TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (
        Tool(
            ToolSpec(
                "read_campaign",
                "Read a campaign's name, owner and its analytics mappings.",
                {"type": "object", "properties": {"campaign_id": _campaign_id_schema()}, "required": ["campaign_id"]},
            ),
            "campaign:read",
            _read_campaign,
        ),
        Tool(
            ToolSpec(
                "read_measurement",
                "Read a campaign's measured events per stage and event type for a date range (UTC days).",
                {
                    "type": "object",
                    "properties": {
                        "campaign_id": _campaign_id_schema(),
                        "from": {"type": "string", "description": "First day, YYYY-MM-DD"},
                        "to": {"type": "string", "description": "Last day, YYYY-MM-DD"},
                    },
                    "required": ["campaign_id", "from", "to"],
                },
            ),
            "measurement:read",
            _read_measurement,
        ),
        Tool(
            ToolSpec(
                "list_executions",
                "List a campaign's scheduled and past executions.",
                {
                    "type": "object",
                    "properties": {
                        "campaign_id": _campaign_id_schema(),
                        "status": {"type": "string", "enum": ["SCHEDULED", "RUNNING", "SUCCEEDED", "FAILED"]},
                    },
                    "required": ["campaign_id"],
                },
            ),
            "execution:read",
            _list_executions,
        ),
        Tool(
            ToolSpec(
                "schedule_execution",
                "Schedule a new execution for a campaign stage (a write). When the task carries a proposal "
                "(stage, action, due, payload), only that exact execution may be scheduled. Otherwise a webhook "
                "goes only to an endpoint registered for the campaign, named in payload.endpoint; a URL is "
                "refused. A run may schedule only a few executions.",
                {
                    "type": "object",
                    "properties": {
                        "campaign_id": _campaign_id_schema(),
                        "stage": {"type": "string"},
                        "action": {"type": "string", "enum": ["log", "webhook"]},
                        "due": {"type": "string", "description": "ISO-8601 time with offset, or now"},
                        "payload": {
                            "type": "object",
                            "description": "log: {message}; webhook: {endpoint, body, headers}",
                            "properties": {
                                "message": {"type": "string"},
                                "endpoint": {
                                    "type": "string",
                                    "description": "Name of a webhook endpoint registered for the campaign",
                                },
                                "body": {"type": "object"},
                                "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                            },
                        },
                    },
                    "required": ["campaign_id", "stage", "action", "due"],
                },
            ),
            "execution:write",
            _schedule_execution,
            refusal=_schedule_refusal,
        ),
    )
}


PROPOSAL_FIELDS = ("stage", "action", "due", "payload")


@dataclass(frozen=True)
class AgentBudget:
    """What one run of an agent may do, however many calls its model asks for: counted by the loop (``runner.py``)
    and the schedule tool, never left to the model. A call over it is not made; it is recorded as a denial and
    answered to the model as one.

    ``executions_per_run`` counts the distinct executions a run schedules over all its attempts (a call
    repeated gets its execution back and costs nothing); a request that proposes one (``propose``) may
    schedule that one only.
    """

    tool_calls_per_turn: int
    tool_calls_per_run: int
    executions_per_run: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.tool_calls_per_turn <= self.tool_calls_per_run:
            raise ValueError("an agent's budget needs 1 <= tool_calls_per_turn <= tool_calls_per_run")
        if self.executions_per_run < 0:
            raise ValueError("an agent's executions_per_run cannot be negative")

    def over(self, index_in_turn: int, made_in_run: int) -> str | None:
        """Why the call at ``index_in_turn`` (0-based) of a turn, after ``made_in_run`` calls made, is over budget."""
        if index_in_turn >= self.tool_calls_per_turn:
            return f"over budget: at most {self.tool_calls_per_turn} tool call(s) per model turn"
        if made_in_run >= self.tool_calls_per_run:
            return f"over budget: at most {self.tool_calls_per_run} tool call(s) per run, all made"
        return None


@dataclass(frozen=True)
class InputField:
    kind: type
    required: bool = False
    help: str = ""


@dataclass(frozen=True)
class AgentDefinition:
    name: str
    description: str
    system: str
    tools: tuple[str, ...]
    inputs: dict[str, InputField]
    budget: AgentBudget

    def executions_allowed(self, given: Mapping[str, Any]) -> int:
        """How many executions a run with input ``given`` may schedule: its proposal only, when it has one."""
        return min(self.budget.executions_per_run, 1) if "propose" in given else self.budget.executions_per_run

    def validate_input(self, given: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(given) - set(self.inputs))
        if unknown:
            raise InvalidInput(
                f"agent {self.name!r} does not take input field(s) {', '.join(unknown)}; "
                f"it takes: {', '.join(self.inputs) or 'none'}"
            )
        for key, field in self.inputs.items():
            if key not in given:
                if field.required:
                    raise InvalidInput(f"agent {self.name!r} needs input field {key!r} ({field.help})")
                continue
            if not isinstance(given[key], field.kind):
                raise InvalidInput(
                    f"input field {key!r} of agent {self.name!r} must be a {field.kind.__name__}, "
                    f"got {type(given[key]).__name__}"
                )
            if key in ("from", "to"):
                _parse_day(given[key], key)
        if "propose" in given:
            proposal = given["propose"]
            missing = [k for k in ("stage", "action", "due") if k not in proposal]
            if missing:
                raise InvalidInput(f"input field 'propose' needs {', '.join(missing)}")
            _due_as_keyed(proposal["due"])  # InvalidInput now, not a refused call at run time
            # A proposal is for the run's own campaign: a campaign_id in it would redirect the model's calls.
            extra = sorted(set(proposal) - set(PROPOSAL_FIELDS))
            if extra:
                raise InvalidInput(
                    f"input field 'propose' does not take {', '.join(map(repr, extra))[:200]}; "
                    f"it takes: {', '.join(PROPOSAL_FIELDS)}"
                )
        return given

    def task(self, campaign_id: str, given: dict[str, Any], today: date | None = None) -> dict[str, Any]:
        """The first user message, as a JSON object carrying every argument the tools may need."""
        today = today or datetime.now(UTC).date()
        task: dict[str, Any] = {
            "task": self.description,
            "campaign_id": campaign_id,
            "from": given.get("from", (today - timedelta(days=27)).isoformat()),
            "to": given.get("to", today.isoformat()),
        }
        task.update({k: v for k, v in given.items() if k not in ("propose", "from", "to")})
        task.update(given.get("propose", {}))
        task["campaign_id"] = campaign_id  # last: no input field may name another campaign to the model
        return task


AGENTS: dict[str, AgentDefinition] = {
    a.name: a
    for a in (
        AgentDefinition(
            name="campaign_brief",
            description="Draft short copy for one stage of a campaign, grounded in the campaign and its measurement.",
            system=(
                "You write marketing copy. Read the campaign and its recent measurement with the tools, then "
                "answer with a headline and two sentences of copy for the requested stage. Do not invent numbers."
            ),
            tools=("read_campaign", "read_measurement"),
            # Two reads, each called once or twice.
            budget=AgentBudget(tool_calls_per_turn=2, tool_calls_per_run=6),
            inputs={
                "stage": InputField(str, required=True, help="the funnel stage to write for, e.g. launch"),
                "tone": InputField(str, help="e.g. playful, technical"),
                "from": InputField(str, help="first day of measurement to consider"),
                "to": InputField(str, help="last day of measurement to consider"),
            },
        ),
        AgentDefinition(
            name="measurement_analyst",
            description="Summarise a campaign's measurement and propose its next executions.",
            system=(
                "You analyse campaign measurement. Read the campaign, its measurement and its executions with the "
                "tools; summarise what worked per stage and propose the next executions. Schedule one only when "
                "the user's input proposes it."
            ),
            tools=("read_campaign", "read_measurement", "list_executions", "schedule_execution"),
            # Each of its four tools once a turn; its proposal when the input has one, else two executions.
            budget=AgentBudget(tool_calls_per_turn=4, tool_calls_per_run=12, executions_per_run=2),
            inputs={
                "from": InputField(str, help="first day, YYYY-MM-DD"),
                "to": InputField(str, help="last day, YYYY-MM-DD"),
                "propose": InputField(
                    dict,
                    help="the one execution the run may schedule: stage, action, due, payload "
                    '(a webhook names a registered endpoint: {"endpoint": "NAME", "body": {...}})',
                ),
            },
        ),
    )
}


def get_agent(name: str) -> AgentDefinition:
    try:
        return AGENTS[name]
    except KeyError:
        raise InvalidInput(f"unknown agent {name!r}; known agents: {', '.join(sorted(AGENTS))}") from None
