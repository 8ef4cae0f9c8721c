"""The demo's events: realistic, and a second seeding records none again."""

from __future__ import annotations

from datetime import date

import sqlalchemy as sa

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import marketing_event
from marketing_pipelines.measurement.demo import DEMO_CAMPAIGNS, demo_events, seed_demo_events


def test_seeding_twice_records_the_events_once(sqlite_url: str) -> None:
    engine = get_engine(sqlite_url)
    days = [date(2026, 3, 1), date(2026, 3, 2)]
    lines: list[str] = []
    seed_demo_events(engine, lines.append, days)
    seed_demo_events(engine, lines.append, days)
    expected = sum(len(demo_events(c.id, day)) for c in DEMO_CAMPAIGNS for day in days)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(marketing_event)).scalar_one() == expected
    assert lines == [
        f"      events for 2026-03-01 .. 2026-03-02: {expected} recorded, 0 already there",
        f"      events for 2026-03-01 .. 2026-03-02: 0 recorded, {expected} already there",
    ]


def test_a_day_of_events_narrows_down_the_funnel() -> None:
    events = demo_events("spring-launch", date(2026, 3, 1))
    types = {e["event_type"] for e in events}
    per_type = {t: len({e["actor_id"] for e in events if e["event_type"] == t and e["actor_id"]}) for t in types}
    assert per_type["page_view"] > per_type["signup_started"] > per_type["purchase"] > 0
    assert demo_events("spring-launch", date(2026, 3, 1)) == events
