"""The ``marketing-pipelines`` command (Click).

Known failures (bad input, a missing schema, an unreachable database, a bad setting) end as
one line on stderr naming the problem and the fix, with a non-zero exit; never a traceback.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click
import sqlalchemy as sa

# The warning classes dagster re-exports, without importing dagster itself: that import alone takes about a
# second, which every command would pay (events load of a big file included) though most never run Dagster.
from dagster_shared.utils.warnings import BetaWarning, PreviewWarning

from marketing_pipelines.agents.token_bucket import MAX_BURST, MAX_CALLS_PER_MINUTE
from marketing_pipelines.db.campaigns import Campaign, add_campaign, list_campaigns
from marketing_pipelines.db.engine import DatabaseUnavailable, get_engine
from marketing_pipelines.db.migrate import (
    SchemaNotReady,
    current_revision,
    ensure_schema_current,
    head_revision,
    upgrade,
)
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.http import ServiceError
from marketing_pipelines.redact import redact_url, redact_urls
from marketing_pipelines.settings import Settings, SettingsError

KNOWN_ERRORS: tuple[type[Exception], ...] = (
    InvalidInput,
    SchemaNotReady,
    DatabaseUnavailable,
    SettingsError,
    ServiceError,
)


class FriendlyGroup(click.Group):
    """Turns the project's known errors into one clear ``Error: ...`` line and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KNOWN_ERRORS as exc:
            raise click.ClickException(str(exc)) from None


def settings() -> Settings:
    return Settings.from_env()


def engine() -> sa.Engine:
    return get_engine(settings().resolved_database_url)


@contextmanager
def ready_conn() -> Iterator[sa.Connection]:
    """A transaction on the application database, after checking its schema is current."""
    eng = engine()
    ensure_schema_current(eng)
    with eng.begin() as conn:
        yield conn


def emit_rows(rows: list[dict[str, Any]], columns: list[str], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(rows, default=str, indent=2))
        return
    if not rows:
        click.echo("(none)")
        return
    widths = {c: max(len(c), *(len(_cell(r.get(c))) for r in rows)) for c in columns}
    click.echo("  ".join(c.ljust(widths[c]) for c in columns))
    for r in rows:
        click.echo("  ".join(_cell(r.get(c)).ljust(widths[c]) for c in columns))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if hasattr(value, "isoformat"):
        return value.isoformat(timespec="seconds")
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


# Row ids are 64-bit integers on both databases; a larger number is refused by Click, not by a driver.
ROW_ID = click.IntRange(1, 2**63 - 1)


class FiniteFloat(click.ParamType):
    """A float within (minimum, maximum]: ``nan``, ``inf`` and ``1e308`` are refused with one line."""

    name = "number"

    def __init__(self, minimum: float, maximum: float) -> None:
        self.minimum, self.maximum = minimum, maximum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or not self.minimum < number <= self.maximum:
            self.fail(
                f"{value!r} must be a finite number above {self.minimum:g} and at most {self.maximum:g}", param, ctx
            )
        return number


json_option: Callable[[Callable[..., Any]], Callable[..., Any]] = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON instead of a table."
)


