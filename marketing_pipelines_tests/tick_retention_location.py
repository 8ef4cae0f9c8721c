"""A code location of one sensor and one schedule that always skip: what test_tick_retention.py lets Dagster's
daemon tick, in a code server of its own, to watch the daemon purge their old ticks."""

import dagster as dg


@dg.op
def nothing() -> None:
    """Never runs: both instigators skip."""


@dg.job
def never_run_job() -> None:
    nothing()


@dg.sensor(job=never_run_job, default_status=dg.DefaultSensorStatus.RUNNING)
def always_skipping_sensor() -> dg.SkipReason:
    return dg.SkipReason("nothing to do")


@dg.schedule(
    job=never_run_job,
    cron_schedule="* * * * *",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
)
def every_minute_schedule() -> dg.SkipReason:
    return dg.SkipReason("nothing to do")


defs = dg.Definitions(jobs=[never_run_job], sensors=[always_skipping_sensor], schedules=[every_minute_schedule])
