"""The deployment as it ships for several machines, run here: one code location served by two code-server
replicas behind HAProxy (deploy/haproxy.cfg), the real daemon and webserver pointed at the balancer
(deploy/workspace.yaml), Dagster's storage and the application database on PostgreSQL.

While webhook executions are being claimed and launched, one replica is SIGKILLed. Every execution must
still end SUCCEEDED, each delivered once, within 90 s of the kill (a lease is 300 s: nothing may wait for
one), and the deployment must look like one codebase: one location with the whole asset graph in the UI,
each sensor stored and ticking once per interval, no "multiple code locations" warning from the daemon.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import marketing_execution
from marketing_pipelines_tests.built import DEFS
from marketing_pipelines_tests.factories import add_campaign
from marketing_pipelines_tests.machine import require_or_skip
from marketing_pipelines_tests.processes import (
    REPO_ROOT,
    Child,
    child_env,
    dagster_bin,
    free_port,
    running,
    start,
    wait_for,
)
from marketing_pipelines_tests.webserver import Recorder

pytestmark = pytest.mark.slow

EXECUTIONS = 100
PER_RUN = 10  # ten runs, two per tick, so launches are under way when the replica dies
# A replica that dies while a launch through it is in flight: the daemon's launch fails as user code
# unreachable, puts the run back in the queue (run_coordinator.max_user_code_failure_retries) and launches it
# again through the balancer on a live replica. Nothing waits for a lease (300 s) or a start timeout.
RECOVERY_SECONDS = 90
# Loaded by every Python process of replica 1: its run workers (multiprocessing children of the code server)
# mark that they exist and then take long to start, so the code server's StartRun call for that run is still
# in flight when the replica is killed: the kill lands between claim and start, every time.
SLOW_WORKERS = """
import os, sys, time
if "--multiprocessing-fork" in sys.argv:
    open(os.path.join(os.environ["SLOW_WORKER_MARKERS"], str(os.getpid())), "w").close()
    time.sleep(30)
"""
REQUEUED = "re-submitting the run into the queue"  # Dagster's engine event when a launch is retried
SENSOR_INTERVAL = 2
RELEASE = "test-release-1"  # the --fixed-server-id every replica shares

WORKSPACE_QUERY = """
{ workspaceOrError { __typename ... on Workspace { locationEntries { name
    locationOrLoadError { __typename ... on RepositoryLocation { repositories { name assetNodes { id } } } } } } } }
"""


def _due_webhooks(engine: sa.Engine, url: str, n: int) -> set[int]:
    add_campaign(engine)
    now = datetime.now(UTC)
    rows = [
        {
            "campaign_id": "spring-launch",
            "stage": "launch",
            "action": "webhook",
            "payload": {"url": f"{url}/{i}", "body": {"n": i}},
            "due_at": now - timedelta(seconds=n - i),
            "status": "SCHEDULED",
            "attempts": 0,
            "max_attempts": 3,
            "created_at": now,
            "updated_at": now,
        }
        for i in range(n)
    ]
    with engine.begin() as conn:
        conn.execute(sa.insert(marketing_execution), rows)
        return set(conn.execute(sa.select(marketing_execution.c.id)).scalars())


def _statuses(engine: sa.Engine) -> Counter[str]:
    with engine.connect() as conn:
        return Counter(conn.execute(sa.select(marketing_execution.c.status)).scalars())


def _runs_requested(dagster: sa.Engine) -> int:
    """Runs of the executions job the daemon has created (so their claims reached Dagster)."""
    with dagster.connect() as conn:
        return conn.execute(
            sa.text("SELECT count(*) FROM runs WHERE pipeline_name = 'marketing_execution_job'")
        ).scalar_one()


def _location(web: str) -> tuple[list[str], int] | None:
    """The UI's locations and the asset nodes of the loaded one, once it has loaded."""
    try:
        data = httpx.post(f"{web}/graphql", json={"query": WORKSPACE_QUERY}, timeout=30).json()["data"]
    except (httpx.HTTPError, KeyError, ValueError):
        return None
    entries = data["workspaceOrError"]["locationEntries"]
    loaded = [e["locationOrLoadError"] for e in entries]
    if not loaded or any(entry is None or entry["__typename"] != "RepositoryLocation" for entry in loaded):
        return None
    return [e["name"] for e in entries], sum(len(r["assetNodes"]) for e in loaded for r in e["repositories"])


