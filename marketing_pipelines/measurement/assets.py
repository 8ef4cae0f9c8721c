"""Daily-partitioned measurement assets: raw events (loaded outside Dagster), the two importers, and the rollup.

Partitions are UTC days from ``MARKETING_MEASUREMENT_START_DATE`` up to and including today.
Every asset replaces exactly its partition's day, so any partition can be re-run or backfilled.
"""

from collections.abc import Mapping
from datetime import UTC, date

import dagster as dg

from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.http import RateLimited, ServiceError
from marketing_pipelines.measurement.checks import (
    DOWNLOAD_CHECK_SPECS,
    ROLLUP_CHECK_SPECS,
    check_first_party_count,
    check_no_unflagged_negative_delta,
    check_unique_actors_within_raw_count,
)
from marketing_pipelines.measurement.importers.base import Importer
from marketing_pipelines.measurement.importers.github import GitHubReleasesClient
from marketing_pipelines.measurement.importers.plausible import PlausibleClient
from marketing_pipelines.measurement.imports import (
    campaign_repos,
    import_repo_day,
    replace_site_analytics_day,
)
from marketing_pipelines.measurement.rollup import replace_rollup_day
from marketing_pipelines.settings import Settings

GROUP = "measurement"
OWNERS = ["team:marketing-data"]
NOT_CONFIGURED = "not configured"
# GitHub: a RateLimited wait longer than its RetryPolicy.max_wait_s frees the worker; Dagster re-runs the step later.
RATE_LIMIT_RETRIES = 3

measurement_partitions = dg.DailyPartitionsDefinition(
    start_date=Settings.from_env().measurement_start_date.isoformat(),
    timezone="UTC",
    # Today's partition exists so the late-events sensor can keep today's numbers current;
    # the daily schedule materializes the completed day (yesterday).
    end_offset=1,
)

marketing_event_asset = dg.AssetSpec(
    "marketing_event",
    description=(
        "Raw first-party marketing events, written by `marketing-pipelines events load` and by "
        "`record_events` in the application. One row is one event (event_id is the dedupe key)."
    ),
    group_name=GROUP,
    kinds={"sql"},
    owners=OWNERS,
)


def partition_day(context: dg.AssetExecutionContext) -> date:
    return context.partition_time_window.start.astimezone(UTC).date()


def not_configured_result(importer: Importer, checks: list[dg.AssetCheckResult] | None = None) -> dg.MaterializeResult:
    # Materializes nothing and says why, instead of failing: the rollup and the other importer
    # in the same run still run, and the UI shows the reason on every partition.
    return dg.MaterializeResult(
        metadata={
            "rows": dg.MetadataValue.int(0),
            "status": dg.MetadataValue.text(NOT_CONFIGURED),
            "reason": dg.MetadataValue.text(f"{importer.name}: {importer.not_configured_reason()}"),
        },
        check_results=checks,
    )


def _ints(values: Mapping[str, int]) -> dict[str, dg.MetadataValue]:
    return {key: dg.MetadataValue.int(value) for key, value in values.items()}


@dg.asset(
    name="site_analytics_daily",
    partitions_def=measurement_partitions,
    group_name=GROUP,
    kinds={"python", "plausible", "sql"},
    owners=OWNERS,
)
def site_analytics_daily(
    context: dg.AssetExecutionContext, app_db: AppDatabase, plausible: PlausibleClient
) -> dg.MaterializeResult:
    """Table ``site_analytics_daily``: one row is one page's visitors and pageviews on one day from the
    visits tagged with one utm_campaign. Plausible buckets days in the site's own time zone; set the site
    to UTC in Plausible so its days line up with the events' UTC days.
    """
    day = partition_day(context)
    if not plausible.is_configured():
        context.log.info(f"{plausible.name} is not configured: {plausible.not_configured_reason()}")
        return not_configured_result(plausible)
    engine = app_db.ready_engine()
    # Plausible's limit is an hourly window with no Retry-After: the client fails the partition at
    # once ("retry after the hour") rather than keep a run waiting or spend more requests.
    rows = plausible.daily_campaign_stats(day)
    summary = replace_site_analytics_day(engine, day, rows)
    if summary.unmapped_utm_campaigns:
        context.log.warning(
            f"utm_campaign values with no campaign (set campaign.utm_campaign to count them): "
            f"{', '.join(summary.unmapped_utm_campaigns[:20])}"
        )
    return dg.MaterializeResult(
        metadata={
            **_ints(
                {
                    "rows": summary.rows,
                    "visitors": summary.visitors,
                    "pageviews": summary.pageviews,
                    "utm_campaigns": summary.utm_campaigns,
                    "unmapped_utm_campaigns": len(summary.unmapped_utm_campaigns),
                }
            ),
            "status": dg.MetadataValue.text("imported"),
        }
    )


