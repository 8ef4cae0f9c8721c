"""``marketing-pipelines ui`` and ``demo``: the Dagster UI and the end-to-end demo on the local instance."""

from __future__ import annotations

import os
import sys
from datetime import date
from pathlib import Path

import click

from marketing_pipelines.cli.common import settings
from marketing_pipelines.settings import Settings


@click.command("ui")
@click.option("--port", type=click.IntRange(1, 65535), default=3000, show_default=True, help="Port of the UI.")
def ui_command(port: int) -> None:
    """Open the Dagster UI (dagster dev) on the demo's instance and database.

    The UI, its daemon and the demo share .marketing/dagster_home and MARKETING_DATABASE_URL (or the
    embedded SQLite file), so the demo's runs, materializations, sensor ticks and pool show there,
    and a demo run while the UI is up lets the UI's daemon do the work. Webhooks from this local UI
    may reach the demo's receiver (127.0.0.2, not the UI on 127.0.0.1) unless
    MARKETING_WEBHOOK_ALLOW_NETWORKS says otherwise.

    \b
    Example:
      marketing-pipelines ui            # then open http://127.0.0.1:3000
    """
    from marketing_pipelines.demo import DEMO_RECEIVER_ADDRESS, dagster_home

    home, current = dagster_home(), settings()
    ui_url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "MARKETING_DATABASE_URL": current.resolved_database_url,
        # A local UI's webhooks (and an agent proposing one) may reach the demo's receiver alone unless
        # networks were chosen: not this UI's GraphQL on 127.0.0.1, nor another service there.
        "MARKETING_WEBHOOK_ALLOW_NETWORKS": ",".join(current.webhook_allow_networks) or f"{DEMO_RECEIVER_ADDRESS}/32",
        # Links to runs (alerts sent from this instance) point at this UI.
        "MARKETING_DAGSTER_UI_URL": ui_url,
        # Partitions from the first day with events, unless chosen: the demo's week, not eleven months missing.
        **({"MARKETING_MEASUREMENT_START_DATE": start.isoformat()} if (start := _measurement_start(current)) else {}),
    }
    dagster = Path(sys.executable).parent / "dagster"
    # `dagster dev` warns on every start that it is superseded by `dg dev`, which serves only from inside a
    # dg project's folder, not from the installed package in any folder as this command does: nothing for
    # the user to act on. The filter matches that message alone, in that process alone (-W, not inherited).
    quiet = "ignore:Function `dev_command` is superseded"
    # The webserver on 127.0.0.1 explicitly: on all addresses it would answer at the receiver's address too.
    argv = [sys.executable, "-W", quiet, str(dagster), "dev", "-m", "marketing_pipelines.definitions"]
    argv += ["-h", "127.0.0.1", "-p", str(port)]
    click.echo(f"Dagster UI on {ui_url}, instance {home}", err=True)
    click.echo(f"For links to its runs in `executions show`: export MARKETING_DAGSTER_UI_URL={ui_url}", err=True)
    # From the instance's own folder: started in a folder holding another dagster.yaml (the repository's
    # root) dagster dev warns that the file there is ignored, which says nothing to this command's user.
    # Every path it needs is absolute (DAGSTER_HOME, the database URL); the code loads as a module.
    os.chdir(home)
    os.execve(sys.executable, argv, env)  # dagster dev owns the terminal and its signals from here


def _measurement_start(current: Settings) -> date | None:
    """The first day with events when MARKETING_MEASUREMENT_START_DATE is not set (and the schema is there)."""
    import sqlalchemy as sa

    from marketing_pipelines.db.engine import get_engine
    from marketing_pipelines.measurement.events.write import first_event_day

    if "measurement_start_date" in current.model_fields_set:
        return None
    engine = get_engine(current.resolved_database_url)
    try:
        with engine.connect() as conn:
            return first_event_day(conn)
    except sa.exc.SQLAlchemyError:  # no database or no schema yet: the setting's default stands
        return None
    finally:
        engine.dispose()


@click.command("demo")
@click.option("--days", type=click.IntRange(1, 60), default=7, show_default=True, help="Days of history to seed.")
def demo_command(days: int) -> None:
    """Seed the embedded database and drive the whole path on a real Dagster instance.

    Needs no server, network or API keys. Safe to run again: seeding is idempotent.

    \b
    Example:
      marketing-pipelines demo
    """
    import warnings

    # The one command that loads Dagster in this process. Dagster flags its own beta parameters on every
    # load; they say nothing to a CLI user. Here, not at the CLI's start: that import cost every command 10 ms.
    from dagster_shared.utils.warnings import BetaWarning, PreviewWarning

    from marketing_pipelines.demo import run_demo

    warnings.filterwarnings("ignore", category=BetaWarning)
    warnings.filterwarnings("ignore", category=PreviewWarning)
    run_demo(days=days, echo=click.echo)
