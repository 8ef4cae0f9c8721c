"""The measurement demo runs on a fresh database, and a second run adds nothing."""

from __future__ import annotations

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import marketing_event, measurement_daily_rollup
from marketing_pipelines.measurement.demo import run_measurement_demo
from marketing_pipelines.measurement.keys import ROLLUP_KEY
from marketing_pipelines_tests.built import DEFAULTS


def counts(engine: sa.Engine) -> tuple[int, int, int]:
    with engine.connect() as conn:
        events = conn.execute(sa.select(sa.func.count()).select_from(marketing_event)).scalar_one()
        rows, total = conn.execute(sa.select(sa.func.count(), sa.func.sum(measurement_daily_rollup.c.raw_count))).one()
    return events, rows, total


def test_demo_is_safe_to_run_twice(sqlite_url: str) -> None:
    engine = get_engine(sqlite_url)
    lines: list[str] = []
    with dg.DagsterInstance.ephemeral() as instance:
        run_measurement_demo(engine, instance, lines.append, days=2, settings=DEFAULTS)
        first = counts(engine)
        run_measurement_demo(engine, instance, lines.append, days=2, settings=DEFAULTS)
        records = instance.fetch_materializations(ROLLUP_KEY, limit=100).records
    # Each day's materialization names the importers the demo runs without (it said "none" before).
    shown = {r.asset_materialization.metadata["sources_not_configured"].value for r in records}
    assert len(records) == 4 and shown == {
        "site_analytics_daily: set PLAUSIBLE_API_KEY and PLAUSIBLE_SITE_ID; github_release_downloads_daily: "
        "set GITHUB_TOKEN (unauthenticated GitHub allows 60 requests an hour)"
    }
    assert first[0] > 0 and first[0] == first[2]
    assert counts(engine) == first
    assert any("0 recorded" in line for line in lines)
    assert sum("Funnel" in line for line in lines) == 4
    # The two days in one range run, each day materialized; the unconfigured importers said so and were left out.
    assert sum("in one run: SUCCESS" in line for line in lines) == 2
    assert sum("is not configured, its asset is left out" in line for line in lines) == 4
    assert sum(line.strip().startswith(("20", "19")) and "rollup rows" in line for line in lines) == 4
