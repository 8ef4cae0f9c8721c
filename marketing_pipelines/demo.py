"""``marketing-pipelines demo``: seed the embedded database and drive the real path end to end.

Nothing here is a shortcut of production code: the demo calls the same sensor functions and
jobs that Dagster runs, on a real (local, persistent) Dagster instance under
``.marketing/dagster_home``, against the application database the settings point at.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines import run_tags
from marketing_pipelines.agents import users
from marketing_pipelines.agents.jobs import agent_run_job
from marketing_pipelines.agents.queue import AgentRunRefused, list_agent_runs, request_agent_run
from marketing_pipelines.agents.sensors import build_queued_agent_runs_sensor
from marketing_pipelines.db.campaigns import Campaign, upsert_campaign
from marketing_pipelines.db.engine import get_engine, sqlite_path
from marketing_pipelines.db.migrate import current_revision, upgrade
from marketing_pipelines.db.schema import agent_run, marketing_execution
from marketing_pipelines.definitions import build_defs
from marketing_pipelines.egress import EgressPolicy, parse_networks
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.executions.endpoints import add_endpoint, remove_endpoint
from marketing_pipelines.executions.jobs import marketing_execution_job
from marketing_pipelines.executions.queue import execution_with_dedupe_key, list_executions, schedule_execution
from marketing_pipelines.executions.sensors import build_due_executions_sensor, executions_of_run
from marketing_pipelines.executions.signing import signature
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.measurement.demo import run_measurement_demo
from marketing_pipelines.sealing import SecretBox, new_key
from marketing_pipelines.settings import DEFAULT_DB_DIR, Settings, load_settings

Echo = Callable[[str], None]

DEMO_CAMPAIGNS = (
    Campaign("spring-launch", "Spring launch", "ana", utm_campaign="spring26", github_repo="acme/widget"),
    Campaign("dev-tools-beta", "Developer tools beta", "ben", utm_campaign="devbeta", github_repo="acme/devtools"),
)


# The demo's webhook receiver listens on an address of its own (Linux routes all of 127.0.0.0/8 to
# loopback), so allowing it as a /32 (the demo here, `marketing-pipelines ui` for its daemon) lets
# webhooks reach this receiver and not the Dagster webserver or another service on 127.0.0.1.
DEMO_RECEIVER_ADDRESS = "127.0.0.2"
SIGNATURE_HEADERS = ("webhook-id", "webhook-timestamp", "webhook-signature")


@contextmanager
def _demo_receiver() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A webhook receiver on ``DEMO_RECEIVER_ADDRESS``, so the webhook action runs for real without a network."""
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            received.append(
                {
                    "idempotency_key": self.headers.get("Idempotency-Key"),
                    "body": json.loads(body),
                    "raw": body,
                    "signed": {
                        k: self.headers.get(k) for k in ("webhook-id", "webhook-timestamp", "webhook-signature")
                    },
                }
            )
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    try:
        server = ThreadingHTTPServer((DEMO_RECEIVER_ADDRESS, 0), Handler)
    except OSError as exc:  # macOS configures only 127.0.0.1 on lo0
        raise OSError(
            f"the demo's webhook receiver cannot listen on {DEMO_RECEIVER_ADDRESS} ({exc.strerror or exc}); "
            f"on macOS add it to the loopback interface: sudo ifconfig lo0 alias {DEMO_RECEIVER_ADDRESS}"
        ) from None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://{DEMO_RECEIVER_ADDRESS}:{server.server_address[1]}/demo-hook", received
    finally:
        server.shutdown()
        server.server_close()


# Loopback is reachable only when an operator allows it; the demo allows exactly its receiver's
# address for its own execution.
DEMO_EGRESS = EgressPolicy(parse_networks(f"{DEMO_RECEIVER_ADDRESS}/32"))
# The jobs the claiming sensors request runs of, by name.
JOBS = {job.name: job for job in (marketing_execution_job, agent_run_job)}
DEMO_ENDPOINT = "demo-receiver"


def _demo_endpoint(engine: sa.Engine, settings: Settings, hook_url: str, echo: Echo) -> str | None:
    """Points the demo's registered endpoint at this run's receiver; returns its signing secret.

    The embedded SQLite default gets a key file beside its database (``secrets.key``, readable by its
    owner only) the first time; with another database and no MARKETING_SECRETS_KEY, the demo's
    webhook goes to a raw URL, unsigned, and says so.
    """
    keys = settings.sealing_keys().text
    key_file = settings.secrets_key_file()
    if keys is None and key_file is not None:
        key_file.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="ascii") as handle:
            handle.write(new_key() + "\n")
        keys = settings.sealing_keys().text
        echo(f"      made a key for sealed webhook endpoints: {key_file} (MARKETING_SECRETS_KEY overrides it)")
    if keys is None:
        echo("      MARKETING_SECRETS_KEY is not set: the demo's webhook goes unsigned to a raw URL")
        return None
    with engine.begin() as conn:
        # The receiver's port is new each run: the endpoint is registered again, with a new secret.
        remove_endpoint(conn, DEMO_ENDPOINT)
        return add_endpoint(conn, SecretBox(keys), DEMO_ENDPOINT, hook_url, DEMO_EGRESS, campaign_id="spring-launch")


