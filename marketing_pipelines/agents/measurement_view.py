"""What the agents' ``read_measurement`` tool sees: a campaign's rollup over a date range.

Reads only the rollup table (never raw events), so a tool call costs the same however many
events a campaign has.
"""

from __future__ import annotations

from datetime import date
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.db.schema import metadata

NO_MEASUREMENT = "no measurement yet"


def summarize(conn: sa.Connection, campaign_id: str, start: date, end: date) -> dict[str, Any]:
    rollup = metadata.tables.get("measurement_daily_rollup")
    if rollup is None:
        return {"campaign_id": campaign_id, "status": NO_MEASUREMENT}
    rows = conn.execute(
        sa.select(rollup.c.stage, rollup.c.event_type, sa.func.sum(rollup.c.raw_count).label("raw_count"))
        .where(rollup.c.campaign_id == campaign_id, rollup.c.day >= start, rollup.c.day <= end)
        .group_by(rollup.c.stage, rollup.c.event_type)
        .order_by(rollup.c.stage, rollup.c.event_type)
    ).all()
    if not rows:
        return {"campaign_id": campaign_id, "from": start.isoformat(), "to": end.isoformat(), "status": NO_MEASUREMENT}
    return {
        "campaign_id": campaign_id,
        "from": start.isoformat(),
        "to": end.isoformat(),
        "rows": [{"stage": r.stage, "event_type": r.event_type, "raw_count": int(r.raw_count)} for r in rows],
    }
