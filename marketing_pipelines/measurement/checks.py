"""Asset checks of the measurement assets: the invariants a partition must hold after it is written.

They run inside the materialization (``check_specs`` on the assets) and read the database afresh
after the write committed: a late event that lands meanwhile shows up as a failed count check until
the late-events sensor re-runs the day.

The rollup's checks are partitioned like the rollup (``rollup_check_specs``): each day of a run gets
its own result on its own partition, so the UI shows a failing day on that day, a backfill run's
range included. The importers' checks give one result per check and run, naming the failing days
in its metadata.
"""

import warnings
from collections.abc import Sequence
from datetime import date

import dagster as dg
import sqlalchemy as sa

# Dagster 1.13 exports AssetCheckEvaluation but not the record naming the materialization it checked. Without
# it the UI takes a partition's result as stale and shows no status there (AssetCheckPartitionInfo.is_current).
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

from marketing_pipelines.db.schema import github_release_download_daily, measurement_daily_rollup, site_analytics_daily
from marketing_pipelines.measurement.keys import DOWNLOADS_KEY, ROLLUP_KEY, SITE_KEY
from marketing_pipelines.measurement.rollup.daily import rollup_first_party_per_day
from marketing_pipelines.measurement.rollup.event_days import events_per_day

FIRST_PARTY_COUNT_MATCHES = "first_party_count_matches_events"
UNIQUE_ACTORS_WITHIN_RAW_COUNT = "unique_actors_within_raw_count"
NO_UNFLAGGED_NEGATIVE_DELTA = "no_unflagged_negative_download_delta"
SITE_COUNTS_CONSISTENT = "site_counts_consistent"


def rollup_check_specs(partitions_def: dg.PartitionsDefinition) -> list[dg.AssetCheckSpec]:
    """The rollup's checks, partitioned by ``partitions_def`` (the rollup's own): one result per day."""
    with warnings.catch_warnings():
        # "partitions_def on an AssetCheckSpec is in preview": Dagster is pinned exactly, and
        # test_rollup_metadata.py holds the per-partition results the UI reads.
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return [
            dg.AssetCheckSpec(
                FIRST_PARTY_COUNT_MATCHES,
                asset=ROLLUP_KEY,
                description=(
                    "The day's first-party raw_count total equals the number of events that occurred that UTC day."
                ),
                partitions_def=partitions_def,
            ),
            dg.AssetCheckSpec(
                UNIQUE_ACTORS_WITHIN_RAW_COUNT,
                asset=ROLLUP_KEY,
                description="No rollup row of the day has more unique actors than events.",
                partitions_def=partitions_def,
            ),
        ]


DOWNLOAD_CHECK_SPECS = [
    dg.AssetCheckSpec(
        NO_UNFLAGGED_NEGATIVE_DELTA,
        asset=DOWNLOADS_KEY,
        description="Every negative raw delta of the day is clamped to 0 and flagged negative_clamped.",
    )
]
SITE_CHECK_SPECS = [
    dg.AssetCheckSpec(
        SITE_COUNTS_CONSISTENT,
        asset=SITE_KEY,
        description=(
            "No row of the day has a negative visitors or pageviews count (severity ERROR: the rollup sums pageviews) "
            "or more visitors than pageviews (severity WARN: Plausible counts a visitor on a page for a custom event "
            "there too, so a page can legitimately have visitors without pageviews)."
        ),
    )
]


# Days named in a failed check's metadata, at most: a year-long range lists its first few.
LISTED_DAYS = 20


def _days_metadata(days: Sequence[date]) -> dict[str, dg.MetadataValue]:
    return {
        "failing_days": dg.MetadataValue.int(len(days)),
        **(
            {"first_failing_days": dg.MetadataValue.text(", ".join(d.isoformat() for d in days[:LISTED_DAYS]))}
            if days
            else {}
        ),
    }


def check_first_party_count(conn: sa.Connection, days: Sequence[date]) -> dict[date, dg.AssetCheckResult]:
    """Each day of ``days``: the rollup's first-party raw_count equals the day's events. Two queries for the range."""
    events, rolled_up = events_per_day(conn, days), rollup_first_party_per_day(conn, days)
    return {
        day: dg.AssetCheckResult(
            check_name=FIRST_PARTY_COUNT_MATCHES,
            asset_key=ROLLUP_KEY,
            passed=events[day] == rolled_up[day],
            # Late events are expected between a write and the sensor's re-run; a warning, not an error.
            severity=dg.AssetCheckSeverity.WARN,
            metadata={
                "events": dg.MetadataValue.int(events[day]),
                "rollup_raw_count": dg.MetadataValue.int(rolled_up[day]),
            },
        )
        for day in days
    }


