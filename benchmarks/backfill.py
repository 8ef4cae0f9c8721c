"""A year of measurement partitions backfilled from the UI's GraphQL call, through the real daemon.

One invocation, on throwaway PostgreSQL databases (the application's and Dagster's own):

1. Loads ``--events`` events (default 1,000,000) spread over ``--days`` UTC days (default 365) for
   ``--campaigns`` campaigns, and points the two importers at fake Plausible and GitHub APIs served
   from this process (answers shaped like the real ones), so all three assets do their real work.
2. Starts ``dagster-daemon run`` and ``dagster-webserver`` on the repository's workspace, and sends
   the webserver the ``launchPartitionBackfill`` mutation the UI sends for "Materialize all
   partitions" of the three measurement assets: an asset backfill, which follows each asset's
   ``BackfillPolicy.multi_run`` (one run per ``MARKETING_BACKFILL_DAYS_PER_RUN`` days).
3. Waits for the backfill to complete and checks every day: the rollup's first-party total equals the
   day's events, and every asset has every partition materialized.
4. The one-run-per-day shape, side by side: the daemon and webserver restarted with
   ``MARKETING_BACKFILL_DAYS_PER_RUN=1`` (one run per partition, as every backfill ran before the
   backfill policy) and the same mutation for the first ``--per-day-sample`` days; then checks that
   those days' rows are identical to what the range runs wrote. A year of it would take hours, so
   it is measured on the sample and its seconds per partition compared.

    python benchmarks/backfill.py
    python benchmarks/backfill.py --events 100000 --days 60 --per-day-sample 5 --days-per-run 30
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, date, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dagster as dg
import httpx
import sqlalchemy as sa
from _common import free_port, print_table
from _daemon import (
    WORKSPACE,
    Daemon,
    dagster_bin,
    deployment,
    log_findings,
)
from _measurement_events import campaign_ids, generate_events, load_events

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import campaign, measurement_daily_rollup

ASSETS = ("site_analytics_daily", "github_release_downloads_daily", "measurement_daily_rollup")
# Without their credentials the importers are not in the definitions: "every measurement asset" is the rollup.
ROLLUP_ONLY = ("measurement_daily_rollup",)
JOB = "measurement_daily_job"
LOCATION = "marketing_pipelines"
BOOT_TIMEOUT_S = 240.0
ENDED = {"COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED", "COMPLETED"}

LAUNCH = """
mutation Launch($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message }
    ... on InvalidStepError { invalidStepKey }
    ... on InvalidOutputError { stepKey invalidOutputName }
    ... on UnauthorizedError { message }
    ... on PartitionSetNotFoundError { message }
    ... on InvalidSubsetError { message }
  }
}
"""


# --- fake services -------------------------------------------------------------------------------


class _Quiet(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def answer(self, status: int, payload: Any, headers: Mapping[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)


def plausible_handler(utm_campaigns: list[str], requests: list[dict[str, Any]]) -> type[BaseHTTPRequestHandler]:
    """``POST /api/v2/query``: one row per (day, utm_campaign, page) of the asked range, paginated."""

    class Handler(_Quiet):
        def do_POST(self) -> None:
            query = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
            requests.append(query)
            first, last = (date.fromisoformat(d) for d in query["date_range"])
            rows = []
            day = first
            while day <= last:
                for i, utm in enumerate(utm_campaigns):
                    for page in ("/", "/pricing"):
                        n = (day.toordinal() + i) % 50
                        rows.append({"dimensions": [day.isoformat(), utm, page], "metrics": [n + 5, 2 * n + 7]})
                day += timedelta(days=1)
            page = query["pagination"]
            chunk = rows[page["offset"] : page["offset"] + page["limit"]]
            self.answer(200, {"results": chunk, "meta": {}, "query": query})

    return Handler


def github_handler(requests: list[str]) -> type[BaseHTTPRequestHandler]:
    """``GET /repos/{owner}/{repo}/releases``: one release with two assets whose counts grow with the hour."""

    class Handler(_Quiet):
        def do_GET(self) -> None:
            requests.append(self.path)
            repo = self.path.split("?")[0].removeprefix("/repos/").removesuffix("/releases")
            grown = int(time.time() // 3600) % 1000
            assets = [
                {
                    "url": f"http://{self.headers['host']}/repos/{repo}/releases/assets/{asset_id}",
                    "id": asset_id,
                    "node_id": f"RA_{asset_id}",
                    "name": f"{repo.split('/')[1]}-{asset_id}.tar.gz",
                    "label": "",
                    "content_type": "application/gzip",
                    "state": "uploaded",
                    "size": 1024,
                    "download_count": 1000 + grown * asset_id,
                    "created_at": "2026-01-02T08:30:00Z",
                    "updated_at": "2026-01-02T08:31:00Z",
                    "browser_download_url": f"https://github.com/{repo}/releases/download/v1/{asset_id}",
                }
                for asset_id in (abs(hash(repo)) % 10_000 * 10 + 1, abs(hash(repo)) % 10_000 * 10 + 2)
            ]
            release = {
                "id": abs(hash(repo)) % 100_000,
                "tag_name": "v1.0.0",
                "name": "v1.0.0",
                "draft": False,
                "prerelease": False,
                "created_at": "2026-01-02T08:00:00Z",
                "published_at": "2026-01-02T08:35:00Z",
                "assets": assets,
            }
            self.answer(200, [release], {"etag": f'"{repo}-{grown}"'})

    return Handler


@contextlib.contextmanager
def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# --- the UI's GraphQL ----------------------------------------------------------------------------


def graphql(client: httpx.Client, query: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
    response = client.post("/graphql", json={"query": query, "variables": dict(variables or {})})
    response.raise_for_status()
    payload = response.json()
    if payload.get("errors"):
        raise RuntimeError(f"GraphQL errors: {payload['errors']}")
    return payload["data"]


def wait_for_location(client: httpx.Client, server: Daemon) -> None:
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    query = "{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus } } } }"
    while time.monotonic() < deadline:
        server.check_alive()
        with contextlib.suppress(httpx.HTTPError):
            entries = graphql(client, query)["workspaceOrError"]["locationEntries"]
            if any(e["name"] == LOCATION and e["loadStatus"] == "LOADED" for e in entries):
                return
        time.sleep(1)
    raise RuntimeError(f"the webserver did not load {LOCATION}; log:\n{server.log_tail()}")


def launch(client: httpx.Client, params: Mapping[str, Any]) -> str:
    result = graphql(client, LAUNCH, {"params": params})["launchPartitionBackfill"]
    if result["__typename"] != "LaunchBackfillSuccess":
        raise RuntimeError(f"launchPartitionBackfill: {result}")
    return str(result["backfillId"])


def wait_backfill(
    instance: dg.DagsterInstance, backfill_id: str, daemon: Daemon, timeout_s: float
) -> tuple[str, float, int]:
    """(final status, seconds from launch until it ended, runs it launched)."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        daemon.check_alive()
        backfill = instance.get_backfill(backfill_id)
        if backfill is not None and backfill.status.value in ENDED:
            break
        time.sleep(0.5)
    elapsed = time.monotonic() - began
    backfill = instance.get_backfill(backfill_id)
    runs = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
    status = backfill.status.value if backfill else "missing"
    return (status if status in ENDED else f"TIMEOUT ({status})"), elapsed, len(runs)


