"""A year's backfill of a measurement source within its request quota, through the real daemon.

One invocation, on throwaway PostgreSQL databases, with a fake Plausible Stats API served from this process that
enforces a request quota as Plausible does (``--quota`` requests per ``--period`` seconds, a 429 with Plausible's
body and no Retry-After past it). The quota is scaled down from Plausible's 600 an hour so that a year's backfill
(``--days`` days in runs of ``--days-per-run``) needs more requests than one period allows. Two sessions of
``dagster-daemon run`` and ``dagster-webserver``, side by side, each sending the UI's "Materialize" of
``site_analytics_daily`` over every day:

- **shared bucket**: the source's bucket (``source:site_analytics``) sized from the quota as the contract sizes it
  (``Quota.burst``, ``Quota.per_minute``), what ``marketing-pipelines limits set`` does for an operator;
- **no bucket**: the bucket set far above the quota, as if requests were not planned (how every importer ran
  before the contract).

Prints for each: the backfill's end state, seconds, runs and failed runs, the requests the fake received and the
429s it answered, the most requests it saw in any one period, and (shared bucket) the ratio of the seconds taken
to the floor the quota sets, the seconds needed to spend that many requests at the quota's rate.

    python benchmarks/source_quota.py
    python benchmarks/source_quota.py --days 120 --days-per-run 10 --quota 4 --period 60
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import deque
from datetime import UTC, date, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import dagster as dg
from _common import print_table, throwaway_database
from _daemon import INSTANCE_CONFIG, daemon_env, dagster_storage_database, environ, log_findings
from backfill import _Quiet, asset_backfill, launch, serve, session, wait_backfill

from marketing_pipelines.db import token_bucket
from marketing_pipelines.db.campaigns import Campaign, upsert_campaign
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import EVERY_MODEL
from marketing_pipelines.measurement.sources import SITE_ANALYTICS, Quota

SITE = SITE_ANALYTICS.asset


class Enforcer:
    """The fake's own view of the quota: the requests it served, and the 429s it answered past the quota."""

    def __init__(self, quota: int, period_s: float) -> None:
        self.quota, self.period_s = quota, period_s
        self.served: list[float] = []
        self.window: deque[float] = deque()
        self.refused = 0
        self.lock = threading.Lock()

    def admit(self) -> bool:
        now = time.monotonic()
        with self.lock:
            while self.window and now - self.window[0] >= self.period_s:
                self.window.popleft()
            if len(self.window) >= self.quota:
                self.refused += 1
                return False
            self.window.append(now)
            self.served.append(now)
            return True

    def most_in_a_period(self) -> int:
        """The most requests served within any ``period_s`` seconds."""
        best, start = 0, 0
        for end, stamp in enumerate(self.served):
            while stamp - self.served[start] >= self.period_s:
                start += 1
            best = max(best, end - start + 1)
        return best


def plausible(enforcer: Enforcer) -> type[BaseHTTPRequestHandler]:
    class Handler(_Quiet):
        def do_POST(self) -> None:
            query = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
            if not enforcer.admit():
                limit = f"Your API key is limited to {enforcer.quota} requests per {enforcer.period_s:.0f} seconds."
                self.answer(429, {"error": f"Too many API requests. {limit}"})
                return
            first, last = (date.fromisoformat(d) for d in query["date_range"])
            rows, day = [], first
            while day <= last:
                views = day.toordinal() % 30 + 1
                rows.append({"dimensions": [day.isoformat(), "spring26", "/"], "metrics": [views, 2 * views]})
                day += timedelta(days=1)
            page = query["pagination"]
            chunk = rows[page["offset"] : page["offset"] + page["limit"]]
            self.answer(200, {"results": chunk, "meta": {}, "query": {}})

    return Handler


