"""Daily-partitioned measurement assets, one ``@dg.asset`` per table: raw events (loaded outside Dagster), the
two importers (in the definitions only while their sources are configured), and the rollup.

Partitions are UTC days from ``MARKETING_MEASUREMENT_START_DATE`` up to and including today.
Every asset replaces exactly its partitions' days, so any partition can be re-run or backfilled;
a backfill run covers a range of days in one pass (``BackfillPolicy.multi_run``).
"""

import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from typing import Any

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines.db.engine import may_succeed_later
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.http import RateLimited, ServiceError
from marketing_pipelines.measurement.checks import (
    DOWNLOAD_CHECK_SPECS,
    FIRST_PARTY_COUNT_MATCHES,
    SITE_CHECK_SPECS,
    UNIQUE_ACTORS_WITHIN_RAW_COUNT,
    check_first_party_count,
    check_no_unflagged_negative_delta,
    check_site_counts,
    check_unique_actors_within_raw_count,
    on_partition,
    rollup_check_specs,
)
from marketing_pipelines.measurement.events.write import IngestionReading, ingestion_reading
from marketing_pipelines.measurement.importers.base import (
    MAX_COUNT,
    Importer,
    MetricImporter,
    MetricRow,
    QuotaExhausted,
)
from marketing_pipelines.measurement.importers.github import GitHubReleasesClient
from marketing_pipelines.measurement.importers.plausible import PlausibleClient
from marketing_pipelines.measurement.importers.store import (
    campaign_keys,
    campaign_repos,
    import_repo_day,
    replace_metric_days,
    replace_site_analytics_day,
)
from marketing_pipelines.measurement.keys import DOWNLOADS_KEY, ROLLUP_KEY, SITE_KEY
from marketing_pipelines.measurement.quota import request_gate
from marketing_pipelines.measurement.report.charts import funnel_chart_markdown
from marketing_pipelines.measurement.report.rendering import funnel_markdown
from marketing_pipelines.measurement.rollup.daily import (
    FIRST_PARTY,
    MAX_SHOWN_COUNTS,
    SOURCE_COUNT_NOUNS,
    RollupSummary,
    replace_rollup_days,
)
from marketing_pipelines.measurement.sources import (
    GITHUB_RELEASES,
    METRIC_TABLE,
    SITE_ANALYTICS,
    SOURCES,
    Source,
    missing_variables,
)
from marketing_pipelines.observable import observable_assets
from marketing_pipelines.redact import redact_text, shown_cell, visible_controls
from marketing_pipelines.settings import Settings

GROUP = "measurement"
OWNERS = ["team:marketing-data"]
# GitHub's RateLimited, and a source's shared quota (quota.py) short for longer than a step may wait, free the
# worker: Dagster re-runs the step later.
RATE_LIMIT_RETRIES = 3
# A step that failed transiently (5xx or transport errors that outlasted the HTTP client's own attempts, a dropped
# database connection, a lock or serialization conflict) re-runs the whole step, 30 s, 90 s and 210 s later
# (exponential), each +/- up to 30 s so replicas that failed together do not retry together. A re-run rewrites rather
# than adds: every day is replaced in its own transaction. Every other failure (credentials, a rejected query,
# Plausible's hourly limit, days outside the partitions, a missing schema, a bug) fails the step at once:
# Dagster's RetryPolicy retries any exception but a Failure with allow_retries=False (failures_classified).
IMPORT_RETRY_POLICY = dg.RetryPolicy(
    max_retries=3, delay=30, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
)
ROLLUP_IO_MANAGER = "rollup_frames"
# Each measurement asset (every source's importer and the rollup) is materialized by measurement_daily_schedule at
# 00:15 UTC: one that has not been by 06:00 UTC is FAILING in the UI's freshness (Dagster's freshness daemon,
# on by default, evaluates it every 30 s), so a source that stopped answering shows on its own asset, by name,
# where the catalog and the asset's page show health. Any partition's materialization counts, as Dagster's
# policies are per asset; within_retention (retention.py) says which days are missing.
DAILY_FRESHNESS = dg.FreshnessPolicy.cron(deadline_cron="0 6 * * *", lower_bound_delta=timedelta(hours=6))
# The tags of a run over a partition range, as a backfill run carries them (Dagster does not re-export the names).
RANGE_START_TAG, RANGE_END_TAG = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"


