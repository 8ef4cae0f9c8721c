"""Two code-server replicas evaluate ``due_executions_sensor`` at once against one PostgreSQL app database.

Both replicas are real ``dagster code-server start`` processes, called over gRPC the way the
daemon calls them, with Dagster's own storage on PostgreSQL through deploy/dagster.yaml. Each
due execution must be launched exactly once, and both replicas must have claimed some.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml

# The daemon's own client and argument types for evaluating a sensor on a code server; Dagster has
# no public API for this call.
from dagster._core.definitions.sensor_definition import SensorExecutionData
from dagster._core.instance.ref import InstanceRef
from dagster._core.remote_origin import GrpcServerCodeLocationOrigin, RemoteRepositoryOrigin
from dagster._core.workspace.config_schema import ensure_workspace_config
from dagster._grpc.client import DagsterGrpcClient
from dagster._grpc.types import ListRepositoriesResponse, SensorExecutionArgs
from dagster._serdes import deserialize_value
from dagster._utils.error import SerializableErrorInfo

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import marketing_execution
from marketing_pipelines.executions.sensors import TAG_CLAIMED_BY, executions_of_run
from marketing_pipelines_tests.factories import add_campaign, bulk_due_executions
from marketing_pipelines_tests.processes import (
    REPO_ROOT,
    child_env,
    dagster_bin,
    free_port,
    running,
    start,
    wait_for,
)

DUE = 600
BATCH_SIZE = 10
PER_RUN = 4  # runs of up to 4 executions: a tick of 10 makes runs of 4, 4 and 2
REPLICAS = 2
LOCATION = "marketing_pipelines"
SENSOR = "due_executions_sensor"
LOOP_SECONDS = 60


@pytest.fixture
def dagster_storage_env(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A throwaway PostgreSQL database for Dagster's storage, as the DAGSTER_PG_* vars deploy/dagster.yaml reads."""
    name = f"mp_dagster_{uuid.uuid4().hex[:10]}"
    # CREATE/DROP DATABASE may run from any database; the app's test database is at hand.
    admin = sa.create_engine(get_engine(pg_url).url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(pg_url)
    env = {
        "DAGSTER_PG_HOST": url.host or "127.0.0.1",
        "DAGSTER_PG_PORT": str(url.port or 5432),
        "DAGSTER_PG_USER": url.username or "postgres",
        "DAGSTER_PG_PASSWORD": url.password or "",
        "DAGSTER_PG_DB": name,
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    try:
        yield env
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@dataclass
class Replica:
    name: str
    client: DagsterGrpcClient
    origin: RemoteRepositoryOrigin | None = None
    batches: list[list[dg.RunRequest]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    skips: list[str] = field(default_factory=list)

    def repository_origin(self) -> RemoteRepositoryOrigin | None:
        """The one repository the server loaded, or None while it is still loading."""
        try:
            response = deserialize_value(self.client.list_repositories())
        except Exception:  # not listening yet, or the proxy's child not up yet
            return None
        if not isinstance(response, ListRepositoriesResponse):
            return None
        [symbol] = response.repository_symbols
        location = GrpcServerCodeLocationOrigin(host=self.client.host, port=self.client.port, location_name=LOCATION)
        self.origin = RemoteRepositoryOrigin(location, symbol.repository_name)
        return self.origin

    def tick(self, instance_ref: InstanceRef) -> SensorExecutionData | str:
        """One evaluation of the sensor on this server, as the daemon would ask for it."""
        assert self.origin is not None
        args = SensorExecutionArgs(
            repository_origin=self.origin, instance_ref=instance_ref, sensor_name=SENSOR, timeout=30
        )
        result = deserialize_value(self.client.external_sensor_execution(args))
        if isinstance(result, SensorExecutionData):
            return result
        error = getattr(result, "error", None)
        return error.to_string() if isinstance(error, SerializableErrorInfo) else repr(result)

    def drain(self, instance_ref: InstanceRef, go: threading.Barrier, deadline: float) -> None:
        """Tick until the sensor finds nothing due (or errors); keep every batch of run requests."""
        go.wait()
        while time.monotonic() < deadline:
            result = self.tick(instance_ref)
            if isinstance(result, str):
                self.errors.append(result)
                return
            if result.run_requests:
                self.batches.append(list(result.run_requests))
            else:
                self.skips.append(result.skip_message or "")
                return
        self.errors.append(f"still claiming after {LOOP_SECONDS}s")


def test_two_code_server_replicas_launch_each_due_execution_exactly_once(
    pg_url: str, dagster_storage_env: dict[str, str], tmp_path: Path
) -> None:
    engine = get_engine(pg_url)
    add_campaign(engine)
    bulk_due_executions(engine, DUE)
    with engine.connect() as conn:
        due_ids = set(conn.execute(sa.select(marketing_execution.c.id)).scalars())
    assert len(due_ids) == DUE

    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "deploy" / "dagster.yaml", home / "dagster.yaml")
    env = child_env(
        DAGSTER_HOME=str(home),
        MARKETING_DATABASE_URL=pg_url,
        MARKETING_SENSOR_BATCH_SIZE=str(BATCH_SIZE),
        MARKETING_EXECUTIONS_PER_RUN=str(PER_RUN),
        **dagster_storage_env,
    )
    # Opening the instance here creates Dagster's tables once, before the replicas race to use them.
    with dg.DagsterInstance.from_config(str(home)) as instance, running([]) as children:
        instance_ref = instance.get_ref()
        replicas: list[Replica] = []
        for i in range(REPLICAS):
            port = free_port()
            argv = [
                dagster_bin("dagster"),
                "code-server",
                "start",
                "-m",
                "marketing_pipelines.definitions",
                "--location-name",
                LOCATION,
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
            ]
            children.append(start(f"code-server-{i}", argv, env, tmp_path))
            replicas.append(Replica(f"code-server-{i}", DagsterGrpcClient(port=port, host="127.0.0.1")))
        for replica in replicas:
            wait_for(f"{replica.name} to load the definitions", replica.repository_origin, 75, children)

        go = threading.Barrier(REPLICAS)
        deadline = time.monotonic() + LOOP_SECONDS
        threads = [threading.Thread(target=r.drain, args=(instance_ref, go, deadline)) for r in replicas]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(LOOP_SECONDS + 35)
        assert not any(t.is_alive() for t in threads), "a replica's sensor call never returned"

    assert [r.errors for r in replicas] == [[]] * REPLICAS, "\n".join(e for r in replicas for e in r.errors)
    requests = [req for r in replicas for batch in r.batches for req in batch]
    launched = [i for req in requests for i in executions_of_run(req.tags)]
    assert len(launched) == len(set(launched)), "an execution was launched twice"
    assert set(launched) == due_ids
    per_tick = [sum(len(executions_of_run(req.tags)) for req in batch) for r in replicas for batch in r.batches]
    assert all(n <= BATCH_SIZE for n in per_tick)
    assert all(len(executions_of_run(req.tags)) <= PER_RUN for req in requests)
    claimed_per_replica = {r.name: sum(len(executions_of_run(q.tags)) for b in r.batches for q in b) for r in replicas}
    assert all(claimed_per_replica.values()), f"a replica claimed nothing: {claimed_per_replica}"
    assert all(s.startswith("Nothing due") for r in replicas for s in r.skips)
    # The database agrees with the run requests: each row is leased to the claim that launched it.
    with engine.connect() as conn:
        leases = dict(conn.execute(sa.select(marketing_execution.c.id, marketing_execution.c.lease_owner)).all())
    assert leases == {i: req.tags[TAG_CLAIMED_BY] for req in requests for i in executions_of_run(req.tags)}


def test_deploy_workspace_names_each_replica_as_its_own_grpc_location() -> None:
    path = REPO_ROOT / "deploy" / "workspace.yaml"
    config = ensure_workspace_config(yaml.safe_load(path.read_text()), str(path))
    entries = [entry["grpc_server"] for entry in config["load_from"]]  # KeyError: an entry is not a gRPC server
    assert len(entries) >= REPLICAS
    names = [entry["location_name"] for entry in entries]
    assert len(set(names)) == len(names), f"two replicas share a location name: {names}"
    assert len({(entry["host"], entry["port"]) for entry in entries}) == len(entries)
