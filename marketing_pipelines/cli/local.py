"""``marketing-pipelines ui`` and ``demo``: the Dagster UI and the end-to-end demo on the local instance."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import click

from marketing_pipelines.cli.common import CheckedCommand, settings, visible


@click.command("ui", cls=CheckedCommand)
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
    from marketing_pipelines.local_dagster import dagster_home, database_problem, local_environment

    home, current = dagster_home(), settings()
    ui_url = f"http://127.0.0.1:{port}"
    # The UI serves without the application database (its definitions, the instance's history); the sensors
    # skip their ticks until it is there. Only `db upgrade` and the demo create it, so this says what to run.
    problem = database_problem(current)
    if problem is not None:
        demo = "`marketing-pipelines demo` creates and fills it"
        click.echo(f"Note: {visible(problem)}; until then the sensors skip their ticks ({demo})", err=True)
    env = local_environment(current, home, ui_url=ui_url)
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
    # Started from a script as a background job (`marketing-pipelines ui &`), this process ignores
    # SIGINT, an ignored signal stays ignored across exec, and dagster dev copies SIGINT's disposition
    # onto SIGTERM (dagster._utils.interrupts.setup_interrupt_handlers) for itself and every child: an
    # operator's kill, systemd's stop or docker stop would never stop it. A Python handler, unlike
    # SIG_IGN, is reset to the default by exec, so what runs next starts with both signals at the
    # default; in-process tests keep their own handlers.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # dagster dev runs in a process group of its own under serve_in_own_group, which turns this process's
    # SIGINT (Ctrl-C), SIGTERM or SIGHUP into one SIGINT to dagster dev alone: signalled together with its
    # code server, its daemon stored the sensor tick it was evaluating as FAILURE.
    serve = [sys.executable, "-m", "marketing_pipelines.local_dagster"]
    os.execve(sys.executable, [*serve, *argv], env)


@click.command("demo", cls=CheckedCommand)
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
    run_demo(settings(), days=days, echo=click.echo)
