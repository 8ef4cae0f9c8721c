"""``measurement_daily_schedule``: imports and rolls up the UTC day that just ended, and again the days a source
may still revise."""

from collections.abc import Sequence
from datetime import UTC, date, timedelta

import dagster as dg

from marketing_pipelines.measurement.assets import measurement_daily_job
from marketing_pipelines.measurement.sources import Source
from marketing_pipelines.run_tags import REVISION_OF
from marketing_pipelines.settings import Settings


def revision_requests(yesterday: date, sources: Sequence[Source], first: date) -> list[dg.RunRequest]:
    """A run per earlier day that a configured source may still revise (``contract.revision_days``): that day of
    the sources revising it. Its rollup follows by declarative automation (assets.ROLLUP_AUTOMATION, evaluated by
    measurement_automation_sensor) once the import succeeded. Yesterday's own run imports every source and rolls
    the day up."""
    by_day: dict[date, list[Source]] = {}
    for source in sources:
        for day in source.contract.revised_days(yesterday):
            if day >= first:
                by_day.setdefault(day, []).append(source)
    return [
        dg.RunRequest(
            # Once per (revised day, schedule day): each later tick within the window imports the day again.
            run_key=f"measurement-revision:{day.isoformat()}:{yesterday.isoformat()}",
            partition_key=day.isoformat(),
            asset_selection=[dg.AssetKey(s.asset) for s in revising],
            tags={REVISION_OF: ",".join(s.name for s in revising)},
        )
        for day, revising in sorted(by_day.items(), reverse=True)
    ]


def build_measurement_daily_schedule(settings: Settings, sources: Sequence[Source] = ()) -> dg.ScheduleDefinition:
    """The schedule over the partitions ``settings`` start (MARKETING_MEASUREMENT_START_DATE); ``sources`` are the
    configured importers' sources, whose revision windows add runs."""
    first = settings.measurement_start_date
    revising = [s for s in sources if s.contract.revision_days > 0]
    revision_note = (
        " Then re-imports the days "
        + ", ".join(f"{s.name} may revise ({s.contract.revision_days} before)" for s in revising)
        + "; measurement_automation_sensor rebuilds their rollup."
        if revising
        else ""
    )

    @dg.schedule(
        name="measurement_daily_schedule",
        cron_schedule="15 0 * * *",
        execution_timezone="UTC",
        job=measurement_daily_job,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=(
            "At 00:15 UTC, materializes yesterday's partition of the importers and the rollup. Fifteen minutes "
            "lets events of the last seconds arrive; later ones are picked up by measurement_late_events_sensor."
            + revision_note
        ),
    )
    def measurement_daily_schedule(context: dg.ScheduleEvaluationContext) -> list[dg.RunRequest] | dg.SkipReason:
        yesterday = (context.scheduled_execution_time.astimezone(UTC) - timedelta(days=1)).date()
        if yesterday < first:
            return dg.SkipReason(f"{yesterday} is before MARKETING_MEASUREMENT_START_DATE")
        key = yesterday.isoformat()
        # One run per day however often the tick is evaluated (e.g. a restarted daemon catching up).
        return [
            dg.RunRequest(run_key=f"measurement-daily:{key}", partition_key=key),
            *revision_requests(yesterday, revising, first),
        ]

    return measurement_daily_schedule