def measurement_partitions(start_date: date) -> dg.DailyPartitionsDefinition:
    """UTC days from ``start_date`` (MARKETING_MEASUREMENT_START_DATE) up to and including today."""
    return dg.DailyPartitionsDefinition(
        start_date=start_date.isoformat(),
        timezone="UTC",
        # Today's partition exists so the late-events sensor can keep today's numbers current;
        # the daily schedule materializes the completed day (yesterday).
        end_offset=1,
    )


MARKETING_EVENT_KEY = dg.AssetKey("marketing_event")
# A day of the rollup is rebuilt, by measurement_automation_sensor, once a day of an importer it reads was
# materialized by a run that did not also rebuild it: a source's revised day (measurement_daily_schedule's revision
# runs import only), an importer's partition re-run or backfilled from the UI. Dagster's any_deps_updated already
# skips an update whose run also materializes the rollup (the daily job, `backfill --imports`), and waits while an
# importer of the day or the day itself is in progress. The raw events are not in it: marketing_event is one
# observed table, not per day, and an observation would mark every day; measurement_late_events_sensor knows
# which days late events fall on (sensors.py).
ROLLUP_AUTOMATION = (
    dg.AutomationCondition.any_deps_updated().ignore(dg.AssetSelection.assets(MARKETING_EVENT_KEY)).since_last_handled()
    & ~dg.AutomationCondition.any_deps_in_progress()
    & ~dg.AutomationCondition.in_progress()
).with_label("an importer's day changed since this day was built")
marketing_event_asset = dg.AssetSpec(
    MARKETING_EVENT_KEY,
    description=(
        "Raw first-party marketing events, written by `marketing-pipelines events load` and by "
        "`record_events` in the application. One row is one event (event_id is the dedupe key). Observed "
        "by measurement_late_events_sensor each tick: `last_ingested_at`, `ingested_last_hour`."
    ),
    group_name=GROUP,
    kinds={"sql"},
    owners=OWNERS,
)


def marketing_event_observation(reading: IngestionReading) -> dg.AssetObservation:
    """One reading of the raw events table; the late-events sensor records one each tick."""
    last = reading.last_ingested_at
    return dg.AssetObservation(
        MARKETING_EVENT_KEY,
        metadata={
            "ingested_last_hour": dg.MetadataValue.int(reading.ingested_last_hour),
            "last_ingested_at": dg.MetadataValue.timestamp(last) if last else dg.MetadataValue.text("no event yet"),
        },
    )


def _observe_marketing_event(context: dg.AssetExecutionContext) -> Iterator[dg.ObserveResult]:
    with context.resources.app_db.ready_engine().connect() as conn:
        observation = marketing_event_observation(ingestion_reading(conn, datetime.now(UTC)))
    yield dg.ObserveResult(asset_key=observation.asset_key, metadata=observation.metadata)


observe_marketing_event = observable_assets(
    [marketing_event_asset],
    "observe_marketing_event",
    "One reading of the raw events table, as measurement_late_events_sensor records it every tick.",
    _observe_marketing_event,
)


def partition_days(context: dg.AssetExecutionContext) -> list[date]:
    """The UTC days of the run: one for a scheduled or sensor run, a range for a backfill run.

    Fails the step, without a retry and before anything is written, when a day is not one of the asset's
    partitions: a run created by a process whose MARKETING_MEASUREMENT_START_DATE differs from this code
    location's (Dagster checks the range only when the metadata of its first day is recorded, after the
    days were written)."""
    window = context.partition_time_window
    first, end = window.start.astimezone(UTC).date(), window.end.astimezone(UTC).date()
    days = [first + timedelta(days=n) for n in range((end - first).days)]
    partitions_def = context.assets_def.partitions_def
    outside = [d for d in days if partitions_def is None or not partitions_def.has_partition_key(d.isoformat())]
    if outside:
        first_key = partitions_def.get_first_partition_key() if partitions_def is not None else None
        raise dg.Failure(
            description=(
                f"{len(outside)} of the run's days ({_span(outside)}) are not partitions of this code location, "
                f"which start on {first_key} (MARKETING_MEASUREMENT_START_DATE) and end today: the run was created "
                "where that setting differs. Give every process that loads the code the same value; nothing was "
                "written, and a retry would fail the same way."
            ),
            allow_retries=False,
        )
    return days


