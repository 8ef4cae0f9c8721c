"""``history_purge_job`` and ``history_purge_schedule``: the history of finished work, deleted once a day when it
is older than ``MARKETING_HISTORY_RETENTION_DAYS`` (the ``history_retention`` resource).

The SQL is ``purge.py``'s, which ``marketing-pipelines db purge`` runs too. Dagster's own history (sensor and
schedule ticks) is purged by the daemon under the ``retention:`` block of every shipped ``dagster.yaml``.
"""

from collections.abc import Mapping
from datetime import UTC, datetime

import dagster as dg

from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.monitoring.purge import history_cutoff, no_rows, purge_batches
from marketing_pipelines.redact import error_text, shown_cell
from marketing_pipelines.settings import Settings, resource_from_settings, setting_field, shown_in_ui


@shown_in_ui
class HistoryRetention(dg.ConfigurableResource):
    """How long the history of finished work is kept: finished executions with their attempts, finished agent
    runs with their transcripts, and rejected event-file lines. Events, imported data and rollups are kept."""

    retention_days: int = setting_field("history_retention_days")

    def cutoff(self, now: datetime | None = None) -> datetime:
        """History finished before this moment is deleted."""
        return history_cutoff(self.retention_days, now)


def _metadata(deleted: Mapping[str, int], cutoff: datetime, days: int) -> dict[str, dg.MetadataValue]:
    # One number per table, so the run's page (and the job's history of runs) shows what each day removed.
    metadata: dict[str, dg.MetadataValue] = {table: dg.MetadataValue.int(n) for table, n in deleted.items()}
    metadata["retention_days"] = dg.MetadataValue.int(days)
    metadata["finished_before"] = dg.MetadataValue.timestamp(cutoff)
    return metadata


@dg.op(
    name="purge_history",
    description="Deletes finished executions, agent runs and rejected event lines older than the retention, in "
    "short batches; its output's metadata counts the rows deleted from each table.",
    # Nothing downstream reads a value: the counts are the metadata.
    out=dg.Out(dg.Nothing),
)
def purge_history(
    context: dg.OpExecutionContext, app_db: AppDatabase, history_retention: HistoryRetention
) -> dg.Output[None]:
    engine = app_db.ready_engine()
    cutoff = history_retention.cutoff(datetime.now(UTC))
    deleted = no_rows()
    try:
        for batch in purge_batches(engine, cutoff):
            for table, rows in batch.items():
                deleted[table] += rows
    except Exception as exc:
        # What earlier batches deleted is committed: the failure says so, with their counts, and the run fails
        # where Dagster users look (the Runs page's Failed filter). The next day's run continues the purge.
        raise dg.Failure(
            description=f"The purge stopped: {shown_cell(error_text(exc))[:500]}. Rows counted in this failure's "
            "metadata were deleted before it; the rest are as they were.",
            metadata=_metadata(deleted, cutoff, history_retention.retention_days),
        ) from exc
    summary = ", ".join(f"{n} from {table}" for table, n in deleted.items())
    context.log.info(f"Deleted the history finished before {cutoff.isoformat(timespec='seconds')}: {summary}.")
    return dg.Output(None, metadata=_metadata(deleted, cutoff, history_retention.retention_days))


@dg.job(
    name="history_purge_job",
    description="Deletes the history of finished work older than MARKETING_HISTORY_RETENTION_DAYS (finished "
    "executions and their attempts, finished agent runs and their transcripts, rejected event lines); "
    "SCHEDULED, RUNNING and QUEUED rows, events and rollups are never touched.",
)
def history_purge_job() -> None:
    purge_history()


@dg.schedule(
    name="history_purge_schedule",
    cron_schedule="30 3 * * *",
    execution_timezone="UTC",
    job=history_purge_job,
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="At 03:30 UTC, away from the 00:15 measurement run, deletes the history older than "
    "MARKETING_HISTORY_RETENTION_DAYS. Stop it to keep every row; `marketing-pipelines db purge` does the same by "
    "hand.",
)
def history_purge_schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    day = context.scheduled_execution_time.astimezone(UTC).date().isoformat()
    # One run per day however often the tick is evaluated (a restarted daemon catching up).
    return dg.RunRequest(run_key=f"history-purge:{day}")


def build_defs(settings: Settings) -> dg.Definitions:
    """The purge's job, its schedule and the ``history_retention`` resource ``settings`` configure."""
    return dg.Definitions(
        jobs=[history_purge_job],
        schedules=[history_purge_schedule],
        resources={"history_retention": resource_from_settings(HistoryRetention, settings)},
    )