# --- checks --------------------------------------------------------------------------------------


def day_totals(engine: sa.Engine, first: date, last: date) -> tuple[dict[date, int], dict[date, int]]:
    """(events per UTC day, rollup first-party raw_count per day) over [first, last]."""
    r = measurement_daily_rollup
    with engine.connect() as conn:
        events = dict(
            conn.execute(
                sa.text(
                    "SELECT (occurred_at AT TIME ZONE 'UTC')::date AS day, count(*) FROM marketing_event "
                    "WHERE occurred_at >= :a AND occurred_at < :b GROUP BY 1"
                ),
                {
                    "a": datetime.combine(first, datetime.min.time(), tzinfo=UTC),
                    "b": datetime.combine(last + timedelta(days=1), datetime.min.time(), tzinfo=UTC),
                },
            ).all()
        )
        rolled = dict(
            conn.execute(
                sa.select(r.c.day, sa.func.sum(r.c.raw_count))
                .where(r.c.source == "first_party", r.c.day >= first, r.c.day <= last)
                .group_by(r.c.day)
            ).all()
        )
    return {d: int(n) for d, n in events.items()}, {d: int(n) for d, n in rolled.items()}


def rollup_rows(engine: sa.Engine, first: date, last: date) -> list[tuple[Any, ...]]:
    """The rollup rows of [first, last] without rolled_up_at, which differs between two builds of the same rows."""
    r = measurement_daily_rollup
    columns = [c for c in r.c if c.name != "rolled_up_at"]
    with engine.connect() as conn:
        rows = conn.execute(sa.select(*columns).where(r.c.day >= first, r.c.day <= last)).all()
    return sorted((tuple(row) for row in rows), key=repr)


