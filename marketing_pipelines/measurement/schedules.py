"""``measurement_daily_schedule``: imports and rolls up the UTC day that just ended."""

from datetime import UTC, timedelta

import dagster as dg

from marketing_pipelines.measurement.assets import measurement_daily_job
from marketing_pipelines.settings import Settings


def build_measurement_daily_schedule(settings: Settings) -> dg.ScheduleDefinition:
    """The schedule over the partitions ``settings`` start (MARKETING_MEASUREMENT_START_DATE)."""
    first = settings.measurement_start_date

    @dg.schedule(
        name="measurement_daily_schedule",
        cron_schedule="15 0 * * *",
        execution_timezone="UTC",
        job=measurement_daily_job,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=(
            "At 00:15 UTC, materializes yesterday's partition of the importers and the rollup. Fifteen minutes "
            "lets events of the last seconds arrive; later ones are picked up by measurement_late_events_sensor."
        ),
    )
    def measurement_daily_schedule(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
        yesterday = (context.scheduled_execution_time.astimezone(UTC) - timedelta(days=1)).date()
        if yesterday < first:
            return dg.SkipReason(f"{yesterday} is before MARKETING_MEASUREMENT_START_DATE")
        key = yesterday.isoformat()
        # One run per day however often the tick is evaluated (e.g. a restarted daemon catching up).
        return dg.RunRequest(run_key=f"measurement-daily:{key}", partition_key=key)

    return measurement_daily_schedule
