"""deploy/docker/ run as it ships: every process in a container of the image, every run in a container of its own.

The stack (compose.yaml): two code-server replicas behind HAProxy, the webserver and the one daemon, each in a
container of the image built from deploy/container/Dockerfile, with the DockerRunLauncher of
deploy/docker/dagster.yaml starting each run in a fresh container. Dagster's storage and the application
database are this machine's PostgreSQL (both empty until the stack's `migrate` fills them); every container
uses the host's network.

deploy/README.md's Docker section is run as written, block by block, with this test's own image tag, folders
and ports (the variables its first block, not run, tells an operator to set), and `docker compose` spelled as
this machine's Compose is called (`docker-compose`, 1.29, where the plugin is missing): the build, the secrets'
files, the one-shot `migrate`, `up`, commands run with `exec`, the drain and return of a replica. Between the
blocks, while 500 webhook executions and 20 agent runs go through the stack, one code-server container and one
run container are killed (`docker kill`). Then every execution SUCCEEDED and every agent run too, each webhook's
key reached the receiver, the agent_runs pool held, every run's container is gone but its stdout and stderr are
what the UI's GraphQL gives "View stdout/stderr", both code servers are healthy, and the secrets (files in the
folder mounted at /run/secrets) are nowhere a reader of the engine or of Dagster's storage looks: the image's
layers, `docker inspect` of the stack's containers and of a run's container, the runs' events.

Needs a Docker engine and Docker Compose; skipped with the install hint where either is missing. Several
minutes on 2 cores with the image built (deploy/README.md, "Docker", has the time measured; the run containers
are most of it: each is a fresh copy of the image under the vfs storage driver).
"""

from __future__ import annotations

import io
import json
import secrets
import subprocess
import sys
import tarfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import agent_run
from marketing_pipelines.sealing import new_key
from marketing_pipelines_tests.containers import built_image, compose_command, docker
from marketing_pipelines_tests.factories import request_offline_analysis
from marketing_pipelines_tests.processes import REPO_ROOT, free_port, wait_for
from marketing_pipelines_tests.test_container_image import deploy_readme_blocks, run_block
from marketing_pipelines_tests.test_replica_failover import _due_webhooks, _location, _statuses
from marketing_pipelines_tests.webserver import Recorder

pytestmark = pytest.mark.slow

EXECUTIONS = 500
PER_RUN = 25  # 20 execution runs
AGENT_RUNS = 20
POOL_LIMIT = 2  # MARKETING_MAX_CONCURRENT_AGENT_RUNS
# The receiver answers each webhook after this long and a run sends one at a time, so an execution run is
# mid-batch for about 2.5 s: the run container killed below dies with its work half done.
ANSWER_SECONDS = 0.1
DONE_WITHIN_SECONDS = 900
RUN_LABEL = "dagster/run_id"  # the DockerRunLauncher's label on every run container
DOCKER_SECTION = "Docker: every process and every run in a container"
DRAIN = 0x08  # HAProxy's SRV_ADMF_DRAIN bit of a server's srv_admin_state
LOGS_CAPTURED = """
query ($runId: ID!) { logsForRun(runId: $runId) { __typename ... on EventConnection {
    events { __typename ... on LogsCapturedEvent { fileKey stepKeys } } } } }
"""
CAPTURED_LOGS = """
query ($runId: ID!, $fileKey: String!) { runOrError(runId: $runId) { __typename ... on Run {
    capturedLogs(fileKey: $fileKey) { stdout stderr } } } }
"""