def _verified(secret: str | None, received: list[dict[str, Any]]) -> int:
    """How many deliveries carry a valid signature under ``secret`` (what a receiver checks)."""
    count = 0
    for item in received:
        signed = item["signed"]
        if secret and signed["webhook-signature"]:
            expected = signature(secret, signed["webhook-id"], int(signed["webhook-timestamp"]), item["raw"])
            count += expected in signed["webhook-signature"].split(" ")
    return count


# The instance config of the demo's Dagster home, the one `marketing-pipelines ui` opens too: the
# repository's dagster.yaml settings (telemetry off, run monitoring, pools, the fast run queue).
DAGSTER_YAML = """\
# Written by marketing-pipelines for the demo and `marketing-pipelines ui`; the same settings as the
# repository's dagster.yaml. Storage: SQLite files in this folder.
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
  config:
    dequeue_interval_seconds: 1
    dequeue_use_threads: true
    dequeue_num_workers: 4
sensors:
  use_threads: true
  num_workers: 4
run_monitoring:
  enabled: true
  poll_interval_seconds: 5
  start_timeout_seconds: 180
  free_slots_after_run_end_seconds: 15
concurrency:
  pools:
    default_limit: 4
    granularity: run
  runs:
    max_concurrent_runs: 10
telemetry:
  enabled: false
"""


def dagster_home(cwd: Path | None = None) -> Path:
    """``.marketing/dagster_home`` beside the embedded database, with its dagster.yaml (written once)."""
    home = (cwd or Path.cwd()) / DEFAULT_DB_DIR / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists():
        config.write_text(DAGSTER_YAML)
    return home


def demo_instance() -> dg.DagsterInstance:
    return dg.DagsterInstance.from_config(str(dagster_home()))


def daemon_running(instance: dg.DagsterInstance, within_s: float = 60.0) -> bool:
    """Whether a dagster-daemon (e.g. `marketing-pipelines ui`) is serving this instance right now."""
    beats = instance.get_daemon_heartbeats()
    sensor = beats.get("SENSOR")
    return sensor is not None and time.time() - sensor.timestamp < within_s


def _wait_for_daemon(
    engine: sa.Engine, execution_ids: list[int], agent_run_ids: list[int], echo: Echo, timeout_s: float = 240
) -> None:
    """Let the running daemon claim and run the demo's work; wait (bounded) until it is done."""
    deadline = time.monotonic() + timeout_s
    pending: list[str] = []
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            e = marketing_execution
            waiting = conn.execute(
                sa.select(e.c.id).where(e.c.id.in_(execution_ids), e.c.status.in_(["SCHEDULED", "RUNNING"]))
            ).scalars()
            pending = [f"execution {i}" for i in waiting]
            runs = conn.execute(
                sa.select(agent_run.c.id).where(
                    agent_run.c.id.in_(agent_run_ids), agent_run.c.status.in_(["QUEUED", "RUNNING"])
                )
            ).scalars()
            pending += [f"agent run {i}" for i in runs]
        if not pending:
            return
        time.sleep(1)
    echo(f"      still waiting after {timeout_s:.0f}s: {', '.join(pending)}; the UI's runs page shows why")


def run_demo(days: int = 7, echo: Echo = print, settings: Settings | None = None) -> None:
    """The demo on ``settings`` (default: the environment's, as `marketing-pipelines demo` runs it)."""
    settings = settings or load_settings()
    engine = get_engine(settings.resolved_database_url)
    _migrate(engine, echo)
    with _demo_receiver() as (hook_url, received):
        echo("[2/4] Seeding campaigns and due executions (a second demo reuses what the first one seeded)")
        with engine.begin() as conn:
            for campaign in DEMO_CAMPAIGNS:
                upsert_campaign(conn, campaign)
        secret = _demo_endpoint(engine, settings, hook_url, echo)
        scheduled = _seed_executions(engine, {"endpoint": DEMO_ENDPOINT} if secret else {"url": hook_url}, echo)
        requested, reused_runs, refused = _seed_agent_runs(engine, settings)
        echo(
            f"      queued agent runs {requested}"
            + (f"; reused {reused_runs}" if reused_runs else "")
            + " (ana may schedule executions; ben may only read spring-launch)"
        )
        requested += reused_runs
        for reason in refused:
            echo(f"      refused at request time: {reason}")

        echo("[3/4] Measurement, then the claiming sensors' ticks and the runs they launch (.marketing/dagster_home)")
        with demo_instance() as instance:
            # Measurement first, so the agents' read_measurement tool finds the rollup.
            run_measurement_demo(engine, instance, echo, days, settings)
            if daemon_running(instance):
                # `marketing-pipelines ui` is up on this instance: its daemon claims the work (two
                # claimers are safe, but the demo's receiver must outlive whichever runs the webhook).
                echo("      the UI's dagster-daemon is running on this instance: it claims and runs the work")
                _wait_for_daemon(engine, scheduled, requested, echo)
            else:
                launched = _drain(instance, settings, echo)
                echo(f"      {launched} runs finished")
        signed = f", {_verified(secret, received)} with a valid signature" if secret else ""
        echo(f"      the webhook receiver got {len(received)} request(s){signed}")
    _echo_outcomes(engine, scheduled, requested, echo)


