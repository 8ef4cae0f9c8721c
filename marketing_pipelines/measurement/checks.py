"""Asset checks of the measurement assets: the invariants a partition must hold after it is written.

They run inside the materialization (``check_specs`` on the assets), so every partition's
materialization carries its own results, and they read the database afresh after the write
committed: a late event that lands meanwhile shows up as a failed count check until the
late-events sensor re-runs the day.
"""

from datetime import date

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines.db.schema import github_release_download_daily, measurement_daily_rollup
from marketing_pipelines.measurement.rollup import event_count, rollup_first_party_total

ROLLUP_KEY = dg.AssetKey("measurement_daily_rollup")
DOWNLOADS_KEY = dg.AssetKey("github_release_downloads_daily")

FIRST_PARTY_COUNT_MATCHES = "first_party_count_matches_events"
UNIQUE_ACTORS_WITHIN_RAW_COUNT = "unique_actors_within_raw_count"
NO_UNFLAGGED_NEGATIVE_DELTA = "no_unflagged_negative_download_delta"

ROLLUP_CHECK_SPECS = [
    dg.AssetCheckSpec(
        FIRST_PARTY_COUNT_MATCHES,
        asset=ROLLUP_KEY,
        description="The day's first-party raw_count total equals the number of events that occurred that UTC day.",
    ),
    dg.AssetCheckSpec(
        UNIQUE_ACTORS_WITHIN_RAW_COUNT,
        asset=ROLLUP_KEY,
        description="No rollup row of the day has more unique actors than events.",
    ),
]
DOWNLOAD_CHECK_SPECS = [
    dg.AssetCheckSpec(
        NO_UNFLAGGED_NEGATIVE_DELTA,
        asset=DOWNLOADS_KEY,
        description="Every negative raw delta of the day is clamped to 0 and flagged negative_clamped.",
    )
]


def check_first_party_count(conn: sa.Connection, day: date) -> dg.AssetCheckResult:
    events, rolled_up = event_count(conn, day), rollup_first_party_total(conn, day)
    return dg.AssetCheckResult(
        check_name=FIRST_PARTY_COUNT_MATCHES,
        asset_key=ROLLUP_KEY,
        passed=events == rolled_up,
        # Late events are expected between a write and the sensor's re-run; a warning, not an error.
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"events": dg.MetadataValue.int(events), "rollup_raw_count": dg.MetadataValue.int(rolled_up)},
    )


def check_unique_actors_within_raw_count(conn: sa.Connection, day: date) -> dg.AssetCheckResult:
    r = measurement_daily_rollup
    bad = int(
        conn.execute(sa.select(sa.func.count()).where(r.c.day == day, r.c.unique_actors > r.c.raw_count)).scalar_one()
    )
    return dg.AssetCheckResult(
        check_name=UNIQUE_ACTORS_WITHIN_RAW_COUNT,
        asset_key=ROLLUP_KEY,
        passed=bad == 0,
        metadata={"violating_rows": dg.MetadataValue.int(bad)},
    )


def check_no_unflagged_negative_delta(conn: sa.Connection, day: date) -> dg.AssetCheckResult:
    g = github_release_download_daily
    bad = int(
        conn.execute(
            sa.select(sa.func.count()).where(
                g.c.day == day,
                sa.or_(
                    sa.and_(g.c.raw_delta < 0, g.c.negative_clamped.is_(False)),
                    g.c.downloads < 0,
                ),
            )
        ).scalar_one()
    )
    flagged = int(
        conn.execute(sa.select(sa.func.count()).where(g.c.day == day, g.c.negative_clamped.is_(True))).scalar_one()
    )
    return dg.AssetCheckResult(
        check_name=NO_UNFLAGGED_NEGATIVE_DELTA,
        asset_key=DOWNLOADS_KEY,
        passed=bad == 0,
        metadata={"unflagged_negative": dg.MetadataValue.int(bad), "flagged_negative": dg.MetadataValue.int(flagged)},
    )
