"""``marketing-pipelines executions``: schedule, list, cancel and show campaign executions."""

from __future__ import annotations

import json

import click

from marketing_pipelines.cli.common import (
    ROW_ID,
    FriendlyGroup,
    cell_text,
    emit_rows,
    json_option,
    ready_conn,
    settings,
)
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.redact import redact_url, redact_urls


@click.group(cls=FriendlyGroup)
def executions() -> None:
    """Schedule and inspect campaign executions (claimed by due_executions_sensor when due)."""


@executions.command("schedule")
@click.option("--campaign", "campaign_id", required=True, help="Campaign id.")
@click.option("--stage", required=True, help="Funnel stage, e.g. awareness, launch, follow-up.")
@click.option("--action", required=True, help="Action to run: log or webhook.")
@click.option("--due", required=True, help="ISO-8601 time with offset, or 'now'.")
@click.option("--payload", default=None, help="JSON object for the action.")
@click.option("--max-attempts", type=click.IntRange(1, 100), default=None, help="Attempts before FAILED (1-100).")
@click.option("--dedupe-key", default=None, help="Scheduling the same key twice returns the first execution.")
def executions_schedule(
    campaign_id: str,
    stage: str,
    action: str,
    due: str,
    payload: str | None,
    max_attempts: int | None,
    dedupe_key: str | None,
) -> None:
    """Schedule an execution; prints its id.

    \b
    Example:
      marketing-pipelines executions schedule --campaign spring-launch --stage launch \\
        --action webhook --due 2026-12-01T09:00:00+00:00 \\
        --payload '{"url": "https://hooks.example.com/launch", "body": {"text": "We launched"}}'
    """
    from marketing_pipelines.executions.actions import webhook_policy
    from marketing_pipelines.executions.queue import parse_due, parse_payload, schedule_execution

    due_at, parsed_payload = parse_due(due), parse_payload(payload)
    with ready_conn() as conn:
        execution_id = schedule_execution(
            conn,
            campaign_id=campaign_id,
            stage=stage,
            action=action,
            due_at=due_at,
            payload=parsed_payload,
            max_attempts=max_attempts or settings().execution_max_attempts,
            dedupe_key=dedupe_key,
            egress=webhook_policy(settings()),
        )
    click.echo(execution_id)


@executions.command("list")
@click.option(
    "--status",
    type=click.Choice(["SCHEDULED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"], case_sensitive=False),
    default=None,
)
@click.option("--campaign", "campaign_id", default=None)
@click.option("--limit", type=click.IntRange(1, 10_000), default=200, show_default=True)
@json_option
def executions_list(status: str | None, campaign_id: str | None, limit: int, as_json: bool) -> None:
    """List executions in due order.

    \b
    Example:
      marketing-pipelines executions list --status FAILED
    """
    from marketing_pipelines.executions.queue import list_executions

    with ready_conn() as conn:
        rows = [dict(r) for r in list_executions(conn, status.upper() if status else None, campaign_id, limit)]
    for row in rows:  # errors are redacted when written; rows from older versions may not be
        row["last_error"] = redact_urls(row["last_error"]) if row["last_error"] else None
    columns = ["id", "campaign_id", "stage", "action", "due_at", "status", "attempts", "max_attempts", "last_error"]
    emit_rows(rows, columns, as_json)


@executions.command("cancel")
@click.argument("execution_id", type=ROW_ID)
def executions_cancel(execution_id: int) -> None:
    """Cancel a SCHEDULED or RUNNING execution.

    A running execution's batch run goes on with its other executions and records nothing for
    this one; a webhook already in flight may still arrive once.

    \b
    Example:
      marketing-pipelines executions cancel 42
    """
    from marketing_pipelines.executions.queue import cancel_execution

    with ready_conn() as conn:
        previous = cancel_execution(conn, execution_id, "cancelled by marketing-pipelines executions cancel")
    click.echo(f"execution {execution_id} cancelled (was {previous})")


@executions.command("show")
@click.argument("execution_id", type=ROW_ID)
@json_option
def executions_show(execution_id: int, as_json: bool) -> None:
    """Show an execution: status, last error, and each attempt with the Dagster run that performed it.

    In the Dagster UI the runs of execution 42 carry the tag marketing/execution_id.42 (value: the attempt).

    \b
    Example:
      marketing-pipelines executions show 42
    """
    from marketing_pipelines.executions.queue import get_execution, list_attempts

    with ready_conn() as conn:
        row = get_execution(conn, execution_id)
        if row is None:
            raise InvalidInput(f"execution {execution_id} does not exist; see marketing-pipelines executions list")
        execution = dict(row)
        attempts = [dict(a) for a in list_attempts(conn, execution_id)]
    payload = execution["payload"]
    if execution["action"] == "webhook" and isinstance(payload, dict):
        # The URL and headers are the user's and may carry tokens: shown redacted.
        execution["payload"] = {
            **payload,
            "url": redact_url(str(payload.get("url", ""))),
            **({"headers": dict.fromkeys(payload["headers"], "***")} if payload.get("headers") else {}),
        }
    if execution["last_error"]:
        execution["last_error"] = redact_urls(execution["last_error"])
    for attempt in attempts:
        attempt["error"] = redact_urls(attempt["error"]) if attempt["error"] else None
    if as_json:
        click.echo(json.dumps({"execution": execution, "attempts": attempts}, default=str, indent=2))
        return
    for key in ("id", "campaign_id", "stage", "action", "status", "due_at", "attempts", "max_attempts", "run_id"):
        click.echo(f"{key:>12}: {cell_text(execution.get(key))}")
    click.echo(f"{'last_error':>12}: {redact_urls(execution.get('last_error') or '-')}")
    click.echo(f"{'UI tag':>12}: marketing/execution_id.{execution_id}")
    click.echo("attempts:")
    emit_rows(attempts, ["attempt", "run_id", "started_at", "finished_at", "outcome", "error"], False)
    if execution["attempts"] > len(attempts):
        # The claim counts an attempt; a run that never started (or started after its lease expired
        # and found another attempt owning the row) leaves no attempt row.
        click.echo(f"({execution['attempts'] - len(attempts)} claim(s) never started a run)")