def _sensor_ticks(dagster: sa.Engine, name: str) -> list[float]:
    """Timestamps of every stored tick of sensor ``name``, oldest first."""
    with dagster.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT timestamp, tick_body FROM job_ticks WHERE type = 'SENSOR' ORDER BY timestamp")
        ).all()
    # Dagster stores a tick's instigator name under its old field name, job_name.
    return [row.timestamp.timestamp() for row in rows if json.loads(row.tick_body).get("job_name") == name]


def _stored_instigators(dagster: sa.Engine) -> Counter[str]:
    with dagster.connect() as conn:
        bodies = conn.execute(sa.text("SELECT instigator_body FROM instigators")).scalars().all()
    return Counter(json.loads(body)["origin"]["job_name"] for body in bodies)


def _haproxy_command(socket_path: Path, command: str) -> str:
    """One command on HAProxy's admin socket (what `socat stdio SOCKET` does in the runbook); its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(socket_path))
        sock.sendall(command.encode() + b"\n")
        return sock.makefile().read()


def _deployment(
    tmp_path: Path, pg_url: str, dagster_env: dict[str, str], per_run: int, batch: int
) -> tuple[dict[str, str], list[int]]:
    """deploy/'s files in ``tmp_path``, Dagster's tables migrated as the runbook does; (every process's
    environment, the two replicas' ports)."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "deploy" / "dagster.yaml", home / "dagster.yaml")
    shutil.copy(REPO_ROOT / "deploy" / "workspace.yaml", tmp_path / "workspace.yaml")
    balancer, replica_ports, stats = free_port(), [free_port(), free_port()], free_port()
    env = child_env(
        DAGSTER_HOME=str(home),
        MARKETING_DATABASE_URL=pg_url,
        MARKETING_WEBHOOK_ALLOW_NETWORKS="127.0.0.1/32",
        MARKETING_SENSOR_INTERVAL_SECONDS=str(SENSOR_INTERVAL),
        MARKETING_EXECUTIONS_PER_RUN=str(per_run),
        MARKETING_SENSOR_BATCH_SIZE=str(batch),
        CODE_SERVERS_HOST="127.0.0.1",
        CODE_SERVERS_PORT=str(balancer),
        CODE_SERVERS_BIND=f"127.0.0.1:{balancer}",
        CODE_SERVER_1=f"127.0.0.1:{replica_ports[0]}",
        CODE_SERVER_2=f"127.0.0.1:{replica_ports[1]}",
        HAPROXY_STATS_BIND=f"127.0.0.1:{stats}",
        HAPROXY_ADMIN_SOCKET=str(tmp_path / "haproxy.sock"),
        **dagster_env,
    )
    # As the runbook does: Dagster's tables exist before any process uses them.
    migrate = subprocess.run(
        [dagster_bin("dagster"), "instance", "migrate"], env=env, cwd=tmp_path, capture_output=True, timeout=180
    )
    assert migrate.returncode == 0, migrate.stdout.decode() + migrate.stderr.decode()
    return env, replica_ports


@pytest.mark.parametrize("lost", ["process", "host", "drained"])
def test_a_replica_killed_while_work_is_launched_costs_no_execution_and_no_lease(
    lost: str, pg_url: str, dagster_pg: tuple[str, dict[str, str]], hook: Recorder, tmp_path: Path
) -> None:
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        require_or_skip("haproxy is not installed (Debian: apt-get install haproxy)")
    engine = get_engine(pg_url)
    due = _due_webhooks(engine, hook.url, EXECUTIONS)
    dagster_url, dagster_env = dagster_pg
    dagster = get_engine(dagster_url)

    env, replica_ports = _deployment(tmp_path, pg_url, dagster_env, PER_RUN, 2 * PER_RUN)

    web_port = free_port()
    web = f"http://127.0.0.1:{web_port}"
    with running([]) as children:
        replicas: list[Child] = []
        markers = tmp_path / "slow_workers"
        for i, port in enumerate(replica_ports, 1):
            argv = [dagster_bin("dagster"), "api", "grpc", "-m", "marketing_pipelines.definitions"]
            argv += ["-h", "127.0.0.1", "-p", str(port), "--fixed-server-id", RELEASE]
            replica_env = env
            if lost in ("process", "host") and i == 1:
                (tmp_path / "slow" / "sitecustomize.py").parent.mkdir()
                (tmp_path / "slow" / "sitecustomize.py").write_text(SLOW_WORKERS)
                markers.mkdir()
                replica_env = {**env, "PYTHONPATH": str(tmp_path / "slow"), "SLOW_WORKER_MARKERS": str(markers)}
            replicas.append(start(f"replica_{i}", argv, replica_env, tmp_path))
        children.extend(replicas)
        balancer_argv = [haproxy, "-db", "-f", str(REPO_ROOT / "deploy" / "haproxy.cfg")]
        children.append(start("haproxy", balancer_argv, env, tmp_path))
        workspace = ["-w", str(tmp_path / "workspace.yaml")]
        web_argv = [dagster_bin("dagster-webserver"), *workspace, "-h", "127.0.0.1", "-p", str(web_port)]
        children.append(start("webserver", web_argv, env, tmp_path))
        located = wait_for("the UI to load the location through the balancer", lambda: _location(web), 120, children, 2)
        admin = tmp_path / "haproxy.sock"
        if lost in ("process", "host"):
            # Which replica takes a launch is the balancer's choice (fewest connections), so a launch may never
            # reach replica 1 (seen in CI: every launch went to replica 2 and no worker ever started there).
            # Replica 2 is drained until a launch is in flight on replica 1, then takes calls again.
            assert _haproxy_command(admin, "set server code_server_replicas/replica_2 state drain").strip() == ""
        daemon = start("daemon", [dagster_bin("dagster-daemon"), "run", *workspace], env, tmp_path)
        children.append(daemon)

        if lost == "drained":
            # The runbook's way to take a replica out: no new calls through the balancer, then SIGTERM, which
            # lets the runs it started finish before the server exits.
            wait_for("the first execution runs to be requested", lambda: _runs_requested(dagster) >= 3, 120, children)
            drain = "set server code_server_replicas/replica_1 state drain"
            assert _haproxy_command(admin, drain).strip() == ""
            time.sleep(2)  # calls already on their way through the balancer arrive
            os.kill(replicas[0].process.pid, signal.SIGTERM)
        else:
            # A run is between claim and start on replica 1: its launch call is in flight. "process": the code
            # server dies (the worker it spawned lives on as an orphan); "host": the machine goes, workers too.
            wait_for("a run worker on replica 1", lambda: any(markers.iterdir()), 120, children, interval=0.2)
            assert _haproxy_command(admin, "set server code_server_replicas/replica_2 state ready").strip() == ""
            if lost == "process":
                os.kill(replicas[0].process.pid, signal.SIGKILL)
            else:
                os.killpg(replicas[0].process.pid, signal.SIGKILL)
        bound = RECOVERY_SECONDS
        killed_at = time.monotonic()
        survivors = [c for c in children if c is not replicas[0]]
        wait_for(
            f"all {EXECUTIONS} executions to succeed within {bound} s of the kill",
            lambda: _statuses(engine) == Counter({"SUCCEEDED": EXECUTIONS}),
            bound,
            survivors,
            interval=1,
            detail=lambda: f"{dict(_statuses(engine))}; daemon log:\n{daemon.log_tail(30)}",
        )
        recovered_in = time.monotonic() - killed_at
        after = _location(web)
        time.sleep(3 * SENSOR_INTERVAL)  # a few more ticks on the survivor alone
        ticks = _sensor_ticks(dagster, "due_executions_sensor")
        daemon_log = daemon.log_path.read_text(errors="replace")

    # Each execution once: one delivery per idempotency key, one key per execution.
    keys = Counter(r.headers["idempotency-key"] for r in hook.received)
    assert len(keys) == len(due) and set(keys.values()) == {1}, keys.most_common(3)
    with engine.connect() as conn:
        owners = set(conn.execute(sa.select(marketing_execution.c.run_id)).scalars())
    assert None not in owners
    with dagster.connect() as conn:
        runs = dict(conn.execute(sa.text("SELECT status, count(*) FROM runs GROUP BY status")).all())
    print(f"{lost} lost: all succeeded {recovered_in:.1f} s after the kill; Dagster runs by status: {runs}")
    if lost == "drained":
        assert runs == {"SUCCESS": EXECUTIONS // PER_RUN}, "a drained replica failed a run"
    else:
        # The launch caught in flight was put back in the queue and launched again, instead of failing.
        with dagster.connect() as conn:
            requeued = conn.execute(
                sa.text("SELECT count(*) FROM event_logs WHERE event LIKE :m"), {"m": f"%{REQUEUED}%"}
            ).scalar_one()
        assert requeued >= 1, runs

    # One codebase, one location: the UI shows the whole asset graph under one name, before and after the kill.
    names, assets = located
    assert names == ["marketing_pipelines"] and after == located
    assert assets == len(list(DEFS.resolve_asset_graph().get_all_asset_keys()))
    assert "multiple code locations" not in daemon_log
    # Each sensor and schedule is stored once, and the claiming sensor ticks once per interval, not once per replica.
    stored = _stored_instigators(dagster)
    assert stored["due_executions_sensor"] == 1 and stored["execution_run_failure_sensor"] == 1, stored
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert len(ticks) >= 5 and min(gaps) >= SENSOR_INTERVAL * 0.9, gaps


STRANDED_BOUND_SECONDS = 30  # issue 36: every execution of the dead tick SUCCEEDED within this of the kill


def _blocked_replica(engine: sa.Engine) -> str | None:
    """The replica whose connection waits on a lock (its application_name), if one does."""
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT application_name FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database() AND application_name LIKE 'replica_%' LIMIT 1"
            )
        ).scalar()


