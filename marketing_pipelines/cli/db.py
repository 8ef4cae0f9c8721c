"""``marketing-pipelines db``: create or upgrade the application schema, rebuild the weekly sketch index, purge old
history."""

from __future__ import annotations

import click

from marketing_pipelines.cli.common import FriendlyGroup, emit_rows, engine, settings
from marketing_pipelines.db.engine import check_connection, sqlite_path
from marketing_pipelines.db.schema_version import ensure_schema_current


@click.group(cls=FriendlyGroup)
def db() -> None:
    """Create or upgrade the application database schema."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Apply all migrations (creates the SQLite file on first use).

    On PostgreSQL, MARKETING_DATABASE_URL names the database (postgresql://USER@HOST:5432/NAME), as a role
    that may change its schema: deploy/migrate.sh runs this as MARKETING_MIGRATOR.

    \b
    Example:
      marketing-pipelines db upgrade
    """
    # Alembic is slow to import: only the commands that migrate or ask it pay, not `--help`.
    from marketing_pipelines.db.migrate import current_revision, upgrade

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
    from marketing_pipelines.db.schema_version import code_head_revision, recorded_revisions

    eng = engine()
    check_connection(eng)
    # Read as the schema check reads them (alembic_version and the migration files' revision lines): importing
    # Alembic took a third of this command's time. Alembic answers only what those cannot: several rows in
    # alembic_version (it refuses them in one line) or a history that is not one plain chain.
    recorded, head = recorded_revisions(eng), code_head_revision()
    current = recorded[0] if recorded else None
    if len(recorded) > 1 or head is None:
        from marketing_pipelines.db.migrate import current_revision, head_revision

        current, head = current_revision(eng), head_revision()
    click.echo(f"database: {current or 'empty'}; code needs: {head}")


@db.command("rebuild-weekly-sketches")
def db_rebuild_weekly_sketches() -> None:
    """Rebuild measurement_weekly_sketch from the daily rollup, for every rolled-up week.

    Rolling up a day keeps its week current; run this once after upgrading a database that already
    holds daily rollups. Until then reports are correct, merging daily sketches instead of weekly ones.

    \b
    Example:
      marketing-pipelines db rebuild-weekly-sketches
    """
    # The rollup's sketches (datasketches) load for this command only.
    from marketing_pipelines.measurement.rollup.weekly import rebuild_all_weeks

    eng = engine()
    ensure_schema_current(eng)
    weeks, rows = rebuild_all_weeks(eng)
    click.echo(f"rebuilt {weeks} week(s), {rows} weekly sketch row(s)")


# MARKETING_HISTORY_RETENTION_DAYS's bounds (settings.py), which test_purge.py holds equal: this module loads
# before the settings do.
RETENTION_DAYS = click.IntRange(1, 3650)


@db.command("purge")
@click.option(
    "--older-than-days",
    type=RETENTION_DAYS,
    default=None,
    help="Delete history finished more than this many days ago (1 to 3650; default: "
    "MARKETING_HISTORY_RETENTION_DAYS, 90 unless set).",
)
@click.option("--dry-run", is_flag=True, help="Count the rows that would be deleted; delete nothing.")
def db_purge(older_than_days: int | None, dry_run: bool) -> None:
    """Delete the history of finished work older than N days, and print the rows deleted from each table.

    History is finished executions (SUCCEEDED, FAILED, CANCELLED) with their attempts, finished agent runs with
    their transcripts, and rejected event-file lines. SCHEDULED, RUNNING and QUEUED rows are never deleted,
    however old; events, imported data and rollups are data and stay. history_purge_schedule runs the same
    purge every day; Dagster's own sensor and schedule ticks are purged by its daemon (dagster.yaml,
    retention).

    \b
    Example:
      marketing-pipelines db purge --older-than-days 90 --dry-run
    """
    # The purge's SQL and the schema load for this command only.
    from marketing_pipelines.monitoring.purge import count_history, history_cutoff, no_rows, purge_batches

    days = older_than_days if older_than_days is not None else settings().history_retention_days
    cutoff = history_cutoff(days)
    eng = engine()
    ensure_schema_current(eng)
    if dry_run:
        counts = count_history(eng, cutoff)
    else:
        counts = no_rows()
        try:
            for batch in purge_batches(eng, cutoff):
                for table, rows in batch.items():
                    counts[table] += rows
        except Exception:
            # Each batch committed on its own: say what the failure leaves deleted, then its one line.
            done = ", ".join(f"{rows} from {table}" for table, rows in counts.items())
            click.echo(f"deleted before the failure: {done}", err=True)
            raise
    verb = "would delete" if dry_run else "deleted"
    click.echo(f"{verb} the history finished before {cutoff.isoformat(timespec='seconds')} ({days} days ago):")
    emit_rows([{"table": table, "rows": rows} for table, rows in counts.items()], ["table", "rows"], False)
