"""The ``marketing-pipelines`` command (Click).

Known failures (bad input, a missing schema, an unreachable database, a bad setting) end as
one line on stderr naming the problem and the fix, with a non-zero exit; never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click
import sqlalchemy as sa

from marketing_pipelines.db.campaigns import Campaign, InvalidInput, add_campaign, list_campaigns
from marketing_pipelines.db.engine import DatabaseUnavailable, get_engine
from marketing_pipelines.db.migrate import (
    SchemaNotReady,
    current_revision,
    ensure_schema_current,
    head_revision,
    upgrade,
)
from marketing_pipelines.http import ServiceError
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
    eng = engine()
    before = current_revision(eng) if _has_connection(eng) else None
    upgrade(eng)
    after = current_revision(eng)
    where = eng.url.render_as_string(hide_password=True)
    click.echo(f"{where}: schema at {after}" + ("" if before == after else f" (was {before or 'empty'})"))


def _has_connection(eng: sa.Engine) -> bool:
    from marketing_pipelines.db.engine import check_connection

    check_connection(eng)
    return True


@db.command("current")
def db_current() -> None:
    """Show the schema revision of the database and the one this code needs.

    \b
    Example:
      marketing-pipelines db current
    """
    eng = engine()
    _has_connection(eng)
    click.echo(f"database: {current_revision(eng) or 'empty'}; code needs: {head_revision()}")


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
    """Schedule and inspect campaign executions (claimed by due_work_sensor when due)."""


@executions.command("schedule")
@click.option("--campaign", "campaign_id", required=True, help="Campaign id.")
@click.option("--stage", required=True, help="Funnel stage, e.g. awareness, launch, follow-up.")
@click.option("--action", required=True, help="Action to run: log or webhook.")
@click.option("--due", required=True, help="ISO-8601 time with offset, or 'now'.")
@click.option("--payload", default=None, help="JSON object for the action.")
@click.option("--max-attempts", type=click.IntRange(min=1), default=None, help="Attempts before FAILED.")
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
@click.option("--limit", type=click.IntRange(min=1), default=200, show_default=True)
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
    columns = ["id", "campaign_id", "stage", "action", "due_at", "status", "attempts", "max_attempts", "last_error"]
    emit_rows(rows, columns, as_json)


# --- demo -------------------------------------------------------------------------------------


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


if __name__ == "__main__":
    main()