# --- the run -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--campaigns", type=int, default=20)
    parser.add_argument("--actors", type=int, default=50_000)
    parser.add_argument(
        "--per-day-sample", type=int, default=7, help="days of the one-run-per-day shape (0: skip that shape)"
    )
    parser.add_argument("--days-per-run", type=int, default=None, help="MARKETING_BACKFILL_DAYS_PER_RUN")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument(
        "--unconfigured-importers",
        action="store_true",
        help="leave Plausible and GitHub unconfigured: they are not in the definitions, and a backfill of every "
        "measurement asset (the rollup) must end COMPLETED_SUCCESS with every day rolled up",
    )
    args = parser.parse_args()
    if not 0 <= args.per_day_sample <= args.days:
        sys.exit("--per-day-sample must be between 0 and --days")

    # The partitions end today (end_offset=1); the events fill the --days days up to yesterday.
    today = datetime.now(UTC).date()
    first_day = today - timedelta(days=args.days)
    partition_keys = [(first_day + timedelta(days=n)).isoformat() for n in range(args.days + 1)]
    frame = generate_events(args.events, first_day, args.days, args.actors, args.campaigns)
    ids = campaign_ids(args.campaigns)
    plausible_requests: list[dict[str, Any]] = []
    github_requests: list[str] = []

    with (
        deployment() as deployed,
        serve(plausible_handler([f"utm-{c}" for c in ids], plausible_requests)) as plausible_url,
        serve(github_handler(github_requests)) as github_url,
    ):
        app_url = deployed.app_url
        load_s = load_events(app_url, frame)
        engine = get_engine(app_url)
        with engine.begin() as conn:
            for i, campaign_id in enumerate(ids):
                conn.execute(
                    sa.update(campaign)
                    .where(campaign.c.id == campaign_id)
                    .values(utm_campaign=f"utm-{campaign_id}", github_repo=f"acme/{campaign_id}" if i % 2 else None)
                )
        print(f"loaded {args.events:,} events over {args.days} days in {load_s:.1f} s")

        home = deployed.home
        env = deployed.env(
            {"MARKETING_MEASUREMENT_START_DATE": first_day.isoformat()}
            | (
                {}
                if args.unconfigured_importers
                else {**plausible_env(plausible_url), "GITHUB_TOKEN": "ghp_bench", "GITHUB_API_URL": github_url}
            ),
        )
        logs = Path(tempfile.mkdtemp(prefix="mp-bench-backfill-"))
        with dg.DagsterInstance.from_config(str(home)) as instance:
            ranged_env = {
                **env,
                **({"MARKETING_BACKFILL_DAYS_PER_RUN": str(args.days_per_run)} if args.days_per_run else {}),
            }
            with session(ranged_env, logs, "ranged") as (client, daemon):
                results = measure_ranged(client, instance, daemon, engine, args, partition_keys, first_day)
            # The shape before the backfill policy: one run per partition, the same asset backfill otherwise.
            if args.per_day_sample:
                with session({**env, "MARKETING_BACKFILL_DAYS_PER_RUN": "1"}, logs, "per-day") as (client, daemon):
                    results |= measure_per_day(client, instance, daemon, engine, args, partition_keys, first_day)
        engine.dispose()

    report(results, args, plausible_requests, github_requests, logs)


def plausible_env(url: str) -> dict[str, str]:
    """Plausible configured, its API the local fake at ``url``."""
    return {"PLAUSIBLE_API_KEY": "bench-key", "PLAUSIBLE_SITE_ID": "bench.example", "PLAUSIBLE_BASE_URL": url}


@contextlib.contextmanager
def session(env: Mapping[str, str], logs: Path, label: str) -> Iterator[tuple[httpx.Client, Daemon]]:
    """dagster-webserver and dagster-daemon on ``env``, the webserver's location loaded."""
    port = free_port()
    webserver = Daemon.start(
        env,
        logs / f"webserver-{label}.log",
        [dagster_bin("dagster-webserver"), "-w", str(WORKSPACE), "-h", "127.0.0.1", "-p", str(port)],
    )
    daemon = Daemon.start(env, logs / f"daemon-{label}.log")
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            wait_for_location(client, webserver)
            yield client, daemon
    finally:
        daemon.stop()
        webserver.stop()


def selected_assets(args: argparse.Namespace) -> tuple[str, ...]:
    """Every measurement asset the definitions hold, as the UI's "Materialize all" selects them."""
    return ROLLUP_ONLY if args.unconfigured_importers else ASSETS


def asset_backfill(partition_keys: list[str], assets: tuple[str, ...]) -> dict[str, Any]:
    """What the UI sends for "Materialize" of the assets over these partitions: an asset backfill."""
    return {
        "assetSelection": [{"path": [key]} for key in assets],
        "partitionNames": partition_keys,
        "fromFailure": False,
    }