def check_unique_actors_within_raw_count(conn: sa.Connection, days: Sequence[date]) -> dict[date, dg.AssetCheckResult]:
    """Each day of ``days``: no rollup row has more unique actors than events. One query for the range."""
    r = measurement_daily_rollup
    bad = dict(
        conn.execute(
            sa.select(r.c.day, sa.func.count())
            .where(r.c.day.in_(list(days)), r.c.unique_actors > r.c.raw_count)
            .group_by(r.c.day)
        ).all()
    )
    return {
        day: dg.AssetCheckResult(
            check_name=UNIQUE_ACTORS_WITHIN_RAW_COUNT,
            asset_key=ROLLUP_KEY,
            passed=not bad.get(day),
            metadata={"violating_rows": dg.MetadataValue.int(int(bad.get(day, 0)))},
        )
        for day in days
    }


def on_partition(instance: dg.DagsterInstance, result: dg.AssetCheckResult, day: date) -> dg.AssetCheckEvaluation:
    """``result`` as its check's evaluation on ``day``'s partition, against that partition's latest materialization.

    A run yields an AssetCheckResult at most once per check, and Dagster gives it the run's partition,
    which a backfill run over a range does not have: the result would land on no partition at all.
    Yield this after the day's materialization: it reads that back (as Dagster does for a result).
    """
    if result.asset_key is None or result.check_name is None:
        raise ValueError("a partitioned check result needs its asset_key and check_name")
    partition = day.isoformat()
    latest = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=result.asset_key, asset_partitions=[partition]), limit=1
    ).records
    return dg.AssetCheckEvaluation(
        asset_key=result.asset_key,
        check_name=result.check_name,
        passed=result.passed,
        metadata=result.metadata,
        target_materialization_data=(
            AssetCheckEvaluationTargetMaterializationData(
                run_id=latest[0].run_id, storage_id=latest[0].storage_id, timestamp=latest[0].timestamp
            )
            if latest
            else None
        ),
        severity=result.severity,
        description=result.description,
        blocking=False,  # as the rollup's specs (a blocking check would also need the spec's flag here)
        partition=partition,
    )


def check_no_unflagged_negative_delta(conn: sa.Connection, days: Sequence[date]) -> dg.AssetCheckResult:
    g = github_release_download_daily
    in_range = g.c.day.in_(list(days))
    unflagged = sa.or_(sa.and_(g.c.raw_delta < 0, g.c.negative_clamped.is_(False)), g.c.downloads < 0)
    bad = conn.execute(
        sa.select(g.c.day, sa.func.count()).where(in_range, unflagged).group_by(g.c.day).order_by(g.c.day)
    ).all()
    flagged = int(conn.execute(sa.select(sa.func.count()).where(in_range, g.c.negative_clamped.is_(True))).scalar_one())
    return dg.AssetCheckResult(
        check_name=NO_UNFLAGGED_NEGATIVE_DELTA,
        asset_key=DOWNLOADS_KEY,
        passed=not bad,
        metadata={
            "unflagged_negative": dg.MetadataValue.int(sum(n for _, n in bad)),
            "flagged_negative": dg.MetadataValue.int(flagged),
            **_days_metadata([d for d, _ in bad]),
        },
    )


def check_site_counts(conn: sa.Connection, days: Sequence[date]) -> dg.AssetCheckResult:
    """Per day of ``days``: no negative counts (ERROR) and no page with more visitors than pageviews (WARN)."""
    s = site_analytics_daily
    negative = sa.or_(s.c.visitors < 0, s.c.pageviews < 0)
    # A row counts once, as its worse problem.
    more_visitors = sa.and_(s.c.visitors > s.c.pageviews, sa.not_(negative))
    bad = conn.execute(
        sa.select(
            s.c.day,
            sa.func.sum(sa.case((negative, 1), else_=0)),
            sa.func.sum(sa.case((more_visitors, 1), else_=0)),
        )
        .where(s.c.day.in_(list(days)), sa.or_(negative, more_visitors))
        .group_by(s.c.day)
        .order_by(s.c.day)
    ).all()
    negative_rows = sum(int(n) for _, n, _ in bad)
    return dg.AssetCheckResult(
        check_name=SITE_COUNTS_CONSISTENT,
        asset_key=SITE_KEY,
        passed=not bad,
        # A negative count cannot come from Plausible and corrupts the rollup; more visitors than pageviews can.
        severity=dg.AssetCheckSeverity.ERROR if negative_rows else dg.AssetCheckSeverity.WARN,
        metadata={
            "negative_count_rows": dg.MetadataValue.int(negative_rows),
            "visitors_over_pageviews_rows": dg.MetadataValue.int(sum(int(n) for _, _, n in bad)),
            **_days_metadata([d for d, _, _ in bad]),
        },
    )
