"""What the agents' ``read_measurement`` tool sees: the measurement report over a date range.

It is the same report analysts get (``measurement.report``), which reads only the rollup, so a
tool call costs the same however many raw events a campaign has.
"""

from __future__ import annotations

from datetime import date
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.measurement.report.build import measurement_report

NO_MEASUREMENT = "no measurement yet"


def summarize(conn: sa.Connection, campaign_id: str, start: date, end: date) -> dict[str, Any]:
    report = measurement_report(conn, campaign_id, start, end)
    window = {"campaign_id": campaign_id, "from": start.isoformat(), "to": end.isoformat()}
    if not report.totals:
        return {**window, "status": NO_MEASUREMENT}
    return {
        **window,
        "totals": [
            {
                "source": t.source,
                "stage": t.stage,
                "event_type": t.event_type,
                "raw_count": t.raw_count,
                "unique_actors": t.unique_actors,
                "unique_actors_exact": t.unique_actors_exact,
            }
            for t in report.totals
        ],
        "funnel": [
            {"stage": f.stage, "unique_actors": f.unique_actors, "from_previous": f.from_previous}
            for f in report.funnel
        ],
    }
