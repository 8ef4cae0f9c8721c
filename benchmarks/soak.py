"""Faults at load: the deployment as it ships, run under load while its parts are killed, then checked.

The topology of deploy/: PostgreSQL for both databases, ``deploy/dagster.yaml``, two code-server
replicas (``dagster api grpc --fixed-server-id``) behind HAProxy (``deploy/haproxy.cfg``), the real
``dagster-daemon`` and ``dagster-webserver`` through ``deploy/workspace.yaml``. A local webhook receiver
records every delivery's idempotency key and attempt; it answers 500 to about ``--fail-rate`` of them
and stalls past the client's timeout on about ``--stall-rate`` (decided per key and attempt from the
seed, so a run repeats). Like any receiver that dedupes on the key, it answers 200 again to a key it
has already answered 200.

The load: ``--executions`` webhook executions due over ``--spread`` seconds, ``--agent-runs`` agent runs
(offline provider) from ``--users`` users, a ``--backfill-days`` measurement backfill launched as the UI
launches one, and a file of events loaded while it runs.

Two rounds in one invocation, on fresh databases each: the load alone ("calm"), then the same load
with faults injected on a schedule drawn from the seed ("faults"): SIGKILL of the daemon (started
again), of run workers in the middle of a batch and of an agent run, of a code server (started
again), a PostgreSQL restart (``pg_ctlcluster ... restart``, needs root), and the receiver going
away for 30 s. After the last fault nothing is touched: the round waits for the system to drain by
itself, then checks and prints each figure:

- every execution terminal (SUCCEEDED, or FAILED with a reason), none RUNNING, none SCHEDULED and due;
- every idempotency key delivered at least once; deliveries beyond one per key counted by cause, a
  key answered 200 again only after its sender timed out or its attempt was cut off by a kill;
  distinct keys answered 200 = executions that SUCCEEDED;
- every agent run terminal, none QUEUED or RUNNING; no agent_runs pool slot held by a finished run;
  the model calls never beyond the token bucket's bound (``--model-calls-per-minute``);
- every failed run in exactly one alert (more only after a daemon kill between the POST and the cursor);
- every backfilled day rolled up and equal to an independent count of its events;
- no code server restarted or shut itself down except the one killed on purpose;
- faults injected, time from the last fault to drained, executions per minute against the calm round.

It exits non-zero when a check fails.

    python benchmarks/soak.py --help
    python benchmarks/soak.py                                   # default sizes (about 15-25 min here)
    python benchmarks/soak.py --executions 200 --agent-runs 10 --backfill-days 10 --spread 40 --no-calm
    python benchmarks/soak.py --overload --fail-rate 0 --stall-rate 0 --faults daemon,run,code   # overloaded

``--overload`` replaces the faults round with one under pressure (``_pressure.py``: CPU-bound processes,
a disk writer syncing 256 MB files, and a client taking every free PostgreSQL connection 8 s of every
20), with ``--stacks`` whole deployments loaded at once on the same PostgreSQL server. With a receiver
that fails nothing, it checks that every execution SUCCEEDED: overload makes the work slower, never
failed. Each round prints its executions per minute and due-to-SUCCEEDED latency (median, 95th
percentile, max), so calm and overload compare side by side (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from _common import ReceiverServer, print_table, throwaway_database
from _daemon import Daemon, daemon_env, dagster_bin, dagster_storage_database, log_findings
from _measurement_events import generate_events
from _pressure import Pressure
from backfill import asset_backfill, day_totals, free_port, graphql, launch

from marketing_pipelines.agents import users
from marketing_pipelines.agents.queue import request_agent_run
from marketing_pipelines.db.campaigns import Campaign, upsert_campaign
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import agent_run, agent_run_step, marketing_execution, marketing_execution_attempt
from marketing_pipelines.monitoring.alert_sensor import WATCHED_JOBS
from marketing_pipelines.settings import load_settings

REPO_ROOT = Path(__file__).resolve().parent.parent
DEPLOY = REPO_ROOT / "deploy"
CAMPAIGN = "soak-launch"
RELEASE = "soak-release"
WEBHOOK_TIMEOUT_S = 2.0  # MARKETING_WEBHOOK_TIMEOUT_SECONDS: a stall lasts longer than this
# Under --overload the shipped timeout: the receiver, in this process, is starved like everything else, and
# a 2 s answer would be a timeout of this script's making, not of the machine under test.
OVERLOAD_WEBHOOK_TIMEOUT_S = 10.0
TERMINAL_AGENT = {"SUCCEEDED", "FAILED", "REFUSED", "CANCELLED"}


# --- the webhook receiver --------------------------------------------------------------------------


@dataclass
class Delivery:
    key: str
    attempt: str
    answer: str  # "200", "500", "stalled", or "200 late" (answered after the sender's timeout)


@dataclass
class Receiver:
    seed: int
    fail_rate: float
    stall_rate: float
    timeout_s: float = WEBHOOK_TIMEOUT_S  # the sender's (MARKETING_WEBHOOK_TIMEOUT_SECONDS)
    deliveries: list[Delivery] = field(default_factory=list)
    alerts: list[str] = field(default_factory=list)  # the text of each alert message (always answered 200)
    applied: set[str] = field(default_factory=set)  # keys answered 200: their effect happened
    lock: threading.Lock = field(default_factory=threading.Lock)
    port: int = 0
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    @property
    def alert_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/alerts"

    def decide(self, key: str, attempt: str) -> str:
        """200, 500 or a stall for this key and attempt: drawn from the seed, so a run repeats."""
        digest = hashlib.sha256(f"{self.seed}:{key}:{attempt}".encode()).digest()
        draw = int.from_bytes(digest[:8], "big") / 2**64
        if draw < self.stall_rate:
            return "stalled"
        return "500" if draw < self.stall_rate + self.fail_rate else "200"

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                received = time.monotonic()
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path == "/alerts":
                    with receiver.lock:
                        receiver.alerts.append(json.loads(body)["text"])
                    self.send_response(200)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                key = self.headers.get("idempotency-key", "")
                attempt = self.headers.get("marketing-attempt", "")
                # A receiver that dedupes on the key (docs/OPERATIONS.md, "Webhooks: one effect, one key")
                # answers a key it has applied with that result again, whatever else it is going through.
                answer = "200" if key in receiver.applied else receiver.decide(key, attempt)
                delivery = Delivery(key, attempt, answer)
                with receiver.lock:
                    receiver.deliveries.append(delivery)
                if answer == "stalled":
                    time.sleep(receiver.timeout_s + 1)  # the client has given up by now
                    return
                if answer == "200":
                    with receiver.lock:
                        receiver.applied.add(key)
                self.send_response(int(answer))
                self.send_header("content-length", "0")
                self.end_headers()
                if answer == "200" and time.monotonic() - received > receiver.timeout_s:
                    # Answered after the sender's timeout (this process was starved of CPU): the sender saw a
                    # timeout and will try again, so this 200 is an effect it could not know of.
                    delivery.answer = "200 late"

            def log_message(self, *args: Any) -> None:
                pass

        server = ReceiverServer(("127.0.0.1", self.port), Handler)
        self.port = server.server_address[1]
        self.server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Gone: new connections are refused until ``start`` binds the same port again."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


# --- the deployment ----------------------------------------------------------------------------------


@dataclass
class Deployment:
    env: dict[str, str]
    logs: Path
    replica_ports: list[int]
    web_port: int
    replicas: list[Daemon] = field(default_factory=list)
    others: dict[str, Daemon] = field(default_factory=dict)
    restarts: Counter[str] = field(default_factory=Counter)

    def start_replica(self, i: int) -> None:
        argv = [dagster_bin("dagster"), "api", "grpc", "-m", "marketing_pipelines.definitions"]
        argv += ["-h", "127.0.0.1", "-p", str(self.replica_ports[i]), "--fixed-server-id", RELEASE]
        log = self.logs / f"replica_{i + 1}.{self.restarts[f'replica_{i + 1}']}.log"
        daemon = Daemon.start(self.env, log, argv)
        if i < len(self.replicas):
            self.replicas[i] = daemon
        else:
            self.replicas.append(daemon)

    def start_daemon(self) -> None:
        log = self.logs / f"daemon.{self.restarts['daemon']}.log"
        workspace = str(self.logs / "workspace.yaml")
        self.others["daemon"] = Daemon.start(self.env, log, [dagster_bin("dagster-daemon"), "run", "-w", workspace])

    def start(self) -> None:
        shutil.copy(DEPLOY / "workspace.yaml", self.logs / "workspace.yaml")
        for i in range(len(self.replica_ports)):
            self.start_replica(i)
        haproxy = shutil.which("haproxy")
        if haproxy is None:
            sys.exit("haproxy is not installed (Debian: apt-get install haproxy)")
        self.others["haproxy"] = Daemon.start(
            self.env, self.logs / "haproxy.log", [haproxy, "-db", "-f", str(DEPLOY / "haproxy.cfg")]
        )
        workspace = str(self.logs / "workspace.yaml")
        web = [dagster_bin("dagster-webserver"), "-w", workspace, "-h", "127.0.0.1", "-p", str(self.web_port)]
        self.others["webserver"] = Daemon.start(self.env, self.logs / "webserver.log", web)
        self.start_daemon()

    def stop(self) -> None:
        for name in ("daemon", "webserver", "haproxy"):
            if name in self.others:
                self.others[name].stop()
        for replica in self.replicas:
            replica.stop()


# The deployments running now: a stop of this script (SIGTERM) while --overload's stacks run in threads
# stops their processes from the main thread (overload_rounds).
LIVE_DEPLOYMENTS: list[Deployment] = []


@contextlib.contextmanager
def deployment(app_url: str, logs: Path, overrides: Mapping[str, str]) -> Iterator[Deployment]:
    with dagster_storage_database() as pg:
        home = logs / "dagster_home"
        home.mkdir()
        shutil.copy(DEPLOY / "dagster.yaml", home / "dagster.yaml")
        balancer, ports, stats = free_port(), [free_port(), free_port()], free_port()
        env = daemon_env(
            app_url,
            home,
            pg,
            {
                "CODE_SERVERS_HOST": "127.0.0.1",
                "CODE_SERVERS_PORT": str(balancer),
                "CODE_SERVERS_BIND": f"127.0.0.1:{balancer}",
                "CODE_SERVER_1": f"127.0.0.1:{ports[0]}",
                "CODE_SERVER_2": f"127.0.0.1:{ports[1]}",
                "HAPROXY_STATS_BIND": f"127.0.0.1:{stats}",
                "HAPROXY_ADMIN_SOCKET": str(logs / "haproxy.sock"),
                **overrides,
            },
        )
        migrate = subprocess.run(
            [dagster_bin("dagster"), "instance", "migrate"], env=env, cwd=logs, capture_output=True, timeout=300
        )
        if migrate.returncode != 0:
            sys.exit(migrate.stdout.decode() + migrate.stderr.decode())
        deploy = Deployment(env, logs, ports, free_port())
        LIVE_DEPLOYMENTS.append(deploy)
        try:
            deploy.start()
            yield deploy
        finally:
            deploy.stop()
            LIVE_DEPLOYMENTS.remove(deploy)


LOCATION_QUERY = """
{ workspaceOrError { ... on Workspace { locationEntries { name locationOrLoadError { __typename } } } } }
"""


def wait_loaded(client: httpx.Client, webserver: Daemon, timeout_s: float = 180) -> None:
    """Until the webserver has the location's definitions (not a load error from before the replicas were up)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        webserver.check_alive()
        with contextlib.suppress(httpx.HTTPError, KeyError, TypeError):
            entries = graphql(client, LOCATION_QUERY)["workspaceOrError"]["locationEntries"]
            if entries and all(e["locationOrLoadError"]["__typename"] == "RepositoryLocation" for e in entries):
                return
        time.sleep(2)
    raise RuntimeError(f"the webserver did not load the location; log:\n{webserver.log_tail()}")


