"""The measurement sources beside first-party events: what each promises (its contract) and the settings that
turn it on.

Read without importing the sources' HTTP clients (``importers/``, which import httpx), so
``marketing-pipelines status`` can say what is not configured at a command's start-up cost, and
the definitions can leave an unconfigured importer out. A source is configured when each of its
settings is set (non-empty): the services' own variables, read through ``Settings``.

Each importer resource declares its source's contract (``contract``, a ``SourceContract`` from this table), and the
assets, checks and rollup read it instead of knowing the source: how far back a day can still be read
(``lookback_days``), which recent days still change and are imported again (``revision_days``), whether the source
counts per day or only a running total (``count_kind``), which numbers add up across days and which (unique
visitors) only hold for the range they were asked for, its request quota, and after how many days a day not
read is lost for good (``retention_days``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from typing import Literal

from pydantic import SecretStr

from marketing_pipelines.settings import Settings, env_name

CountKind = Literal["daily", "cumulative"]


@dataclass(frozen=True)
class Quota:
    """A source's documented request limit: ``requests`` per ``period_s`` seconds, ``concurrency`` at once."""

    requests: int
    period_s: float
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.requests < 2 or self.period_s <= 0:
            raise ValueError(f"a quota needs at least two requests over a positive period, got {self}")

    @property
    def burst(self) -> float:
        """The shared bucket's capacity: a tenth of the quota, at least one request.

        A token bucket of capacity C refilled at R per period admits up to C + R in any one period; with
        C = quota / 10 and R = quota - C, no period, however it is aligned, sees more than the quota.
        """
        return max(1.0, self.requests / 10)

    @property
    def per_minute(self) -> float:
        """The bucket's refill: what is left of the quota after its burst, spread over the period."""
        return (self.requests - self.burst) * 60.0 / self.period_s


# The campaign columns a source's key can match (db/schema.py ``campaign``).
CAMPAIGN_MATCHES = ("utm_campaign", "github_repo", "pypi_package", "npm_package")
# The table the importers built on this contract write (db/schema.py); the first two importers have their own.
METRIC_TABLE = "source_daily_metric"


@dataclass(frozen=True)
class Counted:
    """A metric the rollup sums per campaign and day, and the stage and event type its rows carry there."""

    metric: str
    stage: str
    event_type: str


@dataclass(frozen=True)
class SourceContract:
    """What a measurement source promises, declared by its importer and read by the assets, checks and rollup."""

    # How many days back from today a day can still be read (None: the source keeps its whole history). An
    # older day is never fetched again: what was imported for it is kept, and a day never imported is refused.
    lookback_days: int | None
    # The last N complete days may still change at the source (late processing, revisions): the daily run
    # imports them again until they settle. 0: a day is final once it ends.
    revision_days: int
    # "cumulative": the source reports running totals only; the importer stores daily deltas (once, at import).
    count_kind: CountKind
    # Numbers that add up across days and pages, each a rollup row's raw_count.
    counted: tuple[Counted, ...]
    # Numbers true only of the range they were asked for (unique visitors, persons): never summed across days,
    # kept per day and re-queried for a longer range.
    range_only: tuple[str, ...]
    quota: Quota
    # A day not read within this many days of its end is lost (None: never). Checked by within_retention.
    retention_days: int | None
    # The campaign column its keys match (CAMPAIGN_MATCHES): which campaign a number counts for.
    match: str

    def __post_init__(self) -> None:
        if self.match not in CAMPAIGN_MATCHES:
            raise ValueError(f"match must be one of {CAMPAIGN_MATCHES}, got {self.match!r}")
        if set(self.summable) & set(self.range_only):
            raise ValueError(f"a metric either adds up or holds for its range only: {self.summable}, {self.range_only}")

    @property
    def summable(self) -> tuple[str, ...]:
        return tuple(c.metric for c in self.counted)

    def readable(self, day: date, today: date) -> bool:
        """Whether ``day`` can still be read from the source on ``today``."""
        return self.lookback_days is None or (today - day).days <= self.lookback_days

    def revised_days(self, last_complete: date) -> list[date]:
        """The days before ``last_complete`` the source may still revise, newest first."""
        return [last_complete - timedelta(days=n) for n in range(1, self.revision_days + 1)]


@dataclass(frozen=True)
class Source:
    name: str  # as the rollup's ``source`` column names it
    asset: str  # the importer's asset key
    settings: tuple[str, ...]  # the Settings fields that turn it on
    contract: SourceContract
    # Where the contract's numbers were read (docs), so a reader can check them.
    documented_at: str
    # The importer's resource key in the definitions.
    resource_key: str
    # Where its rows are stored: METRIC_TABLE, or the first two importers' own tables.
    table: str = METRIC_TABLE

    @property
    def quota_bucket(self) -> str:
        """The shared bucket of its request quota (measurement/quota.py), as ``limits show`` and ``limits set``
        name it."""
        return f"source:{self.name}"


