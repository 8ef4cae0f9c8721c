"""``marketing-pipelines users``, ``agents`` and ``limits``: who may do what, queued agent runs, model-call rates."""

from __future__ import annotations

import json
import os

import click
import sqlalchemy as sa

from marketing_pipelines.agents.display import output_lines
from marketing_pipelines.cli.common import (
    ROW_ID,
    FiniteFloat,
    FriendlyGroup,
    cell_text,
    emit_rows,
    json_option,
    ready_conn,
    settings,
)
from marketing_pipelines.db.token_bucket import MAX_CALLS_PER_MINUTE, MAX_TOKENS_PER_MINUTE
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.redact import redact_value, shown_cell, shown_text
from marketing_pipelines.settings import MODEL_PROVIDERS

# --- users ------------------------------------------------------------------------------------


@click.group(cls=FriendlyGroup)
def users() -> None:
    """Add users and grant them permissions (optionally on one campaign)."""


@users.command("add")
@click.argument("user_id")
@click.option("--name", "display_name", default=None, help="Display name (defaults to the id).")
def users_add(user_id: str, display_name: str | None) -> None:
    """Add an active user.

    \b
    Example:
      marketing-pipelines users add ana --name "Ana Lima"
    """
    from marketing_pipelines.agents.users import add_user

    with ready_conn() as conn:
        add_user(conn, user_id, display_name)
    click.echo(f"added user {user_id}")


@users.command("grant")
@click.argument("user_id")
@click.argument("permission")
@click.option("--campaign", "campaign_id", default=None, help="Limit the grant to one campaign.")
def users_grant(user_id: str, permission: str, campaign_id: str | None) -> None:
    """Grant PERMISSION: campaign:read, measurement:read, execution:read or execution:write.

    \b
    Example:
      marketing-pipelines users grant ana measurement:read --campaign spring-launch
    """
    from marketing_pipelines.agents.users import grant

    with ready_conn() as conn:
        added = grant(conn, user_id, permission, campaign_id)
    scope = f"on {campaign_id}" if campaign_id else "on all campaigns"
    click.echo(f"{'granted' if added else 'already had'} {permission} {scope} to {user_id}")


@users.command("revoke")
@click.argument("user_id")
@click.argument("permission")
@click.option("--campaign", "campaign_id", default=None, help="Revoke the grant on this campaign only.")
def users_revoke(user_id: str, permission: str, campaign_id: str | None) -> None:
    """Revoke a grant. Queued and running agent runs of the user lose it at their next tool call.

    \b
    Example:
      marketing-pipelines users revoke ana execution:write
    """
    from marketing_pipelines.agents.users import revoke

    with ready_conn() as conn:
        removed = revoke(conn, user_id, permission, campaign_id)
    click.echo(f"{'revoked' if removed else 'had no grant of'} {permission} for {user_id}")


@users.command("deactivate")
@click.argument("user_id")
def users_deactivate(user_id: str) -> None:
    """Deactivate a user: their agent runs fail with a clear reason instead of running.

    \b
    Example:
      marketing-pipelines users deactivate ben
    """
    from marketing_pipelines.agents.users import set_active

    with ready_conn() as conn:
        set_active(conn, user_id, False)
    click.echo(f"deactivated {user_id}")


@users.command("list")
@json_option
def users_list(as_json: bool) -> None:
    """List users and their grants.

    \b
    Example:
      marketing-pipelines users list
    """
    from marketing_pipelines.agents.users import current_grants
    from marketing_pipelines.db.schema import app_user

    with ready_conn() as conn:
        rows = [
            {
                "id": u.id,
                "display_name": u.display_name,
                "active": bool(u.active),
                "grants": " ".join(f"{g.permission}@{g.scope}" for g in sorted(current_grants(conn, u.id))),
            }
            for u in conn.execute(sa.select(app_user).order_by(app_user.c.id))
        ]
    emit_rows(rows, ["id", "display_name", "active", "grants"], as_json)


# --- agents -----------------------------------------------------------------------------------


@click.group(cls=FriendlyGroup)
def agents() -> None:
    """Queue AI agent runs (run later by agent_run_job as the requesting user) and inspect them."""