@contextmanager
def failures_classified() -> Iterator[None]:
    """A measurement step's failure, retried by the step's RetryPolicy only when a later attempt may succeed.

    Dagster retries every exception but a ``Failure`` with ``allow_retries=False``; without this, a failure
    that every attempt meets (a missing schema, a bug, Dagster's own partition-range check) held its run
    for three more attempts and several minutes. Failures and retry requests the step raised itself keep
    their own classification; a database error counts as transient per ``may_succeed_later``.
    """
    try:
        yield
    except (dg.Failure, dg.RetryRequested, dg.DagsterError):
        raise
    except Exception as exc:
        if may_succeed_later(exc):
            raise
        raise dg.Failure(
            description=f"{type(exc).__name__}: {redact_text(str(exc))} (not retried: every attempt would fail alike)",
            allow_retries=False,
        ) from exc


def _span(days: Sequence[date]) -> str:
    return days[0].isoformat() if len(days) == 1 else f"{days[0].isoformat()}..{days[-1].isoformat()}"


def _funnel_chart(conn: sa.Connection, day: date) -> dict[str, dg.MetadataValue]:
    chart = funnel_chart_markdown(conn, day)
    return {"funnel_chart": dg.MetadataValue.md(chart)} if chart else {}


def _ints(values: Mapping[str, int]) -> dict[str, dg.MetadataValue]:
    return {key: dg.MetadataValue.int(value) for key, value in values.items()}


def refuse_unreadable(importer: Importer, days: Sequence[date], today: date) -> None:
    """Fail the step, before any request and without a retry, when a day is older than the source lets be read
    (``contract.lookback_days``): a re-import would replace the day's stored rows with the nothing the source
    answers. What was imported for such a day stays, and its rollup still reads it.

    Not for a source of running totals (``count_kind`` cumulative): its store keeps the snapshots that later
    runs re-derive a day from (importers/store.py)."""
    contract = importer.contract
    if contract.count_kind == "cumulative":
        return
    unreadable = [day for day in days if not contract.readable(day, today)]
    if unreadable:
        first_readable = today - timedelta(days=contract.lookback_days or 0)
        raise dg.Failure(
            description=(
                f"{importer.name} can be read only {contract.lookback_days} days back: {len(unreadable)} of the "
                f"run's days ({_span(unreadable)}) are older. Nothing was requested or replaced; their stored rows, "
                f"if any, stay. Backfill from {first_readable} on."
            ),
            allow_retries=False,
        )


def _require_configured(importer: Importer) -> None:
    """An importer's asset is in the definitions only while its source is configured (``left_out_importers``).
    Given an unconfigured client anyway (definitions assembled by hand), the step fails at once, without a
    retry, naming what to set: it never succeeds having imported nothing."""
    if not importer.is_configured():
        raise dg.Failure(
            description=f"{importer.name} is not configured: {importer.not_configured_reason()}",
            allow_retries=False,
        )


SITE_ANALYTICS_DESCRIPTION = (
    "Table `site_analytics_daily`: one row is one page's visitors and pageviews on one day from the visits "
    "tagged with one utm_campaign. Plausible buckets days in the site's own time zone; set the site to UTC in "
    "Plausible so its days line up with the events' UTC days. In the definitions only while Plausible is configured."
)
RELEASE_DOWNLOADS_DESCRIPTION = (
    "Table `github_release_download_daily`: one row is one release asset's downloads on one UTC day, the "
    "difference between its snapshot for that day and the repository's previous snapshot (rows of a "
    "repository's first snapshot are baselines with no known downloads). Snapshots are kept per asset id and "
    "day in `github_release_asset_snapshot`. GitHub only reports current totals: a partition takes a snapshot "
    "only while its day ended less than a day ago; re-running an older partition re-derives its deltas from "
    "the stored snapshot. In the definitions only while GitHub is configured."
)