def _compose(argv: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*compose_command(), "-f", str(REPO_ROOT / "deploy" / "docker" / "compose.yaml"), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _readme_blocks() -> list[str]:
    """The Docker section's blocks that run, `docker compose` as this machine's Compose is called."""
    blocks = deploy_readme_blocks(DOCKER_SECTION)
    assert [why for _, why in blocks if why is not None], "the operator's own values: one block left out, saying why"
    spelled = " ".join(compose_command()) + " "
    return [body.replace("docker compose ", spelled) for body, why in blocks if why is None]


def _run_readme_block(body: str, env: dict[str, str], timeout: float = 900) -> str:
    done = run_block(body, env, timeout)
    assert done.returncode == 0, f"deploy/README.md, Docker:\n{body}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def _health(env: dict[str, str], service: str) -> str:
    container = _compose(["ps", "-q", service], env).stdout.strip()
    return docker("inspect", container, "--format", "{{.State.Health.Status}}").stdout.strip() if container else ""


def _admin_state(env: dict[str, str], server: str) -> int:
    """HAProxy's srv_admin_state of ``server``, read through the balancer's admin socket as an operator would."""
    shown = _compose(
        ["exec", "-T", "balancer", "sh", "-c",
         'echo "show servers state code_server_replicas" | socat stdio "$HAPROXY_ADMIN_SOCKET"'],
        env,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stdout + shown.stderr
    [row] = [line.split() for line in shown.stdout.splitlines() if f" {server} " in f" {line} "]
    return int(row[6])


def _graphql(web: str, query: str, **variables: str) -> dict:
    return httpx.post(f"{web}/graphql", json={"query": query, "variables": variables}, timeout=60).json()["data"]


def _captured_stderr(web: str, run_id: str) -> str:
    """What "View stdout/stderr" shows of ``run_id``'s steps: the UI's own GraphQL queries, through the webserver."""
    events = _graphql(web, LOGS_CAPTURED, runId=run_id)["logsForRun"]["events"]
    keys = [event["fileKey"] for event in events if event["__typename"] == "LogsCapturedEvent"]
    assert keys, f"run {run_id} captured no logs"
    return "".join(
        _graphql(web, CAPTURED_LOGS, runId=run_id, fileKey=key)["runOrError"]["capturedLogs"]["stderr"] or ""
        for key in keys
    )


def _run_containers(job: str | None = None, *, every: bool = False) -> list[str]:
    """Ids of the run containers (of ``job``), running ones only unless ``every``."""
    argv = ["ps", "-q", "--no-trunc", "--filter", f"label={RUN_LABEL}"]
    if job:
        argv += ["--filter", f"label=dagster/job_name={job}"]
    return docker(*argv, *(["-a"] if every else [])).stdout.split()


def _runs(dagster: sa.Engine, job: str) -> list[sa.Row]:
    with dagster.connect() as conn:
        return conn.execute(
            sa.text("SELECT run_id, status, start_time, end_time FROM runs WHERE pipeline_name = :job"), {"job": job}
        ).all()


def _most_at_once(runs: list[sa.Row]) -> int:
    """The most runs that were running at one moment (start_time to end_time)."""
    moments = sorted(
        [(r.start_time, 1) for r in runs if r.start_time] + [(r.end_time, -1) for r in runs if r.end_time],
        key=lambda m: (m[0], m[1]),  # an end before a start at the same instant
    )
    most = now = 0
    for _, step in moments:
        now += step
        most = max(most, now)
    return most


def _agent_statuses(engine: sa.Engine) -> Counter[str]:
    with engine.connect() as conn:
        return Counter(conn.execute(sa.select(agent_run.c.status)).scalars())


def _queue_agent_runs(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        for permission in ("campaign:read", "measurement:read", "execution:read"):
            users.grant(conn, "ana", permission)
        for _ in range(AGENT_RUNS):
            request_offline_analysis(conn, "ana")


class _Inspector:
    """Keeps `docker inspect` of every run container seen while it runs (a finished one is removed at once)."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            for container in _run_containers():
                if container not in self.seen:
                    shown = docker("inspect", container)
                    if shown.returncode == 0:
                        self.seen[container] = shown.stdout

    def __enter__(self) -> _Inspector:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _image_bytes(image: str, tmp_path: Path) -> Iterator[bytes]:
    """Every file of every layer of ``image`` (`docker save`), as bytes."""
    saved = tmp_path / "image.tar"
    assert docker("save", "-o", str(saved), image, timeout=600).returncode == 0
    with tarfile.open(saved) as outer:
        for member in outer:
            if not member.isfile():
                continue
            blob = outer.extractfile(member)
            assert blob is not None
            data = blob.read()
            if member.name.endswith(".tar") or member.name.startswith("blobs/"):
                try:
                    with tarfile.open(fileobj=io.BytesIO(data)) as layer:
                        for inner in layer:
                            if inner.isfile() and (f := layer.extractfile(inner)) is not None:
                                yield f.read()
                    continue
                except tarfile.TarError:
                    pass
            yield data


@pytest.fixture
def stack_env(pg_url: str, dagster_pg: tuple[str, dict[str, str]], tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment deploy/README.md's Docker blocks run in: this test's image, folders, ports and secrets.

    The application database is a new, empty one (the stack's `migrate` creates its schema); Dagster's is
    dagster_pg's, empty too. Both are reached as the server's superuser, which stands in for the migration and
    the application roles alike (trust authentication: PostgreSQL never asks for the planted passwords, so
    they only have to stay hidden). The stack is taken down afterwards, its volumes and run containers removed.
    """
    image = built_image()
    _, dagster_env = dagster_pg
    server = sa.engine.make_url(pg_url)
    app_database = f"mp_docker_{secrets.token_hex(5)}"
    admin = sa.create_engine(get_engine(pg_url).url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{app_database}"'))
    role = server.username or "postgres"

    def url_with_a_password(password: str) -> str:
        return server.set(database=app_database, password=password).render_as_string(hide_password=False)

    planted = {
        "MARKETING_DATABASE_URL": url_with_a_password(f"db-{secrets.token_hex(8)}"),
        "DAGSTER_PG_PASSWORD": f"dagster-{secrets.token_hex(8)}",
        "MARKETING_SECRETS_KEY": new_key(),
        "MARKETING_MIGRATOR_URL": url_with_a_password(f"migrator-{secrets.token_hex(8)}"),
        "DAGSTER_MIGRATOR_PASSWORD": f"dagster-migrator-{secrets.token_hex(8)}",
    }
    # The shipped settings file (every setting named, empty for its default) with this test's values.
    values = {
        **{k: v for k, v in dagster_env.items() if k != "DAGSTER_PG_PASSWORD"},
        "MARKETING_WEBHOOK_ALLOW_NETWORKS": "127.0.0.1/32",
        "MARKETING_SENSOR_INTERVAL_SECONDS": "2",
        "MARKETING_EXECUTIONS_PER_RUN": str(PER_RUN),
        "MARKETING_SENSOR_BATCH_SIZE": str(2 * PER_RUN),
        "MARKETING_WEBHOOK_CONCURRENCY": "1",
        "MARKETING_MAX_CONCURRENT_AGENT_RUNS": str(POOL_LIMIT),
        "MARKETING_MODEL_PROVIDER": "offline",
    }
    shipped = (REPO_ROOT / "deploy" / "docker" / "settings.env").read_text().splitlines()
    settings = tmp_path / "settings.env"
    settings.write_text(
        "\n".join(f"{n}={values[n]}" if (n := line.split("=")[0]) in values else line for line in shipped) + "\n"
    )
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "COMPOSE_PROJECT_NAME": f"mp{secrets.token_hex(4)}",
        "MARKETING_IMAGE": image,
        "MARKETING_SECRETS_DIR": str(tmp_path / "secrets"),
        "MARKETING_MIGRATOR_SECRETS_DIR": str(tmp_path / "migrator-secrets"),
        "MARKETING_SETTINGS_FILE": str(settings),
        "DOCKER_GID": str(Path("/var/run/docker.sock").stat().st_gid),
        "DAGSTER_MIGRATOR": role,
        "MARKETING_APP_USER": role,
        "DAGSTER_APP_USER": role,
        "BIND_ADDRESS": "127.0.0.1",
        "CODE_SERVERS_PORT": str(free_port()),
        "CODE_SERVER_1_PORT": str(free_port()),
        "CODE_SERVER_2_PORT": str(free_port()),
        "HAPROXY_STATS_PORT": str(free_port()),
        "WEBSERVER_PORT": str(free_port()),
    }
    # A stack left by an interrupted run of this test holds the volumes' names.
    for volume in ("marketing-secrets", "marketing-compute-logs"):
        docker("volume", "rm", "-f", volume)
    try:
        yield {
            **env,
            **planted,
            "APP_DATABASE_URL": server.set(database=app_database).render_as_string(hide_password=False),
        }
    finally:
        logs = _compose(["logs", "--no-color", "--tail", "40"], env)
        print(logs.stdout[-6000:])
        _compose(["down", "-v", "--remove-orphans", "-t", "5"], env)
        for container in _run_containers(every=True):
            docker("rm", "-f", container)
        for volume in ("marketing-secrets", "marketing-compute-logs"):
            docker("volume", "rm", "-f", volume)
        get_engine(server.set(database=app_database).render_as_string(hide_password=False)).dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{app_database}" WITH (FORCE)'))
        admin.dispose()


def test_the_compose_file_is_valid_for_the_compose_here(tmp_path: Path) -> None:
    # Issue 45: Debian 12 has Compose 1.29 and no plugin; the file must serve both (the test picks the one here).
    (tmp_path / "secrets").mkdir()
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "MARKETING_IMAGE": "marketing-pipelines:test",
        "MARKETING_SECRETS_DIR": str(tmp_path / "secrets"),
        "DOCKER_GID": "0",
    }
    config = _compose(["config"], env, timeout=60)
    assert config.returncode == 0, config.stderr
    services = _compose(["config", "--services"], env, timeout=60).stdout.split()
    assert sorted(services) == ["balancer", "code_server_1", "code_server_2", "daemon", "migrate", "webserver"]
    # `up` leaves the one-shot migration out: it is run on its own, once per release.
    assert "profiles:\n    - migrate" in config.stdout or "profiles:\n      - migrate" in config.stdout


# The image build (when not cached) and 41 run containers on a busy 2-core machine: more than the suite's 600 s.
@pytest.mark.timeout(2400)
def test_the_docker_stack_runs_each_run_in_its_own_container_through_kills(
    stack_env: dict[str, str], dagster_pg: tuple[str, dict[str, str]], hook: Recorder, tmp_path: Path
) -> None:
    env = stack_env
    secret_names = ("MARKETING_DATABASE_URL", "DAGSTER_PG_PASSWORD", "MARKETING_SECRETS_KEY")
    planted = {name: env[name] for name in (*secret_names, "MARKETING_MIGRATOR_URL", "DAGSTER_MIGRATOR_PASSWORD")}
    build, write_secrets, migrate_and_start, inside, drain, undrain = _readme_blocks()
    assert "docker build" in build and "run --rm -T migrate" in migrate_and_start and "up -d" in migrate_and_start
    assert "marketing-pipelines status" in inside and "state drain" in drain and "state ready" in undrain

    _run_readme_block(build, {**env, "DOCKER_BUILDKIT": "0"}, timeout=1500)
    _run_readme_block(write_secrets, env)
    # An API key besides, as an operator adds the ones they use: the same folder, the same owner and mode.
    key = Path(env["MARKETING_SECRETS_DIR"]) / "ANTHROPIC_API_KEY"
    key.write_text(planted.setdefault("ANTHROPIC_API_KEY", f"sk-ant-{secrets.token_hex(12)}"))
    subprocess.run(["chown", "10001:10001", str(key)], check=True)
    key.chmod(0o400)
    # Both databases are empty until here: the one-shot migrate creates both schemas.
    started = _run_readme_block(migrate_and_start, env)
    assert "migrated: both databases are current" in started, started
    engine = get_engine(env["APP_DATABASE_URL"])
    dagster = get_engine(dagster_pg[0])
    hook.on_request = lambda _: time.sleep(ANSWER_SECONDS)
    due = _due_webhooks(engine, hook.url, EXECUTIONS)
    _queue_agent_runs(engine)

    web = f"http://127.0.0.1:{env['WEBSERVER_PORT']}"
    located = wait_for("the UI to load the location through the balancer", lambda: _location(web), 300, interval=2)
    assert located[0] == ["marketing_pipelines"]

    # Commands run inside the stack's containers have their secrets (issue 45: they had none).
    wait_for(
        "both code servers to report healthy",
        lambda: all(_health(env, s) == "healthy" for s in ("code_server_1", "code_server_2")),
        400,
        interval=3,
    )
    liveness = ["exec", "-T", "-e", "DAGSTER_DAEMON_HEARTBEAT_TOLERANCE=60", "webserver", "dagster-daemon"]
    wait_for(
        "the daemon's heartbeats", lambda: _compose([*liveness, "liveness-check"], env).returncode == 0, 180, interval=2
    )
    said = _run_readme_block(inside, env)
    assert "Daemon live" in said, said
    missing = _compose(
        ["exec", "-T", "-e", "SECRETS_DIR=/run/no-secrets", "code_server_2", "marketing-pipelines", "status"], env
    )
    assert missing.returncode == 64, missing.stdout + missing.stderr
    assert "with-secrets: MARKETING_DATABASE_URL is missing: no file /run/no-secrets/MARKETING_DATABASE_URL" in (
        missing.stderr
    )

    with _Inspector() as inspector:
        # A code server dies while runs are being launched: the balancer sends the next calls to the other one.
        wait_for("the first execution runs to start", lambda: len(_runs(dagster, "marketing_execution_job")) >= 2, 300)
        killed_server = _compose(["ps", "-q", "code_server_1"], env).stdout.strip()
        assert docker("kill", killed_server).returncode == 0

        # A run container dies mid-batch: run monitoring fails its run (max_resume_run_attempts: 0) and the
        # run-failure sensor hands its executions back to be claimed again.
        def started_run_container() -> str | None:
            started = {r.run_id for r in _runs(dagster, "marketing_execution_job") if r.status == "STARTED"}
            for container in _run_containers("marketing_execution_job"):
                labels = docker("inspect", container, "--format", "{{json .Config.Labels}}").stdout
                if labels and json.loads(labels).get(RUN_LABEL) in started:
                    return container
            return None

        killed_run_container = wait_for("an execution run mid-batch", started_run_container, 300, interval=0.3)
        killed_run = json.loads(docker("inspect", killed_run_container, "--format", "{{json .Config.Labels}}").stdout)
        assert docker("kill", killed_run_container).returncode == 0
        killed_at = time.monotonic()

        wait_for(
            f"all {EXECUTIONS} executions and {AGENT_RUNS} agent runs to succeed",
            lambda: (
                _statuses(engine) == Counter({"SUCCEEDED": EXECUTIONS})
                and _agent_statuses(engine) == Counter({"SUCCEEDED": AGENT_RUNS})
            ),
            DONE_WITHIN_SECONDS,
            interval=2,
            detail=lambda: (
                f"{dict(_statuses(engine))} {dict(_agent_statuses(engine))}\n"
                + _compose(["logs", "--no-color", "--tail", "30", "daemon"], env).stdout
            ),
        )
    recovered_in = time.monotonic() - killed_at
    # Every run's container is gone once its run ends: the engine removes each as it exits (auto_remove).
    wait_for("every run container to be removed", lambda: not _run_containers(every=True), 60, interval=1)

    # Each webhook's key reached the receiver; a key twice only from the run killed mid-batch (delivered, not
    # yet recorded when its container died, so sent again under the same key).
    keys = Counter(r.headers["idempotency-key"] for r in hook.received)
    assert len(keys) == len(due), (len(keys), len(due))
    assert sum(n - 1 for n in keys.values()) <= PER_RUN, keys.most_common(3)
    execution_runs = _runs(dagster, "marketing_execution_job")
    failed = [r.run_id for r in execution_runs if r.status == "FAILURE"]
    assert failed == [killed_run[RUN_LABEL]], failed  # the killed run, and no other, shows as failed
    agent_runs = _runs(dagster, "agent_run_job")
    assert {r.status for r in agent_runs} == {"SUCCESS"}
    assert _most_at_once(agent_runs) <= POOL_LIMIT
    # Each run ran in a container of its own, not in a code server.
    assert len(inspector.seen) >= len(execution_runs) // 2, len(inspector.seen)

    # A finished run's steps' output outlived its container (issue 45: "View stdout/stderr" was empty).
    succeeded = next(r.run_id for r in execution_runs if r.status == "SUCCESS")
    assert "perform_executions" in _captured_stderr(web, succeeded)

    # A replica drained through the balancer's admin socket, stopped, started and put back (deploy/README.md).
    _run_readme_block(drain, env)
    assert _admin_state(env, "replica_1") & DRAIN
    assert _compose(["ps", "-q", "code_server_1"], env).stdout.strip()  # stopped, not removed
    _run_readme_block(undrain, env)
    assert not _admin_state(env, "replica_1") & DRAIN
    wait_for(
        "code_server_1 to report healthy again", lambda: _health(env, "code_server_1") == "healthy", 400, interval=3
    )

    # The secrets: in the processes, where the entry point exported them (the surviving code server's PID 1) ...
    server = _compose(["ps", "-q", "code_server_2"], env).stdout.strip()
    environ = docker("exec", server, "cat", "/proc/1/environ").stdout.split("\0")
    assert {f"{name}={planted[name]}" for name in secret_names} <= set(environ)
    stack = _compose(["ps", "-q"], env).stdout.split()
    shown = [docker("inspect", *stack).stdout, *inspector.seen.values()]
    with dagster.connect() as conn:
        events = conn.execute(sa.text("SELECT event FROM event_logs")).scalars().all()
    layers = list(_image_bytes(env["MARKETING_IMAGE"], tmp_path))
    for name, value in planted.items():
        # ... and nowhere else: not in the image, the containers' configuration or the runs' events.
        assert not any(value in text for text in shown), f"{name} in docker inspect"
        assert not any(value in event for event in events), f"{name} in a run's events"
        assert not any(value.encode() in blob for blob in layers), f"{name} in the image"
    # Each run container was given settings by name only, and the secrets folder read-only.
    config = json.loads(next(iter(inspector.seen.values())))[0]
    mounts = {mount["Name"]: mount for mount in config["Mounts"] if mount["Type"] == "volume"}
    assert mounts["marketing-secrets"]["RW"] is False and mounts["marketing-compute-logs"]["RW"] is True
    assert config["HostConfig"]["NetworkMode"] == "host" and config["HostConfig"]["AutoRemove"] is True
    print(
        f"{len(execution_runs)} execution runs, {len(agent_runs)} agent runs, {len(inspector.seen)} containers seen;"
        f" everything SUCCEEDED {recovered_in:.0f} s after the run container was killed"
    )
    assert httpx.get(f"{web}/server_info", timeout=10).status_code == 200


@pytest.mark.timeout(1200)
def test_the_run_container_benchmark_runs(pg_database: str) -> None:
    """benchmarks/run_container.py at its smallest (its numbers decide nothing here; docs/PERFORMANCE.md has them)."""
    image = built_image()
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "run_container.py"), "--rounds", "1", "--image", image],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "container / subprocess: launch to first op" in done.stdout