@agents.command("request")
@click.option("--agent", required=True, help="campaign_brief or measurement_analyst.")
@click.option("--campaign", "campaign_id", required=True, help="Campaign id.")
@click.option("--as", "user_id", required=True, help="The requesting user; the run acts with their permissions.")
@click.option("--input", "input_json", default=None, help="JSON object of the agent's inputs.")
@click.option("--provider", default=None, help="offline, anthropic or openai (default MARKETING_MODEL_PROVIDER).")
@click.option(
    "--max-run-seconds", type=click.IntRange(1, 86_400), default=None, help="Time limit of the run (1-86400)."
)
def agents_request(
    agent: str,
    campaign_id: str,
    user_id: str,
    input_json: str | None,
    provider: str | None,
    max_run_seconds: int | None,
) -> None:
    """Queue an agent run and print its id; it never runs inline.

    \b
    Example:
      marketing-pipelines agents request --agent campaign_brief --campaign spring-launch \\
        --as ana --input '{"stage": "launch", "tone": "playful"}'
    """
    from marketing_pipelines.agents.queue import AgentRunRefused, request_agent_run
    from marketing_pipelines.strict_json import parse_json_object

    s = settings()
    payload = parse_json_object(input_json, "--input")
    refused: AgentRunRefused | None = None
    with ready_conn() as conn:
        try:
            run_id = request_agent_run(
                conn,
                agent=agent,
                campaign_id=campaign_id,
                requested_by=user_id,
                input=payload,
                provider=provider or s.model_provider,
                max_run_seconds=max_run_seconds if max_run_seconds is not None else s.agent_max_run_seconds,
                settings=s,
            )
        except AgentRunRefused as exc:
            refused = exc  # caught inside the transaction, so the REFUSED row it wrote is committed
    if refused is not None:
        raise refused
    click.echo(run_id)


@agents.command("list")
@click.option("--status", default=None, help="QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED or REFUSED.")
@click.option("--as", "user_id", default=None, help="Only runs requested by this user.")
@json_option
def agents_list(status: str | None, user_id: str | None, as_json: bool) -> None:
    """List agent runs, newest first; requests refused when made are listed as REFUSED.

    \b
    Example:
      marketing-pipelines agents list --status QUEUED
    """
    from marketing_pipelines.agents.costs import summary_of
    from marketing_pipelines.agents.queue import list_agent_runs

    with ready_conn() as conn:
        # Redacted as a whole: --json prints every column, the requester's input and the model's output too.
        runs = list_agent_runs(conn, status.upper() if status else None, user_id)
        # Every column, and the cost as text: cost_usd (6 decimals) beside the exact cost_nano_usd.
        costs = [summary_of(r) for r in runs]
        rows = [
            redact_value(dict(r)) | {"cost_usd": c["cost_usd"], "cost_complete": c["cost_complete"]}
            for r, c in zip(runs, costs, strict=True)
        ]
    if not as_json:
        # A cost some turns of which had no price shows what is known and "+?".
        rows = [{**r, "cost_usd": r["cost_usd"] + ("" if r["cost_complete"] else "+?")} for r in rows]
    columns = ["id", "agent", "campaign_id", "requested_by", "status", "attempts", "requested_at", "cost_usd", "error"]
    emit_rows(rows, columns, as_json)


@agents.command("show")
@click.argument("agent_run_id", type=ROW_ID)
@json_option
def agents_show(agent_run_id: int, as_json: bool) -> None:
    """Show an agent run: status, output and its transcript (model turns, tool calls, denials).

    Inputs, tool arguments and output are shown redacted (URLs cut to their host, header and secret-like
    values ``***``); the stored record keeps them whole, as the run used them.

    \b
    Example:
      marketing-pipelines agents show 1
    """
    from marketing_pipelines.agents.costs import cost_text, summary_of
    from marketing_pipelines.agents.queue import require_agent_run, transcript

    with ready_conn() as conn:
        stored = require_agent_run(conn, agent_run_id)
        run = redact_value(dict(stored))
        steps = [redact_value(dict(s)) for s in transcript(conn, agent_run_id)]
    # Tokens and cost of every attempt's model turns: cost_nano_usd exact, cost_usd its text (6 decimals).
    cost = summary_of(stored)
    if as_json:
        click.echo(json.dumps({"run": run, "cost": cost, "transcript": steps}, default=str, indent=2))
        return
    keys = ("id", "agent", "campaign_id", "requested_by", "status", "attempts", "lost_attempts", "max_attempts")
    for key in (*keys, "run_id"):
        click.echo(f"{key:>13}: {shown_text(cell_text(run.get(key)))}")
    click.echo(
        f"{'tokens':>13}: {cost['input_tokens']} in, {cost['output_tokens']} out, "
        f"{cost['cache_read_tokens']} cache read, {cost['cache_write_tokens']} cache write "
        f"({cost['model_turns']} model turns)"
    )
    click.echo(f"{'cost':>13}: {cost_text(cost)} (default prices read {cost['prices_read_on']})")
    # Errors and output whole (a table cell is cut at 60 characters), never raw: model text may hold
    # escape sequences that would rewrite the terminal.
    click.echo(f"{'error':>13}: {shown_cell(run['error']) if run.get('error') else '-'}")
    if run.get("output"):
        click.echo(f"{'output':>13}:")
        click.echo("\n".join(output_lines(str(run["output"].get("text", "")))))
    click.echo("transcript:")
    for s in steps:
        name = shown_cell(s["name"] or "")
        content, whole = s["content"], {"error": "error", "tool_error": "error", "denial": "reason"}.get(s["kind"])
        if whole and isinstance(content, dict) and whole in content:
            text = shown_cell(str(content[whole]))
        else:
            text = shown_cell(cell_text(content))
        click.echo(f"  [{s['attempt']}.{s['seq']:>2}] {s['kind']:<11} {name:<20} {text}")