def _rollup_description() -> str:
    """What one row of the rollup is, and what each source adds to it, read from the sources' contracts."""
    sources = "; ".join(
        f"`{s.name}` {', '.join(c.metric for c in s.contract.counted)} (by campaign.{s.contract.match})"
        for s in SOURCES
    )
    return (
        "Table `measurement_daily_rollup`: one row is one (UTC day, campaign, source, stage, event type) with its "
        "raw_count, its exact unique_actors that day (NULL for imported rows, whose actors are unknown) and the "
        "serialized HLL sketch of its actor ids, which the report merges for unique actors over a range. Sources: "
        f"`first_party` events; {sources}. Numbers true of one day only (unique visitors, persons, users) stay in "
        "their importer's table, never summed here. Also refreshes the days' ISO weeks in "
        "`measurement_weekly_sketch`, the per-week sketch unions the report merges for whole weeks."
    )


ROLLUP_DESCRIPTION = _rollup_description()


def site_analytics(
    context: dg.AssetExecutionContext, engine: sa.Engine, plausible: PlausibleClient, days: Sequence[date]
) -> dg.MaterializeResult:
    _require_configured(plausible)
    refuse_unreadable(plausible, days, datetime.now(UTC).date())
    # One query for the whole range, within the quota every replica shares. Plausible's own limit is an hourly
    # window with no Retry-After: a 429 fails the run at once ("retry after the hour") rather than keep a run
    # waiting or spend more requests; the shared bucket keeps the project from meeting it.
    try:
        by_day = plausible.campaign_stats(days[0], days[-1], gate=request_gate(engine, SITE_ANALYTICS))
    except QuotaExhausted as exc:
        raise dg.RetryRequested(max_retries=RATE_LIMIT_RETRIES, seconds_to_wait=exc.retry_after_s) from exc
    except ServiceError as exc:
        raise dg.Failure(description=str(exc), allow_retries=exc.transient) from exc
    unmapped: set[str] = set()
    for day in days:
        summary = replace_site_analytics_day(engine, day, by_day[day])
        unmapped.update(summary.unmapped_utm_campaigns)
        context.add_asset_metadata(
            {
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
            },
            partition_key=day.isoformat(),
        )
    if unmapped:
        # Plausible's utm values are whatever a visitor's link carried: each on one line, its controls visible.
        context.log.warning(
            f"utm_campaign values with no campaign (set campaign.utm_campaign to count them): "
            f"{', '.join(shown_cell(value) for value in sorted(unmapped)[:20])}"
        )
    with engine.connect() as conn:
        return dg.MaterializeResult(check_results=[check_site_counts(conn, days)])


