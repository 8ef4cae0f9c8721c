"""Revised days rolled up again by declarative automation, through the real daemon: ticks, runs and latency.

One invocation, on throwaway PostgreSQL databases (the application's and Dagster's own), with a fake Plausible
Stats API served from this process:
1. Starts ``dagster-daemon run`` and ``dagster-webserver`` on the repository's workspace with Plausible configured,
   and backfills ``--days`` days of ``site_analytics_daily`` and ``measurement_daily_rollup`` together (the UI's
   "Materialize" of both): the daemon's automation must ask for none of them again.
2. Plausible revises ``--revised`` of those days (its answers change), and a backfill of the importer alone
   re-imports them, as ``measurement_daily_schedule``'s revision runs do. ``measurement_automation_sensor``
   (the rollup's ``AutomationCondition``) must rebuild exactly those days' rollup.
3. Prints, per revised day, the latency from the importer's materialization to the rollup's, the automation
   sensor's ticks and what they launched, and the ratio of the median latency to its ceiling: one sensor interval
   plus a one-run backfill from launch to COMPLETED (the importer-only backfill of step 2, measured alongside).
   Checks that every revised day's rollup equals an independent recount of the fake's revised answers, and that
   no other day's rollup was rebuilt.

    python benchmarks/rollup_automation.py
    python benchmarks/rollup_automation.py --days 10 --revised 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import dagster as dg
import httpx
import sqlalchemy as sa
from _common import print_table
from _daemon import deployment, log_findings
from backfill import _Quiet, asset_backfill, graphql, launch, plausible_env, serve, session, wait_backfill

from marketing_pipelines.db.campaigns import Campaign, upsert_campaign
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import measurement_daily_rollup
from marketing_pipelines.measurement.defs import measurement_automation_sensor

SITE, ROLLUP = "site_analytics_daily", "measurement_daily_rollup"
INTERVAL_S = measurement_automation_sensor.minimum_interval_seconds or 30
UTMS = ("spring26", "devbeta", "autumn26")
TICKS = """
query Ticks($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor { sensorState { ticks(limit: 200) { status timestamp runIds } } }
  }
}
"""


class Answers:
    """The fake's pageviews of (day, utm, page), raised by ``revision`` on the revised days."""

    def __init__(self) -> None:
        self.revised: set[date] = set()
        self.requests = 0

    def pageviews(self, day: date, utm_index: int, page_index: int) -> int:
        base = (day.toordinal() + utm_index * 7 + page_index) % 40 + 3
        return base + (100 if day in self.revised else 0)