@agents.command("retry")
@click.argument("agent_run_id", type=ROW_ID)
@click.option(
    "--max-attempts",
    type=click.IntRange(1, 100),
    default=None,
    help="Attempts the retry may make (1-100; default: as many as a request gets).",
)
def agents_retry(agent_run_id: int, max_attempts: int | None) -> None:
    """Queue a FAILED or CANCELLED agent run again, as its requester, with a fresh attempt budget.

    The requester must still be active and hold a permission the agent uses on the campaign; the
    run acts with their grants as they are now. A REFUSED request is not retried: request it again.

    \b
    Example:
      marketing-pipelines agents retry 1
    """
    from marketing_pipelines.agents.queue import DEFAULT_MAX_ATTEMPTS, retry_agent_run

    with ready_conn() as conn:
        result = retry_agent_run(conn, agent_run_id, max_attempts or DEFAULT_MAX_ATTEMPTS)
    click.echo(
        f"agent run {agent_run_id} queued again (was {result.previous_status}): "
        f"up to {result.max_attempts - result.attempts} more attempt(s)"
    )


@agents.command("cancel")
@click.argument("agent_run_id", type=ROW_ID)
def agents_cancel(agent_run_id: int) -> None:
    """Cancel a QUEUED or RUNNING agent run (its Dagster run is terminated when DAGSTER_HOME is set).

    \b
    Example:
      marketing-pipelines agents cancel 1
    """
    from marketing_pipelines.agents.queue import cancel_agent_run

    with ready_conn() as conn:
        result = cancel_agent_run(conn, agent_run_id, "cancelled by marketing-pipelines agents cancel")
    click.echo(f"agent run {agent_run_id} cancelled (was {result.previous_status})")
    if result.run_id:
        # The run also stops by itself at its next step (its lease renewal finds the row
        # CANCELLED); terminating it through the instance just makes that immediate.
        if os.environ.get("DAGSTER_HOME"):
            import dagster as dg  # only here: the command line starts without Dagster

            with dg.DagsterInstance.get() as instance:
                terminated = instance.run_coordinator.cancel_run(result.run_id)
            click.echo(f"Dagster run {result.run_id}: {'terminated' if terminated else 'already finished'}")
        else:
            click.echo(f"Dagster run {result.run_id} stops at its next step (set DAGSTER_HOME to terminate it now)")


# --- limits -----------------------------------------------------------------------------------


@click.group(cls=FriendlyGroup)
def limits() -> None:
    """Show or set the model-call limits: calls, input tokens, output tokens or all tokens per minute."""


UNIT_OPTIONS = {
    "requests": "calls_per_minute",
    "input_tokens": "input_tokens_per_minute",
    "output_tokens": "output_tokens_per_minute",
    "tokens": "tokens_per_minute",
}


