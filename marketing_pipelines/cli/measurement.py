"""``marketing-pipelines events`` (load a file, list its rejects), ``report`` (a campaign from the daily rollup) and
``backfill`` (the rollup over a range of days, as an asset backfill)."""

from __future__ import annotations

import sys
from datetime import date
from pathlib import Path

import click

from marketing_pipelines.cli.common import (
    CheckedCommand,
    FriendlyGroup,
    emit_rows,
    engine,
    json_option,
    ready_conn,
    settings,
)
from marketing_pipelines.db.schema_version import ensure_schema_current
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.redact import visible_controls


@click.group(cls=FriendlyGroup)
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
      printf '%s%s\\n' '{"event_id": "e-1", "campaign_id": "spring-launch", "stage": "awareness", ' \\
        '"event_type": "page_view", "occurred_at": "2026-11-02T10:00:00+00:00"}' > events-2026-11.jsonl
      marketing-pipelines events load events-2026-11.jsonl
      printf 'event_id,campaign_id,stage,event_type,occurred_at\\n%s\\n' \\
        'c-1,spring-launch,awareness,page_view,2026-11-03T10:00:00+00:00' > export.csv
      marketing-pipelines events load export.csv --source crm
    """
    from tqdm import tqdm

    from marketing_pipelines.measurement.events.files import file_format, load_events_file
    from marketing_pipelines.measurement.events.rejects import reject_file_label

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
            click.echo(f"  {len(lines):>6} x {visible_controls(reason)} (line {first})", err=True)
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
    from marketing_pipelines.measurement.events.rejects import list_rejects, reject_file_label

    label = reject_file_label(Path(file)) if file else None
    with ready_conn() as conn:
        rows = [dict(r) for r in list_rejects(conn, label, limit)]
    emit_rows(rows, ["file", "line_number", "reason", "raw"], as_json)


def parse_day(value: str, option: str) -> date:
    """A day given as ``--from``/``--to``; InvalidInput names the option and the value."""
    try:
        return date.fromisoformat(value.strip())
    except ValueError:
        raise InvalidInput(f"{option} {value!r} is not a day like 2026-11-26") from None


@click.command("report", cls=CheckedCommand)
@click.option("--campaign", "campaign_id", required=True, help="Campaign id.")
@click.option("--from", "start", default=None, help="First UTC day (YYYY-MM-DD); default: first rolled-up day.")
@click.option("--to", "end", default=None, help="Last UTC day, inclusive; default: last rolled-up day.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "json", "html"]),
    default="table",
    show_default=True,
    help="html: one self-contained page, the funnel and each source's days as charts over their tables.",
)
@click.option("--stages", default=None, help="Funnel order, comma-separated (default: by unique actors).")
def report_command(campaign_id: str, start: str | None, end: str | None, fmt: str, stages: str | None) -> None:
    """Counts, unique actors, a daily series and the funnel of a campaign, from the daily rollup.

    Reads only measurement_daily_rollup and its weekly sketch index; days not materialized yet
    are missing from it.

    \b
    Example:
      marketing-pipelines report --campaign spring-launch --from 2026-11-01 --to 2026-11-30
      marketing-pipelines report --campaign spring-launch --format csv > spring.csv
      marketing-pipelines report --campaign spring-launch --format html > spring.html
    """
    # Imported here: the other commands need not load the report's reads and sketches.
    from marketing_pipelines.measurement.report.build import measurement_report
    from marketing_pipelines.measurement.report.charts import render_html
    from marketing_pipelines.measurement.report.rendering import render

    first = parse_day(start, "--from") if start else None
    last = parse_day(end, "--to") if end else None
    order = [s.strip() for s in stages.split(",") if s.strip()] if stages else None
    with ready_conn() as conn:
        result = measurement_report(conn, campaign_id, first, last, stage_order=order)
    # The page draws on the report's text (its number formats), so it is rendered beside it, not by it.
    click.echo((render_html(result) if fmt == "html" else render(result, fmt)).rstrip("\n"))
    partitions_start = settings().measurement_start_date
    if first is not None and first < partitions_start:
        # Those days have no partition to materialize: the suggestion above cannot apply to them.
        click.echo(
            f"note: days before {partitions_start} are outside the measurement partitions "
            "(MARKETING_MEASUREMENT_START_DATE) and are never rolled up",
            err=True,
        )


@click.command("backfill", cls=CheckedCommand)
@click.option("--from", "start", required=True, help="First UTC day (YYYY-MM-DD).")
@click.option("--to", "end", required=True, help="Last UTC day, inclusive.")
@click.option(
    "--imports",
    is_flag=True,
    help="Re-import the configured importers' days too (each over the days its source can still read), then roll up.",
)
@click.option(
    "-w",
    "--workspace",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A deployment's Dagster workspace file; default: the definitions module, as `ui` loads it.",
)
def backfill_command(start: str, end: str, imports: bool, workspace: Path | None) -> None:
    """Backfill the daily rollup over a range of days, in range runs, as the UI's Materialize does.

    Creates one asset backfill on the instance of DAGSTER_HOME (unset: the demo's and `ui`'s,
    .marketing/dagster_home); the daemon runs it as range runs of up to MARKETING_BACKFILL_DAYS_PER_RUN
    days each, shown under Runs > Backfills. Every day is replaced, so any day can be backfilled again.

    \b
    Example:
      marketing-pipelines backfill --from 2026-11-01 --to 2026-11-30
    """
    import os
    from datetime import UTC, datetime

    import dagster as dg

    from marketing_pipelines.local_dagster import daemon_running, dagster_home, local_environment
    from marketing_pipelines.measurement.backfill import backfill_plan, check_range, launch_backfill

    current = settings()
    first, last = parse_day(start, "--from"), parse_day(end, "--to")
    check_range(first, last, current.measurement_start_date, datetime.now(UTC).date())
    if os.environ.get("DAGSTER_HOME"):
        home, env = Path(os.environ["DAGSTER_HOME"]), dict(os.environ)
    else:
        # The instance `ui` and the demo use, with the environment they give its processes.
        home = dagster_home()
        env = local_environment(current, home)
    plan, notes = backfill_plan(current, imports, first, last, datetime.now(UTC).date())
    launched = launch_backfill(plan, current.backfill_days_per_run, env, workspace)
    span = f"{first}..{last} ({(last - first).days + 1} days)"
    click.echo(
        f"Backfill {launched.backfill_id}: {', '.join(p.asset for p in plan)}, {span}, on the instance at {home}"
    )
    for note in notes:
        click.echo(f"  {note}")
    click.echo(
        f"The daemon runs it as {launched.runs} run(s) of up to {current.backfill_days_per_run} days "
        "(MARKETING_BACKFILL_DAYS_PER_RUN); the UI shows it under Runs > Backfills."
    )
    with dg.DagsterInstance.from_config(str(home)) as instance:
        if not daemon_running(instance):
            click.echo(
                "No dagster-daemon serves this instance now: the backfill waits for one "
                "(`marketing-pipelines ui`, or the deployment's dagster-daemon).",
                err=True,
            )
