"""``marketing-pipelines status``: whether the two work queues keep up, as a table or JSON."""

from __future__ import annotations

import json

import click

from marketing_pipelines.cli.common import CheckedCommand, emit_rows, json_option, ready_conn, settings
from marketing_pipelines.measurement.sources import SOURCES, missing_variables
from marketing_pipelines.monitoring.health import QueueHealth, queue_health

COLUMNS = ["queue", "waiting", "oldest waiting", "running", "failed last hour", "succeeded last hour"]


def age_text(seconds: float | None) -> str | None:
    """A wait as a person reads it: ``45s``, ``2m 05s``, ``3h 02m``, ``2d 04h``; None when nothing waits."""
    if seconds is None:
        return None
    whole = int(seconds)
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def table_rows(health: QueueHealth) -> list[dict[str, object]]:
    e, a = health.executions, health.agent_runs
    return [
        {
            "queue": "executions (due)",
            "waiting": e.due,
            "oldest waiting": age_text(e.oldest_due_seconds),
            "running": e.running,
            "failed last hour": e.failed_last_hour,
            "succeeded last hour": e.succeeded_last_hour,
        },
        {
            "queue": "agent runs (queued)",
            "waiting": a.queued,
            "oldest waiting": age_text(a.oldest_queued_seconds),
            "running": a.running,
            "failed last hour": a.failed_last_hour,
            "succeeded last hour": None,
        },
    ]


@click.command("status", cls=CheckedCommand)
@json_option
def status_command(as_json: bool) -> None:
    """How many executions are due and agent runs queued, how long the oldest waits, what runs and what failed.

    Executions count as waiting once their due time has passed; agent runs from their request.
    "Last hour" counts rows that finished in the hour up to now; REFUSED agent runs count nowhere.
    Measurement sources that are not configured (and what turns each on) are named after the table.

    \b
    Example:
      marketing-pipelines status --json
    """
    with ready_conn() as conn:
        health = queue_health(conn)
    missing = missing_variables(settings())
    if as_json:
        sources = {s.name: {"configured": s.name not in missing, "set": missing.get(s.name, [])} for s in SOURCES}
        click.echo(json.dumps({**health.as_json(), "measurement_sources": sources}))
        return
    emit_rows(table_rows(health), COLUMNS, as_json=False)
    if missing:
        # Not an error: the rollup builds from the sources that are configured (first-party events always).
        named = ", ".join(f"{name} (set {' and '.join(names)})" for name, names in missing.items())
        click.echo(f"measurement sources not configured: {named}")