def release_downloads(
    context: dg.AssetExecutionContext, engine: sa.Engine, github: GitHubReleasesClient, days: Sequence[date]
) -> dg.MaterializeResult:
    _require_configured(github)
    with engine.connect() as conn:
        repos = campaign_repos(conn)
    gate = request_gate(engine, GITHUB_RELEASES)
    for day in days:
        results, errors = [], []
        for repo in repos:
            try:
                results.append(import_repo_day(engine, github, repo, day, gate=gate))
            except RateLimited as exc:
                # A wait longer than the retry's is not held in the worker: Dagster re-runs the step later,
                # and the days already imported are simply imported again.
                raise dg.RetryRequested(max_retries=RATE_LIMIT_RETRIES, seconds_to_wait=exc.retry_after_s) from exc
            except ServiceError as exc:
                errors.append((repo, exc))
        if errors:
            # The repos and days that worked are stored; re-running redoes all of them idempotently.
            raise dg.Failure(
                description=f"{day}: {len(errors)} of {len(repos)} repositories failed: "
                + "; ".join(f"{repo}: {exc}" for repo, exc in errors),
                allow_retries=all(exc.transient for _, exc in errors),
            )
        missing = [r.repo for r in results if r.snapshot == "missing"]
        if missing:
            context.log.warning(
                f"No snapshot for {day} of {', '.join(missing)}: the day ended more than a day ago and GitHub "
                "reports only current totals, so its downloads cannot be reconstructed."
            )
        moved = {r.repo: r.moved_to for r in results if r.moved_to}
        context.add_asset_metadata(
            {
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
            partition_key=day.isoformat(),
        )
    with engine.connect() as conn:
        return dg.MaterializeResult(check_results=[check_no_unflagged_negative_delta(conn, days)])


# A count no source reports for one key, day and dimension (importers/base.MAX_COUNT); larger is a corrupt or
# hostile answer.
MAX_METRIC_VALUE = MAX_COUNT


def checked_metric_rows(
    source: Source, by_day: Mapping[date, Sequence[MetricRow]], days: Sequence[date], keys: Sequence[str]
) -> dict[date, list[MetricRow]]:
    """The importer's rows, refused whole (a permanent ServiceError) unless they hold exactly the asked days, only
    the asked keys, metrics of the contract, and counts from 0 to MAX_METRIC_VALUE: a day is replaced by what is
    returned for it, so a row of another day or campaign must not land in it."""
    contract, asked = source.contract, set(keys)
    metrics = {*contract.summable, *contract.range_only}
    if set(by_day) != set(days):
        raise ServiceError(
            source.name, f"answered days {_span(sorted(by_day)) if by_day else 'none'}, not {_span(days)}"
        )
    for day, rows in by_day.items():
        for row in rows:
            problem = (
                "another day"
                if row.day != day
                else "a key not asked for"
                if row.key not in asked
                else "a metric not in its contract"
                if row.metric not in metrics
                else "a count out of range"
                if not (type(row.value) is int and 0 <= row.value <= MAX_METRIC_VALUE)  # bool is an int subclass
                else None
            )
            if problem:
                raise ServiceError(source.name, f"{day}: a row of {problem}: {shown_cell(repr(row))[:300]}")
    return {day: list(by_day[day]) for day in days}


def metric_import(
    context: dg.AssetExecutionContext, engine: sa.Engine, importer: MetricImporter, source: Source, days: Sequence[date]
) -> dg.MaterializeResult:
    """One run's days of a source built on the contract: fetched for every campaign key within the shared quota,
    checked, and each day replaced in ``source_daily_metric``."""
    _require_configured(importer)
    refuse_unreadable(importer, days, datetime.now(UTC).date())
    with engine.connect() as conn:
        keys = campaign_keys(conn, source.contract.match)
    if not keys:
        context.log.warning(
            f"No campaign has a {source.contract.match}: {source.name} has nothing to import "
            f"(set it with `marketing-pipelines campaigns add ... --{source.contract.match.replace('_', '-')}`)."
        )
        by_day: Mapping[date, Sequence[MetricRow]] = {day: [] for day in days}
    else:
        try:
            by_day = importer.daily_metrics(days[0], days[-1], keys, gate=request_gate(engine, source))
            by_day = checked_metric_rows(source, by_day, days, keys)
        except RateLimited as exc:
            # The shared quota (QuotaExhausted) or the source's own 429 with a wait longer than a step holds.
            raise dg.RetryRequested(max_retries=RATE_LIMIT_RETRIES, seconds_to_wait=exc.retry_after_s) from exc
        except ServiceError as exc:
            raise dg.Failure(description=str(exc), allow_retries=exc.transient) from exc
    for written in replace_metric_days(engine, source.name, by_day):
        context.add_asset_metadata(
            {
                **_ints({"rows": written.rows, "keys": written.keys}),
                **_ints({metric: written.totals.get(metric, 0) for metric in source.contract.summable}),
                "status": dg.MetadataValue.text("imported"),
            },
            partition_key=written.day.isoformat(),
        )
    return dg.MaterializeResult()


def metric_asset_description(source: Source) -> str:
    """What one row is, from the source's contract."""
    contract = source.contract
    counted = ", ".join(f"`{c.metric}` (rolled up as {c.stage}/{c.event_type})" for c in contract.counted)
    ranged = ", ".join(f"`{m}`" for m in contract.range_only) or "none"
    return (
        f"Rows of `source_daily_metric` with source `{source.name}`: one row is one metric of one day for one "
        f"campaign key (campaign.{contract.match}) and dimension. Summed by the rollup: {counted}. Per day only, "
        f"never summed across days: {ranged}. Read back {contract.lookback_days or 'any number of'} days; "
        f"re-imported {contract.revision_days} day(s) after; quota {contract.quota.requests} requests per "
        f"{contract.quota.period_s:.0f} s (shared bucket {source.quota_bucket}). In the definitions only while "
        "the source is configured."
    )


def rollup(
    context: dg.AssetExecutionContext, engine: sa.Engine, days: Sequence[date], left_out: Mapping[dg.AssetKey, str]
) -> Iterator[dg.MaterializeResult | dg.AssetCheckEvaluation | dg.Output[None]]:
    # Idempotent: each day is deleted and rebuilt in its own transaction, then each week once.
    summaries = replace_rollup_days(engine, days)
    # Each day says which sources it could not include, and what turns each on.
    not_configured = "; ".join(f"{key.to_user_string()}: {reason}" for key, reason in left_out.items()) or "none"
    with engine.connect() as conn:
        for summary in summaries:
            context.add_asset_metadata(
                {"funnel": dg.MetadataValue.md(funnel_markdown(conn, summary.day))}
                | _funnel_chart(conn, summary.day)
                | _counts_metadata(summary)
                | _ints(source_metrics(summary.source_counts))
                | _ints(
                    {
                        "rows": summary.rows,
                        "events": summary.events,
                        "event_types": summary.event_types,
                        "first_party_rows": summary.first_party_rows,
                        "first_party_events": summary.first_party_events,
                        "unique_actors_sum": summary.unique_actors_sum,
                        "site_pageviews": summary.site_pageviews,
                        "downloads": summary.downloads,
                        "campaigns": summary.campaigns,
                        "weekly_sketch_rows": summary.week_rows,
                    }
                )
                | {"week_start": dg.MetadataValue.text(summary.week_start.isoformat())}
                | {"sources_not_configured": dg.MetadataValue.text(not_configured)},
                partition_key=summary.day.isoformat(),
            )
        checks = {
            FIRST_PARTY_COUNT_MATCHES: check_first_party_count(conn, days),
            UNIQUE_ACTORS_WITHIN_RAW_COUNT: check_unique_actors_within_raw_count(conn, days),
        }
    # One materialization per day, each with the day's metadata; the checks' results name them, so after.
    yield dg.MaterializeResult()
    for name, results in checks.items():
        # One result per check and day, on the day's partition: an AssetCheckResult takes the run's partition,
        # which a range run does not have (checks.on_partition). Dagster still needs the check's output, which
        # it yields itself only for an AssetCheckResult (without it the step fails: "did not return an output").
        yield dg.Output(
            None, context.assets_def.get_output_name_for_asset_check_key(dg.AssetCheckKey(ROLLUP_KEY, name))
        )
        for day, result in results.items():
            yield on_partition(context.instance, result, day)
    context.log.info(
        f"Rolled up {_span(days)}: {sum(s.first_party_events for s in summaries)} events into "
        f"{sum(s.rows for s in summaries)} rows."
    )


# Sources every day's metadata names, 0 on a day without their rows: a plot's line then drops to 0 rather than
# skipping the day. Any other source the rollup holds is named on the days it has rows.
ALWAYS_MEASURED = (FIRST_PARTY, SITE_ANALYTICS.name, GITHUB_RELEASES.name)


def source_metric_name(source: str) -> str:
    """``source_first_party_events``, ``source_site_analytics_pageviews``, ``source_github_releases_downloads``;
    ``source_<name>_count`` for any other source. Stable names: the UI's Plots tab draws one chart per numeric
    metadata name across the asset's partitions, so each source's daily trend is one chart."""
    slug = re.sub(r"[^a-z0-9]+", "_", source.lower()).strip("_") or "unnamed"
    return f"source_{slug}_{SOURCE_COUNT_NOUNS.get(source, 'count')}"


def source_metrics(source_counts: Mapping[str, int]) -> dict[str, int]:
    """Each source's raw_count of the day under its ``source_metric_name``."""
    sources = [*ALWAYS_MEASURED, *sorted(set(source_counts) - set(ALWAYS_MEASURED))]
    return {source_metric_name(source): source_counts.get(source, 0) for source in sources}


COUNTS_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn("campaign_id", "string"),
        dg.TableColumn("source", "string", description="first_party, site_analytics or github_releases"),
        dg.TableColumn("stage", "string"),
        dg.TableColumn("event_type", "string"),
        dg.TableColumn("raw_count", "int", description="Events (pageviews, downloads) of the day"),
        dg.TableColumn("unique_actors", "int", description="Exact distinct actors of the day; empty for imported rows"),
    ]
)


