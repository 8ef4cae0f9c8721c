"""The rollup: the daily rollup (``daily``), its weekly sketch index (``weekly``) and the UTC day (``event_days``).

The names below stay importable from here, as they were before the split; each lives in the module named.
"""

from __future__ import annotations

from marketing_pipelines.measurement.rollup.daily import (
    FIRST_PARTY,
    GITHUB_RELEASES,
    RELEASE_EVENT_TYPE,
    RELEASE_STAGE,
    SITE_ANALYTICS,
    SITE_EVENT_TYPE,
    SITE_STAGE,
    FirstPartyAggregate,
    RollupSummary,
    RowKey,
    first_party_day,
    partition_transaction,
    replace_rollup_day,
    replace_rollup_days,
    rollup_first_party_per_day,
)
from marketing_pipelines.measurement.rollup.daily import _in_day as _in_day  # a test guards its SQL
from marketing_pipelines.measurement.rollup.event_days import (
    day_bounds,
    days_with_events_ingested,
    events_per_day,
    utc_day,
)
from marketing_pipelines.measurement.rollup.weekly import (
    WEEK_LOCK_NAMESPACE,
    DailyMember,
    WeekRow,
    merge_week,
    rebuild_all_weeks,
    refresh_week,
    week_start,
)

__all__ = [
    "FIRST_PARTY",
    "GITHUB_RELEASES",
    "RELEASE_EVENT_TYPE",
    "RELEASE_STAGE",
    "SITE_ANALYTICS",
    "SITE_EVENT_TYPE",
    "SITE_STAGE",
    "WEEK_LOCK_NAMESPACE",
    "DailyMember",
    "FirstPartyAggregate",
    "RollupSummary",
    "RowKey",
    "WeekRow",
    "day_bounds",
    "days_with_events_ingested",
    "events_per_day",
    "first_party_day",
    "merge_week",
    "partition_transaction",
    "rebuild_all_weeks",
    "refresh_week",
    "replace_rollup_day",
    "replace_rollup_days",
    "rollup_first_party_per_day",
    "utc_day",
    "week_start",
]