def _migrate(engine: sa.Engine, echo: Echo) -> None:
    where = engine.url.render_as_string(hide_password=True)
    path = sqlite_path(engine)
    before = current_revision(engine) if path is None or path.exists() else None
    upgrade(engine)
    after = current_revision(engine)
    echo(f"[1/4] Database {where}: " + (f"schema current ({after})" if before == after else f"migrated to {after}"))


def _seed_executions(engine: sa.Engine, target: dict[str, Any], echo: Echo) -> list[int]:
    """Two log executions per demo campaign and one webhook to ``target``, due a minute ago; ids in order.

    Each has a dedupe key, so a second demo reuses the first one's rather than adding its own.
    """
    wanted = [
        (
            f"demo:{c.id}:{stage}",
            {
                "campaign_id": c.id,
                "stage": stage,
                "action": "log",
                "payload": {"message": f"{c.name}: post the {stage} announcement"},
            },
        )
        for c in DEMO_CAMPAIGNS
        for stage in ("awareness", "launch")
    ]
    webhook = {"text": "Spring launch follow-up"}
    wanted.append(
        (
            "demo:webhook",
            {
                "campaign_id": "spring-launch",
                "stage": "follow-up",
                "action": "webhook",
                "payload": {**target, "body": webhook},
            },
        )
    )
    due = datetime.now(UTC) - timedelta(minutes=1)
    scheduled, reused = [], []
    with engine.begin() as conn:
        for key, fields in wanted:
            existing = execution_with_dedupe_key(conn, key)
            if existing is not None:
                reused.append(existing)
            else:
                scheduled.append(schedule_execution(conn, due_at=due, dedupe_key=key, egress=DEMO_EGRESS, **fields))
    echo(f"      scheduled executions {scheduled}" + (f"; reused {reused}" if reused else ""))
    return scheduled + reused


def _demo_resources(settings: Settings) -> dict[str, Any]:
    """The definitions' resources for ``settings``, with webhooks allowed to the demo's receiver only.

    The demo requests offline agent runs only: no model provider is called over the network.
    """
    return {
        **build_defs(settings).resources,
        "webhook": WebhookClient.from_settings(
            settings, timeout_s=5, allow_networks=[str(n) for n in DEMO_EGRESS.allow]
        ),
    }


def _echo_outcomes(engine: sa.Engine, scheduled: list[int], requested: list[int], echo: Echo) -> None:
    echo("[4/4] Outcomes")
    with engine.connect() as conn:
        rows = [r for r in list_executions(conn, limit=10_000) if r["id"] in set(scheduled)]
        runs = [r for r in list_agent_runs(conn, limit=10_000) if r["id"] in set(requested)]
    for row in rows:
        echo(
            f"      execution {row['id']:>4} {row['campaign_id']:<15} {row['stage']:<10} {row['action']:<8} "
            f"{row['status']:<10} attempts={row['attempts']}"
        )
    for run in sorted(runs, key=lambda r: r["id"]):
        output = run["output"] or {}
        echo(
            f"      agent run {run['id']:>4} {run['agent']:<20} {run['campaign_id']:<15} as {run['requested_by']:<4} "
            f"{run['status']:<10} tool calls={output.get('tool_calls', 0)} refused={output.get('denials', 0)}"
            + (f" error={run['error']}" if run["error"] else "")
        )
    echo("      See one transcript with: marketing-pipelines agents show " + str(min(requested)))


def _add_demo_users(conn: sa.Connection) -> None:
    """ana may schedule executions anywhere; ben may only read spring-launch."""
    grants = {
        "ana": [(p, None) for p in ("campaign:read", "measurement:read", "execution:read", "execution:write")],
        "ben": [(p, "spring-launch") for p in ("campaign:read", "measurement:read", "execution:read")],
    }
    for user_id, user_grants in grants.items():
        if users.get_user(conn, user_id) is None:
            users.add_user(conn, user_id)
        for permission, campaign_id in user_grants:
            users.grant(conn, user_id, permission, campaign_id)


