"""The agents and the tools they may call.

A tool names the permission it needs and the argument that scopes it to a campaign; the loop
refuses any campaign but the run's own, then checks that permission for the requester
(``users.authorize``) before every call. Tools run inside one database transaction each and
return JSON-serialisable results.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.agents.providers.types import ToolSpec
from marketing_pipelines.db.campaigns import get_campaign
from marketing_pipelines.egress import EgressPolicy
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.executions.queue import list_executions, parse_due, schedule_execution
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


@dataclass(frozen=True)
class Tool:
    spec: ToolSpec
    permission: str
    run: Callable[[sa.Connection, dict[str, Any], ToolCallContext], Any]
    campaign_arg: str = "campaign_id"

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


def _schedule_execution(conn: sa.Connection, args: dict[str, Any], ctx: ToolCallContext) -> Any:
    payload = args.get("payload") or {}
    if isinstance(payload, str):
        payload = loads_json(payload)  # ValueError (not JSON, NaN, too deep): the loop records a tool error
    if args["campaign_id"] != ctx.campaign_id:
        # The loop refuses this before any tool runs; a write checks again rather than trust one caller.
        raise InvalidInput(f"agent run {ctx.agent_run_id} may schedule only for campaign {ctx.campaign_id!r}")
    due = str(args["due"])
    due_at = parse_due(due)
    execution_id = schedule_execution(
        conn,
        campaign_id=ctx.campaign_id,
        stage=args["stage"],
        action=args["action"],
        due_at=due_at,
        payload=payload,
        egress=ctx.egress,
        dedupe_key=agent_execution_key(
            ctx.agent_run_id,
            ctx.campaign_id,
            {
                "stage": args["stage"],
                "action": args["action"],
                # "now" resolves anew on every call: keyed as written, so a redelivered call still matches.
                "due": "now" if due.strip().lower() == "now" else due_at.isoformat(),
                "payload": payload,
            },
        ),
    )
    return {"scheduled_execution_id": execution_id}


def agent_execution_key(agent_run_id: int, campaign_id: str, execution: dict[str, Any]) -> str:
    """The dedupe key of an execution an agent run schedules: its run, its campaign and a hash of what it does.

    The same call made again (a redelivered or retried run) gets the existing execution back; any
    other stage, action, due time or payload in the same run is a different execution and gets its own
    row. Hashed, not spelled out, so the key fits its column whatever the stage or payload, and no
    separator inside them can make two executions' keys meet.
    """
    canonical = json.dumps(execution, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return f"agent-run:{agent_run_id}:{campaign_id}:{hashlib.sha256(canonical.encode()).hexdigest()}"


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
                "Schedule a new execution for a campaign stage (a write).",
                {
                    "type": "object",
                    "properties": {
                        "campaign_id": _campaign_id_schema(),
                        "stage": {"type": "string"},
                        "action": {"type": "string", "enum": ["log", "webhook"]},
                        "due": {"type": "string", "description": "ISO-8601 time with offset"},
                        "payload": {"type": "object"},
                    },
                    "required": ["campaign_id", "stage", "action", "due"],
                },
            ),
            "execution:write",
            _schedule_execution,
        ),
    )
}


PROPOSAL_FIELDS = ("stage", "action", "due", "payload")


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
            inputs={
                "from": InputField(str, help="first day, YYYY-MM-DD"),
                "to": InputField(str, help="last day, YYYY-MM-DD"),
                "propose": InputField(dict, help="an execution to schedule: stage, action, due, payload"),
            },
        ),
    )
}


def get_agent(name: str) -> AgentDefinition:
    try:
        return AGENTS[name]
    except KeyError:
        raise InvalidInput(f"unknown agent {name!r}; known agents: {', '.join(sorted(AGENTS))}") from None
