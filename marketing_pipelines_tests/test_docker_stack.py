"""deploy/docker/ run as it ships: every process in a container of the image, every run in a container of its own.

The stack (compose.yaml): two code-server replicas behind HAProxy, the webserver and the one daemon, each in a
container of the image built from deploy/container/Dockerfile, with the DockerRunLauncher of
deploy/docker/dagster.yaml starting each run in a fresh container. Dagster's storage and the application
database are this machine's PostgreSQL; every container uses the host's network.

While 500 webhook executions and 20 agent runs go through it, one code-server container and one run container
are killed (`docker kill`). Then every execution SUCCEEDED and every agent run too, each webhook's key reached
the receiver, the agent_runs pool held, every run's container is gone, and the secrets (files in the folder
mounted at /run/secrets) are nowhere a reader of the engine or of Dagster's storage looks: the image's layers,
`docker inspect` of the stack's containers and of a run's container, the runs' events.

Needs a Docker engine and Docker Compose; skipped with the install hint where either is missing. About 5
minutes on 2 cores with the image built (the run containers are most of it: each is a fresh copy of the
image under the vfs storage driver).
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
from marketing_pipelines_tests.processes import REPO_ROOT, child_env, dagster_bin, free_port, wait_for
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


def _compose(argv: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*compose_command(), "-f", str(REPO_ROOT / "deploy" / "docker" / "compose.yaml"), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
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
    """The compose environment of a stack on free ports, its secrets planted in a folder; stopped afterwards."""
    image = built_image()
    _, dagster_env = dagster_pg
    planted = {
        # Trust authentication here: PostgreSQL never asks for these passwords, so they only have to stay hidden.
        "MARKETING_DATABASE_URL": sa.engine.make_url(pg_url)
        .set(password=f"db-{secrets.token_hex(8)}")
        .render_as_string(hide_password=False),
        "DAGSTER_PG_PASSWORD": f"dagster-{secrets.token_hex(8)}",
        "MARKETING_SECRETS_KEY": new_key(),
        "ANTHROPIC_API_KEY": f"sk-ant-{secrets.token_hex(12)}",
    }
    folder = tmp_path / "secrets"
    folder.mkdir(mode=0o700)
    for name, value in planted.items():
        (folder / name).write_text(value + "\n")
        (folder / name).chmod(0o400)
    subprocess.run(["chown", "-R", "10001:10001", str(folder)], check=False)  # the image's uid reads them
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
    # As the runbook does: Dagster's tables exist before any process uses them (deploy/dagster.yaml has the
    # same storage as the stack's, without the launcher this machine's virtualenv may not have).
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO_ROOT / "deploy" / "dagster.yaml").read_text())
    migrate = subprocess.run(
        [dagster_bin("dagster"), "instance", "migrate"],
        env=child_env(DAGSTER_HOME=str(home), **dagster_env),
        cwd=tmp_path,
        capture_output=True,
        timeout=180,
    )
    assert migrate.returncode == 0, migrate.stdout.decode() + migrate.stderr.decode()
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "COMPOSE_PROJECT_NAME": f"mp{secrets.token_hex(4)}",
        "MARKETING_IMAGE": image,
        "MARKETING_SECRETS_DIR": str(folder),
        "MARKETING_SETTINGS_FILE": str(settings),
        "DOCKER_GID": str(Path("/var/run/docker.sock").stat().st_gid),
        "BIND_ADDRESS": "127.0.0.1",
        "CODE_SERVERS_PORT": str(free_port()),
        "CODE_SERVER_1_PORT": str(free_port()),
        "CODE_SERVER_2_PORT": str(free_port()),
        "HAPROXY_STATS_PORT": str(free_port()),
        "WEBSERVER_PORT": str(free_port()),
    }
    # A stack left by an interrupted run of this test holds the volume's name.
    docker("volume", "rm", "-f", "marketing-secrets")
    try:
        yield {**env, **{f"PLANTED_{k}": v for k, v in planted.items()}}
    finally:
        logs = _compose(["logs", "--no-color", "--tail", "40"], env)
        print(logs.stdout[-6000:])
        _compose(["down", "-v", "--remove-orphans", "-t", "5"], env)
        for container in _run_containers(every=True):
            docker("rm", "-f", container)
        docker("volume", "rm", "-f", "marketing-secrets")


# The image build (when not cached) and 41 run containers on a busy 2-core machine: more than the suite's 600 s.
@pytest.mark.timeout(1800)
def test_the_docker_stack_runs_each_run_in_its_own_container_through_kills(
    stack_env: dict[str, str], pg_url: str, dagster_pg: tuple[str, dict[str, str]], hook: Recorder, tmp_path: Path
) -> None:
    env = {k: v for k, v in stack_env.items() if not k.startswith("PLANTED_")}
    planted = {k.removeprefix("PLANTED_"): v for k, v in stack_env.items() if k.startswith("PLANTED_")}
    engine = get_engine(pg_url)
    dagster = get_engine(dagster_pg[0])
    hook.on_request = lambda _: time.sleep(ANSWER_SECONDS)
    due = _due_webhooks(engine, hook.url, EXECUTIONS)
    _queue_agent_runs(engine)

    up = _compose(["up", "-d", "--build"], env, timeout=900)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    web = f"http://127.0.0.1:{env['WEBSERVER_PORT']}"
    located = wait_for("the UI to load the location through the balancer", lambda: _location(web), 180, interval=2)
    assert located[0] == ["marketing_pipelines"]

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

    # The secrets: in the processes, where the entry point exported them (the surviving code server's PID 1) ...
    server = _compose(["ps", "-q", "code_server_2"], env).stdout.strip()
    environ = docker("exec", server, "cat", "/proc/1/environ").stdout.split("\0")
    assert {f"{name}={value}" for name, value in planted.items()} <= set(environ)
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
    assert {"Type": "volume", "Name": "marketing-secrets"}.items() <= config["Mounts"][0].items()
    assert config["Mounts"][0]["RW"] is False
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