# --- load ----------------------------------------------------------------------------------------------


def seed_load(engine: sa.Engine, args: argparse.Namespace, receiver: Receiver) -> datetime:
    """The executions and agent runs of one round; returns when the last execution is due."""
    now = datetime.now(UTC)
    last_due = now + timedelta(seconds=args.spread)
    with engine.begin() as conn:
        upsert_campaign(conn, Campaign(id=CAMPAIGN, name="Soak launch", owner="ana"))
        rows = [
            {
                "campaign_id": CAMPAIGN,
                "stage": "launch",
                "action": "webhook",
                "payload": {"url": receiver.url, "body": {"n": i}},
                "due_at": now + timedelta(seconds=10 + (args.spread - 10) * i / max(args.executions - 1, 1)),
                "status": "SCHEDULED",
                "attempts": 0,
                "max_attempts": 3,
                "created_at": now,
                "updated_at": now,
            }
            for i in range(args.executions)
        ]
        conn.execute(sa.insert(marketing_execution), rows)
        for u in range(args.users):
            user = f"user-{u}"
            users.add_user(conn, user)
            for permission in ("campaign:read", "measurement:read", "execution:read"):
                users.grant(conn, user, permission)
        for i in range(args.agent_runs):
            request_agent_run(
                conn,
                agent="measurement_analyst",
                campaign_id=CAMPAIGN,
                requested_by=f"user-{i % args.users}",
                provider="offline",
                settings=load_settings(),
            )
    return last_due