@click.group(cls=FriendlyGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Scheduled campaign executions, queued AI agent runs and campaign measurement on Dagster.

    The application database is MARKETING_DATABASE_URL, or a SQLite file in ./.marketing/.

    \b
    Example, from nothing to a finished run:
      marketing-pipelines demo
    """
    # Dagster flags its own beta parameters on every load; they say nothing to a CLI user.
    warnings.filterwarnings("ignore", category=BetaWarning)
    warnings.filterwarnings("ignore", category=PreviewWarning)


# --- db ---------------------------------------------------------------------------------------


@main.group(cls=FriendlyGroup)
def db() -> None:
    """Create or upgrade the application database schema."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Apply all migrations (creates the SQLite file on first use).

    \b
    Example:
      MARKETING_DATABASE_URL=postgresql://app@db:5432/marketing marketing-pipelines db upgrade
    """
    from marketing_pipelines.db.engine import check_connection, sqlite_path

    eng = engine()
    path = sqlite_path(eng)
    if path is None:
        check_connection(eng)
    before = current_revision(eng) if path is None or path.exists() else None
    upgrade(eng)
    after = current_revision(eng)
    where = eng.url.render_as_string(hide_password=True)
    click.echo(f"{where}: schema at {after}" + ("" if before == after else f" (was {before or 'empty'})"))


@db.command("current")
def db_current() -> None:
    """Show the schema revision of the database and the one this code needs.

    \b
    Example:
      marketing-pipelines db current
    """
    from marketing_pipelines.db.engine import check_connection

    eng = engine()
    check_connection(eng)
    click.echo(f"database: {current_revision(eng) or 'empty'}; code needs: {head_revision()}")


@db.command("rebuild-weekly-sketches")
def db_rebuild_weekly_sketches() -> None:
    """Rebuild measurement_weekly_sketch from the daily rollup, for every rolled-up week.

    Rolling up a day keeps its week current; run this once after upgrading a database that already
    holds daily rollups. Until then reports are correct, merging daily sketches instead of weekly ones.

    \b
    Example:
      marketing-pipelines db rebuild-weekly-sketches
    """
    from marketing_pipelines.measurement.rollup import rebuild_all_weeks

    eng = engine()
    ensure_schema_current(eng)
    weeks, rows = rebuild_all_weeks(eng)
    click.echo(f"rebuilt {weeks} week(s), {rows} weekly sketch row(s)")


# --- campaigns --------------------------------------------------------------------------------


@main.group(cls=FriendlyGroup)
def campaigns() -> None:
    """Add and list campaigns."""


@campaigns.command("add")
@click.argument("campaign_id")
@click.option("--name", required=True, help="Display name.")
@click.option("--owner", required=True, help="Who runs the campaign.")
@click.option("--utm-campaign", default=None, help="utm_campaign value that maps site analytics to it.")
@click.option("--github-repo", default=None, help="owner/name whose release downloads count for it.")
def campaigns_add(campaign_id: str, name: str, owner: str, utm_campaign: str | None, github_repo: str | None) -> None:
    """Add a campaign.

    \b
    Example:
      marketing-pipelines campaigns add spring-launch --name "Spring launch" --owner ana \\
        --utm-campaign spring26 --github-repo acme/widget
    """
    with ready_conn() as conn:
        add_campaign(conn, Campaign(campaign_id, name, owner, utm_campaign, github_repo))
    click.echo(f"added campaign {campaign_id}")


@campaigns.command("list")
@json_option
def campaigns_list(as_json: bool) -> None:
    """List campaigns.

    \b
    Example:
      marketing-pipelines campaigns list --json
    """
    with ready_conn() as conn:
        rows = [c.__dict__ for c in list_campaigns(conn)]
    emit_rows(rows, ["id", "name", "owner", "utm_campaign", "github_repo"], as_json)


# --- executions -------------------------------------------------------------------------------


@main.group(cls=FriendlyGroup)
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
        click.echo(f"{key:>12}: {_cell(execution.get(key))}")
    click.echo(f"{'last_error':>12}: {redact_urls(execution.get('last_error') or '-')}")
    click.echo(f"{'UI tag':>12}: marketing/execution_id.{execution_id}")
    click.echo("attempts:")
    emit_rows(attempts, ["attempt", "run_id", "started_at", "finished_at", "outcome", "error"], False)
    if execution["attempts"] > len(attempts):
        # The claim counts an attempt; a run that never started (or started after its lease expired
        # and found another attempt owning the row) leaves no attempt row.
        click.echo(f"({execution['attempts'] - len(attempts)} claim(s) never started a run)")


# --- demo -------------------------------------------------------------------------------------


@main.command("ui")
@click.option("--port", type=click.IntRange(1, 65535), default=3000, show_default=True, help="Port of the UI.")
def ui_command(port: int) -> None:
    """Open the Dagster UI (dagster dev) on the demo's instance and database.

    The UI, its daemon and the demo share .marketing/dagster_home and MARKETING_DATABASE_URL (or the
    embedded SQLite file), so the demo's runs, materializations, sensor ticks and pool show there,
    and a demo run while the UI is up lets the UI's daemon do the work. Webhooks from this local UI
    may reach 127.0.0.1 (the demo's receiver) unless MARKETING_WEBHOOK_ALLOW_NETWORKS says otherwise.

    \b
    Example:
      marketing-pipelines ui            # then open http://127.0.0.1:3000
    """
    import os
    import sys
    from pathlib import Path

    from marketing_pipelines.demo import dagster_home

    home = dagster_home()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "MARKETING_DATABASE_URL": settings().resolved_database_url,
        "MARKETING_WEBHOOK_ALLOW_NETWORKS": os.environ.get("MARKETING_WEBHOOK_ALLOW_NETWORKS") or "127.0.0.1/32",
    }
    dagster = Path(sys.executable).parent / "dagster"
    argv = [str(dagster), "dev", "-m", "marketing_pipelines.definitions", "-p", str(port)]
    click.echo(f"Dagster UI on http://127.0.0.1:{port}, instance {home}", err=True)
    os.execve(str(dagster), argv, env)  # dagster dev owns the terminal and its signals from here


@main.command("demo")
@click.option("--days", type=click.IntRange(1, 60), default=7, show_default=True, help="Days of history to seed.")
def demo_command(days: int) -> None:
    """Seed the embedded database and drive the whole path on a real Dagster instance.

    Needs no server, network or API keys. Safe to run again: seeding is idempotent.

    \b
    Example:
      marketing-pipelines demo
    """
    from marketing_pipelines.demo import run_demo

    run_demo(days=days, echo=click.echo)


# --- measurement ------------------------------------------------------------------------------


@main.group(cls=FriendlyGroup)
def events() -> None:
    """Load first-party marketing events into the measurement tables."""


@events.command("load")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, readable=True))
@click.option("--source", default="file", show_default=True, help="source of rows that do not name one.")
def events_load(file: str, source: str) -> None:
    """Load a .jsonl or .csv file of events; safe to run again (event_id dedupes).

    Fields: event_id, campaign_id, stage, event_type, occurred_at (ISO-8601 with offset),
    and optionally actor_id, source, properties (a JSON object). Invalid rows are stored in
    marketing_event_reject with the line number and reason; the rest load.

    \b
    Example:
      marketing-pipelines events load events-2026-11.jsonl
      marketing-pipelines events load export.csv --source crm
    """
    import sys
    from pathlib import Path

    from tqdm import tqdm

    from marketing_pipelines.measurement.events import file_format, load_events_file, reject_file_label

    path = Path(file)
    file_format(path)
    eng = engine()
    ensure_schema_current(eng)
    size = path.stat().st_size
    interactive = sys.stderr.isatty()
    if size > 0 and (interactive or size >= PROGRESS_MIN_BYTES):
        # In a log (stderr not a terminal) the bar redraws rarely, so a long load leaves a few lines, not thousands.
        with tqdm(
            total=size,
            desc=f"loading {path.name}",
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            file=sys.stderr,
            mininterval=0.5 if interactive else 30,
        ) as bar:
            counts = load_events_file(eng, path, progress=bar.update, source=source)
    else:
        counts = load_events_file(eng, path, source=source)
    click.echo(
        f"loaded {counts.loaded}, duplicate {counts.duplicate}, conflict {counts.conflict}, rejected {counts.rejected}"
    )
    if counts.reasons:
        by_count = sorted(counts.reasons.items(), key=lambda item: (-len(item[1]), item[1][0]))
        for reason, lines in by_count[:REASONS_SHOWN]:
            first = ", ".join(str(n) for n in lines[:3]) + (", ..." if len(lines) > 3 else "")
            click.echo(f"  {len(lines):>6} x {reason} (line {first})", err=True)
        if len(by_count) > REASONS_SHOWN:
            click.echo(f"  ... and {len(by_count) - REASONS_SHOWN} more reason(s)", err=True)
        click.echo(
            f"see them all with: marketing-pipelines events rejects --file '{reject_file_label(path)}'", err=True
        )


REASONS_SHOWN = 10
# events load shows a progress bar on a terminal, and in logs for files this large.
PROGRESS_MIN_BYTES = 100 * 1024 * 1024


@events.command("rejects")
@click.option("--file", "file", default=None, help="Only this file (as events load names it: its absolute path).")
@click.option("--limit", type=click.IntRange(1, 10_000), default=200, show_default=True)
@json_option
def events_rejects(file: str | None, limit: int, as_json: bool) -> None:
    """List rejected lines and conflicting events with their line number and reason.

    \b
    Example:
      marketing-pipelines events rejects --file /data/events-2026-11.jsonl
    """
    from pathlib import Path

    from marketing_pipelines.measurement.events import list_rejects, reject_file_label

    label = reject_file_label(Path(file)) if file else None
    with ready_conn() as conn:
        rows = [dict(r) for r in list_rejects(conn, label, limit)]
    emit_rows(rows, ["file", "line_number", "reason", "raw"], as_json)


@main.command("report")
@click.option("--campaign", "campaign_id", required=True, help="Campaign id.")
@click.option("--from", "start", default=None, help="First UTC day (YYYY-MM-DD); default: first rolled-up day.")
@click.option("--to", "end", default=None, help="Last UTC day, inclusive; default: last rolled-up day.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
@click.option("--stages", default=None, help="Funnel order, comma-separated (default: by unique actors).")
def report_command(campaign_id: str, start: str | None, end: str | None, fmt: str, stages: str | None) -> None:
    """Counts, unique actors, a daily series and the funnel of a campaign, from the daily rollup.

    Reads only measurement_daily_rollup and its weekly sketch index; days not materialized yet
    are missing from it.

    \b
    Example:
      marketing-pipelines report --campaign spring-launch --from 2026-11-01 --to 2026-11-30
      marketing-pipelines report --campaign spring-launch --format csv > spring.csv
    """
    from marketing_pipelines.measurement.report import measurement_report, parse_day, render

    first = parse_day(start, "--from") if start else None
    last = parse_day(end, "--to") if end else None
    order = [s.strip() for s in stages.split(",") if s.strip()] if stages else None
    with ready_conn() as conn:
        result = measurement_report(conn, campaign_id, first, last, stage_order=order)
    click.echo(render(result, fmt).rstrip("\n"))
    partitions_start = settings().measurement_start_date
    if first is not None and first < partitions_start:
        # Those days have no partition to materialize: the suggestion above cannot apply to them.
        click.echo(
            f"note: days before {partitions_start} are outside the measurement partitions "
            "(MARKETING_MEASUREMENT_START_DATE) and are never rolled up",
            err=True,
        )


# --- users ------------------------------------------------------------------------------------


@main.group(cls=FriendlyGroup)
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
    import sqlalchemy as sa

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


@main.group(cls=FriendlyGroup)
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
    from marketing_pipelines.agents.queue import parse_input, request_agent_run

    s = settings()
    payload = parse_input(input_json)
    with ready_conn() as conn:
        run_id = request_agent_run(
            conn,
            agent=agent,
            campaign_id=campaign_id,
            requested_by=user_id,
            input=payload,
            provider=provider or s.model_provider,
            max_run_seconds=max_run_seconds if max_run_seconds is not None else s.agent_max_run_seconds,
        )
    click.echo(run_id)


@agents.command("list")
@click.option("--status", default=None, help="QUEUED, RUNNING, SUCCEEDED, FAILED or CANCELLED.")
@click.option("--as", "user_id", default=None, help="Only runs requested by this user.")
@json_option
def agents_list(status: str | None, user_id: str | None, as_json: bool) -> None:
    """List agent runs, newest first.

    \b
    Example:
      marketing-pipelines agents list --status QUEUED
    """
    from marketing_pipelines.agents.queue import list_agent_runs

    with ready_conn() as conn:
        rows = [dict(r) for r in list_agent_runs(conn, status.upper() if status else None, user_id)]
    columns = ["id", "agent", "campaign_id", "requested_by", "status", "attempts", "requested_at", "error"]
    emit_rows(rows, columns, as_json)


@agents.command("show")
@click.argument("agent_run_id", type=ROW_ID)
@json_option
def agents_show(agent_run_id: int, as_json: bool) -> None:
    """Show an agent run: status, output and its transcript (model turns, tool calls, denials).

    \b
    Example:
      marketing-pipelines agents show 12
    """
    from marketing_pipelines.agents.queue import require_agent_run, transcript

    with ready_conn() as conn:
        run = dict(require_agent_run(conn, agent_run_id))
        steps = [dict(s) for s in transcript(conn, agent_run_id)]
    if as_json:
        click.echo(json.dumps({"run": run, "transcript": steps}, default=str, indent=2))
        return
    for key in ("id", "agent", "campaign_id", "requested_by", "status", "attempts", "run_id", "error"):
        click.echo(f"{key:>13}: {_cell(run.get(key))}")
    if run.get("output"):
        click.echo(f"{'output':>13}:\n{run['output'].get('text', '')}")
    click.echo("transcript:")
    for s in steps:
        click.echo(f"  [{s['attempt']}.{s['seq']:>2}] {s['kind']:<11} {s['name'] or '':<20} {_cell(s['content'])}")


@agents.command("cancel")
@click.argument("agent_run_id", type=ROW_ID)
def agents_cancel(agent_run_id: int) -> None:
    """Cancel a QUEUED or RUNNING agent run (its Dagster run is terminated when DAGSTER_HOME is set).

    \b
    Example:
      marketing-pipelines agents cancel 12
    """
    import os

    from marketing_pipelines.agents.queue import cancel_agent_run

    with ready_conn() as conn:
        result = cancel_agent_run(conn, agent_run_id, "cancelled by marketing-pipelines agents cancel")
    click.echo(f"agent run {agent_run_id} cancelled (was {result.previous_status})")
    if result.run_id:
        # The run also stops by itself at its next step (its lease renewal finds the row
        # CANCELLED); terminating it through the instance just makes that immediate.
        if os.environ.get("DAGSTER_HOME"):
            import dagster as dg

            with dg.DagsterInstance.get() as instance:
                terminated = instance.run_coordinator.cancel_run(result.run_id)
            click.echo(f"Dagster run {result.run_id}: {'terminated' if terminated else 'already finished'}")
        else:
            click.echo(f"Dagster run {result.run_id} stops at its next step (set DAGSTER_HOME to terminate it now)")


# --- limits -----------------------------------------------------------------------------------


@main.group(cls=FriendlyGroup)
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
    from marketing_pipelines.agents.providers import PROVIDER_NAMES
    from marketing_pipelines.agents.token_bucket import ensure_bucket, list_buckets

    s = settings()
    with ready_conn() as conn:
        for provider in PROVIDER_NAMES:
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
    from marketing_pipelines.agents.providers import PROVIDER_NAMES
    from marketing_pipelines.agents.token_bucket import configure_bucket

    if provider not in PROVIDER_NAMES:
        raise InvalidInput(f"unknown provider {provider!r}; known: {', '.join(PROVIDER_NAMES)}")
    with ready_conn() as conn:
        configure_bucket(conn, provider, calls_per_minute, burst)
    click.echo(f"{provider}: {calls_per_minute:g} calls/minute, burst {burst or calls_per_minute:g}")


if __name__ == "__main__":
    main()
