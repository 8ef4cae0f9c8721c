"""Writes what the importers fetch to the database, one partition day at a time.

The clients beside this module (``plausible``, ``github``) only speak HTTP: an import-linter contract keeps
them off the database, so this is the one module of importers/ that writes.

Each function replaces exactly one day (and, for GitHub, one repository) in one transaction, so
re-running a partition rewrites it instead of adding to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import sqlalchemy as sa

from marketing_pipelines.db.schema import (
    campaign,
    github_release_asset_snapshot,
    github_release_download_daily,
    github_repo_etag,
    site_analytics_daily,
    source_daily_metric,
)
from marketing_pipelines.measurement.importers.base import MetricRow, RequestGate
from marketing_pipelines.measurement.importers.github import (
    DownloadDelta,
    GitHubReleasesClient,
    ReleaseAssetSnapshot,
    derive_download_deltas,
)
from marketing_pipelines.measurement.importers.plausible import SiteAnalyticsRow
from marketing_pipelines.measurement.sources import GITHUB_RELEASES

# GitHub reports only the current cumulative count, so a snapshot stands for the end of a day only
# if it is taken soon after that day ends (the daily schedule runs minutes after midnight UTC).
# Later re-runs of an older day reuse its stored snapshot instead of stamping today's totals on it.
SNAPSHOT_WINDOW = timedelta(days=GITHUB_RELEASES.contract.lookback_days or 0)


@dataclass(frozen=True)
class SiteAnalyticsSummary:
    rows: int
    visitors: int
    pageviews: int
    utm_campaigns: int
    unmapped_utm_campaigns: tuple[str, ...]


def replace_site_analytics_day(engine: sa.Engine, day: date, rows: Sequence[SiteAnalyticsRow]) -> SiteAnalyticsSummary:
    now = datetime.now(UTC)
    t = site_analytics_daily
    with engine.begin() as conn:
        conn.execute(sa.delete(t).where(t.c.day == day))
        if rows:
            conn.execute(sa.insert(t), [{**r.__dict__, "fetched_at": now} for r in rows])
        mapped = set(
            conn.execute(sa.select(campaign.c.utm_campaign).where(campaign.c.utm_campaign.is_not(None))).scalars()
        )
    utms = {r.utm_campaign for r in rows}
    return SiteAnalyticsSummary(
        rows=len(rows),
        visitors=sum(r.visitors for r in rows),
        pageviews=sum(r.pageviews for r in rows),
        utm_campaigns=len(utms),
        unmapped_utm_campaigns=tuple(sorted(utms - mapped)),
    )


@dataclass(frozen=True)
class RepoDownloads:
    repo: str
    snapshot: str  # "fetched", "not_modified", "stored" (reused) or "missing"
    deltas: tuple[DownloadDelta, ...]
    moved_to: str | None = None  # GitHub answered 301: the repository's new API location

    @property
    def downloads(self) -> int:
        return sum(d.delta for d in self.deltas)

    @property
    def baseline(self) -> bool:
        return any(d.baseline for d in self.deltas)

    @property
    def negative_clamped(self) -> int:
        return sum(d.negative_clamped for d in self.deltas)


@dataclass(frozen=True)
class MetricDay:
    """What one day of a source built on the contract holds after its import."""

    day: date
    rows: int
    totals: dict[str, int]  # metric -> its sum over keys and dimensions
    keys: int


def campaign_keys(conn: sa.Connection, match: str) -> list[str]:
    """The distinct values campaigns hold in column ``match`` (a source contract's), sorted."""
    column = campaign.c[match]
    return sorted(conn.execute(sa.select(column).where(column.is_not(None)).distinct()).scalars())


def replace_metric_days(engine: sa.Engine, source: str, by_day: Mapping[date, Sequence[MetricRow]]) -> list[MetricDay]:
    """Replace each day's rows of ``source`` in ``source_daily_metric``, one transaction per day, in day order."""
    now, t, written = datetime.now(UTC), source_daily_metric, []
    for day in sorted(by_day):
        rows = by_day[day]
        with engine.begin() as conn:
            conn.execute(sa.delete(t).where(t.c.source == source, t.c.day == day))
            if rows:
                conn.execute(
                    sa.insert(t),
                    [
                        {
                            "source": source,
                            "day": r.day,
                            "key": r.key,
                            "dimension": r.dimension,
                            "metric": r.metric,
                            "value": r.value,
                            "fetched_at": now,
                        }
                        for r in rows
                    ],
                )
        totals: dict[str, int] = {}
        for r in rows:
            totals[r.metric] = totals.get(r.metric, 0) + r.value
        written.append(MetricDay(day, len(rows), totals, len({r.key for r in rows})))
    return written


def campaign_repos(conn: sa.Connection) -> list[str]:
    return sorted(
        conn.execute(sa.select(campaign.c.github_repo).where(campaign.c.github_repo.is_not(None)).distinct()).scalars()
    )


def can_take_snapshot(day: date, now: datetime) -> bool:
    day_end = datetime.combine(day + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
    return now < day_end + SNAPSHOT_WINDOW


def import_repo_day(
    engine: sa.Engine,
    client: GitHubReleasesClient,
    repo: str,
    day: date,
    now: datetime | None = None,
    gate: RequestGate | None = None,
) -> RepoDownloads:
    """Snapshot ``repo`` for ``day`` (when still possible), then replace that day's download deltas of the repo."""
    now = now or datetime.now(UTC)
    snapshot_state, moved_to = "stored", None
    if can_take_snapshot(day, now):
        snapshot_state, moved_to = _take_snapshot(engine, client, repo, day, now, gate)
    with engine.begin() as conn:
        current = _snapshot(conn, repo, day)
        if current is None:
            return RepoDownloads(repo, "missing", (), moved_to)
        previous_day = conn.execute(
            sa.select(sa.func.max(github_release_asset_snapshot.c.day)).where(
                github_release_asset_snapshot.c.repo == repo, github_release_asset_snapshot.c.day < day
            )
        ).scalar_one_or_none()
        previous = _snapshot(conn, repo, previous_day) if previous_day is not None else None
        deltas = derive_download_deltas(
            {a.asset_id: a.download_count for a in previous or ()}, current, repo_has_history=previous is not None
        )
        t = github_release_download_daily
        conn.execute(sa.delete(t).where(t.c.day == day, t.c.repo == repo))
        if deltas:
            conn.execute(
                sa.insert(t),
                [
                    {
                        "day": day,
                        "asset_id": d.asset_id,
                        "repo": d.repo,
                        "release_tag": d.release_tag,
                        "asset_name": d.asset_name,
                        "download_count": d.download_count,
                        "downloads": d.delta,
                        "raw_delta": d.raw_delta,
                        "baseline": d.baseline,
                        "negative_clamped": d.negative_clamped,
                    }
                    for d in deltas
                ],
            )
    return RepoDownloads(repo, snapshot_state, tuple(deltas), moved_to)


def _take_snapshot(
    engine: sa.Engine, client: GitHubReleasesClient, repo: str, day: date, now: datetime, gate: RequestGate | None
) -> tuple[str, str | None]:
    """Store ``repo``'s snapshot for ``day``; returns ("fetched" or "not_modified", where it moved or None)."""
    with engine.connect() as conn:
        stored = conn.execute(
            sa.select(github_repo_etag.c.etag, github_repo_etag.c.snapshot_day).where(github_repo_etag.c.repo == repo)
        ).one_or_none()
        # A 304 means "same as the snapshot this ETag came from"; without those rows it is of no use.
        usable_etag = stored.etag if stored and _snapshot(conn, repo, stored.snapshot_day) else None
    result = client.list_release_assets(repo, etag=usable_etag, gate=gate)
    with engine.begin() as conn:
        if result.not_modified:
            assert stored is not None
            assets: Sequence[ReleaseAssetSnapshot] = _snapshot(conn, repo, stored.snapshot_day) or ()
        else:
            assets = result.assets
        t = github_release_asset_snapshot
        conn.execute(sa.delete(t).where(t.c.repo == repo, t.c.day == day))
        if assets:
            conn.execute(
                sa.insert(t),
                [
                    {
                        "asset_id": a.asset_id,
                        "day": day,
                        "repo": repo,
                        "release_id": a.release_id,
                        "release_tag": a.release_tag,
                        "asset_name": a.asset_name,
                        "download_count": a.download_count,
                        "fetched_at": now,
                    }
                    for a in assets
                ],
            )
        conn.execute(sa.delete(github_repo_etag).where(github_repo_etag.c.repo == repo))
        etag = stored.etag if result.not_modified and stored else result.etag
        if etag and assets:
            conn.execute(sa.insert(github_repo_etag).values(repo=repo, etag=etag, snapshot_day=day, fetched_at=now))
    return ("not_modified" if result.not_modified else "fetched"), result.moved_to


def _snapshot(conn: sa.Connection, repo: str, day: date) -> list[ReleaseAssetSnapshot] | None:
    """The snapshot of ``repo`` for ``day``; None when none was taken (an empty list is a repo without assets)."""
    t = github_release_asset_snapshot
    rows = conn.execute(
        sa.select(t.c.release_id, t.c.release_tag, t.c.asset_id, t.c.asset_name, t.c.download_count, t.c.fetched_at)
        .where(t.c.repo == repo, t.c.day == day)
        .order_by(t.c.asset_id)
    ).all()
    if not rows:
        return None
    return [
        ReleaseAssetSnapshot(
            repo=repo,
            release_id=r.release_id,
            release_tag=r.release_tag,
            asset_id=r.asset_id,
            asset_name=r.asset_name,
            download_count=r.download_count,
            # Not stored: nothing downstream of a snapshot reads it.
            asset_created_at=r.fetched_at,
        )
        for r in rows
    ]