def _counts_metadata(summary: RollupSummary) -> dict[str, dg.MetadataValue]:
    """The day's rows as a table (``counts``): what an analyst asks of one day, in the UI.

    Text comes from event files, so control characters are written visibly. A day of more than
    MAX_SHOWN_COUNTS rows shows its largest and says so (``rows_shown`` of ``rows_total``).
    """
    records = [
        dg.TableRecord(
            {
                "campaign_id": visible_controls(c.campaign_id),
                "source": visible_controls(c.source),
                "stage": visible_controls(c.stage),
                "event_type": visible_controls(c.event_type),
                "raw_count": c.raw_count,
                "unique_actors": c.unique_actors,
            }
        )
        for c in summary.counts
    ]
    metadata: dict[str, dg.MetadataValue] = {"counts": dg.MetadataValue.table(records, schema=COUNTS_SCHEMA)}
    if len(records) < summary.rows:
        metadata |= _ints({"rows_shown": len(records), "rows_total": summary.rows})
        metadata["counts_note"] = dg.MetadataValue.text(
            f"The {len(records)} largest rows by raw_count of {summary.rows} (at most {MAX_SHOWN_COUNTS} are shown); "
            "the report and the measurement_daily_rollup table hold them all."
        )
    return metadata


def left_out_importers(settings: Settings) -> dict[dg.AssetKey, str]:
    """The importer assets whose source ``settings`` leave unconfigured, each with what turns it on."""
    missing = missing_variables(settings)
    return {
        dg.AssetKey(source.asset): f"set {' and '.join(missing[source.name])}"
        for source in SOURCES
        if source.name in missing
    }


