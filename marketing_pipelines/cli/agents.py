"""``marketing-pipelines users``, ``agents`` and ``limits``: who may do what, queued agent runs, model-call rates."""

from __future__ import annotations

import json
import os

import click
import sqlalchemy as sa

from marketing_pipelines.agents.display import output_lines
from marketing_pipelines.agents.token_bucket import MAX_BURST, MAX_CALLS_PER_MINUTE
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
    from marketing_pipelines.agents.queue import list_agent_runs

    with ready_conn() as conn:
        # Redacted as a whole: --json prints every column, the requester's input and the model's output too.
        rows = [redact_value(dict(r)) for r in list_agent_runs(conn, status.upper() if status else None, user_id)]
    columns = ["id", "agent", "campaign_id", "requested_by", "status", "attempts", "requested_at", "error"]
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
    from marketing_pipelines.agents.queue import require_agent_run, transcript

    with ready_conn() as conn:
        run = redact_value(dict(require_agent_run(conn, agent_run_id)))
        steps = [redact_value(dict(s)) for s in transcript(conn, agent_run_id)]
    if as_json:
        click.echo(json.dumps({"run": run, "transcript": steps}, default=str, indent=2))
        return
    keys = ("id", "agent", "campaign_id", "requested_by", "status", "attempts", "lost_attempts", "max_attempts")
    for key in (*keys, "run_id"):
        click.echo(f"{key:>13}: {shown_text(cell_text(run.get(key)))}")
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
    """Show or set the per-provider model-call token buckets."""


@limits.command("show")
@json_option
def limits_show(as_json: bool) -> None:
    """Show each provider's bucket (created with the default size on first use).

    \b
    Example:
      marketing-pipelines limits show
    """
    from marketing_pipelines.agents.token_bucket import ensure_bucket, list_buckets

    s = settings()
    with ready_conn() as conn:
        for provider in MODEL_PROVIDERS:
            ensure_bucket(conn, provider, s.max_model_calls_per_minute)
        # Tokens refill continuously; two decimals say as much as 55.05801618099213 does.
        rows = [
            {**b.__dict__, "calls_per_minute": round(b.calls_per_minute, 2), "tokens": round(b.tokens, 2)}
            for b in list_buckets(conn)
        ]
    emit_rows(rows, ["provider", "calls_per_minute", "capacity", "tokens", "updated_at"], as_json)
    click.echo(f"agent_runs pool limit: {s.max_concurrent_agent_runs} (MARKETING_MAX_CONCURRENT_AGENT_RUNS)")


@limits.command("set")
@click.argument("provider")
@click.option(
    "--calls-per-minute", type=FiniteFloat(0, MAX_CALLS_PER_MINUTE), required=True, help="Sustained rate; > 0."
)
@click.option(
    "--burst", type=FiniteFloat(0, MAX_BURST), default=None, help="Bucket capacity (default: one minute of calls)."
)
def limits_set(provider: str, calls_per_minute: float, burst: float | None) -> None:
    """Set a provider's rate; every process and machine sees it at its next model call.

    \b
    Example:
      marketing-pipelines limits set anthropic --calls-per-minute 50
    """
    from marketing_pipelines.agents.token_bucket import configure_bucket

    if provider not in MODEL_PROVIDERS:
        raise InvalidInput(f"unknown provider {provider!r}; known: {', '.join(MODEL_PROVIDERS)}")
    with ready_conn() as conn:
        configure_bucket(conn, provider, calls_per_minute, burst)
    click.echo(f"{provider}: {calls_per_minute:g} calls/minute, burst {burst or calls_per_minute:g}")
