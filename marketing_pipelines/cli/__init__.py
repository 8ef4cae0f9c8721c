"""The ``marketing-pipelines`` command (Click): the root group ``main``, with every command group attached.

Known failures (bad input, a missing schema, an unreachable database, a bad setting) end as
one line on stderr naming the problem and the fix, with a non-zero exit; never a traceback.

One module per command group: ``db``, ``campaigns``, ``executions``, ``webhooks``, ``measurement`` (events, report),
``agents`` (users, agents, limits) and ``local`` (ui, demo); ``common`` holds what they share. A group's
module is imported only when that group runs or ``--help`` lists it (``COMMANDS``), and none of them
imports Dagster at load time: commands that need it import it when they run. Inside a group's module,
each command imports the domain modules it runs in its body, so its sibling commands do not load them
(scheduling an execution loads no agent provider, listing users no rollup sketches); the standard
library and ``cli.common`` come at the top. A read command thus starts in a fraction of a second
(benchmarks/cli_latency.py).
"""

from __future__ import annotations

import warnings

import click

# The warning classes dagster re-exports, without importing dagster itself: that import alone takes about a
# second, which every command would pay (events load of a big file included) though most never run Dagster.
from dagster_shared.utils.warnings import BetaWarning, PreviewWarning

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
    "users": "marketing_pipelines.cli.agents:users",
    "agents": "marketing_pipelines.cli.agents:agents",
    "limits": "marketing_pipelines.cli.agents:limits",
    "status": "marketing_pipelines.cli.status:status_command",
}


@click.group(cls=LazyGroup, lazy_commands=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
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
