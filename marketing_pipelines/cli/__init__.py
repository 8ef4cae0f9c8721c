"""The ``marketing-pipelines`` command (Click): the root group ``main``, with every command group attached.

Known failures (bad input, a missing schema, an unreachable database, a bad setting) end as
one line on stderr naming the problem and the fix, with a non-zero exit; never a traceback.

One module per command group: ``db``, ``campaigns``, ``executions``, ``measurement`` (events, report),
``agents`` (users, agents, limits) and ``local`` (ui, demo); ``common`` holds what they share. None of
them imports Dagster at load time: commands that need it import it when they run.
"""

from __future__ import annotations

import warnings

import click

# The warning classes dagster re-exports, without importing dagster itself: that import alone takes about a
# second, which every command would pay (events load of a big file included) though most never run Dagster.
from dagster_shared.utils.warnings import BetaWarning, PreviewWarning

from marketing_pipelines.cli import agents, campaigns, db, executions, local, measurement
from marketing_pipelines.cli.common import FriendlyGroup

__all__ = ["main"]


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


for command in (
    db.db,
    campaigns.campaigns,
    executions.executions,
    local.ui_command,
    local.demo_command,
    measurement.events,
    measurement.report_command,
    agents.users,
    agents.agents,
    agents.limits,
):
    main.add_command(command)
