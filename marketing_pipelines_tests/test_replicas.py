"""Two code-server replicas evaluate ``due_executions_sensor`` at once against one PostgreSQL app database.

Both replicas are real ``dagster code-server start`` processes, loaded as two code locations by a real
``dagster-webserver`` (so that each can be addressed on its own), with Dagster's own storage on
PostgreSQL through deploy/dagster.yaml. Each tick is the webserver's public sensor dry run (GraphQL
``sensorDryRun``, the UI's "Test sensor"), which has the replica's code server evaluate the sensor over gRPC
as the daemon does: the claims run in the two replicas' processes, at once. Each due execution must be
launched exactly once, and both replicas must have claimed some. A dry run launches nothing, so after
each tick the test takes the requested runs' rows over as the runs would when they start: a tick
claims only up to the batch size less the rows still waiting for their runs.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml
from dagster_graphql import DagsterGraphQLClient, ReloadRepositoryLocationStatus

from marketing_pipelines import run_tags
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import marketing_execution
from marketing_pipelines.executions.sensors import executions_of_run
from marketing_pipelines_tests.factories import add_campaign, bulk_due_executions, start_run
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

DUE = 600
BATCH_SIZE = 10
PER_RUN = 4  # runs of up to 4 executions: a tick of 10 makes runs of 4, 4 and 2
REPLICAS = 2
SENSOR = "due_executions_sensor"
REPOSITORY = "__repository__"  # the name Dagster gives the repository of a Definitions object
LOOP_SECONDS = 60
WAITING = "Nothing claimed: executions claimed earlier fill the batch"

DRY_RUN = """
mutation ($selector: SensorSelector!, $cursor: String) {
  sensorDryRun(selectorData: $selector, cursor: $cursor) {
    __typename
    ... on Error { message }
    ... on DryRunInstigationTick {
      evaluationResult {
        runRequests { runKey tags { key value } runConfigYaml }
        skipReason
        error { message stack }
      }
    }
  }
}
"""


@pytest.fixture
def dagster_storage_env(dagster_pg: tuple[str, dict[str, str]]) -> dict[str, str]:
    """The DAGSTER_PG_* variables of a throwaway database for Dagster's storage, for the child processes only."""
    return dagster_pg[1]


def replica_workspace(path: Path) -> list[tuple[str, int]]:
    """A workspace naming each code server as a location of its own, on a free local port; (location, port) each.

    Not how the project deploys (deploy/workspace.yaml: one location behind a balancer, proven by
    test_replica_failover.py): here each server must be addressed on its own, so that the two claims are
    known to run in two processes at once.
    """
    entries = [
        {"grpc_server": {"host": "127.0.0.1", "port": free_port(), "location_name": f"marketing_pipelines_{i}"}}
        for i in range(REPLICAS)
    ]
    path.write_text(yaml.safe_dump({"load_from": entries}))
    return [(e["grpc_server"]["location_name"], e["grpc_server"]["port"]) for e in entries]


@dataclass(frozen=True)
class Launched:
    """One run request as the dry run returned it: its tags and the executions in its run config."""

    tags: dict[str, str]
    executions: list[int]

    @classmethod
    def of(cls, request: dict[str, Any]) -> Launched:
        run_config = yaml.safe_load(request["runConfigYaml"]) or {}
        return cls({t["key"]: t["value"] for t in request["tags"]}, executions_of_run(run_config))


@dataclass
class Replica:
    location: str
    webserver: str
    engine: sa.Engine
    batches: list[list[Launched]] = field(default_factory=list)
    owners: dict[int, str] = field(default_factory=dict)  # each execution's lease owner once its run took it over
    errors: list[str] = field(default_factory=list)
    skips: list[str] = field(default_factory=list)

    def tick(self, client: httpx.Client) -> dict[str, Any] | str:
        """One evaluation of the sensor on this replica's code server: its evaluation result, or an error."""
        selector = {"repositoryLocationName": self.location, "repositoryName": REPOSITORY, "sensorName": SENSOR}
        response = client.post("/graphql", json={"query": DRY_RUN, "variables": {"selector": selector, "cursor": None}})
        if response.status_code != 200:
            return f"HTTP {response.status_code}: {response.text[:500]}"
        body = response.json()
        if body.get("errors"):
            return str(body["errors"])
        result = body["data"]["sensorDryRun"]
        if result["__typename"] != "DryRunInstigationTick":
            return f"{result['__typename']}: {result.get('message')}"
        evaluation = result["evaluationResult"]
        if evaluation["error"]:
            return f"{evaluation['error']['message']}\n{evaluation['error']['stack']}"
        return evaluation

    def drain(self, go: threading.Barrier, deadline: float) -> None:
        """Tick until the sensor finds nothing due (or errors); keep every batch of run requests' tags."""
        with httpx.Client(base_url=self.webserver, timeout=60) as client:
            go.wait()
            while time.monotonic() < deadline:
                result = self.tick(client)
                if isinstance(result, str):
                    self.errors.append(result)
                    return
                requests = result["runRequests"] or []
                if requests:
                    batch = [Launched.of(r) for r in requests]
                    self.batches.append(batch)
                    for launched in batch:
                        owner = start_run(self.engine, launched.tags[run_tags.CLAIMED_BY], launched.executions)
                        self.owners.update(dict.fromkeys(launched.executions, owner))
                    continue
                self.skips.append(result["skipReason"] or "")
                if not self.skips[-1].startswith(WAITING):
                    return
                # The other replica's claim fills the batch until the test has started its runs.
                time.sleep(0.05)
        self.errors.append(f"still claiming after {LOOP_SECONDS}s")


