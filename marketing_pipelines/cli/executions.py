"""``marketing-pipelines executions``: schedule (one or a file), list, cancel, retry, show and reseal executions."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, BinaryIO

import click

from marketing_pipelines.cli.common import (
    ROW_ID,
    FriendlyGroup,
    cell_text,
    cli_webhook_policy,
    emit_rows,
    json_option,
    ready_conn,
    settings,
)
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.redact import (
    HIDDEN,
    hide_values,
    redact_text,
    redact_url,
    redact_value,
    secret_parts,
    shown_cell,
    shown_text,
)
from marketing_pipelines.settings import dagster_ui_base, env_name


@click.group(cls=FriendlyGroup)
def executions() -> None:
    """Schedule and inspect campaign executions (claimed by due_executions_sensor when due)."""


@executions.command("schedule")
@click.option("--campaign", "campaign_id", default=None, help="Campaign id. Required without --file.")
@click.option("--stage", default=None, help="Funnel stage, e.g. awareness, launch, follow-up. Required without --file.")
@click.option("--action", default=None, help="Action to run: log or webhook. Required without --file.")
@click.option("--due", default=None, help="ISO-8601 time with offset, or 'now'. Required without --file.")
@click.option("--payload", default=None, help="JSON object for the action.")
@click.option("--max-attempts", type=click.IntRange(1, 100), default=None, help="Attempts before FAILED (1-100).")
@click.option("--dedupe-key", default=None, help="Scheduling the same key twice returns the first execution.")
@click.option(
    "--file",
    "rows_file",
    type=click.Path(dir_okay=False, allow_dash=True),
    default=None,
    help="JSON Lines ('-': stdin), one execution per line with the keys campaign, stage, action, due, payload, "
    "max_attempts, dedupe_key. Not with the options above.",
)
def executions_schedule(
    campaign_id: str | None,
    stage: str | None,
    action: str | None,
    due: str | None,
    payload: str | None,
    max_attempts: int | None,
    dedupe_key: str | None,
    rows_file: str | None,
) -> None:
    """Schedule an execution and print its id, or schedule every line of a JSON Lines file.

    With --file, a bad line is reported as `line N: reason` and schedules nothing; the other lines
    are scheduled (once: a line whose dedupe_key was scheduled before adds nothing), then a summary
    is printed. The exit code is 1 if any line was bad.

    A due time in the past is accepted (the execution is due now) with a note saying so.

    \b
    Example:
      marketing-pipelines executions schedule --campaign spring-launch --stage launch \\
        --action webhook --due 2030-12-01T09:00:00+00:00 \\
        --payload '{"url": "https://hooks.example.com/launch", "body": {"text": "We launched"}}'
      echo '{"campaign": "spring-launch", "stage": "launch", "action": "log", "due": "now"}' > launch.jsonl
      marketing-pipelines executions schedule --file launch.jsonl
    """
    from marketing_pipelines.executions.queue import parse_due, refuse_webhook_user_info, schedule_execution
    from marketing_pipelines.strict_json import parse_json_object

    required = {"--campaign": campaign_id, "--stage": stage, "--action": action, "--due": due}
    options = {**required, "--payload": payload, "--max-attempts": max_attempts, "--dedupe-key": dedupe_key}
    if rows_file is not None:
        given = [flag for flag, value in options.items() if value is not None]
        if given:
            raise click.UsageError(f"--file cannot be combined with {', '.join(given)}")
        with open_rows_file(rows_file) as stream:
            schedule_file(stream)
        return
    if campaign_id is None or stage is None or action is None or due is None:
        missing = [flag for flag, value in required.items() if value is None]
        raise click.UsageError(f"Missing option {', '.join(missing)} (or give --file)")
    due_at, parsed_payload = parse_due(due), parse_json_object(payload, "payload")
    refuse_webhook_user_info(action, parsed_payload)
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
            egress=cli_webhook_policy(),
            keys=settings().sealing_keys,
        )
    click.echo(execution_id)
    if due.strip().lower() != "now" and (late := due_in_past(due_at)):
        click.echo(f"note: --due {shown_cell(due.strip())} is {late} in the past: the execution is due now", err=True)


def due_in_past(due_at: datetime) -> str | None:
    """How long ago ``due_at`` was ("3 days", "2 minutes"), if over a minute ago: a typo or a stale example
    (a date copied from a doc that has since passed) runs at once, which its scheduler should hear of."""
    late = datetime.now(UTC) - due_at
    if late < timedelta(minutes=1):
        return None
    for unit, seconds in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if (count := int(late.total_seconds() // seconds)) >= 1:
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return None


@contextmanager
def open_rows_file(path: str) -> Iterator[BinaryIO]:
    """``--file`` opened for reading: a regular file, or stdin for ``-``.

    A named pipe (or a device) would block the command until a writer came, or never end: refused at
    once, before it blocks (opened non-blocking, then checked), with stdin named as the way to pipe rows in.
    """
    if path == "-":
        yield sys.stdin.buffer
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise click.BadParameter(
            f"'{shown_cell(path)}' cannot be read: {exc.strerror}", param_hint="'--file'"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise click.BadParameter(
            f"'{shown_cell(path)}' is not a regular file (a named pipe or a device); give a file, or pipe the rows "
            "to --file -",
            param_hint="'--file'",
        )
    os.set_blocking(fd, True)
    with os.fdopen(fd, "rb") as stream:
        yield stream


def schedule_file(rows_file: BinaryIO) -> None:
    """``schedule --file``: every good line scheduled, every bad one named on stderr, then a summary."""
    from marketing_pipelines.executions.queue import read_schedule_file, schedule_lines

    lines = read_schedule_file(rows_file)
    with ready_conn() as conn:
        outcome = schedule_lines(
            conn,
            lines,
            default_max_attempts=settings().execution_max_attempts,
            egress=cli_webhook_policy(),
            keys=settings().sealing_keys,
        )
    for error in outcome.errors:
        click.echo(f"line {error.number}: {shown_text(error.reason)}", err=True)
    click.echo(
        f"scheduled {len(outcome.new)} new, {len(outcome.existing)} already scheduled by dedupe key, "
        f"{len(outcome.errors)} rejected"
    )
    if outcome.errors:
        raise click.exceptions.Exit(1)


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
    for row in rows:  # --json prints every column
        row["last_error"] = shown_error(row["last_error"], row["payload"])
        row["dedupe_key"] = redact_text(row["dedupe_key"]) if row["dedupe_key"] else None
        row["payload"] = shown_payload(row["payload"], with_body=False)
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
      marketing-pipelines executions cancel 1
    """
    from marketing_pipelines.executions.queue import cancel_execution

    with ready_conn() as conn:
        previous = cancel_execution(conn, execution_id, "cancelled by marketing-pipelines executions cancel")
    click.echo(f"execution {execution_id} cancelled (was {previous})")