@limits.command("show")
@json_option
def limits_show(as_json: bool) -> None:
    """Show every limit as it stands now (refilled to this moment), with what configured or learned it.

    \b
    Example:
      marketing-pipelines limits show
    """
    from marketing_pipelines.db.schema import EVERY_MODEL
    from marketing_pipelines.db.token_bucket import database_now, ensure_limit, list_buckets

    s = settings()
    defaults = s.default_model_limits()
    with ready_conn() as conn:
        for provider in MODEL_PROVIDERS:
            for unit, per_minute in defaults.items():
                ensure_limit(conn, provider, EVERY_MODEL, unit, per_minute)
        now = database_now(conn)
        buckets = list_buckets(conn)
    rows = [
        {
            "provider": b.provider,
            "model": b.model,
            "unit": b.unit,
            # Rates and tokens refill continuously; two decimals say as much as 55.05801618099213 does.
            "per_minute": round(b.per_minute, 2),
            "capacity": round(b.capacity, 2),
            "available": round(b.tokens_at(now), 2),
            "configured": b.configured_per_minute,
            "learned": b.learned_per_minute,
            "paused_for_s": round((b.paused_until - now).total_seconds(), 1)
            if b.paused_until and b.paused_until > now
            else None,
        }
        for b in buckets
    ]
    columns = ["provider", "model", "unit", "per_minute", "capacity", "available", "configured", "learned"]
    emit_rows(rows, [*columns, "paused_for_s"] if any(r["paused_for_s"] for r in rows) else columns, as_json)
    if not as_json:
        click.echo(f"agent_runs pool limit: {s.max_concurrent_agent_runs} (MARKETING_MAX_CONCURRENT_AGENT_RUNS)")


@limits.command("set")
@click.argument("provider")
@click.option("--model", default="*", show_default=True, help="A model of the provider; * is every model.")
@click.option("--calls-per-minute", type=FiniteFloat(0, MAX_CALLS_PER_MINUTE), default=None, help="Requests; > 0.")
@click.option(
    "--input-tokens-per-minute", type=FiniteFloat(0, MAX_TOKENS_PER_MINUTE), default=None, help="Anthropic's ITPM."
)
@click.option(
    "--output-tokens-per-minute", type=FiniteFloat(0, MAX_TOKENS_PER_MINUTE), default=None, help="Anthropic's OTPM."
)
@click.option("--tokens-per-minute", type=FiniteFloat(0, MAX_TOKENS_PER_MINUTE), default=None, help="OpenAI's TPM.")
@click.option(
    "--burst", type=FiniteFloat(0, MAX_TOKENS_PER_MINUTE), default=None, help="Bucket capacity (default: a minute's)."
)
def limits_set(provider: str, model: str, burst: float | None, **per_minute: float | None) -> None:
    """Set a provider's limits; every process and machine sees them at its next model call.

    A limit the provider's answers state lower is still kept lower; nothing is ever raised above what is set here.

    \b
    Examples:
      marketing-pipelines limits set anthropic --calls-per-minute 50
      marketing-pipelines limits set anthropic --model claude-sonnet-4-5 --input-tokens-per-minute 30000
      marketing-pipelines limits set source:site_analytics --calls-per-minute 15 --burst 100
    """
    from marketing_pipelines.db.token_bucket import configure_limit
    from marketing_pipelines.measurement.sources import SOURCES

    # A measurement source's request quota is a bucket of the same table (measurement/quota.py).
    known = (*MODEL_PROVIDERS, *(source.quota_bucket for source in SOURCES))
    if provider not in known:
        raise InvalidInput(f"unknown provider {provider!r}; known: {', '.join(known)}")
    given = {unit: per_minute[option] for unit, option in UNIT_OPTIONS.items() if per_minute[option] is not None}
    if not given:
        raise InvalidInput(
            "name at least one limit: " + ", ".join(f"--{o.replace('_', '-')}" for o in UNIT_OPTIONS.values())
        )
    if burst is not None and len(given) > 1:
        raise InvalidInput("--burst sizes one limit: give it with one --...-per-minute option at a time")
    with ready_conn() as conn:
        for unit, rate in given.items():
            configure_limit(conn, provider, model, unit, rate, burst)
    for unit, rate in given.items():
        click.echo(shown_text(f"{provider} {model}: {rate:g} {unit.replace('_', ' ')}/minute, burst {burst or rate:g}"))


@limits.command("clear")
@click.argument("provider")
@click.option("--model", default="*", show_default=True, help="A model of the provider; * is every model.")
@click.option("--unit", type=click.Choice(list(UNIT_OPTIONS)), required=True, help="The limit to remove.")
def limits_clear(provider: str, model: str, unit: str) -> None:
    """Remove one limit: that unit is then limited only where the provider's answers state a limit.

    \b
    Example:
      marketing-pipelines limits clear anthropic --unit output_tokens
    """
    from marketing_pipelines.db.token_bucket import clear_limit

    with ready_conn() as conn:
        removed = clear_limit(conn, provider, model, unit)
    click.echo(shown_text(f"{provider} {model} {unit}: {'removed' if removed else 'there was no such limit'}"))