def _daily_asset(shared: Mapping[str, Any], **kwargs: Any) -> Callable[[Callable[..., Any]], dg.AssetsDefinition]:
    """``dg.asset`` with the arguments every measurement asset shares (``shared``) and its own."""
    with warnings.catch_warnings():
        # "Parameter `backfill_policy` of function `asset` is currently in beta" (1.13.27; @multi_asset does not
        # warn), once per asset at every code load: Dagster is pinned exactly, and test_backfill_range.py holds
        # what a range run writes.
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.asset(**shared, **kwargs)


def metric_asset(source: Source, shared: Mapping[str, Any]) -> dg.AssetsDefinition:
    """The daily asset of a source built on the contract, its importer the resource ``source.resource_key``."""

    @_daily_asset(
        shared,
        key=dg.AssetKey(source.asset),
        description=metric_asset_description(source),
        kinds={"python", "sql"},
        required_resource_keys={"app_db", source.resource_key},
    )
    def _import(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        importer = getattr(context.resources, source.resource_key)
        with failures_classified():
            return metric_import(
                context, context.resources.app_db.ready_engine(), importer, source, partition_days(context)
            )

    return _import


def build_measurement_assets(
    settings: Settings,
    *,
    retry_policy: dg.RetryPolicy = IMPORT_RETRY_POLICY,
    left_out: Mapping[dg.AssetKey, str] | None = None,
) -> list[dg.AssetsDefinition]:
    """The measurement assets, one per table, partitioned from MARKETING_MEASUREMENT_START_DATE: the
    importers not ``left_out``, then the rollup. Tests pass a retry policy without delay.

    A backfill run holds at most MARKETING_BACKFILL_DAYS_PER_RUN days of each asset: a run costs seconds
    of Dagster overhead whatever it holds, a day of the rollup a fraction of a second (benchmarks/backfill.py
    measures the choice). A run's steps are the importers, then the rollup; a failed import fails the run
    and Dagster does not run the rollup after it, while the other importer still imports.

    ``left_out``: importers that are not configured, each with what turns it on. They are not in the
    definitions at all, rather than assets whose every partition stays missing: the catalog shows
    what this deployment measures, a backfill of every measurement asset succeeds, and the rollup
    (whose description says what is left out) builds from the sources that are configured.
    """
    left_out = dict(left_out or {})
    partitions_def = measurement_partitions(settings.measurement_start_date)
    shared: dict[str, Any] = {
        "partitions_def": partitions_def,
        # Backfills by range: one run replaces up to backfill_days_per_run days, each in its own transaction.
        "backfill_policy": dg.BackfillPolicy.multi_run(max_partitions_per_run=settings.backfill_days_per_run),
        "retry_policy": retry_policy,
        "group_name": GROUP,
        "owners": OWNERS,
        "freshness_policy": DAILY_FRESHNESS,
    }

    @_daily_asset(
        shared,
        key=SITE_KEY,
        description=SITE_ANALYTICS_DESCRIPTION,
        kinds={"python", "plausible", "sql"},
        check_specs=SITE_CHECK_SPECS,
    )
    def site_analytics_daily(
        context: dg.AssetExecutionContext, app_db: AppDatabase, plausible: PlausibleClient
    ) -> dg.MaterializeResult:
        with failures_classified():
            return site_analytics(context, app_db.ready_engine(), plausible, partition_days(context))

    @_daily_asset(
        shared,
        key=DOWNLOADS_KEY,
        description=RELEASE_DOWNLOADS_DESCRIPTION,
        kinds={"python", "github", "sql"},
        check_specs=DOWNLOAD_CHECK_SPECS,
    )
    def github_release_downloads_daily(
        context: dg.AssetExecutionContext, app_db: AppDatabase, github: GitHubReleasesClient
    ) -> dg.MaterializeResult:
        with failures_classified():
            return release_downloads(context, app_db.ready_engine(), github, partition_days(context))

    built_on_contract = [metric_asset(source, shared) for source in SOURCES if source.table == METRIC_TABLE]
    importers = [
        a for a in (site_analytics_daily, github_release_downloads_daily, *built_on_contract) if a.key not in left_out
    ]

    @_daily_asset(
        shared,
        key=ROLLUP_KEY,
        description=ROLLUP_DESCRIPTION
        + "".join(
            f"\n\nNot configured, so not in these definitions: `{key.to_user_string()}` ({reason})."
            for key, reason in left_out.items()
        ),
        kinds={"sql", "datasketches"},
        deps=[marketing_event_asset, *(a.key for a in importers)],
        check_specs=rollup_check_specs(partitions_def),
        # Loading the asset (defs.load_asset_value, a downstream asset) reads the table as a DataFrame.
        io_manager_key=ROLLUP_IO_MANAGER,
        automation_condition=ROLLUP_AUTOMATION,
    )
    def measurement_daily_rollup(
        context: dg.AssetExecutionContext, app_db: AppDatabase
    ) -> Iterator[dg.MaterializeResult | dg.AssetCheckEvaluation | dg.Output[None]]:
        with failures_classified():
            yield from rollup(context, app_db.ready_engine(), partition_days(context), left_out)

    return [*importers, measurement_daily_rollup]


# The rollup with its own checks. today_is_current (freshness.py), a check on the rollup too, is recorded by its
# sensor and executed on its own from the UI; the runs of these jobs leave it out, as they always have.
_ROLLUP_AND_ITS_CHECKS = dg.AssetSelection.assets(ROLLUP_KEY).without_checks() | dg.AssetSelection.checks(
    dg.AssetCheckKey(ROLLUP_KEY, FIRST_PARTY_COUNT_MATCHES),
    dg.AssetCheckKey(ROLLUP_KEY, UNIQUE_ACTORS_WITHIN_RAW_COUNT),
)
measurement_daily_job = dg.define_asset_job(
    "measurement_daily_job",
    # The group's materializable assets: the rollup and whichever importers the definitions hold, with their checks.
    selection=(dg.AssetSelection.groups(GROUP).materializable() - dg.AssetSelection.assets(ROLLUP_KEY))
    | _ROLLUP_AND_ITS_CHECKS,
    description="Imports one day from Plausible and GitHub, then rebuilds that day's rollup.",
)
measurement_rollup_job = dg.define_asset_job(
    "measurement_rollup_job",
    selection=_ROLLUP_AND_ITS_CHECKS,
    description="Rebuilds one day's rollup from the events and imports already stored (late events).",
)
