"""``within_retention``: a WARN check on each importer whose source forgets days, before a day is lost for good.

A source's contract says after how many days a day not read is gone (``retention_days``: GitHub keeps traffic 14
days, a release asset's running total only means a day if it is snapshotted within a day). A source that stops
answering, an expired credential, a stopped schedule: each leaves partitions unmaterialized while the days age.
The check lists every day within the source's retention whose partition was never materialized and WARNs once one
has waited past its grace (half its retention, at most a day after the day ended): the warning comes while the day
can still be read, with how long is left. Days that aged out unread are counted as lost.

``measurement_freshness_sensor`` records it each interval without a run, beside ``today_is_current``; executed from
the UI it computes the same from Dagster's record of materialized partitions.
"""

# No ``from __future__ import annotations``: Dagster reads the check's ``context`` annotation as a type, and a string
# fails the code location's load ("Cannot annotate `context` parameter with type ...").
from collections.abc import Collection, Mapping
from datetime import UTC, date, datetime, timedelta
from typing import Any

import dagster as dg

from marketing_pipelines.measurement.rollup.event_days import day_bounds
from marketing_pipelines.measurement.sources import Source

WITHIN_RETENTION = "within_retention"


def grace(retention_days: int) -> timedelta:
    """How long after its end an unread day may wait before the check warns: half the retention, at most a day."""
    return min(timedelta(days=1), timedelta(days=retention_days) / 2)


def retention_fields(source: Source, materialized: Collection[str], now: datetime, first: date) -> dict[str, Any]:
    """The check's outcome for ``source`` at ``now``: ``materialized`` holds its materialized partition keys,
    ``first`` is the first partition (MARKETING_MEASUREMENT_START_DATE)."""
    retention = source.contract.retention_days
    assert retention is not None, f"{source.name} keeps every day: no retention to check"
    today = now.astimezone(UTC).date()
    window_start = max(first, today - timedelta(days=retention))
    ended = [window_start + timedelta(days=n) for n in range((today - window_start).days)]
    unread = [day for day in ended if day.isoformat() not in materialized]
    overdue = [day for day in unread if now - day_bounds(day)[1] >= grace(retention)]
    metadata: dict[str, dg.MetadataValue] = {
        "retention_days": dg.MetadataValue.int(retention),
        "days_not_imported": dg.MetadataValue.int(len(unread)),
        "days_overdue": dg.MetadataValue.int(len(overdue)),
    }
    if not overdue:
        return _fields(
            source,
            True,
            f"{source.name}: every day of the last {retention} that is due was imported ({len(unread)} not yet due).",
            metadata,
        )
    oldest = overdue[0]
    left = day_bounds(oldest)[1] + timedelta(days=retention) - now
    metadata["oldest_overdue_day"] = dg.MetadataValue.text(oldest.isoformat())
    metadata["hours_left"] = dg.MetadataValue.float(round(max(left.total_seconds(), 0.0) / 3600, 1))
    return _fields(
        source,
        False,
        f"{source.name}: {len(overdue)} day(s) not imported ({_days(overdue)}); the source keeps a day {retention} "
        f"day(s) after it ends, so {oldest} is lost in about {max(left.total_seconds(), 0.0) / 3600:.0f} h. "
        f"Materialize those partitions of {source.asset} (is the source answering, is its credential valid?).",
        metadata,
    )


def _days(days: list[date]) -> str:
    shown = ", ".join(day.isoformat() for day in days[:5])
    return shown + (f" and {len(days) - 5} more" if len(days) > 5 else "")


def _fields(source: Source, passed: bool, description: str, metadata: Mapping[str, dg.MetadataValue]) -> dict[str, Any]:
    return {
        "asset_key": dg.AssetKey(source.asset),
        "check_name": WITHIN_RETENTION,
        "passed": passed,
        # WARN: the day can still be read when this fires; an ERROR would page for what a re-run fixes.
        "severity": dg.AssetCheckSeverity.WARN,
        "description": description,
        "metadata": dict(metadata),
    }


def retention_evaluation(instance: dg.DagsterInstance, source: Source, first: date) -> dict[str, Any]:
    """The check's fields for ``source`` now, from the instance's record of materialized partitions."""
    materialized = instance.get_materialized_partitions(dg.AssetKey(source.asset))
    return retention_fields(source, materialized, datetime.now(UTC), first)


def build_retention_check(source: Source, first: date) -> dg.AssetChecksDefinition:
    retention = source.contract.retention_days

    @dg.asset_check(
        asset=dg.AssetKey(source.asset),
        name=WITHIN_RETENTION,
        description=(
            f"{source.name} keeps a day only {retention} day(s) after it ends: WARN when a day of that window was "
            f"not imported {grace(retention or 1)} after it ended, with how long is left before it is lost. "
            "measurement_freshness_sensor evaluates it every interval without a run."
        ),
        blocking=False,
    )
    def within_retention(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        fields = retention_evaluation(context.instance, source, first)
        return dg.AssetCheckResult(
            passed=fields["passed"],
            severity=fields["severity"],
            description=fields["description"],
            metadata=fields["metadata"],
        )

    return within_retention


def sources_with_retention(sources: Collection[Source]) -> list[Source]:
    return [source for source in sources if source.contract.retention_days is not None]
