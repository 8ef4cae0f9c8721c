"""Generated events for measurement tests, an independent pandas recount of them, and the rollup rows stored."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import dagster as dg
import pandas as pd
import sqlalchemy as sa

from marketing_pipelines.db.schema import measurement_daily_rollup
from marketing_pipelines.measurement.events.write import record_events
from marketing_pipelines.measurement.keys import ROLLUP_KEY
from marketing_pipelines_tests.factories import add_campaign
from marketing_pipelines_tests.measurement.runs import materialize_measurement

CAMPAIGNS = ("alpha", "bravo", "charlie", "delta")
STAGES = {
    "awareness": ("page_view", "email_open"),
    "consideration": ("signup_started",),
    "conversion": ("signup_completed", "purchase"),
}
# Offsets from -08:00 to +14:00, including a half-hour one, so local dates differ from UTC dates.
ZONES = ("UTC", "America/Los_Angeles", "Asia/Kolkata", "Pacific/Kiritimati", "Europe/Berlin")
DAYS = (date(2026, 11, 25), date(2026, 11, 26), date(2026, 11, 27))
ROLLUP_COLUMNS = ["day", "campaign_id", "stage", "event_type", "raw_count", "unique_actors"]


def generated_events(seed: int = 7, per_day: int = 120, actors: int = 40) -> list[dict[str, Any]]:
    """Events over DAYS (and a little either side) for every campaign, with repeat and missing actors.

    Every UTC midnight between the days gets events exactly on it and a microsecond before it,
    written in a non-UTC zone, so a wrong day boundary moves them to the wrong partition.
    """
    rng = random.Random(seed)
    events: list[dict[str, Any]] = []

    def add(campaign: str, moment: datetime, zone: str) -> None:
        stage = rng.choice(list(STAGES))
        events.append(
            {
                "event_id": f"gen-{seed}-{len(events)}",
                "campaign_id": campaign,
                "stage": stage,
                "event_type": rng.choice(STAGES[stage]),
                "actor_id": None if rng.random() < 0.08 else f"{campaign}-actor-{rng.randrange(actors)}",
                "occurred_at": moment.astimezone(ZoneInfo(zone)).isoformat(),
                "source": rng.choice(("web", "app")),
                "properties": {"n": len(events)},
            }
        )

    start = datetime.combine(DAYS[0], datetime.min.time(), tzinfo=UTC)
    for campaign in CAMPAIGNS:
        for _ in range(per_day * len(DAYS)):
            add(campaign, start + timedelta(seconds=rng.uniform(-7200, 86_400 * len(DAYS) + 7200)), rng.choice(ZONES))
        for offset in range(len(DAYS) + 1):
            midnight = start + timedelta(days=offset)
            for zone in ZONES:
                add(campaign, midnight, zone)
                add(campaign, midnight - timedelta(microseconds=1), zone)
    return events


def pandas_recount(events: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows per (day, campaign, stage, event type) with raw_count and unique_actors, counted from the event dicts."""
    frame = pd.DataFrame(events)
    frame["day"] = pd.to_datetime(frame["occurred_at"], utc=True, format="ISO8601").dt.floor("D").dt.date
    grouped = frame.groupby(["day", "campaign_id", "stage", "event_type"], as_index=False).agg(
        raw_count=("event_id", "size"), unique_actors=("actor_id", "nunique")
    )
    return grouped.sort_values(["day", "campaign_id", "stage", "event_type"]).reset_index(drop=True)


def rollup_rows_frame(engine: sa.Engine, source: str = "first_party") -> pd.DataFrame:
    """The stored measurement_daily_rollup rows of one source, ROLLUP_COLUMNS only, sorted by day and key."""
    r = measurement_daily_rollup
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(r.c.day, r.c.campaign_id, r.c.stage, r.c.event_type, r.c.raw_count, r.c.unique_actors).where(
                r.c.source == source
            )
        ).all()
    frame = pd.DataFrame([tuple(row) for row in rows], columns=ROLLUP_COLUMNS)
    return frame.sort_values(ROLLUP_COLUMNS[:4]).reset_index(drop=True)


def seed(engine: sa.Engine, events: list[dict[str, Any]]) -> None:
    for campaign in sorted({e["campaign_id"] for e in events}):
        add_campaign(engine, campaign)
    with engine.begin() as conn:
        record_events(conn, events, source="test")


def materialize_rollup(db_url: str, instance: dg.DagsterInstance, *days: date) -> dg.ExecuteInProcessResult:
    """The rollup of one day, or of a range of days in one run (as a backfill run does)."""
    return materialize_measurement([ROLLUP_KEY], db_url, days, instance)
