"""A batch run killed with SIGKILL mid-batch: what it finished stays finished, the rest recover once.

This is also the redelivery scenario of a webhook: the POST arrived, the worker died before
recording it, the lease expired and a second worker sent it again, with the same Idempotency-Key.

The run works in its own process (webhooks one at a time, so the kill lands at a known point):
the third webhook's receiver holds the request, the test waits until the first two executions are
recorded SUCCEEDED (the run commits outcomes finished together in one transaction, from its own
thread, while the third is in flight) and kills the process. The other three are RUNNING under the
dead run until their leases expire, then the sensor requeues and re-claims them, and a new run finishes them.
The third had begun (its POST was in flight): its attempt was lost. The last two were waiting for a
worker thread and never began: their attempts are given back, as nothing was tried at their receivers.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.egress import EgressPolicy, parse_networks
from marketing_pipelines.executions.jobs import marketing_execution_job
from marketing_pipelines.executions.queue import get_execution, list_attempts, schedule_execution
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.executions.sensors import executions_of_run
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines_tests.built import due_executions_sensor
from marketing_pipelines_tests.executions.runs import LOCAL, perform, sensor_requests
from marketing_pipelines_tests.factories import add_campaign
from marketing_pipelines_tests.webserver import Received, webhook_server

LEASE_SECONDS = 5  # the smallest lease the setting accepts: recovery within seconds
N = 5
HELD = "/hook/2"  # the third execution's webhook: the run is killed while it is in flight


SHORT_LEASE = ExecutionSettings(lease_seconds=LEASE_SECONDS)


def _worker(db_url: str, run_config: dict[str, Any], tags: dict[str, str]) -> None:
    with dg.DagsterInstance.ephemeral() as instance:
        marketing_execution_job.execute_in_process(
            run_config=run_config,
            tags=tags,
            instance=instance,
            resources={
                "app_db": AppDatabase(url=db_url),
                "webhook": WebhookClient(timeout_s=60, allow_networks=LOCAL, concurrency=1),
                "execution_settings": SHORT_LEASE,
            },
        )


def _tick(db_url: str) -> list[dg.RunRequest]:
    return sensor_requests(due_executions_sensor, db_url, dg.DagsterInstance.ephemeral(), SHORT_LEASE)


@pytest.mark.slow  # a killed worker process and a lease run out
def test_killed_batch_keeps_finished_rows_and_recovers_the_rest_once(db_url: str, engine: sa.Engine) -> None:
    add_campaign(engine)
    arrived, release = threading.Event(), threading.Event()

    def hold(received: Received) -> None:
        if received.path == HELD and not arrived.is_set():
            arrived.set()
            release.wait(timeout=60)

    with webhook_server() as hook:
        hook.on_request = hold
        with engine.begin() as conn:
            ids = [
                schedule_execution(
                    conn,
                    campaign_id="spring-launch",
                    stage="launch",
                    action="webhook",
                    due_at=datetime.now(UTC) - timedelta(seconds=N - i),
                    payload={"url": f"{hook.url}/{i}", "body": {"n": i}},
                    egress=EgressPolicy(parse_networks(LOCAL)),
                )
                for i in range(N)
            ]
        [request] = _tick(db_url)
        assert executions_of_run(request.run_config) == ids

        worker = mp.get_context("spawn").Process(
            target=_worker, args=(db_url, dict(request.run_config), dict(request.tags))
        )

        def statuses() -> list[str]:
            with engine.connect() as conn:
                return [get_execution(conn, i)["status"] for i in ids]  # type: ignore[index]

        worker.start()
        try:
            assert arrived.wait(timeout=120), "the run never reached the third webhook"
            # The first two answers came back before the third was sent; their outcomes are committed
            # by the op's own thread a moment later. The kill must land after that, not race it.
            deadline = time.monotonic() + 30
            while statuses()[:2] != ["SUCCEEDED", "SUCCEEDED"] and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(worker.pid, signal.SIGKILL)
            worker.join(timeout=30)
        finally:
            release.set()
            if worker.is_alive():
                worker.kill()
        assert worker.exitcode == -signal.SIGKILL
        assert statuses() == ["SUCCEEDED", "SUCCEEDED", "RUNNING", "RUNNING", "RUNNING"]

        # Nothing is due until the dead run's leases expire; then one tick requeues and re-claims them.
        assert _tick(db_url) == []
        time.sleep(LEASE_SECONDS + 1)
        [retry] = _tick(db_url)
        assert executions_of_run(retry.run_config) == ids[2:]
        with engine.connect() as conn:
            assert [get_execution(conn, i)["attempts"] for i in ids[2:]] == [2, 1, 1]  # type: ignore[index]
        with dg.DagsterInstance.ephemeral() as instance:
            result = perform(retry, db_url, instance, settings=SHORT_LEASE)
        assert result.success

    assert statuses() == ["SUCCEEDED"] * N
    posts = Counter(r.path for r in hook.received)
    # Finished rows were not sent again; the one in flight at the kill was sent again (at least once).
    assert posts == {"/hook/0": 1, "/hook/1": 1, "/hook/2": 2, "/hook/3": 1, "/hook/4": 1}
    # ... with the same Idempotency-Key both times, so its receiver can tell a redelivery from a new
    # request; the attempt is in its own header.
    redelivered = [
        (r.headers["idempotency-key"], r.headers["marketing-attempt"]) for r in hook.received if r.path == HELD
    ]
    assert redelivered == [(f"marketing-execution-{ids[2]}", "1"), (f"marketing-execution-{ids[2]}", "2")]
    with engine.connect() as conn:
        history = {i: [(a["attempt"], a["outcome"]) for a in list_attempts(conn, i)] for i in ids}
    assert history == {
        ids[0]: [(1, "SUCCEEDED")],
        ids[1]: [(1, "SUCCEEDED")],
        ids[2]: [(1, "LEASE_EXPIRED"), (2, "SUCCEEDED")],
        **{i: [(1, "SUCCEEDED")] for i in ids[3:]},
    }