@dg.asset(
    name="github_release_downloads_daily",
    partitions_def=measurement_partitions,
    group_name=GROUP,
    kinds={"python", "github", "sql"},
    owners=OWNERS,
    check_specs=DOWNLOAD_CHECK_SPECS,
)
def github_release_downloads_daily(
    context: dg.AssetExecutionContext, app_db: AppDatabase, github: GitHubReleasesClient
) -> dg.MaterializeResult:
    """Table ``github_release_download_daily``: one row is one release asset's downloads on one UTC day,
    the difference between its snapshot for that day and the repository's previous snapshot (rows of a
    repository's first snapshot are baselines with no known downloads). Snapshots are kept per asset id
    and day in ``github_release_asset_snapshot``.

    GitHub only reports current totals: a partition takes a snapshot only while its day ended less
    than a day ago; re-running an older partition re-derives its deltas from the stored snapshot.
    """
    day = partition_day(context)
    engine = app_db.ready_engine()
    if not github.is_configured():
        context.log.info(f"{github.name} is not configured: {github.not_configured_reason()}")
        with engine.connect() as conn:
            return not_configured_result(github, [check_no_unflagged_negative_delta(conn, day)])
    with engine.connect() as conn:
        repos = campaign_repos(conn)
    results, errors = [], []
    for repo in repos:
        try:
            results.append(import_repo_day(engine, github, repo, day))
        except RateLimited as exc:
            raise dg.RetryRequested(max_retries=RATE_LIMIT_RETRIES, seconds_to_wait=exc.retry_after_s) from exc
        except ServiceError as exc:
            errors.append(f"{repo}: {exc}")
    if errors:
        # The repos that worked are stored; re-running the partition redoes all of them idempotently.
        raise dg.Failure(description=f"{len(errors)} of {len(repos)} repositories failed: " + "; ".join(errors))
    missing = [r.repo for r in results if r.snapshot == "missing"]
    if missing:
        context.log.warning(
            f"No snapshot for {day} of {', '.join(missing)}: the day ended more than a day ago and GitHub "
            "reports only current totals, so its downloads cannot be reconstructed."
        )
    moved = {r.repo: r.moved_to for r in results if r.moved_to}
    with engine.connect() as conn:
        check = check_no_unflagged_negative_delta(conn, day)
    return dg.MaterializeResult(
        metadata={
            # A renamed or transferred repository still imports (GitHub redirects it); update the
            # campaign's github_repo to the new name when it shows here.
            **({"moved_repos": dg.MetadataValue.json(moved)} if moved else {}),
            **_ints(
                {
                    "rows": sum(len(r.deltas) for r in results),
                    "repos": len(repos),
                    "downloads": sum(r.downloads for r in results),
                    "repos_fetched": sum(r.snapshot == "fetched" for r in results),
                    "repos_not_modified": sum(r.snapshot == "not_modified" for r in results),
                    "repos_baseline": sum(r.baseline for r in results),
                    "repos_without_snapshot": len(missing),
                    "negative_deltas_clamped": sum(r.negative_clamped for r in results),
                }
            ),
            "status": dg.MetadataValue.text("imported"),
        },
        check_results=[check],
    )


@dg.asset(
    name="measurement_daily_rollup",
    partitions_def=measurement_partitions,
    group_name=GROUP,
    kinds={"sql", "datasketches"},
    owners=OWNERS,
    deps=[marketing_event_asset, site_analytics_daily, github_release_downloads_daily],
    check_specs=ROLLUP_CHECK_SPECS,
)
def measurement_daily_rollup(context: dg.AssetExecutionContext, app_db: AppDatabase) -> dg.MaterializeResult:
    """Table ``measurement_daily_rollup``: one row is one (UTC day, campaign, source, stage, event type) with
    its raw_count, its exact unique_actors that day (NULL for imported rows, whose actors are unknown) and
    the serialized HLL sketch of its actor ids, which the report merges for unique actors over a range.
    Sources: ``first_party`` events, ``site_analytics`` pageviews (by campaign.utm_campaign) and
    ``github_releases`` downloads (by campaign.github_repo). Also refreshes the day's ISO week in
    ``measurement_weekly_sketch``, the per-week sketch unions the report merges for whole weeks.
    """
    day = partition_day(context)
    engine = app_db.ready_engine()
    # Idempotent: replace_rollup_day deletes and rebuilds the day in one transaction.
    summary = replace_rollup_day(engine, day)
    with engine.connect() as conn:
        checks = [check_first_party_count(conn, day), check_unique_actors_within_raw_count(conn, day)]
    return dg.MaterializeResult(
        metadata=_ints(
            {
                "rows": summary.rows,
                "first_party_rows": summary.first_party_rows,
                "first_party_events": summary.first_party_events,
                "unique_actors_sum": summary.unique_actors_sum,
                "site_pageviews": summary.site_pageviews,
                "downloads": summary.downloads,
                "campaigns": summary.campaigns,
                "weekly_sketch_rows": summary.week_rows,
            }
        )
        | {"week_start": dg.MetadataValue.text(summary.week_start.isoformat())},
        check_results=checks,
    )


measurement_daily_job = dg.define_asset_job(
    "measurement_daily_job",
    selection=[site_analytics_daily, github_release_downloads_daily, measurement_daily_rollup],
    description="Imports one day from Plausible and GitHub, then rebuilds that day's rollup.",
)
measurement_rollup_job = dg.define_asset_job(
    "measurement_rollup_job",
    selection=[measurement_daily_rollup],
    description="Rebuilds one day's rollup from the events and imports already stored (late events).",
)