def write_events(path: Path, args: argparse.Namespace, first_day: date) -> int:
    frame = generate_events(
        args.events, first_day, args.backfill_days, actors=max(args.events // 10, 1), seed=args.seed
    )
    frame["campaign_id"] = CAMPAIGN
    with path.open("w") as out:
        for i, row in enumerate(frame.itertuples(index=False)):
            record = {
                "event_id": f"soak-{i}",
                "campaign_id": row.campaign_id,
                "stage": row.stage,
                "event_type": row.event_type,
                "occurred_at": row.occurred_at.isoformat(),
            }
            if isinstance(row.actor_id, str):
                record["actor_id"] = row.actor_id
            out.write(json.dumps(record) + "\n")
    return len(frame)


def load_events(env: Mapping[str, str], path: Path, logs: Path) -> subprocess.Popen[bytes]:
    """``marketing-pipelines events load FILE``, in the background, as an operator would while work runs."""
    log = (logs / "events-load.log").open("wb")
    return subprocess.Popen(
        [dagster_bin("marketing-pipelines"), "events", "load", str(path)],
        env=dict(env),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


# --- faults --------------------------------------------------------------------------------------------


RUN_WORKER = sa.text(
    "SELECT r.run_id, e.event FROM runs r JOIN event_logs e ON e.run_id = r.run_id"
    " WHERE r.status = 'STARTED' AND r.pipeline_name = :job AND e.dagster_event_type = 'PIPELINE_START'"
)


def _kill_run_worker(dagster: sa.Engine, job: str, wait_s: float = 60) -> str:
    """SIGKILL the worker of a run of ``job`` while it runs (the pid its RUN_START event carries)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        with contextlib.suppress(sa.exc.SQLAlchemyError), dagster.connect() as conn:
            for run_id, event in conn.execute(RUN_WORKER, {"job": job}).all():
                pid = json.loads(event)["dagster_event"]["pid"]
                with contextlib.suppress(FileNotFoundError, ProcessLookupError, TypeError):
                    if b"--multiprocessing-fork" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        os.kill(pid, signal.SIGKILL)
                        return f"SIGKILL the run worker of {job} run {run_id[:8]} while it ran"
        time.sleep(0.5)
    return f"no {job} run was running for {wait_s:.0f} s: nothing killed"


def _restart_daemon(deploy: Deployment) -> str:
    daemon = deploy.others["daemon"]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(daemon.process.pid, signal.SIGKILL)
    daemon.process.wait(10)
    time.sleep(5)
    deploy.restarts["daemon"] += 1
    deploy.start_daemon()
    return "SIGKILL the daemon, started again 5 s later"


def _restart_code_server(deploy: Deployment, i: int) -> str:
    replica = deploy.replicas[i]
    os.kill(replica.process.pid, signal.SIGKILL)  # the server only: the run workers it started go on
    replica.process.wait(10)
    time.sleep(10)
    deploy.restarts[f"replica_{i + 1}"] += 1
    deploy.start_replica(i)
    return f"SIGKILL code server {i + 1}, started again 10 s later"


def _restart_postgres() -> str:
    version = sorted(os.listdir("/etc/postgresql"))[0]
    done = subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"], capture_output=True, timeout=120
    )
    if done.returncode != 0:
        return f"PostgreSQL restart FAILED: {done.stderr.decode().strip()}"
    return "PostgreSQL restarted (pg_ctlcluster restart)"


def _receiver_away(receiver: Receiver, seconds: float) -> str:
    receiver.stop()
    time.sleep(seconds)
    receiver.start()
    return f"receiver away for {seconds:.0f} s"


def fault_plan(
    args: argparse.Namespace, deploy: Deployment, receiver: Receiver, dagster: sa.Engine
) -> list[tuple[float, str, Callable[[], str]]]:
    """(seconds after the load starts, name, action) for each fault, spread over the load from the seed."""
    rng = random.Random(args.seed)
    # In the order they happen: the agent runs are claimed from the start, so their worker is killed first.
    faults: list[tuple[str, Callable[[], str]]] = [
        ("run worker mid-agent-run", lambda: _kill_run_worker(dagster, "agent_run_job")),
        # Before the kills: work a kill hands back a lease later then finds the receiver there again.
        ("receiver", lambda: _receiver_away(receiver, 30)),
        ("daemon", lambda: _restart_daemon(deploy)),
        ("run worker mid-batch", lambda: _kill_run_worker(dagster, "marketing_execution_job")),
        ("code server", lambda: _restart_code_server(deploy, rng.randrange(len(deploy.replicas)))),
        ("postgres", _restart_postgres),
    ]
    chosen = [(name, action) for name, action in faults if name.split()[0] in args.faults]
    window = max(args.spread - 20, 10)
    slots = sorted(rng.uniform(15, 15 + window) for _ in chosen)
    return [(at, name, action) for at, (name, action) in zip(slots, chosen, strict=True)]


# --- what the machine went through ------------------------------------------------------------------


@dataclass
class Sampler:
    """Every 2 s: the 1-minute load average, client connections to PostgreSQL, and Dagster runs STARTED."""

    dagster: sa.Engine
    samples: list[tuple[float, int, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        query = sa.text(
            "SELECT (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'),"
            " (SELECT count(*) FROM runs WHERE status = 'STARTED')"
        )
        while not self._stop.wait(2):
            with contextlib.suppress(sa.exc.SQLAlchemyError):  # PostgreSQL restarting
                with self.dagster.connect() as conn:
                    connections, started = conn.execute(query).one()
                self.samples.append((os.getloadavg()[0], int(connections), int(started)))

    def summary(self) -> str:
        if not self.samples:
            return "no samples"
        loads = sorted(load for load, _, _ in self.samples)
        busiest = max(self.samples, key=lambda s: s[1])
        # Connections with no run started are the daemon's, webserver's, code servers' and this script's.
        idle = sorted(c for _, c, r in self.samples if r == 0) or [0]
        base = idle[len(idle) // 2]
        per_run = max(((c - base) / r for _, c, r in self.samples if r >= 1), default=0.0)
        return (
            f"load average median {loads[len(loads) // 2]:.1f}, peak {loads[-1]:.1f}; PostgreSQL connections peak "
            f"{busiest[1]} (with {busiest[2]} runs STARTED), {base} with none, at most {per_run:.1f} more per run"
        )


# --- checks --------------------------------------------------------------------------------------------


def due_to_done(engine: sa.Engine) -> tuple[float, float, float]:
    """Seconds from due to SUCCEEDED over the round's executions: median, 95th percentile and max."""
    t = marketing_execution
    with engine.connect() as conn:
        rows = conn.execute(sa.select(t.c.due_at, t.c.finished_at).where(t.c.status == "SUCCEEDED")).all()
    # An execution's due_at moves with its retries: this is the wait after its last due time.
    waits = sorted(max(0.0, (finished - due).total_seconds()) for due, finished in rows if finished and due)
    if not waits:
        return (0.0, 0.0, 0.0)
    return (waits[len(waits) // 2], waits[min(len(waits) - 1, int(len(waits) * 0.95))], waits[-1])


def execution_states(engine: sa.Engine) -> Counter[str]:
    with engine.connect() as conn:
        return Counter(conn.execute(sa.select(marketing_execution.c.status)).scalars())


def drained(engine: sa.Engine, dagster: sa.Engine, backfill_id: str | None) -> bool:
    """Every execution and agent run terminal and the backfill ended; False while a database is restarting."""
    t, a = marketing_execution, agent_run
    try:
        with engine.connect() as conn:
            open_executions = conn.execute(
                sa.select(sa.func.count()).where(t.c.status.in_(("SCHEDULED", "RUNNING")))
            ).scalar_one()
            open_agents = conn.execute(
                sa.select(sa.func.count()).where(a.c.status.in_(("QUEUED", "RUNNING")))
            ).scalar_one()
        if open_executions or open_agents or backfill_id is None:
            return not (open_executions or open_agents)
        with dagster.connect() as conn:
            query = sa.text("SELECT status FROM bulk_actions WHERE key = :k")
            status = conn.execute(query, {"k": backfill_id}).scalar()
    except sa.exc.OperationalError:
        return False
    return status in ("COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED")


RUNS_BY_STATUS = "SELECT status, count(*) FROM runs GROUP BY status"
FAILED_WATCHED_RUNS = sa.text(
    "SELECT count(*) FROM runs WHERE status = 'FAILURE' AND pipeline_name IN :jobs"
).bindparams(sa.bindparam("jobs", expanding=True))


def first_of_repeated_200(deliveries: list[Delivery]) -> list[Delivery]:
    """For each key answered 200 more than once, its first delivery answered 200."""
    firsts: dict[str, Delivery] = {}
    counts: Counter[str] = Counter()
    for d in deliveries:
        if d.answer == "200":
            counts[d.key] += 1
            firsts.setdefault(d.key, d)
    return [firsts[key] for key, n in counts.items() if n > 1]


def repeated_200_cause(attempt: tuple[str | None, str | None] | None) -> str:
    """Why a key answered 200 was sent again, from what the sender recorded for that attempt.

    "timeout": the sender recorded a timeout (it gave up before reading the answer); "kill": the
    attempt never recorded an outcome of its own (its lease expired, or its run failed and was
    reconciled); anything else is unexplained.
    """
    if attempt is None:
        return "unexplained"
    outcome, error = attempt
    if error and "timed out" in error:
        return "timeout"
    if outcome in ("LEASE_EXPIRED", "LEASE_LOST") or (error and error.startswith("Dagster run")):
        return "kill"
    return "unexplained"


def bucket_overshoot(call_times: list[float], per_minute: float, slack_s: float = 5.0) -> float:
    """How far the model calls went past the token bucket's bound, in calls (at most 0 when it held).

    A bucket of ``per_minute`` tokens refilled at ``per_minute`` a minute admits at most
    ``per_minute + rate * (t_j - t_i)`` calls between any two calls i and j. The times are those of
    the transcript's model turns, written just after each call: ``slack_s`` of refill allows for that.
    """
    rate = per_minute / 60.0
    times = sorted(call_times)
    worst = float("-inf")
    for i, start in enumerate(times):
        for j in range(i, len(times)):
            worst = max(worst, (j - i + 1) - (per_minute + rate * (times[j] - start + slack_s)))
    return worst if times else 0.0


def failed_watched_runs(dagster: sa.Engine) -> int:
    """Runs of the jobs marketing_alerts_sensor watches that ended FAILURE: each should be in one alert."""
    with dagster.connect() as conn:
        return conn.execute(FAILED_WATCHED_RUNS, {"jobs": sorted(WATCHED_JOBS)}).scalar_one()


def alerted_runs(texts: list[str]) -> int:
    """Failed runs the alert messages counted, from each message's head ("... 3 failed runs, ...")."""
    heads = (text.splitlines()[0] for text in texts if text)
    return sum(int(m.group(1)) for head in heads if (m := re.search(r"(\d+) failed runs?\b", head)))


@dataclass
class Round:
    label: str
    seconds_to_drain: float = 0.0
    executions_per_minute: float = 0.0
    faults: list[tuple[float, str]] = field(default_factory=list)
    after_last_fault_s: float = 0.0
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    machine: str = ""
    latency_s: tuple[float, float, float] = (0.0, 0.0, 0.0)  # due to SUCCEEDED: median, 95th percentile, max

    def check(self, what: str, ok: bool, detail: Any = "") -> None:
        self.checks.append((what, ok, str(detail)))


def check_round(
    result: Round,
    engine: sa.Engine,
    dagster: sa.Engine,
    receiver: Receiver,
    deploy: Deployment,
    args: argparse.Namespace,
) -> None:
    states = execution_states(engine)
    with engine.connect() as conn:
        failed_without_reason = conn.execute(
            sa.select(sa.func.count()).where(
                marketing_execution.c.status == "FAILED", marketing_execution.c.last_error.is_(None)
            )
        ).scalar_one()
        succeeded_keys = {
            f"marketing-execution-{i}"
            for i in conn.execute(
                sa.select(marketing_execution.c.id).where(marketing_execution.c.status == "SUCCEEDED")
            ).scalars()
        }
        all_keys = {f"marketing-execution-{i}" for i in conn.execute(sa.select(marketing_execution.c.id)).scalars()}
        a = marketing_execution_attempt
        attempts = {
            (f"marketing-execution-{execution_id}", str(attempt)): (outcome, error)
            for execution_id, attempt, outcome, error in conn.execute(
                sa.select(a.c.execution_id, a.c.attempt, a.c.outcome, a.c.error)
            ).all()
        }
        agents = Counter(conn.execute(sa.select(agent_run.c.status)).scalars())
        model_calls = [
            created.timestamp()
            for created in conn.execute(
                sa.select(agent_run_step.c.created_at).where(agent_run_step.c.kind == "model_turn")
            ).scalars()
        ]
        failed_errors = {
            f"marketing-execution-{i}": error or ""
            for i, error in conn.execute(
                sa.select(marketing_execution.c.id, marketing_execution.c.last_error).where(
                    marketing_execution.c.status == "FAILED"
                )
            ).all()
        }
        failed_reasons = Counter(
            (reason or "")[:60]
            for reason in conn.execute(
                sa.select(marketing_execution.c.last_error).where(marketing_execution.c.status == "FAILED")
            ).scalars()
        )
    terminal = states["SUCCEEDED"] + states["FAILED"] == args.executions
    result.check(
        "every execution terminal (SUCCEEDED, or FAILED with a reason)",
        terminal and not failed_without_reason,
        dict(states),
    )
    result.check("why executions FAILED", True, dict(failed_reasons.most_common(3)))
    if args.fail_rate == 0 and args.stall_rate == 0 and "receiver" not in args.faults:
        # Nothing in this round makes a delivery fail: a FAILED execution is overload or faults turned into
        # failure, which they must never be (slower, not failed).
        result.check(
            "every execution SUCCEEDED (the receiver failed none, so nothing may fail)",
            states["SUCCEEDED"] == args.executions,
            f"{dict(states)}; FAILED because: {dict(failed_reasons.most_common(3))}",
        )
    delivered = Counter(d.key for d in receiver.deliveries)
    never = all_keys - set(delivered)
    # What became of each attempt of a key never delivered: the fault that took it, by attempt number.
    lost_to = Counter(
        f"attempt {attempt}: {outcome or 'open'} {(error or '')[:70]}"
        for (key, attempt), (outcome, error) in attempts.items()
        if key in never
    )
    result.check(
        "every idempotency key delivered at least once",
        not never,
        f"{len(never)} never" + (f"; their attempts: {dict(lost_to.most_common(6))}" if never else ""),
    )
    answered_200 = Counter(d.key for d in receiver.deliveries if d.answer == "200")
    effects = set(answered_200)
    # An effect whose 200 was lost to a kill is retried; when every attempt left then finds the receiver
    # gone, the execution ends FAILED ("unreachable") with its effect done: at-least-once delivery cannot
    # know better. Counted and shown, never silent.
    effect_then_unreachable = {k for k in effects - succeeded_keys if "unreachable" in failed_errors.get(k, "")}
    result.check(
        "distinct effects (keys answered 200) = executions that SUCCEEDED",
        effects - effect_then_unreachable == succeeded_keys and (not effect_then_unreachable or bool(result.faults)),
        f"{len(effects)} effects, {len(succeeded_keys)} SUCCEEDED; {len(effects - succeeded_keys)} effects without "
        f"SUCCEEDED ({len(effect_then_unreachable)} of them 200 before a kill, then every attempt left unreachable), "
        f"{len(succeeded_keys - effects)} SUCCEEDED without",
    )
    extra = sum(delivered.values()) - len(delivered)
    causes = Counter(d.answer for d in receiver.deliveries)
    repeats = Counter(
        repeated_200_cause(attempts.get((d.key, d.attempt))) for d in first_of_repeated_200(receiver.deliveries)
    )
    result.check(
        "deliveries beyond one per key explained (a 200 in time repeated only after a sender timeout or a kill)",
        not repeats["unexplained"] and (not repeats["kill"] or bool(result.faults)),
        f"{extra} extra: retries after {causes['500']} answers of 500, {causes['stalled']} stalls and "
        f"{causes['200 late']} answers after the timeout; keys answered 200 again after a 200 in time: "
        f"{repeats['timeout']} whose sender timed out first (a CPU-starved run worker read the answer too late), "
        f"{repeats['kill']} whose attempt was cut off (a kill between the POST and its record), "
        f"{repeats['unexplained']} unexplained",
    )
    result.check("every agent run terminal", not (agents["QUEUED"] or agents["RUNNING"]), dict(agents))
    overshoot = bucket_overshoot(model_calls, args.model_calls_per_minute)
    busiest = max((sum(1 for t in model_calls if start <= t < start + 60) for start in model_calls), default=0)
    result.check(
        "the token bucket never over-admitting",
        overshoot <= 0,
        f"{len(model_calls)} model calls, at most {busiest} in a minute at {args.model_calls_per_minute:g}/min; "
        f"{max(overshoot, 0):.1f} beyond the bucket's bound",
    )
    with dagster.connect() as conn:
        runs = dict(conn.execute(sa.text(RUNS_BY_STATUS)).all())
        held = conn.execute(
            sa.text(
                "SELECT count(*) FROM concurrency_slots s JOIN runs r ON r.run_id = s.run_id "
                "WHERE s.concurrency_key = 'agent_runs' AND r.status IN ('SUCCESS', 'FAILURE', 'CANCELED')"
            )
        ).scalar_one()
    in_progress = sum(n for s, n in runs.items() if s in ("QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"))
    result.check("no Dagster run left in progress", in_progress == 0, runs)
    result.check("no agent_runs pool slot held by a finished run", held == 0, f"{held} held")
    failed_runs, alerted = failed_watched_runs(dagster), alerted_runs(receiver.alerts)
    daemon_killed = any("daemon" in what for _, what in result.faults)
    result.check(
        "every failed run alerted once (more only after a daemon kill between the POST and the cursor)",
        alerted == failed_runs or (alerted > failed_runs and daemon_killed),
        f"{failed_runs} runs FAILURE, {alerted} counted in {len(receiver.alerts)} alert(s)",
    )
    first = date.today() - timedelta(days=args.backfill_days)
    events, rolled = day_totals(engine, first, date.today() - timedelta(days=1))
    wrong = {
        d: (events.get(d, 0), rolled.get(d, 0))
        for d in set(events) | set(rolled)
        if events.get(d, 0) != rolled.get(d, 0)
    }
    result.check(
        "every backfilled day rolled up and equal to a recount of its events",
        not wrong,
        f"{len(events)} days with events; {len(wrong)} differ {sorted(wrong.items())[:3]}",
    )
    shutdowns = [
        line
        for replica_log in deploy.logs.glob("replica_*.log")
        for line in replica_log.read_text(errors="replace").splitlines()
        if "No heartbeat received" in line or "Shutting down Dagster code server" in line
    ]
    result.check("no code server restarted by load alone", not shutdowns, shutdowns[:2])


def dagster_url(env: Mapping[str, str]) -> str:
    return (
        f"postgresql://{env['DAGSTER_PG_USER']}:{env['DAGSTER_PG_PASSWORD']}@{env['DAGSTER_PG_HOST']}:"
        f"{env['DAGSTER_PG_PORT']}/{env['DAGSTER_PG_DB']}"
    )


# --- one round -----------------------------------------------------------------------------------------


def run_round(
    label: str,
    args: argparse.Namespace,
    with_faults: bool,
    logs: Path,
    on_load: Callable[[], None] = lambda: None,
    on_drained: Callable[[], None] = lambda: None,
) -> Round:
    """One round on fresh databases; ``on_load`` is called once its load is in, ``on_drained`` once it drained."""
    result = Round(label)
    timeout_s = OVERLOAD_WEBHOOK_TIMEOUT_S if args.overload else WEBHOOK_TIMEOUT_S
    receiver = Receiver(args.seed, args.fail_rate, args.stall_rate, timeout_s)
    receiver.start()
    overrides = {
        "MARKETING_WEBHOOK_TIMEOUT_SECONDS": str(timeout_s),
        "MARKETING_RETRY_BACKOFF_SECONDS": str(args.backoff),
        "MARKETING_EXECUTIONS_PER_RUN": str(args.per_run),
        "MARKETING_LATE_EVENTS_INTERVAL_SECONDS": "30",
        "MARKETING_MODEL_PROVIDER": "offline",
        "MARKETING_MEASUREMENT_START_DATE": (date.today() - timedelta(days=args.backfill_days)).isoformat(),
        "MARKETING_ALERT_WEBHOOK_URL": receiver.alert_url,
        "MARKETING_EXECUTION_LEASE_SECONDS": str(args.lease),
        "MARKETING_AGENT_LEASE_GRACE_SECONDS": str(args.lease),
        "MARKETING_AGENT_MAX_RUN_SECONDS": str(args.lease),
        "MARKETING_MAX_MODEL_CALLS_PER_MINUTE": str(args.model_calls_per_minute),
    }
    with throwaway_database("postgres") as app_url, deployment(app_url, logs, overrides) as deploy:
        engine = get_engine(app_url)
        events_file = logs / "events.jsonl"
        if args.events:
            write_events(events_file, args, date.today() - timedelta(days=args.backfill_days))
        with httpx.Client(base_url=f"http://127.0.0.1:{deploy.web_port}", timeout=60) as client:
            wait_loaded(client, deploy.others["webserver"])
            dagster = get_engine(dagster_url(deploy.env))
            sampler = Sampler(dagster).__enter__()
            seed_load(engine, args, receiver)
            started = time.monotonic()
            loader = load_events(deploy.env, events_file, logs) if args.events else None
            days = [(date.today() - timedelta(days=d)).isoformat() for d in range(args.backfill_days, 0, -1)]
            backfill_id = launch(client, asset_backfill(days, ("measurement_daily_rollup",)))
            on_load()
            plan = fault_plan(args, deploy, receiver, dagster) if with_faults else []
            last_fault = started
            for at, _name, action in plan:
                time.sleep(max(0.0, started + at - time.monotonic()))
                what = action()
                last_fault = time.monotonic()
                result.faults.append((round(last_fault - started, 1), what))
                print(f"  [{label}] {last_fault - started:6.1f} s  {what}", flush=True)
            deadline = time.monotonic() + args.timeout
            while not drained(engine, dagster, backfill_id):
                if time.monotonic() > deadline:
                    result.check("drained within --timeout", False, dict(execution_states(engine)))
                    break
                time.sleep(2)
            on_drained()
            if loader is not None:
                loader.wait(timeout=args.timeout)
            # Late events (loaded after their day's rollup) are picked up by the late-events sensor: wait for it.
            time.sleep(0 if not args.events else 75)
            # The alert sensor ticks once a minute: wait for it to report the last failures.
            alerts_deadline = time.monotonic() + 150
            while alerted_runs(receiver.alerts) < failed_watched_runs(dagster) and time.monotonic() < alerts_deadline:
                time.sleep(5)
            sampler.__exit__()
            result.machine = sampler.summary()
            result.seconds_to_drain = time.monotonic() - started
            result.after_last_fault_s = time.monotonic() - last_fault if plan else 0.0
            result.executions_per_minute = args.executions / (result.seconds_to_drain / 60)
            result.latency_s = due_to_done(engine)
            check_round(result, engine, dagster, receiver, deploy, args)
            dagster.dispose()
            findings = log_findings(deploy.logs / "daemon.0.log", limit=8)
            if findings:
                print(f"  [{label}] daemon log findings:\n    " + "\n    ".join(findings))
    receiver.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--executions", type=int, default=5000, help="webhook executions (default 5000)")
    parser.add_argument("--spread", type=float, default=180.0, help="seconds over which they fall due (default 180)")
    parser.add_argument("--per-run", type=int, default=250, help="MARKETING_EXECUTIONS_PER_RUN (default 250)")
    parser.add_argument("--agent-runs", type=int, default=100, help="agent runs, offline provider (default 100)")
    parser.add_argument("--users", type=int, default=4, help="users requesting them (default 4)")
    parser.add_argument(
        "--model-calls-per-minute",
        type=int,
        default=40,
        help="MARKETING_MAX_MODEL_CALLS_PER_MINUTE (default 40: below the agent runs' pace, so the bucket binds)",
    )
    parser.add_argument("--backfill-days", type=int, default=90, help="days of the measurement backfill (default 90)")
    parser.add_argument("--events", type=int, default=50_000, help="events in the file loaded during the load")
    parser.add_argument("--fail-rate", type=float, default=0.10, help="share of deliveries answered 500")
    parser.add_argument("--stall-rate", type=float, default=0.05, help="share of deliveries stalled past the timeout")
    parser.add_argument(
        "--backoff",
        type=float,
        default=15.0,
        help="MARKETING_RETRY_BACKOFF_SECONDS (default 15: the third attempt comes after the receiver's 30 s away)",
    )
    parser.add_argument(
        "--lease",
        type=int,
        default=300,
        help="MARKETING_EXECUTION_LEASE_SECONDS, MARKETING_AGENT_MAX_RUN_SECONDS, MARKETING_AGENT_LEASE_GRACE_SECONDS "
        "(default 300, the shipped values): how long the work of a killed run worker waits",
    )
    parser.add_argument(
        "--faults",
        default="daemon,run,code,postgres,receiver",
        help="which faults: daemon, run (workers), code (server), postgres, receiver (default all)",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds a round may take to drain")
    parser.add_argument("--no-calm", action="store_true", help="skip the round without faults (no ratio)")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep the processes' logs here")
    parser.add_argument(
        "--overload",
        action="store_true",
        help="the second round under CPU, disk and connection pressure (benchmarks/_pressure.py), with --stacks "
        "deployments sharing the PostgreSQL server, instead of the faults round; --faults still applies (to the "
        "first stack); with --fail-rate 0 --stall-rate 0 and no receiver fault every execution must SUCCEED",
    )
    parser.add_argument("--stacks", type=int, default=2, help="deployments loaded at once under --overload (default 2)")
    parser.add_argument(
        "--cpu-burners", type=int, default=16, help="CPU-bound processes under --overload (default 16: load about 19)"
    )
    args = parser.parse_args()
    args.faults = {f.strip() for f in args.faults.split(",") if f.strip()}
    if args.executions < 1 or not 0 <= args.fail_rate + args.stall_rate < 1 or args.backfill_days < 1:
        parser.error("--executions and --backfill-days must be at least 1, and --fail-rate + --stall-rate below 1")
    if not 1 <= args.model_calls_per_minute <= 100_000:
        parser.error(f"--model-calls-per-minute must be between 1 and 100000, got {args.model_calls_per_minute}")
    if not 5 <= args.lease <= 86_400:
        parser.error(f"--lease must be between 5 and 86400 seconds, got {args.lease}")
    if not 1 <= args.stacks <= 4 or not 0 <= args.cpu_burners <= 64:
        parser.error(f"--stacks must be 1 to 4 and --cpu-burners 0 to 64, got {args.stacks} and {args.cpu_burners}")

    root = args.log_dir or Path(tempfile.mkdtemp(prefix="mp-soak-"))
    rounds: list[Round] = []
    if not args.no_calm:
        rounds.append(_round_in(root, "calm", args, with_faults=False))
    if not args.overload:
        rounds.append(_round_in(root, "faults", args, with_faults=True))
    else:
        rounds += overload_rounds(root, args)

    load_avg = os.getloadavg()
    failed = False
    for r in rounds:
        print_table(
            f"round {r.label}: {len(r.faults)} fault(s), drained {r.seconds_to_drain:.0f} s after the load started"
            + (f", {r.after_last_fault_s:.0f} s after the last fault" if r.faults else ""),
            ["check", "holds", "figures"],
            [(what, "yes" if ok else "NO", detail[:400]) for what, ok, detail in r.checks],
        )
        print(f"round {r.label}: {r.machine}")
        for what, ok, detail in r.checks:
            if not ok:
                print(f"round {r.label}: check failed: {what}: {detail}")
                failed = True
    for r in rounds:
        median, p95, worst = r.latency_s
        print(
            f"round {r.label}: {r.executions_per_minute:.0f} executions per minute; due to SUCCEEDED median "
            f"{median:.1f} s, 95th percentile {p95:.1f} s, max {worst:.1f} s"
        )
    calm = next((r for r in rounds if r.label == "calm"), None)
    for r in rounds:
        if calm is not None and r is not calm:
            ratio = r.executions_per_minute / calm.executions_per_minute
            print(
                f"\nexecutions per minute: {r.executions_per_minute:.0f} in round {r.label}, "
                f"{calm.executions_per_minute:.0f} calm; ratio {ratio:.2f} "
                f"(load average {load_avg[0]:.1f} {load_avg[1]:.1f} {load_avg[2]:.1f}, {os.cpu_count()} cores)"
            )
    sys.exit(1 if failed else 0)


def _round_in(root: Path, label: str, args: argparse.Namespace, *, with_faults: bool, **hooks: Any) -> Round:
    logs = root / f"{label.replace('/', '-')}-{uuid.uuid4().hex[:6]}"
    logs.mkdir(parents=True)
    print(f"round {label}: logs in {logs}", flush=True)
    return run_round(label, args, with_faults, logs, **hooks)


def overload_rounds(root: Path, args: argparse.Namespace) -> list[Round]:
    """``--stacks`` deployments loaded at once on one PostgreSQL server, under CPU, disk and connection pressure.

    Each stack has its own databases, processes and receiver; the faults of ``--faults`` hit the first one.
    CPU and disk pressure last from the first start-up to the last check. Connections are taken from the
    moment every stack's load is in until the first stack has drained: the stacks' set-up (databases
    created, instance migrated) and the checks read the server, and a stack still loaded after the
    first drained runs on under CPU and disk pressure only.
    """
    rounds: list[Round | None] = [None] * args.stacks
    errors: list[BaseException] = []
    loaded = threading.Semaphore(0)
    pressure = Pressure(root / "pressure", cpu_burners=args.cpu_burners)

    def one(i: int) -> None:
        try:
            rounds[i] = _round_in(
                root,
                f"overload/{i + 1}",
                args,
                with_faults=i == 0 and bool(args.faults),
                on_load=loaded.release,
                on_drained=pressure.connections_off,
            )
        except BaseException as exc:  # reported below; a stack that crashed is a failed round, not a hang
            errors.append(exc)
            loaded.release()

    def all_loaded() -> None:
        for _ in range(args.stacks):
            loaded.acquire()
        pressure.connections_on()

    with pressure:
        threading.Thread(target=all_loaded, daemon=True).start()
        # Daemon threads: a SIGTERM unwinds the main thread only; it stops the stacks' processes itself.
        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(args.stacks)]
        try:
            for thread in threads:
                thread.start()
                time.sleep(5)  # the stacks' start-ups apart, as two operators' would be
            for thread in threads:
                thread.join()
        except BaseException:
            for deploy in list(LIVE_DEPLOYMENTS):
                deploy.stop()
            raise
    print(f"overload: {pressure.summary()}", flush=True)
    if errors:
        raise errors[0]
    return [r for r in rounds if r is not None]


if __name__ == "__main__":
    socket.setdefaulttimeout(60)
    # SIGTERM (and SIGINT, which a shell ignores in a background job) unwinds: the processes stop and
    # the throwaway databases are dropped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