def findings(daemon: Daemon) -> list[str]:
    # Old days have no GitHub snapshot to derive downloads from: expected here, and said once per day.
    return [line for line in log_findings(daemon.log_path, limit=40) if "No snapshot for" not in line][:12]


def measure_ranged(
    client: httpx.Client,
    instance: dg.DagsterInstance,
    daemon: Daemon,
    engine: sa.Engine,
    args: argparse.Namespace,
    partition_keys: list[str],
    first_day: date,
) -> dict[str, Any]:
    assets = selected_assets(args)
    ranged = wait_backfill(instance, launch(client, asset_backfill(partition_keys, assets)), daemon, args.timeout)
    last_day = first_day + timedelta(days=args.days - 1)
    events, rolled = day_totals(engine, first_day, last_day)
    days = [first_day + timedelta(days=n) for n in range(args.days)]
    return {
        "ranged": ranged,
        "mismatched_days": [d for d in days if events.get(d, 0) != rolled.get(d, 0)],
        "missing": {
            key: len(set(partition_keys) - instance.get_materialized_partitions(dg.AssetKey(key))) for key in assets
        },
        "sample_before": rollup_rows(engine, first_day, first_day + timedelta(days=args.per_day_sample - 1)),
        "ranged_findings": findings(daemon),
    }


def measure_per_day(
    client: httpx.Client,
    instance: dg.DagsterInstance,
    daemon: Daemon,
    engine: sa.Engine,
    args: argparse.Namespace,
    partition_keys: list[str],
    first_day: date,
) -> dict[str, Any]:
    backfill_id = launch(client, asset_backfill(partition_keys[: args.per_day_sample], selected_assets(args)))
    per_day = wait_backfill(instance, backfill_id, daemon, args.timeout)
    return {
        "per_day": per_day,
        "sample_after": rollup_rows(engine, first_day, first_day + timedelta(days=args.per_day_sample - 1)),
        "per_day_findings": findings(daemon),
    }


def report(
    results: dict[str, Any],
    args: argparse.Namespace,
    plausible_requests: list[dict[str, Any]],
    github_requests: list[str],
    logs: Path,
) -> None:
    partitions = args.days + 1
    r_status, r_s, r_runs = results["ranged"]
    ranged_per_day = r_s / partitions
    shape = "range runs (asset backfill, default policy)"
    rows: list[list[Any]] = [[shape, partitions, r_runs, r_status, r_s, ranged_per_day, 60 / ranged_per_day]]
    # Unconfigured importers are not in the definitions, so the backfill of what they hold succeeds either way.
    expected_status, expected_missing = "COMPLETED_SUCCESS", {}
    statuses = [r_status]
    identical = True
    if args.per_day_sample:
        p_status, p_s, p_runs = results["per_day"]
        statuses.append(p_status)
        per_day = p_s / args.per_day_sample
        rows.append(
            ["one run per day (asset backfill)", args.per_day_sample, p_runs, p_status, p_s, per_day, 60 / per_day]
        )
    print_table(
        f"backfill of {partitions} partitions x {len(selected_assets(args))} assets, {args.events:,} events, "
        "through the daemon",
        ["shape", "partitions", "runs", "status", "seconds", "s per partition", "partitions/min"],
        rows,
    )
    if args.per_day_sample:
        print(
            f"\nper partition, range runs are {per_day / ranged_per_day:.1f}x faster than one run per day; "
            f"{partitions} partitions one run per day would take ~{per_day * partitions / 60:.0f} min "
            f"against {r_s / 60:.1f} min"
        )
        identical = results["sample_before"] == results["sample_after"] and bool(results["sample_before"])
        print(
            f"one-run-per-day rows identical to the range runs' rows for the {args.per_day_sample} sampled days: "
            f"{identical} ({len(results['sample_before'])} rows)"
        )
    print(
        f"days whose rollup total differs from their events: {len(results['mismatched_days'])}; "
        f"partitions not materialized per asset: {results['missing']}"
    )
    print(f"requests: Plausible {len(plausible_requests)}, GitHub {len(github_requests)}")
    for name in ("ranged", "per_day"):
        if results.get(f"{name}_findings"):
            print(f"daemon log findings, {name} ({logs}):")
            for line in results[f"{name}_findings"]:
                print(f"  {line[:160]}")
    ok = (
        all(status == expected_status for status in statuses)
        and not results["mismatched_days"]
        and {k: v for k, v in results["missing"].items() if v} == expected_missing
        and identical
    )
    print("\nresult:", "OK" if ok else "NOT OK")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