SHOWN_IDS = 20  # a bulk retry names the executions it retried up to this many


@executions.command("retry")
@click.argument("execution_id", type=ROW_ID, required=False)
@click.option("--failed", "all_failed", is_flag=True, help="Retry every FAILED execution (not CANCELLED ones).")
@click.option("--cancelled", "include_cancelled", is_flag=True, help="With --failed: CANCELLED executions too.")
@click.option("--campaign", "campaign_id", default=None, help="With --failed: only this campaign's executions.")
@click.option("--since", default=None, help="With --failed: only those finished at or after this ISO-8601 time.")
@click.option(
    "--max-attempts",
    type=click.IntRange(1, 100),
    default=None,
    help="Attempts the retry may make (1-100; default: MARKETING_EXECUTION_MAX_ATTEMPTS).",
)
def executions_retry(
    execution_id: int | None,
    all_failed: bool,
    include_cancelled: bool,
    campaign_id: str | None,
    since: str | None,
    max_attempts: int | None,
) -> None:
    """Put a FAILED or CANCELLED execution back in the queue, due now, with a fresh attempt budget.

    Attempt numbers go on counting (the history keeps every attempt), and a webhook keeps its
    Idempotency-Key, so its receiver recognises the redelivery. The budget is --max-attempts, or
    the default of new executions: the original one is not kept once spent. A retry that would
    take an execution past 1000 attempts is refused.

    \b
    Examples:
      marketing-pipelines executions retry 1
      marketing-pipelines executions retry --failed --campaign spring-launch --since 2026-12-01T00:00:00+00:00
    """
    from marketing_pipelines.executions.queue import parse_time, retry_execution, retry_executions

    if execution_id is not None and all_failed:
        raise click.UsageError("give an execution id or --failed, not both")
    if execution_id is None and not all_failed:
        raise click.UsageError("give an execution id, or --failed to retry every FAILED execution")
    filters = {"--cancelled": include_cancelled, "--campaign": campaign_id is not None, "--since": since is not None}
    if execution_id is not None and any(filters.values()):
        raise click.UsageError(f"{', '.join(k for k, v in filters.items() if v)} can only be used with --failed")
    budget = max_attempts or settings().execution_max_attempts
    if execution_id is not None:
        with ready_conn() as conn:
            previous = retry_execution(conn, execution_id, budget)
        click.echo(f"execution {execution_id} retried (was {previous}): due now, up to {budget} more attempt(s)")
        return
    finished_since = parse_time(since, "--since") if since is not None else None
    with ready_conn() as conn:
        retried = retry_executions(
            conn,
            budget=budget,
            campaign_id=campaign_id,
            finished_since=finished_since,
            include_cancelled=include_cancelled,
        )
    shown = f": {', '.join(map(str, retried.ids))}" if 0 < len(retried.ids) <= SHOWN_IDS else ""
    click.echo(f"retried {len(retried.ids)} execution(s), due now, up to {budget} more attempt(s) each{shown}")
    if retried.over_cap:
        click.echo(f"{retried.over_cap} matching execution(s) left as they were: they have made too many attempts")


def shown_payload(payload: Any, with_body: bool) -> Any:
    """An execution's payload as shown: URLs cut to their host, header values and secret-like values ``***``,
    and its ``body`` (what a webhook sends) ``***`` too unless asked for."""
    shown = redact_value(payload)
    if isinstance(shown, dict) and "body" in shown and not with_body:
        shown["body"] = HIDDEN
    return shown


