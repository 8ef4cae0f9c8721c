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
    RANGE_END_TAG,
    RANGE_START_TAG,
    ROLLUP_IO_MANAGER,
    build_measurement_daily,
)
from marketing_pipelines.measurement.events.write import record_events
from marketing_pipelines.measurement.importers.github import GitHubReleasesClient
from marketing_pipelines.measurement.importers.plausible import PlausibleClient
from marketing_pipelines.measurement.keys import ROLLUP_KEY
from marketing_pipelines.measurement.report.build import measurement_report
from marketing_pipelines.measurement.report.frames import RollupFrameIOManager
from marketing_pipelines.measurement.report.rendering import render
from marketing_pipelines.settings import Settings

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
    engine: sa.Engine, instance: dg.DagsterInstance, echo: Callable[[str], None], days: int, settings: Settings
) -> None:
    """Seed ``days`` complete UTC days of events, materialize those partitions on ``instance``, print each report."""
    today = datetime.now(UTC).date()
    first = max(today - timedelta(days=days), settings.measurement_start_date)
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

    url = engine.url.render_as_string(hide_password=False)
    resources = {
        "app_db": AppDatabase(url=url),
        # Unconfigured on purpose: the demo needs no network. An unconfigured importer materializes
        # nothing, so the demo selects only the rollup and says why the importers are left out.
        "plausible": PlausibleClient(),
        "github": GitHubReleasesClient(),
        ROLLUP_IO_MANAGER: RollupFrameIOManager(url=url),
    }
    for importer in (resources["plausible"], resources["github"]):
        if not importer.is_configured():
            echo(f"      {importer.name} is not configured, its asset is left out: {importer.not_configured_reason()}")
    # The week in one run, as a backfill runs a range of days: one materialization per day all the same.
    result = dg.materialize(
        [build_measurement_daily(settings)],
        selection=[ROLLUP_KEY],
        instance=instance,
        resources=resources,
        tags={RANGE_START_TAG: day_list[0].isoformat(), RANGE_END_TAG: day_list[-1].isoformat()},
        run_config={"loggers": {"console": {"config": {"log_level": "WARNING"}}}},
        raise_on_error=False,
    )
    status = "SUCCESS" if result.success else "FAILURE"
    echo(f"      measurement_daily_rollup, {day_list[0]} .. {day_list[-1]} in one run: {status}")
    for day, rollup in _rollup_days(result):
        echo(f"        {day}: rollup rows {rollup.get('rows')}, events {rollup.get('first_party_events')}")

    with engine.connect() as conn:
        for campaign in DEMO_CAMPAIGNS:
            report = measurement_report(conn, campaign.id, day_list[0], day_list[-1])
            echo("")
            for line in render(report, "table").splitlines():
                if line.startswith("Daily"):
                    break
                echo(f"      {line}" if line else "")


def _rollup_days(result: dg.ExecuteInProcessResult) -> list[tuple[str, dict[str, Any]]]:
    """Each day's rollup materialization metadata, in day order."""
    days = [
        (event.partition or "", {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()})
        for event in result.get_asset_materialization_events()
        if event.asset_key == ROLLUP_KEY
    ]
    return sorted(days, key=lambda item: item[0])
