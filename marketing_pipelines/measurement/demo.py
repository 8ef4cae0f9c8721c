"""The measurement part of ``marketing-pipelines demo``: seed events, materialize the daily partitions, print reports.

Event ids are derived from campaign, day and sequence, so a second run inserts nothing new and
re-materializing the partitions rewrites the same rollup rows.
"""

import random
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines.db.campaigns import Campaign, add_campaign, get_campaign
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.measurement.assets import (
    github_release_downloads_daily,
    measurement_daily_rollup,
    measurement_partitions,
    site_analytics_daily,
)
from marketing_pipelines.measurement.events import record_events
from marketing_pipelines.measurement.importers.github import GitHubReleasesClient
from marketing_pipelines.measurement.importers.plausible import PlausibleClient
from marketing_pipelines.measurement.report import measurement_report, render

DEMO_CAMPAIGNS = (
    Campaign("spring-launch", "Spring launch", "ana", utm_campaign="spring26", github_repo="acme/widget"),
    Campaign("dev-tools-beta", "Developer tools beta", "ben", utm_campaign="devbeta", github_repo="acme/devtools"),
)
# (stage, event_type, share of the day's visitors who do it): a narrowing funnel.
FUNNEL = (
    ("awareness", "page_view", 1.0),
    ("awareness", "email_open", 0.5),
    ("consideration", "signup_started", 0.3),
    ("conversion", "signup_completed", 0.12),
    ("conversion", "purchase", 0.04),
)
ACTOR_POOL = 400
SOURCES = ("web", "newsletter", "app")


def demo_events(campaign_id: str, day: date) -> list[dict[str, Any]]:
    """A deterministic, realistic day of events: repeat actors, several per actor, some anonymous."""
    rng = random.Random(f"{campaign_id}:{day.isoformat()}")
    visitors = rng.sample(range(ACTOR_POOL), rng.randint(60, 140))
    start = datetime.combine(day, time.min, tzinfo=UTC)
    events: list[dict[str, Any]] = []
    for stage, event_type, share in FUNNEL:
        for actor in visitors[: max(1, int(len(visitors) * share))]:
            for _ in range(rng.choice((1, 1, 1, 2, 3))):
                anonymous = event_type == "page_view" and rng.random() < 0.1
                events.append(
                    {
                        "event_id": f"demo:{campaign_id}:{day.isoformat()}:{len(events)}",
                        "campaign_id": campaign_id,
                        "stage": stage,
                        "event_type": event_type,
                        "actor_id": None if anonymous else f"{campaign_id}-user-{actor}",
                        "occurred_at": start + timedelta(seconds=rng.randrange(86_400)),
                        "source": rng.choice(SOURCES),
                        "properties": {"demo": True},
                    }
                )
    return events


def run_measurement_demo(
    engine: sa.Engine, instance: dg.DagsterInstance, echo: Callable[[str], None], days: int
) -> None:
    """Seed ``days`` complete UTC days of events, materialize those partitions on ``instance``, print each report."""
    today = datetime.now(UTC).date()
    first = max(today - timedelta(days=days), measurement_partitions.start.date())
    day_list = [first + timedelta(days=i) for i in range((today - first).days)]
    if not day_list:
        echo("      no complete day since MARKETING_MEASUREMENT_START_DATE; nothing to measure yet")
        return

    with engine.begin() as conn:
        for campaign in DEMO_CAMPAIGNS:
            if get_campaign(conn, campaign.id) is None:
                add_campaign(conn, campaign)
        loaded = duplicate = 0
        for campaign in DEMO_CAMPAIGNS:
            for day in day_list:
                counts = record_events(conn, demo_events(campaign.id, day), source="demo")
                loaded, duplicate = loaded + counts.loaded, duplicate + counts.duplicate
    echo(f"      events for {day_list[0]} .. {day_list[-1]}: {loaded} recorded, {duplicate} already there")

    resources = {
        "app_db": AppDatabase(url=engine.url.render_as_string(hide_password=False)),
        # Unconfigured on purpose: the demo needs no network, and shows how an importer reports it.
        "plausible": PlausibleClient(),
        "github": GitHubReleasesClient(),
    }
    assets = [site_analytics_daily, github_release_downloads_daily, measurement_daily_rollup]
    for day in day_list:
        result = dg.materialize(
            assets,
            partition_key=day.isoformat(),
            instance=instance,
            resources=resources,
            run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
            raise_on_error=False,
        )
        rollup = _metadata(result, "measurement_daily_rollup")
        importers = {
            key: _metadata(result, key).get("status")
            for key in ("site_analytics_daily", "github_release_downloads_daily")
        }
        echo(
            f"      {day} {'SUCCESS' if result.success else 'FAILURE'}: rollup rows {rollup.get('rows')}, "
            f"events {rollup.get('first_party_events')}; importers "
            + ", ".join(f"{k} {v}" for k, v in importers.items())
        )

    with engine.connect() as conn:
        for campaign in DEMO_CAMPAIGNS:
            report = measurement_report(conn, campaign.id, day_list[0], day_list[-1])
            echo("")
            for line in render(report, "table").splitlines():
                if line.startswith("Daily"):
                    break
                echo(f"      {line}" if line else "")


def _metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, Any]:
    materializations = result.asset_materializations_for_node(asset)
    if not materializations:
        return {}
    return {k: getattr(v, "value", v) for k, v in materializations[-1].metadata.items()}
