"""A year's backfill of a measurement source within its request quota, through the real daemon.

One invocation per ``--source``, on throwaway PostgreSQL databases, with a fake of that source's API served from this
process (the tests' fakes, answering in the API's own shapes) behind an enforcer of a request quota as the service
enforces its own (``--quota`` requests per ``--period`` seconds, a 429 past it). The quota is scaled down from the
service's so that a year's backfill (``--days`` days, or as many as the source's lookback lets be read, in runs of
``--days-per-run``) needs more requests than one period allows. Sessions of ``dagster-daemon run`` and
``dagster-webserver``, side by side, each sending the UI's "Materialize" of the source's asset over every day:

- **shared bucket**: the source's bucket (``source:<name>``) sized from the quota as the contract sizes it
  (``Quota.burst``, ``Quota.per_minute``), what ``marketing-pipelines limits set`` does for an operator;
- **no bucket**: the bucket set far above the quota, as if requests were not planned (how every importer ran
  before the contract).

Prints for each: the backfill's end state, seconds, runs and failed runs, the requests the fake received and the
429s it answered, the most requests it saw in any one period, and (shared bucket) the ratio of the seconds taken
to the floor the quota sets, the seconds needed to spend that many requests at the quota's rate. GA4's token
requests go to its token endpoint, which the quota does not count (nor does GA4's).

    python benchmarks/source_quota.py
    python benchmarks/source_quota.py --source posthog --skip-unplanned
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
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import dagster as dg
import httpx
from _common import print_table
from _daemon import deployment, log_findings
from backfill import _Quiet, asset_backfill, launch, serve, session, wait_backfill

# The tests' fakes of each service's API (marketing_pipelines_tests), importable from the repository's root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from marketing_pipelines.db import token_bucket
from marketing_pipelines.db.campaigns import Campaign, upsert_campaign
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import EVERY_MODEL
from marketing_pipelines.measurement.sources import Quota, Source, source_named
from marketing_pipelines_tests.measurement.fake_services import (
    FakeGoogle,
    FakePostHog,
    NpmDownloadsFake,
    PyPIStatsFake,
    ga4_report,
    service_account_key,
)

UTM = "spring26"
Handler = Callable[[httpx.Request], httpx.Response]
UNLIMITED = (10**9, 60.0)  # the tests' fakes' own quotas, out of the way of the enforcer's


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


def plausible(days: list[date]) -> Handler:
    """Plausible's Stats API v2 (``POST /api/v2/query``): one page view row per day of the asked range."""

    def answer(request: httpx.Request) -> httpx.Response:
        query = json.loads(request.content)
        first, last = (date.fromisoformat(d) for d in query["date_range"])
        rows = [
            {"dimensions": [d.isoformat(), UTM, "/"], "metrics": [d.toordinal() % 30 + 1, 2 * (d.toordinal() % 30 + 1)]}
            for d in days
            if first <= d <= last
        ]
        page = query["pagination"]
        return httpx.Response(
            200, json={"results": rows[page["offset"] : page["offset"] + page["limit"]], "meta": {}, "query": {}}
        )

    return answer


