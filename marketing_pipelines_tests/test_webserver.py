"""The real ``dagster-webserver`` loads workspace.yaml and serves what ``defs`` defines, over GraphQL.

Expectations come from ``defs`` itself, so the test follows new assets, jobs, sensors and schedules;
a few names are asserted on top because the deployment depends on them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import dagster as dg
import httpx
import pytest

from marketing_pipelines_tests.built import DEFS
from marketing_pipelines_tests.processes import REPO_ROOT, child_env, dagster_bin, free_port, running, start, wait_for

# A real webserver process: end to end, left out of the quick loop.
pytestmark = pytest.mark.slow

LOCATION = "marketing_pipelines"
REQUIRED_JOBS = {"marketing_execution_job", "agent_run_job"}
REQUIRED_SENSORS = {
    "due_executions_sensor",
    "execution_run_failure_sensor",
    "execution_run_canceled_sensor",
    "queued_agent_runs_sensor",
    "agent_run_failure_sensor",
    "agent_run_canceled_sensor",
}
SENSOR_INTERVAL = 7  # not the default, to show the server's environment reaches the code location
EXECUTIONS_PER_RUN = 40  # likewise, for a setting that is resource config

WORKSPACE_QUERY = """
{
  workspaceOrError {
    __typename
    ... on PythonError { message }
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError {
          __typename
          ... on PythonError { message stack }
          ... on RepositoryLocation {
            name
            repositories {
              name
              allTopLevelResourceDetails {
                name
                configFields { name description }
                configuredValues { key value type }
              }
              jobs { name isAssetJob }
              sensors { name defaultStatus minIntervalSeconds sensorState { status } }
              schedules { name cronSchedule defaultStatus scheduleState { status } }
              assetNodes {
                assetKey { path }
                isMaterializable
                isPartitioned
                partitionDefinition { type fmt }
                partitionKeys
                assetChecksOrError { __typename ... on AssetChecks { checks { name } } }
              }
            }
          }
        }
      }
    }
  }
}
"""


def _graphql(client: httpx.Client, query: str) -> dict[str, Any]:
    response = client.post("/graphql", json={"query": query})
    response.raise_for_status()
    body = response.json()
    assert "errors" not in body, body["errors"]
    return body["data"]


def _server_up(client: httpx.Client) -> bool:
    try:
        return client.get("/server_info").status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path) -> dict[str, Any]:
    """Start the webserver once for this module and return its repository as GraphQL sees it."""
    tmp = tmp_path_factory.mktemp("webserver")
    home = tmp / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    app_db = tmp / "app.db"
    shutil.copy(sqlite_template, app_db)
    port = free_port()
    env = child_env(
        DAGSTER_HOME=str(home),
        MARKETING_DATABASE_URL=f"sqlite:///{app_db}",
        MARKETING_SENSOR_INTERVAL_SECONDS=str(SENSOR_INTERVAL),
        MARKETING_EXECUTIONS_PER_RUN=str(EXECUTIONS_PER_RUN),
    )
    argv = [dagster_bin("dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)]
    with running([]) as children, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        children.append(start("dagster-webserver", argv, env, tmp))
        wait_for("dagster-webserver to answer /server_info", lambda: _server_up(client), 75, children)
        data = _graphql(client, WORKSPACE_QUERY)
    workspace = data["workspaceOrError"]
    assert workspace["__typename"] == "Workspace", workspace
    [entry] = workspace["locationEntries"]
    assert entry["name"] == LOCATION
    location = entry["locationOrLoadError"]
    assert location["__typename"] == "RepositoryLocation", f"code location failed to load: {location}"
    assert entry["loadStatus"] == "LOADED"
    [repository] = location["repositories"]
    return repository


@pytest.fixture(scope="module")
def repo_def() -> dg.RepositoryDefinition:
    return DEFS.get_repository_def()


def test_jobs_match_defs(served: dict[str, Any], repo_def: dg.RepositoryDefinition) -> None:
    jobs = {j["name"] for j in served["jobs"]}
    assert jobs == set(repo_def.job_names)
    assert jobs >= REQUIRED_JOBS


def test_sensors_match_defs_and_start_running(served: dict[str, Any], repo_def: dg.RepositoryDefinition) -> None:
    sensors = {s["name"]: s for s in served["sensors"]}
    assert set(sensors) == {s.name for s in repo_def.sensor_defs}
    assert set(sensors) >= REQUIRED_SENSORS
    # Running by default in code: a fresh deployment's daemon ticks them with nobody clicking "start".
    assert {n: (s["defaultStatus"], s["sensorState"]["status"]) for n, s in sensors.items()} == {
        n: ("RUNNING", "RUNNING") for n in sensors
    }
    assert sensors["due_executions_sensor"]["minIntervalSeconds"] == SENSOR_INTERVAL
    assert sensors["queued_agent_runs_sensor"]["minIntervalSeconds"] == SENSOR_INTERVAL


def test_schedules_match_defs(served: dict[str, Any], repo_def: dg.RepositoryDefinition) -> None:
    schedules = {s["name"]: s for s in served["schedules"]}
    expected = {s.name: s for s in repo_def.schedule_defs}
    assert set(schedules) == set(expected)
    for name, schedule in schedules.items():
        assert schedule["cronSchedule"] == expected[name].cron_schedule
        assert schedule["defaultStatus"] == expected[name].default_status.value
        assert schedule["scheduleState"]["status"] == expected[name].default_status.value


def test_assets_checks_and_daily_partitions_match_defs(
    served: dict[str, Any], repo_def: dg.RepositoryDefinition
) -> None:
    graph = repo_def.asset_graph
    nodes = {"/".join(n["assetKey"]["path"]): n for n in served["assetNodes"]}
    assert set(nodes) == {k.to_user_string() for k in graph.get_all_asset_keys()}
    for key in graph.get_all_asset_keys():
        node, spec = nodes[key.to_user_string()], graph.get(key)
        assert node["isMaterializable"] == spec.is_materializable, key
        checks = node["assetChecksOrError"]
        assert checks["__typename"] == "AssetChecks", checks
        assert {c["name"] for c in checks["checks"]} == {c.name for c in spec.check_keys}, key
        partitions = spec.partitions_def
        assert node["isPartitioned"] == (partitions is not None), key
        if isinstance(partitions, dg.DailyPartitionsDefinition):
            expected_keys = partitions.get_partition_keys()  # computed after the server answered
            served_keys = node["partitionKeys"]
            assert node["partitionDefinition"] == {"type": "TIME_WINDOW", "fmt": "%Y-%m-%d"}, key
            assert served_keys, f"{key} has no daily partition"
            # Across midnight UTC the server's answer may lack the newest day, never differ otherwise.
            assert served_keys == expected_keys[: len(served_keys)], key
            assert len(expected_keys) - len(served_keys) <= 1, key


def test_settings_show_as_resource_config_and_secrets_as_env_var_names(served: dict[str, Any]) -> None:
    resources = {r["name"]: r for r in served["allTopLevelResourceDetails"]}
    assert set(resources) == set(DEFS.resources)

    def values(name: str) -> dict[str, tuple[str, str]]:
        return {v["key"]: (v["value"], v["type"]) for v in resources[name]["configuredValues"]}

    # What an operator sees under Deployment > Resources: the value in force, set from the environment ...
    assert values("execution_settings")["executions_per_run"] == (str(EXECUTIONS_PER_RUN), "VALUE")
    assert values("webhook")["concurrency"] == ("32", "VALUE")
    # ... each field naming its variable ...
    described = {f["name"]: f["description"] for f in resources["execution_settings"]["configFields"]}
    assert "Env var: MARKETING_EXECUTIONS_PER_RUN." in described["executions_per_run"]
    # ... and for the database URL (which may hold a password) only the variable's name.
    assert values("app_db")["url"] == ("MARKETING_DATABASE_URL", "ENV_VAR")
