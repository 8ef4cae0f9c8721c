"""The measurement part of ``marketing-pipelines demo``: seed events, print the reports the rollup gives.

Event ids are derived from campaign, day and sequence, so a second run inserts nothing new. The
rollup itself is built by a run of ``measurement_rollup_job`` that the demo launches on its local
instance (demo.py), as an operator's backfill would.
"""

import random
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.db.campaigns import Campaign, add_campaign, get_campaign
from marketing_pipelines.measurement.events.write import record_events
from marketing_pipelines.measurement.report.build import measurement_report
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


def demo_days(days: int, settings: Settings) -> list[date]:
    """The ``days`` complete UTC days before today, none before the first partition."""
    today = datetime.now(UTC).date()
    first = max(today - timedelta(days=days), settings.measurement_start_date)
    return [first + timedelta(days=i) for i in range((today - first).days)]


def seed_demo_events(engine: sa.Engine, echo: Callable[[str], None], day_list: list[date]) -> None:
    """Each demo campaign's events of each day (derived ids: a second demo records none again)."""
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


def echo_reports(engine: sa.Engine, echo: Callable[[str], None], day_list: list[date]) -> None:
    """Each demo campaign's report over the days, read from the rollup, up to its daily table."""
    with engine.connect() as conn:
        for campaign in DEMO_CAMPAIGNS:
            report = measurement_report(conn, campaign.id, day_list[0], day_list[-1])
            echo("")
            for line in render(report, "table").splitlines():
                if line.startswith("Daily"):
                    break
                echo(f"      {line}" if line else "")
