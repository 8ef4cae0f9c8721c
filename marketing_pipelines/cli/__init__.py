"""The ``marketing-pipelines`` command (Click): the root group ``main``, with every command group attached.

Known failures (bad input, a missing schema, an unreachable database, a bad setting) end as
one line on stderr naming the problem and the fix, with a non-zero exit; never a traceback.

One module per command group: ``db``, ``campaigns``, ``executions``, ``webhooks``, ``measurement`` (events, report,
backfill), ``agents`` (users, agents, limits), ``budgets`` and ``local`` (ui, demo); ``common`` holds what they
share. A group's module is imported only when that group runs (``COMMANDS``); ``--help`` lists them from
``SUMMARIES``, importing none, and ``common`` loads only Click at import. None of them imports Dagster at load
time: commands that need it import it when they run (only ``demo`` in-process: it quiets Dagster's beta warnings).
Inside a group's module, each command imports the domain modules it runs in its body, so its sibling commands do
not load them (scheduling an execution loads no agent provider, listing users no rollup sketches); the standard
library and ``cli.common`` come at the top. A read command thus starts in a fraction of a second
(benchmarks/cli_latency.py).
"""

from __future__ import annotations

import click

from marketing_pipelines.cli.common import LazyGroup

__all__ = ["main"]

# Each command's name and where it is defined ("module:attribute").
COMMANDS = {
    "db": "marketing_pipelines.cli.db:db",
    "campaigns": "marketing_pipelines.cli.campaigns:campaigns",
    "executions": "marketing_pipelines.cli.executions:executions",
    "webhooks": "marketing_pipelines.cli.webhooks:webhooks",
    "ui": "marketing_pipelines.cli.local:ui_command",
    "demo": "marketing_pipelines.cli.local:demo_command",
    "events": "marketing_pipelines.cli.measurement:events",
    "report": "marketing_pipelines.cli.measurement:report_command",
    "backfill": "marketing_pipelines.cli.measurement:backfill_command",
    "users": "marketing_pipelines.cli.agents:users",
    "agents": "marketing_pipelines.cli.agents:agents",
    "limits": "marketing_pipelines.cli.agents:limits",
    "budgets": "marketing_pipelines.cli.budgets:budgets",
    "status": "marketing_pipelines.cli.status:status_command",
}


# What `--help` lists for each, so that listing them imports none: the first line of its help.
SUMMARIES = {
    "db": "Create or upgrade the application database schema.",
    "campaigns": "Add and list campaigns.",
    "executions": "Schedule and inspect campaign executions (claimed by due_executions_sensor when due).",
    "webhooks": "Registered webhook endpoints: sealed URLs, Standard Webhooks signatures.",
    "ui": "Open the Dagster UI (dagster dev) on the demo's instance and database.",
    "demo": "Seed the embedded database and drive the whole path on a real Dagster instance.",
    "events": "Load first-party marketing events into the measurement tables.",
    "report": "Counts, unique actors, a daily series and the funnel of a campaign, from the daily rollup.",
    "backfill": "Backfill the daily rollup over a range of days, in range runs, as the UI's Materialize does.",
    "users": "Add users and grant them permissions (optionally on one campaign).",
    "agents": "Queue AI agent runs (run later by agent_run_job as the requesting user) and inspect them.",
    "limits": "Show or set the model-call limits: calls, input tokens, output tokens or all tokens per minute.",
    "budgets": "Daily model-spend budgets per campaign or requester, and today's spend against them.",
    "status": "How many executions are due and agent runs queued, how long the oldest waits, what runs and what "
    "failed.",
}


@click.group(
    cls=LazyGroup,
    lazy_commands=COMMANDS,
    summaries=SUMMARIES,
    context_settings={"help_option_names": ["-h", "--help"]},
)
def main() -> None:
    """Scheduled campaign executions, queued AI agent runs and campaign measurement on Dagster.

    The application database is MARKETING_DATABASE_URL, or a SQLite file in ./.marketing/.

    \b
    Example, from nothing to a finished run:
      marketing-pipelines demo
    """