def shown_error(error: str | None, payload: Any) -> str | None:
    """An error as shown. Errors are redacted when written; rows written by older versions may not be."""
    return hide_values(redact_text(error), secret_parts(payload)) if error else None


@executions.command("show")
@click.argument("execution_id", type=ROW_ID)
@click.option("--body", "with_body", is_flag=True, help="Also show the payload's body (redacted: URLs, secrets).")
@json_option
def executions_show(execution_id: int, with_body: bool, as_json: bool) -> None:
    """Show an execution: status, payload, last error, and each attempt with the Dagster run that performed it.

    With MARKETING_DAGSTER_UI_URL set (the `ui` command prints it), each attempt's run is a link; runs
    carry no tag per execution, so this attempt history is how an execution's runs are found. A payload
    shows a URL's scheme and host only and header names without values; its body shows with --body.

    \b
    Example:
      marketing-pipelines executions show 1
    """
    from marketing_pipelines.executions.queue import failure_cause, get_execution, list_attempts

    with ready_conn() as conn:
        row = get_execution(conn, execution_id)
        if row is None:
            raise InvalidInput(f"execution {execution_id} does not exist; see marketing-pipelines executions list")
        execution = dict(row)
        attempts = [dict(a) for a in list_attempts(conn, execution_id)]
    payload = execution["payload"]
    # The URL, headers and body are the user's and may carry tokens: shown redacted.
    execution["payload"] = shown_payload(payload, with_body)
    execution["last_error"] = shown_error(execution["last_error"], payload)
    execution["dedupe_key"] = redact_text(execution["dedupe_key"]) if execution["dedupe_key"] else None
    runs_url = dagster_runs_url(settings().dagster_ui_url)
    for attempt in attempts:
        attempt["error"] = shown_error(attempt["error"], payload)
        attempt["run_url"] = f"{runs_url}/{attempt['run_id']}" if runs_url and attempt["run_id"] else None
    # Why a FAILED execution failed (its action failed every attempt, was refused, or its attempts were lost
    # after the action began), with its counts: our own text, from its counters.
    execution["cause"] = failure_cause(execution)
    if as_json:
        click.echo(json.dumps({"execution": execution, "attempts": attempts}, default=str, indent=2))
        return
    keys = ("id", "campaign_id", "stage", "action", "status", "due_at", "attempts", "lost_attempts", "max_attempts")
    for key in (*keys, "handed_back", "unstarted_runs", "run_id"):
        click.echo(f"{key:>14}: {cell_text(execution.get(key))}")
    if execution["cause"]:
        click.echo(f"{'failed because':>14}: {execution['cause']}")
    click.echo(f"{'payload':>14}: {shown_text(json.dumps(execution['payload'], default=str, ensure_ascii=False))}")
    click.echo(f"{'last_error':>14}: {shown_cell(execution.get('last_error') or '-')}")
    click.echo("attempts:")
    emit_rows(attempts, ["attempt", "run_id", "started_at", "finished_at", "outcome", "error"], False)
    for attempt in attempts:  # not a table column: a cell is cut at 60 characters, a link must stay whole
        if attempt["run_url"]:
            click.echo(f"{'attempt ' + str(attempt['attempt']):>14}: {attempt['run_url']}")
    if execution["attempts"] > len(attempts):
        # The claim counts an attempt and its run's take-over opens its row: a claim waiting for its run has
        # none yet. A run that never reaches the action gives its attempt back (handed_back counts those).
        click.echo(f"({execution['attempts'] - len(attempts)} attempt(s) claimed and not yet taken over by a run)")


@executions.command("reseal")
def executions_reseal() -> None:
    """Seal every webhook execution's header values again under the first key of MARKETING_SECRETS_KEY.

    Header values are stored sealed. Rotating the key: put a new key first (MARKETING_SECRETS_KEY=new,old),
    run this and `webhooks reseal`, then drop the old one. It also seals the plain values of executions
    scheduled before header values were sealed, whatever their status; those are sent correctly either way.

    \b
    Example:
      export MARKETING_SECRETS_KEY=$(marketing-pipelines webhooks new-key)
      marketing-pipelines executions reseal
    """
    from marketing_pipelines.executions.queue import reseal_execution_headers
    from marketing_pipelines.sealing import SealingError, SecretBox

    try:
        box = SecretBox.of(settings().sealing_keys())
        with ready_conn() as conn:
            count = reseal_execution_headers(conn, box)
    except SealingError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"resealed the header values of {count} execution(s)")


def dagster_runs_url(base: str | None) -> str | None:
    """``<base>/runs`` of the Dagster UI at ``base`` (MARKETING_DAGSTER_UI_URL), or None when it is unset."""
    try:
        ui = dagster_ui_base(base)
    except ValueError as exc:
        raise InvalidInput(f"{env_name('dagster_ui_url')}={redact_url(base or '')!r} is not valid: {exc}") from None
    return None if ui is None else f"{ui}/runs"