def _server_up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/server_info", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def _location_loaded(graphql: DagsterGraphQLClient, location: str) -> bool:
    # The webserver may have tried the replica before it listened; a reload picks it up once it does.
    return graphql.reload_repository_location(location).status == ReloadRepositoryLocationStatus.SUCCESS


# dagster-graphql 1.13.27's client calls gql in a way gql 4 deprecates; nothing this test can change.
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Using variable_values and operation_name:DeprecationWarning")
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
    locations = replica_workspace(tmp_path / "workspace.yaml")
    env = child_env(
        DAGSTER_HOME=str(home),
        MARKETING_DATABASE_URL=pg_url,
        MARKETING_SENSOR_BATCH_SIZE=str(BATCH_SIZE),
        MARKETING_EXECUTIONS_PER_RUN=str(PER_RUN),
        **dagster_storage_env,
    )
    # Dagster's tables are created once, here, before three processes race to use them.
    migrate = subprocess.run(
        [dagster_bin("dagster"), "instance", "migrate"], env=env, cwd=tmp_path, capture_output=True, timeout=180
    )
    assert migrate.returncode == 0, migrate.stdout.decode() + migrate.stderr.decode()

    web_port = free_port()
    webserver = f"http://127.0.0.1:{web_port}"
    with running([]) as children:
        for location, port in locations:
            argv = [dagster_bin("dagster"), "code-server", "start", "-m", "marketing_pipelines.definitions"]
            argv += ["--location-name", location, "-h", "127.0.0.1", "-p", str(port)]
            children.append(start(location, argv, env, tmp_path))
        web_argv = [dagster_bin("dagster-webserver"), "-w", str(tmp_path / "workspace.yaml")]
        children.append(start("webserver", [*web_argv, "-h", "127.0.0.1", "-p", str(web_port)], env, tmp_path))
        wait_for("dagster-webserver to answer /server_info", lambda: _server_up(webserver), 75, children)
        graphql = DagsterGraphQLClient("127.0.0.1", port_number=web_port)
        for location, _ in locations:
            wait_for(f"{location} to load", lambda loc=location: _location_loaded(graphql, loc), 90, children, 2)

        replicas = [Replica(location, webserver, engine) for location, _ in locations]
        go = threading.Barrier(REPLICAS)
        deadline = time.monotonic() + LOOP_SECONDS
        threads = [threading.Thread(target=r.drain, args=(go, deadline)) for r in replicas]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(LOOP_SECONDS + 65)
        assert not any(t.is_alive() for t in threads), "a replica's sensor call never returned"
        _assert_alive(children)

    assert [r.errors for r in replicas] == [[]] * REPLICAS, "\n".join(e for r in replicas for e in r.errors)
    requests = [launched for r in replicas for batch in r.batches for launched in batch]
    launched = [i for request in requests for i in request.executions]
    assert len(launched) == len(set(launched)), "an execution was launched twice"
    assert set(launched) == due_ids
    per_tick = [sum(len(request.executions) for request in batch) for r in replicas for batch in r.batches]
    assert all(n <= BATCH_SIZE for n in per_tick)
    assert all(len(request.executions) <= PER_RUN for request in requests)
    claimed = {r.location: sum(len(request.executions) for b in r.batches for request in b) for r in replicas}
    assert all(claimed.values()), f"a replica claimed nothing: {claimed}"
    assert all(r.skips[-1].startswith("Nothing due") for r in replicas), [r.skips[-3:] for r in replicas]
    # The database agrees with the run requests: each row is leased to the run its claim launched.
    with engine.connect() as conn:
        leases = dict(conn.execute(sa.select(marketing_execution.c.id, marketing_execution.c.lease_owner)).all())
    assert leases == {i: owner for r in replicas for i, owner in r.owners.items()}
    assert all(owner.startswith("run:") for owner in leases.values())


def _assert_alive(children: list[Child]) -> None:
    for child in children:
        child.assert_alive()