def _earlier_request(
    conn: sa.Connection, agent: str, campaign_id: str, user_id: str, given: Any
) -> sa.RowMapping | None:
    """The first agent run of an earlier demo with the same request (a REFUSED one too), if any."""
    earlier = [
        r
        for r in list_agent_runs(conn, requested_by=user_id, limit=10_000)
        if (r["agent"], r["campaign_id"], r["input"]) == (agent, campaign_id, given)
    ]
    return min(earlier, key=lambda r: r["id"]) if earlier else None


def _seed_agent_runs(engine: sa.Engine, settings: Settings) -> tuple[list[int], list[int], list[str]]:
    """Two users with different permissions, and agent runs that exercise both."""
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).replace(hour=9, minute=0, second=0, microsecond=0)
    proposal = {"stage": "follow-up", "action": "log", "due": tomorrow.isoformat(), "payload": {"message": "recap"}}
    with engine.begin() as conn:
        _add_demo_users(conn)
        requests = [
            ("measurement_analyst", "spring-launch", "ana", {"propose": proposal}),
            ("campaign_brief", "spring-launch", "ben", {"stage": "launch", "tone": "playful"}),
            # ben may not write: the run's proposal shows up as a refusal in its transcript.
            ("measurement_analyst", "spring-launch", "ben", {"propose": proposal}),
            # ben holds nothing on dev-tools-beta: refused when requested, nothing queued.
            ("campaign_brief", "dev-tools-beta", "ben", {"stage": "awareness"}),
        ]
        ids, reused, refused = [], [], []
        for agent, campaign_id, user_id, given in requests:
            # The same request from an earlier demo: reuse it (its follow-up execution, if any, was
            # scheduled with the agent run's own dedupe key, so nothing is added twice).
            earlier = _earlier_request(conn, agent, campaign_id, user_id, given)
            if earlier is not None and earlier["status"] == "REFUSED":
                refused.append(
                    f"{earlier['error']} (recorded as agent run {earlier['id']}, REFUSED, by an earlier demo)"
                )
                continue
            if earlier is not None:
                reused.append(earlier["id"])
                continue
            try:
                with conn.begin_nested():
                    try:
                        ids.append(
                            request_agent_run(
                                conn,
                                agent=agent,
                                campaign_id=campaign_id,
                                requested_by=user_id,
                                input=given,
                                provider="offline",
                                max_run_seconds=settings.agent_max_run_seconds,
                                settings=settings,
                            )
                        )
                    except AgentRunRefused as exc:
                        # Caught inside the savepoint, which is then released with the REFUSED row the
                        # request wrote; raised through it, the savepoint would roll the row back.
                        refused.append(str(exc))
            except InvalidInput as exc:  # invalid input: nothing was written
                refused.append(str(exc))
        return ids, reused, refused


def _drain(instance: dg.DagsterInstance, settings: Settings, echo: Echo, max_ticks: int = 20) -> int:
    """Tick the two claiming sensors until neither finds anything, running each requested run on the instance."""
    interval = settings.sensor_interval_seconds  # the daemon's business; the demo ticks them itself
    sensors = [build_due_executions_sensor(interval), build_queued_agent_runs_sensor(interval)]
    resources = _demo_resources(settings)
    # A context manager: the model providers hold an HTTP client they close at teardown.
    with dg.build_sensor_context(instance=instance, resources=resources) as context:
        launched = 0
        for tick in range(1, max_ticks + 1):
            requests: list[dg.RunRequest] = []
            for sensor in sensors:
                result = sensor(context)
                if isinstance(result, dg.SensorResult) and result.run_requests:
                    requests += result.run_requests
                elif isinstance(result, dg.SkipReason):
                    echo(f"      tick {tick}, {sensor.name}: {result.skip_message}")
            if not requests:
                return launched
            echo(f"      tick {tick}: {len(requests)} run request(s)")
            for request in requests:
                job = JOBS[request.job_name or ""]
                result_run = job.execute_in_process(
                    # Dagster's step-by-step console log would bury the demo's own lines; the full
                    # event log is still stored on the instance.
                    run_config={**request.run_config, "loggers": {"console": {"config": {"log_level": "WARNING"}}}},
                    tags={**request.tags, "dagster/run_key": request.run_key or ""},
                    instance=instance,
                    resources=resources,
                    raise_on_error=False,
                )
                executions = sorted(executions_of_run(request.run_config))
                what = (
                    f"executions {executions}" if executions else f"agent run {request.tags.get(run_tags.AGENT_RUN_ID)}"
                )
                echo(f"        run {result_run.run_id[:8]} {'SUCCESS' if result_run.success else 'FAILURE'} ({what})")
                launched += 1
        return launched
