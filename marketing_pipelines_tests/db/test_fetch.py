"""The plain-tuple reads return what SQLAlchemy's own execution returns, on both databases."""

from __future__ import annotations

from datetime import UTC, date, datetime

import sqlalchemy as sa

from marketing_pipelines.db.campaigns import Campaign, upsert_campaign
from marketing_pipelines.db.fetch import fetch_tuples, stream_tuples
from marketing_pipelines.db.schema import measurement_daily_rollup as r

DAYS = [date(2026, 11, d) for d in range(1, 11)]


def test_tuples_match_sqlalchemy_rows(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        upsert_campaign(conn, Campaign(id="alpha", name="Alpha", owner="ana"))
        conn.execute(
            sa.insert(r),
            [
                {
                    "day": day,
                    "campaign_id": "alpha",
                    "source": "first_party",
                    "stage": "awareness",
                    "event_type": "page_view",
                    "raw_count": i,
                    "unique_actors": None if i == 3 else i,
                    "actors_hll": bytes([i]) * 4 if i % 2 else None,
                    "rolled_up_at": datetime(2026, 11, 11, tzinfo=UTC),
                }
                for i, day in enumerate(DAYS)
            ],
        )
    # An expanding IN list is rendered to plain parameters before psycopg2 sees it.
    query = (
        sa.select(r.c.day, r.c.stage, r.c.raw_count, r.c.unique_actors, r.c.actors_hll)
        .where(r.c.campaign_id == "alpha", r.c.day.in_(DAYS[2:7]))
        .order_by(r.c.day)
    )
    with engine.connect() as conn:
        expected = [tuple(row) for row in conn.execute(query)]
        fetched = [tuple(row) for row in fetch_tuples(conn, query)]
        streamed = list(stream_tuples(conn, query, batch=2))

    def plain(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
        # psycopg2 hands bytea over as a memoryview; the values are what matter.
        return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in rows]

    assert len(expected) == 5 and expected[0][0] == DAYS[2]
    assert plain(fetched) == expected
    assert plain(streamed) == expected
