"""Unattended, through the real daemon: a batch with one permanently failing webhook is a failed run.

Nobody watches: ``dagster-daemon`` claims the due executions, runs the batch, fails the run because
one execution FAILED for good, and ``marketing_alerts_sensor`` posts one alert to a local receiver.
``dagster-webserver`` answers the Runs page's "Failed" filter over GraphQL as the UI asks it.
"""

from __future__ import annotations

import shutil
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import marketing_execution
from marketing_pipelines.egress import EgressPolicy, parse_networks
from marketing_pipelines.executions.queue import schedule_execution
from marketing_pipelines_tests.factories import add_campaign
from marketing_pipelines_tests.processes import (
    REPO_ROOT,
    child_env,
    dagster_bin,
    free_port,
    running,
    start,
    wait_for,
)
from marketing_pipelines_tests.webserver import Received, webhook_server

pytestmark = pytest.mark.slow

EXECUTIONS = 4
SECRET = "T0KEN-in-the-alert-url"
FAILED_RUNS = """
query FailedRuns {
  runsOrError(filter: {statuses: [FAILURE]}) {
    __typename
    ... on Runs { results { runId status jobName } }
  }
}
"""


def _answer(received: Received) -> int:
    return 500 if received.path.startswith("/hook/0") else 200


def _sensor_ticks(instance: dg.DagsterInstance, name: str) -> list[Any]:
    states = [s for s in instance.all_instigator_state() if s.instigator_name == name]
    return [t for s in states for t in instance.get_ticks(s.instigator_origin_id, s.selector_id)]


def _failed_runs(webserver: str) -> list[dict[str, str]]:
    response = httpx.post(f"{webserver}/graphql", json={"query": FAILED_RUNS}, timeout=30)
    response.raise_for_status()
    return response.json()["data"]["runsOrError"]["results"]


def _server_up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/server_info", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def test_a_failed_execution_fails_its_run_in_the_ui_and_alerts_once(pg_url: str, tmp_path: Path) -> None:
    engine = get_engine(pg_url)
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    # Create the instance's SQLite storage once, here: the daemon and the webserver starting together on an
    # empty home both migrate it, and under load one of them can meet the other's half-written version
    # table ("more than one head present") and exit.
    dg.DagsterInstance.from_config(str(home)).dispose()
    web_port = free_port()
    webserver = f"http://127.0.0.1:{web_port}"

    with webhook_server() as hook, running([]) as children:
        hook.status_for = _answer
        env = child_env(
            DAGSTER_HOME=str(home),
            MARKETING_DATABASE_URL=pg_url,
            MARKETING_SENSOR_INTERVAL_SECONDS="2",
            MARKETING_WEBHOOK_ALLOW_NETWORKS="127.0.0.1/32",
            MARKETING_ALERT_WEBHOOK_URL=f"http://127.0.0.1:{hook.port}/alert/{SECRET}",
            MARKETING_DAGSTER_UI_URL=webserver,
        )
        children.append(
            start("dagster-daemon", [dagster_bin("dagster-daemon"), "run", "-w", "workspace.yaml"], env, tmp_path)
        )
        web_argv = [dagster_bin("dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(web_port)]
        children.append(start("dagster-webserver", web_argv, env, tmp_path))
        with dg.DagsterInstance.from_config(str(home)) as instance:
            # The alerts sensor's first tick only notes where things stand; the work comes after it.
            wait_for(
                "the alerts sensor's first tick",
                lambda: _sensor_ticks(instance, "marketing_alerts_sensor"),
                120,
                children,
                interval=1,
            )
            add_campaign(engine)
            with engine.begin() as conn:
                ids = [
                    schedule_execution(
                        conn,
                        campaign_id="spring-launch",
                        stage="launch",
                        action="webhook",
                        due_at=datetime.now(UTC) - timedelta(seconds=EXECUTIONS - i),
                        payload={"url": f"{hook.url}/{i}", "body": {"n": i}},
                        max_attempts=1,
                        egress=EgressPolicy(parse_networks(["127.0.0.1/32"])),
                    )
                    for i in range(EXECUTIONS)
                ]

            def statuses() -> dict[int, str]:
                with engine.connect() as conn:
                    rows = conn.execute(sa.select(marketing_execution.c.id, marketing_execution.c.status)).all()
                return dict(rows)

            wait_for(
                "every execution to finish",
                lambda: set(statuses().values()) <= {"SUCCEEDED", "FAILED"} and len(statuses()) == EXECUTIONS,
                120,
                children,
                interval=1,
                detail=lambda: str(statuses()),
            )
            assert statuses() == {i: ("FAILED" if i == ids[0] else "SUCCEEDED") for i in ids}
            with engine.connect() as conn:
                [run_id] = set(conn.execute(sa.select(marketing_execution.c.run_id)).scalars())

            def run_failed() -> bool:
                run = instance.get_run_by_id(run_id)
                return run is not None and run.status == dg.DagsterRunStatus.FAILURE

            wait_for("the batch's Dagster run to end FAILURE", run_failed, 60, children, interval=1)
            # What the Runs page's "Failed" filter lists, asked of the real webserver.
            wait_for("dagster-webserver to answer", lambda: _server_up(webserver), 90, children)
            assert _failed_runs(webserver) == [
                {"runId": run_id, "status": "FAILURE", "jobName": "marketing_execution_job"}
            ]

            def alerts() -> list[Received]:
                return [r for r in hook.received if r.path.startswith("/alert")]

            wait_for("the alert to reach the receiver", alerts, 150, children, interval=1)
            sent_at = len(_sensor_ticks(instance, "marketing_alerts_sensor"))
            # One more tick of the alerts sensor sends nothing more.
            wait_for(
                "another tick of the alerts sensor",
                lambda: len(_sensor_ticks(instance, "marketing_alerts_sensor")) > sent_at,
                150,
                children,
                interval=2,
            )
    [alert] = alerts()
    text = alert.body["text"]
    assert f"{ids[0]}" in text and "spring-launch" in text and "HTTP 500" in text
    assert f"{webserver}/runs/{run_id}" in text
    assert SECRET not in text
    # Every other execution's effect happened once; the failing one was tried once (max_attempts=1).
    deliveries = Counter(r.headers["idempotency-key"] for r in hook.received if r.path.startswith("/hook"))
    assert deliveries == {f"marketing-execution-{i}": 1 for i in ids}
