"""``marketing-pipelines demo``: seed the embedded database and let the real daemon do the work.

Nothing here is a shortcut of production code. The demo seeds rows, then starts what a deployment
runs for the local instance under ``.marketing/dagster_home`` (local_dagster.py): a code server of the
definitions and a dagster-daemon, or it uses the daemon of `marketing-pipelines ui` when that one is
up. The claiming sensors claim the due executions and queued agent runs and launch their runs; the
rollup of the demo's days is one run of ``measurement_rollup_job``, launched with ``dagster job launch``
as an operator would. Each run is a run of its job in the UI, with the sensor that launched it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import UTC, date, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dagster as dg
import sqlalchemy as sa
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from marketing_pipelines import run_tags
from marketing_pipelines.agents import users
from marketing_pipelines.agents.queue import AgentRunRefused, list_agent_runs, request_agent_run
from marketing_pipelines.db.campaigns import upsert_campaign
from marketing_pipelines.db.engine import get_engine, sqlite_path
from marketing_pipelines.db.migrate import current_revision, upgrade
from marketing_pipelines.db.schema import agent_run, marketing_execution
from marketing_pipelines.egress import EgressPolicy, parse_networks
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.executions.endpoints import add_endpoint, remove_endpoint
from marketing_pipelines.executions.queue import execution_with_dedupe_key, list_executions, schedule_execution
from marketing_pipelines.local_dagster import (
    DEMO_RECEIVER_ADDRESS,
    code_location,
    daemon_running,
    dagster_home,
    local_environment,
)
from marketing_pipelines.measurement.assets import RANGE_END_TAG, RANGE_START_TAG, left_out_importers
from marketing_pipelines.measurement.demo import DEMO_CAMPAIGNS, demo_days, echo_reports, seed_demo_events
from marketing_pipelines.measurement.keys import ROLLUP_KEY
from marketing_pipelines.measurement.sensors import rollup_ranges
from marketing_pipelines.redact import redact_text, visible_controls
from marketing_pipelines.sealing import SecretBox, new_key
from marketing_pipelines.settings import Settings

Echo = Callable[[str], None]


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
    """How many deliveries a receiver holding ``secret`` accepts (the reference library's check, as one would)."""
    if not secret:
        return 0
    count = 0
    for item in received:
        try:
            Webhook(secret).verify(item["raw"], {k: v for k, v in item["signed"].items() if v is not None})
        except WebhookVerificationError:
            continue
        count += 1
    return count


def _wait_for_daemon(
    engine: sa.Engine, execution_ids: list[int], agent_run_ids: list[int], echo: Echo, timeout_s: float = 120
) -> None:
    """Let the daemon claim and run the demo's work; wait (bounded) until it is done."""
    deadline = time.monotonic() + timeout_s
    pending = _unfinished(engine, execution_ids, agent_run_ids)
    while pending and time.monotonic() < deadline:
        time.sleep(0.5)
        pending = _unfinished(engine, execution_ids, agent_run_ids)
    if pending:
        echo(f"      still waiting after {timeout_s:.0f}s: {', '.join(pending)}; the UI's runs page shows why")


def run_demo(settings: Settings, days: int = 7, echo: Echo = print) -> None:
    """The demo on ``settings`` (`marketing-pipelines demo` gives the environment's)."""
    engine = get_engine(settings.resolved_database_url)
    _migrate(engine, echo)
    day_list = demo_days(days, settings)
    with _demo_receiver() as (hook_url, received):
        echo("[2/4] Seeding campaigns, due executions and events (a second demo reuses what the first one seeded)")
        with engine.begin() as conn:
            for campaign in DEMO_CAMPAIGNS:
                upsert_campaign(conn, campaign)
        secret = _demo_endpoint(engine, settings, hook_url, echo)
        scheduled = _seed_executions(engine, {"endpoint": DEMO_ENDPOINT} if secret else {"url": hook_url}, echo)
        if day_list:
            seed_demo_events(engine, echo, day_list)
        else:
            echo("      no complete day since MARKETING_MEASUREMENT_START_DATE; nothing to measure yet")
        home = dagster_home()
        with dg.DagsterInstance.from_config(str(home)) as instance:
            runs_before = {r.run_id for r in instance.get_runs()}
            missing = _missing_days(instance, day_list)
            if not (missing or _unseen_requests(engine) or _unfinished(engine, scheduled, [])):
                echo("[3/4] Nothing to run: the executions ran, the days are rolled up, the agent runs were requested")
                requested = _queue_agent_runs(engine, settings, echo)
            else:
                requested = _run_on_the_daemon(instance, engine, settings, home, scheduled, missing, runs_before, echo)
            _echo_runs(instance, runs_before, echo)
        signed = f", {_verified(secret, received)} with a valid signature" if secret else ""
        echo(f"      the webhook receiver got {len(received)} request(s){signed}")
    _echo_outcomes(engine, scheduled, requested, echo)
    if day_list:
        echo_reports(engine, echo, day_list)


def _run_on_the_daemon(
    instance: dg.DagsterInstance,
    engine: sa.Engine,
    settings: Settings,
    home: Path,
    scheduled: list[int],
    missing: list[date],
    runs_before: set[str],
    echo: Echo,
) -> list[int]:
    """The rollup of the missing days, then the agent runs, all run by a daemon; the agent run ids."""
    ui_daemon = daemon_running(instance)
    if ui_daemon:
        # `marketing-pipelines ui` is up on this instance: its daemon claims and launches (two claimers
        # are safe, but the demo's receiver must outlive whichever runs the webhook).
        echo("[3/4] The UI's dagster-daemon is running on this instance: its sensors claim the work")
    else:
        echo(f"[3/4] A code server and a dagster-daemon on {home} (logs: {home / 'local-processes.log'})")
    env = local_environment(settings, home)
    # A code server for the demo's own daemon, or for `dagster job launch`; with the UI's daemon up and no
    # day to roll up, neither is needed.
    wanted = code_location(instance, env, start_daemon=not ui_daemon) if missing or not ui_daemon else nullcontext()
    with wanted as workspace:
        if missing:
            # The rollup first, so the agents' read_measurement tool finds it: a range of days in one run,
            # as a backfill runs them (split as the backfill policy splits them).
            ranges = rollup_ranges(dict.fromkeys(missing, 0), settings.backfill_days_per_run)
            assert workspace is not None
            launched = [_launch_rollup(workspace, env, r.first, r.last) for r in ranges]
            echo(f"      launched {ROLLUP_JOB} for {', '.join(r.span for r in ranges)} (dagster job launch)")
            for asset, how in left_out_importers(settings).items():
                echo(f"      {asset.to_user_string()} is left out of the definitions (not configured: {how})")
            _wait_for_runs(instance, launched, echo)
        requested = _queue_agent_runs(engine, settings, echo)
        _wait_for_daemon(engine, scheduled, requested, echo)
        # Every run this demo caused ends before the code server that launched its worker stops (not the
        # runs someone else started from the UI meanwhile).
        _wait_for_runs(instance, [r.run_id for r in instance.get_runs() if r.run_id not in runs_before], echo)
    return requested


# The demo launches this job's run itself, as an operator's backfill or `dagster job launch` would; the
# claiming sensors launch every other run.
ROLLUP_JOB = "measurement_rollup_job"


def _missing_days(instance: dg.DagsterInstance, day_list: list[date]) -> list[date]:
    """The demo's days whose rollup partition was never materialized on this instance."""
    materialized = instance.get_materialized_partitions(ROLLUP_KEY) if day_list else set()
    return [day for day in day_list if day.isoformat() not in materialized]


def _launch_rollup(workspace: Path, env: dict[str, str], first: date, last: date) -> str:
    """One run of the rollup over first..last through the instance's run queue; its run id."""
    run_id = str(uuid.uuid4())
    tags = {run_tags.LAUNCHED_BY: "marketing-pipelines demo"}
    if first == last:
        tags["dagster/partition"] = first.isoformat()
    else:
        tags.update({RANGE_START_TAG: first.isoformat(), RANGE_END_TAG: last.isoformat()})
    dagster = str(Path(sys.executable).parent / "dagster")
    argv = [dagster, "job", "launch", "-w", str(workspace), "-j", ROLLUP_JOB, "--run-id", run_id]
    done = subprocess.run(
        [*argv, "--tags", json.dumps(tags)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        # Dagster's own error line: it may quote a database URL from the environment, so shown redacted.
        last_line = visible_controls(redact_text((done.stderr.strip().splitlines() or ["no output"])[-1]))
        raise RuntimeError(f"dagster job launch {ROLLUP_JOB} failed (exit {done.returncode}): {last_line}")
    return run_id


def _wait_for_runs(instance: dg.DagsterInstance, run_ids: list[str], echo: Echo, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = [instance.get_run_by_id(run_id) for run_id in run_ids]
        if all(run is not None and run.is_finished for run in runs):
            return
        time.sleep(0.5)
    echo(f"      runs not finished after {timeout_s:.0f}s: {', '.join(r[:8] for r in run_ids)}; the UI shows why")


def _echo_runs(instance: dg.DagsterInstance, before: set[str], echo: Echo) -> None:
    """The runs this demo caused, as the UI's Runs page lists them: job, status, who launched it."""
    # get_runs lists the newest first: reversed, in the order they were created.
    runs = [r for r in reversed(instance.get_runs()) if r.run_id not in before]
    echo(f"      {len(runs)} run(s) on the instance" + (":" if runs else " (nothing was due)"))
    for run in runs:
        sensor = run.tags.get("dagster/sensor_name")
        by = f"sensor {sensor}" if sensor else run.tags.get(run_tags.LAUNCHED_BY, "someone else")
        echo(f"        run {run.run_id[:8]} {run.job_name:<24} {run.status.value:<8} launched by {by}")


def _unfinished(engine: sa.Engine, execution_ids: list[int], agent_run_ids: list[int]) -> list[str]:
    """The executions and agent runs of ``ids`` still waiting for a run or in one."""
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
        return pending + [f"agent run {i}" for i in runs]


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


def _agent_requests() -> list[tuple[str, str, str, dict[str, Any]]]:
    """(agent, campaign, requested by, input) of the demo's agent runs: two users, different permissions."""
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).replace(hour=9, minute=0, second=0, microsecond=0)
    proposal = {"stage": "follow-up", "action": "log", "due": tomorrow.isoformat(), "payload": {"message": "recap"}}
    return [
        ("measurement_analyst", "spring-launch", "ana", {"propose": proposal}),
        ("campaign_brief", "spring-launch", "ben", {"stage": "launch", "tone": "playful"}),
        # ben may not write: the run's proposal shows up as a refusal in its transcript.
        ("measurement_analyst", "spring-launch", "ben", {"propose": proposal}),
        # ben holds nothing on dev-tools-beta: refused when requested, nothing queued.
        ("campaign_brief", "dev-tools-beta", "ben", {"stage": "awareness"}),
    ]


def _unseen_requests(engine: sa.Engine) -> list[tuple[str, str, str, dict[str, Any]]]:
    """The demo's agent-run requests no earlier demo made."""
    with engine.connect() as conn:
        return [r for r in _agent_requests() if _earlier_request(conn, *r) is None]


def _queue_agent_runs(engine: sa.Engine, settings: Settings, echo: Echo) -> list[int]:
    """Requests the demo's agent runs (reusing an earlier demo's); the ids of the runs, new and reused."""
    requested, reused_runs, refused = _seed_agent_runs(engine, settings)
    echo(
        f"      queued agent runs {requested}"
        + (f"; reused {reused_runs}" if reused_runs else "")
        + " (ana may schedule executions; ben may only read spring-launch)"
    )
    for reason in refused:
        echo(f"      refused at request time: {reason}")
    return requested + reused_runs


def _seed_agent_runs(engine: sa.Engine, settings: Settings) -> tuple[list[int], list[int], list[str]]:
    """Two users with different permissions, and agent runs that exercise both."""
    with engine.begin() as conn:
        _add_demo_users(conn)
        ids, reused, refused = [], [], []
        for agent, campaign_id, user_id, given in _agent_requests():
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