SITE_ANALYTICS = Source(
    "site_analytics",
    "site_analytics_daily",
    ("plausible_api_key", "plausible_site_id"),
    SourceContract(
        lookback_days=None,
        # Plausible counts as events arrive; a finished day does not change.
        revision_days=0,
        count_kind="daily",
        counted=(Counted("pageviews", "site", "pageview"),),
        # Per-page visitors of one day; a visitor of two pages or two days is one visitor, so never summed.
        range_only=("visitors",),
        # 600 requests an hour per API key by default; a 429 carries no Retry-After.
        quota=Quota(600, 3600.0),
        retention_days=None,
        match="utm_campaign",
    ),
    "plausible.io/docs/stats-api (rate limiting)",
    resource_key="plausible",
    table="site_analytics_daily",
)
GITHUB_RELEASES = Source(
    "github_releases",
    "github_release_downloads_daily",
    ("github_token",),
    SourceContract(
        # Only the current running total is served: a day's count must be snapshotted within a day of its end
        # (importers/store.SNAPSHOT_WINDOW); later runs reuse the stored snapshot.
        lookback_days=1,
        revision_days=0,
        count_kind="cumulative",
        counted=(Counted("downloads", "release", "download"),),
        range_only=(),
        # 5,000 requests an hour with a token (REST API rate limits), shared with every other use of the token.
        quota=Quota(5000, 3600.0),
        retention_days=1,
        match="github_repo",
    ),
    "docs.github.com/rest/releases/assets, docs.github.com/rest/using-the-rest-api/rate-limits-for-the-rest-api",
    resource_key="github",
    table="github_release_download_daily",
)
POSTHOG = Source(
    "posthog",
    "posthog_daily",
    ("posthog_api_key", "posthog_project_id"),
    SourceContract(
        # PostHog keeps events as long as the project's plan retains them (no fixed window the API states): a
        # day outside the plan's retention answers no rows, which the importer cannot tell from a quiet day.
        lookback_days=None,
        # Events ingested late (SDK batches flushed after midnight, mobile clients offline) land on the day they
        # happened: yesterday is imported again the next day.
        revision_days=1,
        count_kind="daily",
        counted=(Counted("events", "product", "posthog_event"),),
        # Unique persons of one UTC day; a person of two days is one person, so never summed.
        range_only=("persons",),
        # posthog.com/docs/api/queries, "Rate limits": 2,400 an hour, 240 a minute and 3 running at once per
        # project, but "some customers ... are on an old limit of 120 queries/hour", and summaries of the API
        # overview say 120/h too: the lower, which holds on every plan. A 429 carries Retry-After (honoured).
        quota=Quota(120, 3600.0, concurrency=3),
        retention_days=None,
        match="utm_campaign",
    ),
    "posthog.com/docs/api/queries (creating a query, rate limits), posthog/schema HogQLQuery and HogQLQueryResponse",
    resource_key="posthog",
)
GITHUB_TRAFFIC = Source(
    "github_traffic",
    "github_traffic_daily",
    ("github_token", "github_traffic_enabled"),
    SourceContract(
        # The traffic API answers the last 14 days only, the window ending now: its oldest day is cut (part of it
        # fell out before the request), so 13 full days back is what a run can still read whole.
        lookback_days=13,
        # Views and clones are counted as they come: today's number grows until the day ends, and GitHub's
        # counting of yesterday may lag past midnight, so yesterday is read once more.
        revision_days=1,
        count_kind="daily",
        counted=(Counted("views", "repository", "github_view"), Counted("clones", "repository", "github_clone")),
        # Unique visitors and cloners of one day: one person of two days is one person, so never summed.
        range_only=("view_uniques", "clone_uniques"),
        # 5,000 requests an hour with a token (REST API rate limits), the same bucket GitHub counts for the
        # release downloads and every other use of the token: two requests (views, clones) per repository a run.
        quota=Quota(5000, 3600.0),
        # A day not read within the 14-day window is gone: within_retention warns while one can still be read.
        retention_days=13,
        match="github_repo",
    ),
    "docs.github.com/rest/metrics/traffic (views, clones: last 14 days, per=day, push access), "
    "docs.github.com/rest/using-the-rest-api/rate-limits-for-the-rest-api",
    resource_key="github_traffic",
)
PYPI_DOWNLOADS = Source(
    "pypi_downloads",
    "pypi_downloads_daily",
    ("pypi_downloads_enabled",),
    SourceContract(
        # "Time series data is retained only for 180 days" (pypistats.org/api, NOTES; pypistats.org/about).
        lookback_days=180,
        # "All download data is updated once daily": yesterday may land after the daily run, so it is read again.
        revision_days=1,
        count_kind="daily",
        counted=(Counted("downloads", "package", "pypi_download"),),
        range_only=(),
        # pypistats.org publishes no number: "IP-based rate limiting is imposed application-wide", and its etiquette
        # asks for one fetch per package a day from a site run "on limited resources". One request covers every day
        # it keeps, so a day's import is one request per package; 30 a minute finishes a few dozen packages in a
        # minute or two, one request every two seconds at worst, far below what its limiter must allow a browser.
        quota=Quota(30, 60.0),
        retention_days=180,
        match="pypi_package",
    ),
    "pypistats.org/api (NOTES, Etiquette, Rate Limiting), pypistats.org/about",
    resource_key="pypistats",
)
NPM_DOWNLOADS = Source(
    "npm_downloads",
    "npm_downloads_daily",
    ("npm_downloads_enabled",),
    SourceContract(
        # "All other queries are limited to at most 18 months of data. The earliest date for which data will be
        # returned is January 10, 2015" (docs/download-counts.md, Limits): 18 months bounds one query's span, not
        # how far back a day can be read (npm/registry-issue-archive#206: older days come in shorter ranges).
        # The importer asks at most 365 days a request, the bulk limit, below both.
        lookback_days=None,
        # "Once per day, soon after UTC midnight" the previous day is loaded (Data source): the daily run may
        # come first, and a day asked too early reads 0 (npm/documentation#1366), so yesterday is read again.
        revision_days=1,
        count_kind="daily",
        counted=(Counted("downloads", "package", "npm_download"),),
        range_only=(),
        # npm publishes no request limit for this API and answers bursts with 429. A day's import is one request
        # per 128 unscoped packages and one per scoped package; 30 a minute keeps a backfill of 548 days for 100
        # scoped packages (200 requests) under 7 minutes while never sending more than one request every 2 s.
        quota=Quota(30, 60.0),
        # Nothing is forgotten within the partitions: days back to 2015-01-10 stay readable.
        retention_days=None,
        match="npm_package",
    ),
    "github.com/npm/registry docs/download-counts.md (Data source, Ranges, Bulk Queries, Limits)",
    resource_key="npm_downloads",
)
GA4 = Source(
    "ga4",
    "ga4_daily",
    ("ga4_property_id", "ga4_service_account_json"),
    SourceContract(
        # The Data API's reports are aggregated data, which GA4 keeps: the data-retention setting (2 or 14 months
        # on a standard property) deletes user- and event-level data and "only affects explorations and funnel
        # reports", not standard aggregated reports (support.google.com/analytics/answer/7667196).
        lookback_days=None,
        # "Data processing can take 24-48 hours. During that time, data in your reports may change."
        # (support.google.com/analytics/answer/11198161): the two days before the last complete one are read again.
        revision_days=2,
        count_kind="daily",
        counted=(Counted("sessions", "site", "ga4_session"), Counted("page_views", "site", "ga4_pageview")),
        # totalUsers of one day and campaign: a user of two days (or campaigns) is one user, so never summed.
        range_only=("total_users",),
        # GA4 meters tokens, not requests: a standard property has 200,000 a day, 40,000 an hour and 10 concurrent
        # requests, and "most requests consume fewer than 10 tokens" (a range of many days and campaigns costs
        # more). 500 requests an hour at 10 tokens is 5,000 an hour (an eighth of the hourly quota) and, kept up
        # all day, 120,000 a day (three fifths of the daily one), leaving the rest to the property's other users
        # (dashboards, other tools). One request reads a run's whole range, so a year's backfill is a handful.
        quota=Quota(500, 3600.0, concurrency=10),
        retention_days=None,
        match="utm_campaign",
    ),
    "developers.google.com/analytics/devguides/reporting/data/v1/quotas (PropertyQuota), "
    "support.google.com/analytics/answer/7667196, support.google.com/analytics/answer/11198161",
    resource_key="ga4",
)
SOURCES = (SITE_ANALYTICS, GITHUB_RELEASES, GA4, POSTHOG, GITHUB_TRAFFIC, PYPI_DOWNLOADS, NPM_DOWNLOADS)


def source_named(name: str) -> Source:
    """The source whose rollup ``source`` value is ``name``."""
    for source in SOURCES:
        if source.name == name:
            return source
    raise KeyError(f"no measurement source named {name!r}; known: {', '.join(s.name for s in SOURCES)}")


def _is_set(value: object) -> bool:
    if isinstance(value, bool):
        return value  # a source without a key is turned on by its flag
    text = value.get_secret_value() if isinstance(value, SecretStr) else value
    return isinstance(text, str) and bool(text.strip())


def _to_set(field: str) -> str:
    """The variable to set for ``field``, with ``=true`` for a flag."""
    flag = Settings.model_fields[field].annotation is bool
    return f"{env_name(field)}=true" if flag else env_name(field)


def missing_variables(settings: Settings) -> dict[str, list[str]]:
    """Each source that ``settings`` leaves unconfigured -> the variables still to set (a flag as ``NAME=true``)."""
    missing = {s.name: [_to_set(f) for f in s.settings if not _is_set(getattr(settings, f))] for s in SOURCES}
    return {name: names for name, names in missing.items() if names}