def measure(args: argparse.Namespace, planned: bool) -> dict[str, Any]:
    today = datetime.now(UTC).date()
    first = today - timedelta(days=args.days)
    keys = [(first + timedelta(days=n)).isoformat() for n in range(args.days)]
    enforcer = Enforcer(args.quota, args.period)
    quota = Quota(args.quota, args.period)
    with (
        throwaway_database("postgres") as app_url,
        dagster_storage_database() as pg,
        environ(pg),
        tempfile.TemporaryDirectory(prefix="mp-bench-home-") as home_dir,
        serve(plausible(enforcer)) as plausible_url,
    ):
        engine = get_engine(app_url)
        with engine.begin() as conn:
            upsert_campaign(conn, Campaign("spring", "Spring", "ana", utm_campaign="spring26"))
            per_minute, burst = (quota.per_minute, quota.burst) if planned else (100_000.0, 100_000.0)
            token_bucket.configure_limit(conn, SITE_ANALYTICS.quota_bucket, EVERY_MODEL, "requests", per_minute, burst)
        engine.dispose()
        home = Path(home_dir)
        (home / "dagster.yaml").write_text(INSTANCE_CONFIG.read_text())
        env = daemon_env(
            app_url,
            home,
            pg,
            {
                "MARKETING_MEASUREMENT_START_DATE": first.isoformat(),
                "MARKETING_BACKFILL_DAYS_PER_RUN": str(args.days_per_run),
                "PLAUSIBLE_API_KEY": "bench-key",
                "PLAUSIBLE_SITE_ID": "bench.example",
                "PLAUSIBLE_BASE_URL": plausible_url,
            },
        )
        logs = Path(tempfile.mkdtemp(prefix="mp-bench-quota-"))
        label = "shared bucket" if planned else "no bucket"
        with (
            dg.DagsterInstance.from_config(str(home)) as instance,
            session(env, logs, label.replace(" ", "-")) as (client, daemon),
        ):
            status, seconds, runs = wait_backfill(
                instance, launch(client, asset_backfill(keys, (SITE,))), daemon, args.timeout
            )
            failed = len(instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE])))
            missing = len(set(keys) - instance.get_materialized_partitions(dg.AssetKey(SITE)))
            findings = [line for line in log_findings(daemon.log_path) if "No heartbeat" not in line]
    floor = max(len(enforcer.served) - quota.burst, 0) / (quota.per_minute / 60)
    return {
        "label": label,
        "status": status,
        "seconds": seconds,
        "runs": runs,
        "failed": failed,
        "missing": missing,
        "requests": len(enforcer.served),
        "refused": enforcer.refused,
        "most": enforcer.most_in_a_period(),
        "floor": floor,
        "findings": findings,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--days-per-run", type=int, default=15)
    parser.add_argument("--quota", type=int, default=6, help="requests the fake serves per --period")
    parser.add_argument("--period", type=float, default=60.0)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--skip-unplanned", action="store_true", help="measure the shared bucket only")
    args = parser.parse_args()
    results = [measure(args, planned=True)]
    if not args.skip_unplanned:
        results.append(measure(args, planned=False))
    print_table(
        f"{args.days} days of {SITE} in runs of {args.days_per_run}; the fake serves {args.quota} per "
        f"{args.period:.0f} s",
        ["", "backfill", "s", "runs", "failed runs", "days missing", "requests", "429s", "most in a period"],
        [
            [
                r["label"],
                r["status"],
                f"{r['seconds']:.0f}",
                r["runs"],
                r["failed"],
                r["missing"],
                r["requests"],
                r["refused"],
                r["most"],
            ]
            for r in results
        ],
    )
    planned = results[0]
    print(
        f"shared bucket: {planned['seconds']:.0f} s for {planned['requests']} requests; the quota's floor for them "
        f"{planned['floor']:.0f} s; ratio {planned['seconds'] / planned['floor']:.2f}"
        if planned["floor"]
        else "shared bucket: every request fit in the burst"
    )
    for r in results:
        if r["findings"]:
            print(f"{r['label']} daemon log findings:\n  " + "\n  ".join(r["findings"][:8]))
    ok = planned["refused"] == 0 and planned["status"] == "COMPLETED_SUCCESS" and planned["most"] <= args.quota
    print("ok   no 429 and within the quota with the shared bucket" if ok else "FAIL the shared bucket met a 429")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