def _claimed(engine: sa.Engine) -> int:
    """Rows held by a tick's claim (not yet taken over by a run)."""
    with engine.connect() as conn:
        owner = marketing_execution.c.lease_owner
        return conn.execute(sa.select(sa.func.count()).where(owner.like("claim:%"))).scalar_one()


def _in_transaction(engine: sa.Engine, replica: str) -> bool:
    with engine.connect() as conn:
        states = conn.execute(
            sa.text("SELECT state FROM pg_stat_activity WHERE application_name = :name"), {"name": replica}
        ).scalars()
        return any(state != "idle" for state in states)


def test_a_replica_that_dies_after_its_claim_commits_strands_nothing(
    pg_url: str, dagster_pg: tuple[str, dict[str, str]], hook: Recorder, tmp_path: Path
) -> None:
    # The window: a replica's claiming tick has committed its claim and dies before its run requests reach
    # the daemon, so no run and no stored tick carries the claim. Reached from outside the code: a lock on
    # marketing_execution holds every claim; the replica whose tick waits on it is cut off at the balancer
    # (maintenance, its sessions shut: the daemon's evaluation fails as a dead replica's does) while its
    # process goes on; the lock is released, the replica commits its claim into a call nobody awaits, and is
    # then SIGKILLed. Every execution must still succeed, each once, within 30 s of the kill.
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        require_or_skip("haproxy is not installed (Debian: apt-get install haproxy)")
    engine = get_engine(pg_url)
    due = _due_webhooks(engine, hook.url, 20)
    dagster_url, dagster_env = dagster_pg
    dagster = get_engine(dagster_url)
    env, replica_ports = _deployment(tmp_path, pg_url, dagster_env, per_run=5, batch=10)

    locker = engine.connect()
    lock = locker.begin()
    # EXCLUSIVE: reads go on (the health sensor's), the claim's SELECT ... FOR UPDATE and UPDATEs wait.
    locker.execute(sa.text("LOCK TABLE marketing_execution IN EXCLUSIVE MODE"))
    try:
        with running([]) as children:
            replicas: dict[str, Child] = {}
            for i, port in enumerate(replica_ports, 1):
                name = f"replica_{i}"
                argv = [dagster_bin("dagster"), "api", "grpc", "-m", "marketing_pipelines.definitions"]
                argv += ["-h", "127.0.0.1", "-p", str(port), "--fixed-server-id", RELEASE]
                # Each replica's database sessions carry its name, so the test sees whose tick waits.
                named = {**env, "MARKETING_DATABASE_URL": f"{pg_url}?application_name={name}"}
                replicas[name] = start(name, argv, named, tmp_path)
            children.extend(replicas.values())
            children.append(
                start("haproxy", [haproxy, "-db", "-f", str(REPO_ROOT / "deploy" / "haproxy.cfg")], env, tmp_path)
            )
            workspace = ["-w", str(tmp_path / "workspace.yaml")]
            daemon = start("daemon", [dagster_bin("dagster-daemon"), "run", *workspace], env, tmp_path)
            children.append(daemon)

            dying = wait_for(
                "a replica's claiming tick to wait on the lock", lambda: _blocked_replica(engine), 180, children, 0.2
            )
            other = next(name for name in replicas if name != dying)
            # Both replicas out of the balancer, sessions shut: the daemon's evaluation of the waiting tick fails,
            # and no other tick claims before the cut-off one has (it alone then holds a claim nobody will launch).
            for name in (dying, other):
                for command in (
                    f"set server code_server_replicas/{name} state maint",
                    f"shutdown sessions server code_server_replicas/{name}",
                ):
                    assert _haproxy_command(tmp_path / "haproxy.sock", command).strip() == ""
            time.sleep(1)  # the daemon's call through the balancer fails before the replica answers it
            lock.commit()
            wait_for(
                "the cut-off replica to commit its claim",
                lambda: not _in_transaction(engine, dying) and _claimed(engine),
                30,
                interval=0.05,
            )
            os.killpg(replicas[dying].process.pid, signal.SIGKILL)
            assert _haproxy_command(tmp_path / "haproxy.sock", f"set server code_server_replicas/{other} state ready")
            killed_at = time.monotonic()
            survivors = [c for c in children if c is not replicas[dying]]
            wait_for(
                f"all 20 executions to succeed within {STRANDED_BOUND_SECONDS} s of the kill",
                lambda: _statuses(engine) == Counter({"SUCCEEDED": 20}),
                STRANDED_BOUND_SECONDS,
                survivors,
                interval=0.5,
                detail=lambda: f"{dict(_statuses(engine))}; daemon log:\n{daemon.log_tail(30)}",
            )
            recovered_in = time.monotonic() - killed_at
    finally:
        locker.close()

    keys = Counter(r.headers["idempotency-key"] for r in hook.received)
    assert len(keys) == len(due) and set(keys.values()) == {1}, keys.most_common(3)
    with engine.connect() as conn:
        attempts = Counter(conn.execute(sa.select(marketing_execution.c.attempts)).scalars())
        handed_back = Counter(conn.execute(sa.select(marketing_execution.c.handed_back)).scalars())
    # The dead tick claimed rows that were handed back and claimed again: the kill landed after the claim
    # committed, not before. No run began them, so the claim cost no attempt (issue 45): each row made one.
    assert handed_back[1] >= 1, handed_back
    assert attempts == Counter({1: len(due)}), attempts
    # Never two runs for one claim's rows: the runs together performed each execution exactly once (the dead
    # claim got no run, its rows one run each under the claim that took them again), and none failed.
    with dagster.connect() as conn:
        performed = conn.execute(sa.text("SELECT value FROM run_tags WHERE key = 'marketing/executions'")).scalars()
        statuses = dict(conn.execute(sa.text("SELECT status, count(*) FROM runs GROUP BY status")).all())
    assert sum(int(n) for n in performed) == len(due), statuses
    assert set(statuses) == {"SUCCESS"}, statuses
    print(f"stranded claim: all succeeded {recovered_in:.1f} s after the kill; executions by attempts {dict(attempts)}")