def plausible(answers: Answers) -> type[BaseHTTPRequestHandler]:
    class Handler(_Quiet):
        def do_POST(self) -> None:
            query = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
            answers.requests += 1
            first, last = (date.fromisoformat(d) for d in query["date_range"])
            rows, day = [], first
            while day <= last:
                for u, utm in enumerate(UTMS):
                    for p, page in enumerate(("/", "/pricing")):
                        views = answers.pageviews(day, u, p)
                        rows.append({"dimensions": [day.isoformat(), utm, page], "metrics": [views // 2, views]})
                day += timedelta(days=1)
            page = query["pagination"]
            self.answer(
                200, {"results": rows[page["offset"] : page["offset"] + page["limit"]], "meta": {}, "query": {}}
            )

    return Handler


def materializations(instance: dg.DagsterInstance, key: str) -> dict[str, list[float]]:
    """Partition -> timestamps of its materializations, oldest first."""
    records = instance.fetch_materializations(dg.AssetKey(key), limit=10_000).records
    by_partition: dict[str, list[float]] = {}
    for record in records:
        by_partition.setdefault(record.partition_key or "", []).append(record.timestamp)
    return {partition: sorted(stamps) for partition, stamps in by_partition.items()}


def recount(answers: Answers, day: date) -> dict[str, int]:
    return {f"c{u}": sum(answers.pageviews(day, u, p) for p in (0, 1)) for u in range(len(UTMS))}


def rollup_counts(engine: sa.Engine, day: date) -> dict[str, int]:
    r = measurement_daily_rollup
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(r.c.campaign_id, r.c.raw_count).where(r.c.day == day, r.c.source == "site_analytics")
        )
        return {campaign_id: int(count) for campaign_id, count in rows}


def sensor_ticks(client: httpx.Client, since: float) -> list[dict[str, Any]]:
    selector = {
        "repositoryLocationName": "marketing_pipelines",
        "repositoryName": "__repository__",
        "sensorName": measurement_automation_sensor.name,
    }
    result = graphql(client, TICKS, {"selector": selector})["sensorOrError"]
    ticks = result.get("sensorState", {}).get("ticks", []) if result["__typename"] == "Sensor" else []
    return [t for t in ticks if float(t["timestamp"]) >= since]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--revised", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    if not 1 <= args.revised <= args.days:
        sys.exit("--revised must be between 1 and --days")
    today = datetime.now(UTC).date()
    days = [today - timedelta(days=n) for n in range(args.days, 0, -1)]
    revised = days[-args.revised :]
    answers = Answers()

    with deployment() as deployed, serve(plausible(answers)) as plausible_url:
        engine = get_engine(deployed.app_url)
        with engine.begin() as conn:
            for u, utm in enumerate(UTMS):
                upsert_campaign(conn, Campaign(f"c{u}", f"Campaign {u}", "ana", utm_campaign=utm))
        home = deployed.home
        env = deployed.env({"MARKETING_MEASUREMENT_START_DATE": days[0].isoformat(), **plausible_env(plausible_url)})
        logs = Path(tempfile.mkdtemp(prefix="mp-bench-automation-"))
        keys = [d.isoformat() for d in days]
        with (
            dg.DagsterInstance.from_config(str(home)) as instance,
            session(env, logs, "automation") as (client, daemon),
        ):
            both = wait_backfill(instance, launch(client, asset_backfill(keys, (SITE, ROLLUP))), daemon, args.timeout)
            # Two sensor intervals with nothing to do: the automation must ask for nothing after the joint backfill.
            quiet_since = time.time()
            time.sleep(2 * INTERVAL_S + 5)
            rollup_before = materializations(instance, ROLLUP)
            quiet_ticks = sensor_ticks(client, quiet_since)

            answers.revised = set(revised)
            revision_since = time.time()
            only_site = wait_backfill(
                instance,
                launch(client, asset_backfill([d.isoformat() for d in revised], (SITE,))),
                daemon,
                args.timeout,
            )
            site_after = materializations(instance, SITE)
            latencies: dict[date, float | None] = {}
            deadline = time.monotonic() + args.timeout
            while time.monotonic() < deadline:
                rollup_after = materializations(instance, ROLLUP)
                latencies = {
                    d: next(
                        (
                            t - site_after[d.isoformat()][-1]
                            for t in rollup_after.get(d.isoformat(), [])
                            if t > site_after[d.isoformat()][-1]
                        ),
                        None,
                    )
                    for d in revised
                }
                if all(v is not None for v in latencies.values()):
                    break
                daemon.check_alive()
                time.sleep(1)
            time.sleep(INTERVAL_S + 5)  # one more tick: nothing more
            rollup_final = materializations(instance, ROLLUP)
            ticks = sensor_ticks(client, revision_since)
            findings = log_findings(daemon.log_path)
        checks = {
            "revised days equal a recount": all(rollup_counts(engine, d) == recount(answers, d) for d in revised),
            "other days not rebuilt": all(
                len(rollup_final.get(d.isoformat(), [])) == len(rollup_before.get(d.isoformat(), []))
                for d in days
                if d not in revised
            ),
            "each revised day rebuilt once": all(
                len(rollup_final[d.isoformat()]) == len(rollup_before[d.isoformat()]) + 1 for d in revised
            ),
            "nothing asked after the joint backfill": not any(t["runIds"] for t in quiet_ticks),
        }
        engine.dispose()

    measured = [v for v in latencies.values() if v is not None]
    median = statistics.median(measured) if measured else float("nan")
    # The automation sensor asks for the days in one backfill (several partitions of one asset), which the backfill
    # daemon then runs: at best one sensor interval, then a backfill of one run, as long as the importer-only
    # backfill took from launch to COMPLETED in this same session.
    ceiling = INTERVAL_S + only_site[1]
    print_table(
        "revised days",
        ["day", "importer materialized -> rollup rebuilt (s)"],
        [[d.isoformat(), f"{v:.1f}" if v is not None else "never"] for d, v in latencies.items()],
    )
    launched = [t for t in ticks if t["runIds"]]
    print(
        f"joint backfill: {both[0]} in {both[1]:.1f} s, {both[2]} runs; "
        f"importer-only backfill: {only_site[0]} in {only_site[1]:.1f} s, {only_site[2]} runs"
    )
    print(
        f"automation sensor: {len(ticks)} ticks since the revision, {len(launched)} launched "
        f"{sum(len(t['runIds']) for t in launched)} run(s); {len(quiet_ticks)} quiet ticks launched nothing: "
        f"{not any(t['runIds'] for t in quiet_ticks)}"
    )
    print(
        f"median latency {median:.1f} s; ceiling (sensor interval {INTERVAL_S} s + a one-run backfill "
        f"{only_site[1]:.1f} s) {ceiling:.1f} s; ratio {median / ceiling:.2f}"
    )
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    if findings:
        print("daemon log findings:\n  " + "\n  ".join(findings))
    if not all(checks.values()) or len(measured) < len(revised):
        sys.exit(1)


if __name__ == "__main__":
    main()