def ga4(days: list[date]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """GA4's token endpoint and runReport: one row of the campaign per day of the request's date range."""

    def report(body: dict[str, Any]) -> dict[str, Any]:
        [span] = body["dateRanges"]
        first, last = date.fromisoformat(span["startDate"]), date.fromisoformat(span["endDate"])
        return ga4_report([(d, UTM, 3, 5, 2) for d in days if first <= d <= last])

    return report  # wrapped in FakeGoogle once the served URL (its token endpoint's) is known


@dataclass(frozen=True)
class Fake:
    """A source's fake API and the settings and campaign that point the importer at it."""

    handler: Handler
    env: dict[str, str]
    campaign: Campaign
    counted: Callable[[str], bool] = lambda path: True  # which request paths the quota counts


def fake_for(source: Source, url: str, days: list[date]) -> Fake:
    campaign = Campaign("spring", "Spring", "ana", utm_campaign=UTM)
    table = {d: 10 + d.toordinal() % 7 for d in days}
    if source.name == "site_analytics":
        env = {"PLAUSIBLE_API_KEY": "bench-key", "PLAUSIBLE_SITE_ID": "bench.example", "PLAUSIBLE_BASE_URL": url}
        return Fake(plausible(days), env, campaign)
    if source.name == "posthog":
        events = [(datetime.combine(d, datetime.min.time(), tzinfo=UTC) + timedelta(hours=12), UTM, "p1") for d in days]
        env = {"POSTHOG_API_KEY": "phx_bench", "POSTHOG_PROJECT_ID": "1", "POSTHOG_HOST": url}
        return Fake(FakePostHog(events), env, campaign)
    if source.name == "pypi_downloads":
        # The campaign's package and one it does not name (never asked).
        fake = PyPIStatsFake({"acme-widget": table, "acme-lib": table}, quota=UNLIMITED)
        env = {"MARKETING_PYPI_DOWNLOADS_ENABLED": "true", "PYPISTATS_API_URL": url}
        return Fake(fake, env, Campaign("spring", "Spring", "ana", pypi_package="acme-widget"))
    if source.name == "npm_downloads":
        fake = NpmDownloadsFake({"acme-cli": table}, quota=UNLIMITED)
        env = {"MARKETING_NPM_DOWNLOADS_ENABLED": "true", "NPM_DOWNLOADS_API_URL": url}
        return Fake(fake, env, Campaign("spring", "Spring", "ana", npm_package="acme-cli"))
    if source.name == "ga4":
        token_url = f"{url}/token"
        key = json.dumps(service_account_key(token_uri=token_url))
        env = {"GA4_PROPERTY_ID": "123456789", "GA4_SERVICE_ACCOUNT_JSON": key, "GA4_API_URL": url}
        env["GA4_TOKEN_URL"] = token_url
        return Fake(FakeGoogle(ga4(days), token_url=token_url), env, campaign, lambda path: path != "/token")
    raise SystemExit(f"--source {source.name}: no fake for it here")


class Served:
    """Whatever fake is set as ``fake``, behind the enforcer, as an HTTP server's handler class."""

    def __init__(self, enforcer: Enforcer) -> None:
        self.enforcer = enforcer
        self.fake: Fake | None = None
        self.base = ""

    def handler_class(self) -> type[BaseHTTPRequestHandler]:
        served = self

        class Handler(_Quiet):
            def answer_any(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                fake = served.fake
                assert fake is not None
                path = self.path.split("?")[0]
                if fake.counted(path) and not served.enforcer.admit():
                    self.answer(429, {"error": "Too many requests", "detail": "Request was throttled."})
                    return
                request = httpx.Request(
                    self.command, f"{served.base}{self.path}", headers=dict(self.headers), content=body
                )
                response = fake.handler(request)
                response.read()
                self.send_response(response.status_code)
                self.send_header("content-type", response.headers.get("content-type", "application/json"))
                self.send_header("content-length", str(len(response.content)))
                self.end_headers()
                self.wfile.write(response.content)

            do_GET = do_POST = answer_any

        return Handler


def measure(args: argparse.Namespace, source: Source, planned: bool) -> dict[str, Any]:
    today = datetime.now(UTC).date()
    first = today - timedelta(days=args.days)
    # The days the source can still be read (its lookback): a backfill asks for those, as `backfill --imports` does.
    days = [
        first + timedelta(days=n)
        for n in range(args.days)
        if source.contract.readable(first + timedelta(days=n), today)
    ]
    keys = [d.isoformat() for d in days]
    enforcer = Enforcer(args.quota, args.period)
    quota = Quota(args.quota, args.period)
    served = Served(enforcer)
    with deployment() as deployed, serve(served.handler_class()) as url:
        served.base = url
        fake = served.fake = fake_for(source, url, days)
        engine = get_engine(deployed.app_url)
        with engine.begin() as conn:
            upsert_campaign(conn, fake.campaign)
            per_minute, burst = (quota.per_minute, quota.burst) if planned else (100_000.0, 100_000.0)
            token_bucket.configure_limit(conn, source.quota_bucket, EVERY_MODEL, "requests", per_minute, burst)
        engine.dispose()
        home = deployed.home
        env = deployed.env(
            {
                "MARKETING_MEASUREMENT_START_DATE": days[0].isoformat(),
                "MARKETING_BACKFILL_DAYS_PER_RUN": str(args.days_per_run),
                **fake.env,
            }
        )
        logs = Path(tempfile.mkdtemp(prefix="mp-bench-quota-"))
        label = f"{source.name}, {'shared bucket' if planned else 'no bucket'}"
        with (
            dg.DagsterInstance.from_config(str(home)) as instance,
            session(env, logs, label.replace(" ", "-").replace(",", "")) as (client, daemon),
        ):
            status, seconds, runs = wait_backfill(
                instance, launch(client, asset_backfill(keys, (source.asset,))), daemon, args.timeout
            )
            failed = len(instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE])))
            missing = len(set(keys) - instance.get_materialized_partitions(dg.AssetKey(source.asset)))
            findings = [line for line in log_findings(daemon.log_path) if "No heartbeat" not in line]
    floor = max(len(enforcer.served) - quota.burst, 0) / (quota.per_minute / 60)
    return {
        "label": label,
        "days": len(days),
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
    parser.add_argument(
        "--source",
        action="append",
        choices=["site_analytics", "posthog", "pypi_downloads", "npm_downloads", "ga4"],
        help="the source to backfill (repeat for several; default site_analytics)",
    )
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--days-per-run", type=int, default=15)
    parser.add_argument("--quota", type=int, default=6, help="requests the fake serves per --period")
    parser.add_argument("--period", type=float, default=60.0)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--skip-unplanned", action="store_true", help="measure the shared bucket only")
    args = parser.parse_args()
    results = []
    for name in args.source or ["site_analytics"]:
        source = source_named(name)
        results.append(measure(args, source, planned=True))
        if not args.skip_unplanned:
            results.append(measure(args, source, planned=False))
    print_table(
        f"{args.days} days asked (as many as each source can still read) in runs of {args.days_per_run}; the fake "
        f"serves {args.quota} per {args.period:.0f} s",
        ["", "days", "backfill", "s", "runs", "failed runs", "days missing", "requests", "429s", "most in a period"],
        [
            [
                r["label"],
                r["days"],
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
    ok = True
    for r in results:
        if r["label"].endswith("shared bucket"):
            print(
                f"{r['label']}: {r['seconds']:.0f} s for {r['requests']} requests; the quota's floor for them "
                f"{r['floor']:.0f} s; ratio {r['seconds'] / r['floor']:.2f}"
                if r["floor"]
                else f"{r['label']}: every request fit in the burst"
            )
            ok = ok and r["refused"] == 0 and r["status"] == "COMPLETED_SUCCESS" and r["most"] <= args.quota
        if r["findings"]:
            print(f"{r['label']} daemon log findings:\n  " + "\n  ".join(r["findings"][:8]))
    print("ok   no 429 and within the quota with the shared bucket" if ok else "FAIL the shared bucket met a 429")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
