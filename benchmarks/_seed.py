"""Seeding shared by the work-queue benchmarks: N due executions of one campaign, nothing else."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from marketing_pipelines.db.campaigns import Campaign, upsert_campaign
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import marketing_execution as t


def seed_due(url: str, rows: int, chunk: int = 20_000) -> None:
    """Replace every execution with ``rows`` due ones (ids restart where the database allows)."""
    engine = get_engine(url)
    with engine.begin() as conn:
        upsert_campaign(conn, Campaign("bench", "Bench", "bench"))
        conn.execute(sa.delete(t))
    now = datetime.now(UTC)
    for start in range(0, rows, chunk):
        batch = [
            {
                "campaign_id": "bench",
                "stage": "launch",
                "action": "log",
                "payload": {"message": f"m{i}"},
                "due_at": now - timedelta(seconds=rows - i),
                "status": "SCHEDULED",
                "attempts": 0,
                "max_attempts": 3,
                "created_at": now,
                "updated_at": now,
            }
            for i in range(start, min(rows, start + chunk))
        ]
        with engine.begin() as conn:
            conn.execute(sa.insert(t), batch)
