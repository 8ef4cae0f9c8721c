"""Agent runs survive their process: a killed run is recovered and finished once, a queued one waits.

Each run worker is its own OS process (``execute_job`` with the in-process executor, so the process
killed is the one running the agent loop). Runs on SQLite and PostgreSQL application databases.
"""

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents.queue import AGENT_RUNS, get_agent_run
from marketing_pipelines.agents.resources import AgentSettings
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.leasing.claims import run_owner
from marketing_pipelines.leasing.lease import LEASE_EXPIRED_ERROR, finish, retry_or_fail
from marketing_pipelines_tests.agents.agent_processes import (
    FakeOpenAI,
    agent_env,
    dagster_run_id,
    in_new_process,
    join_all,
    request_openai_runs,
    seed_requester,
    sensor_agent_requests,
    start_run_worker,
    transcript_kinds,
    wait_until,
    write_dagster_home,
)

# The smallest lease MARKETING_AGENT_LEASE_GRACE_SECONDS accepts; renewed every third of it.
LEASE_S = 5
SHORT_LEASE = AgentSettings(lease_grace_seconds=LEASE_S)
# The same lease for the run workers, as run config of their agent_settings resource.
SHORT_LEASE_RUN = {"agent_settings": {"config": {"lease_grace_seconds": LEASE_S}}}
PARTIAL = ["task", "model_turn", "tool_call", "tool_result"]
COMPLETE = [*PARTIAL, "model_turn"]
# What the attempt after a killed one records: it resumes from the transcript, asking only the turn left.
RESUMED = ["model_turn"]

# Real run-worker processes and daemons: left out of the quick loop (pytest -m "not slow").
pytestmark = pytest.mark.slow


@dataclass
class World:
    engine: sa.Engine
    url: str
    fake: FakeOpenAI
    env: dict[str, str]
    instance: dg.DagsterInstance


@pytest.fixture
def world(db_url: str, tmp_path: Path) -> Iterator[World]:
    engine = get_engine(db_url)
    seed_requester(engine)
    with FakeOpenAI(final_delay_s=0.2).running() as fake:
        home = write_dagster_home(tmp_path / "dagster_home")
        env = agent_env(fake, db_url, home)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            yield World(engine, db_url, fake, env, instance)


def _row(engine: sa.Engine, agent_run_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        row = get_agent_run(conn, agent_run_id)
    assert row is not None
    return dict(row)


def _attempt(kinds: list[tuple[int, str]], attempt: int) -> list[str]:
    return [kind for a, kind in kinds if a == attempt]


def test_killed_agent_run_is_recovered_after_its_lease_and_finishes_exactly_once(world: World) -> None:
    [agent_run_id] = request_openai_runs(world.engine, 1)
    [first] = sensor_agent_requests(world.instance, world.url, SHORT_LEASE)
    assert first.run_key == f"agent_run:{agent_run_id}:1"

    worker = start_run_worker(first, world.env, SHORT_LEASE_RUN)
    try:
        # Mid-run: the tool call is recorded and the worker waits on its second model call.
        wait_until(
            lambda: world.fake.finals_requested() == 1 and _attempt(transcript_kinds(world.engine, agent_run_id), 1),
            timeout_s=90,
            what="attempt 1 to record its tool call and wait on the model",
        )
        assert _attempt(transcript_kinds(world.engine, agent_run_id), 1) == PARTIAL
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
    finally:
        if worker.is_alive():
            worker.kill()
            worker.join(5)
    assert worker.exitcode == -signal.SIGKILL
    world.fake.release.set()

    killed = _row(world.engine, agent_run_id)
    first_run_id = killed["run_id"]
    assert (killed["status"], killed["attempts"], killed["lease_owner"]) == ("RUNNING", 1, run_owner(first_run_id))
    # Until the lease runs out the row is left alone: from outside, a dead worker and a slow one look alike.
    while datetime.now(UTC) < killed["lease_expires_at"] - timedelta(seconds=0.5):
        assert sensor_agent_requests(world.instance, world.url, SHORT_LEASE) == []
        row = _row(world.engine, agent_run_id)
        assert (row["status"], row["attempts"], row["lease_owner"]) == ("RUNNING", 1, run_owner(first_run_id))
        time.sleep(0.5)
    [second] = wait_until(
        lambda: sensor_agent_requests(world.instance, world.url, SHORT_LEASE),
        timeout_s=LEASE_S + 10,
        what="queued_agent_runs_sensor to requeue and re-claim the expired agent run",
    )
    assert datetime.now(UTC) >= killed["lease_expires_at"]
    assert second.run_key == f"agent_run:{agent_run_id}:2"
    assert second.tags["marketing/attempt"] == "2"
    reclaimed = _row(world.engine, agent_run_id)
    assert (reclaimed["status"], reclaimed["attempts"], reclaimed["error"]) == ("RUNNING", 2, LEASE_EXPIRED_ERROR)

    join_all([start_run_worker(second, world.env, SHORT_LEASE_RUN)], timeout_s=90)

    done = _row(world.engine, agent_run_id)
    assert (done["status"], done["attempts"], done["output"]["text"]) == ("SUCCEEDED", 2, "Spring launch is on track.")
    kinds = transcript_kinds(world.engine, agent_run_id)
    assert (_attempt(kinds, 1), _attempt(kinds, 2)) == (PARTIAL, RESUMED)
    assert {attempt for attempt, _ in kinds} == {1, 2}
    # The turn attempt 1 completed was not asked again; only the one it was killed waiting on.
    assert [kind for _, kind in world.fake.requests] == ["tool_call", "final", "final"]

    # A late write from attempt 1 (a worker that only looked dead) matches no row: fenced by owner.
    with world.engine.begin() as conn:
        assert not finish(conn, AGENT_RUNS, agent_run_id, run_owner(first_run_id), "SUCCEEDED", {"output": {}})
        assert retry_or_fail(conn, AGENT_RUNS, agent_run_id, run_owner(first_run_id), "late", 0) is None
    assert _row(world.engine, agent_run_id) == done

    second_run_id = dagster_run_id(world.instance, second)
    assert world.instance.get_run_by_id(second_run_id).status == dg.DagsterRunStatus.SUCCESS
    # Dagster itself never learnt that attempt 1 died (no code server or run monitoring watched that
    # worker). The tick whose recovery requeued its expired lease marked that run FAILURE, so it shows on
    # the Runs page and in alerts instead of staying STARTED for ever.
    first_run = world.instance.get_run_by_id(first_run_id)
    assert first_run is not None and first_run.status == dg.DagsterRunStatus.FAILURE
    # Pools at granularity run (the shipped dagster.yaml): the run queue counted the run while it was
    # STARTED, and no step slot was claimed that a killed worker could leave behind.
    assert world.instance.event_log_storage.get_concurrency_info("agent_runs").claimed_slots == []


def _request_in_this_process(env: dict[str, str]) -> int:
    os.environ.update(env)
    [agent_run_id] = request_openai_runs(get_engine(env["MARKETING_DATABASE_URL"]), 1)
    return agent_run_id


def _claim_in_this_process(env: dict[str, str]) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    os.environ.update(env)
    with dg.DagsterInstance.get() as instance:
        requests = sensor_agent_requests(instance, env["MARKETING_DATABASE_URL"], SHORT_LEASE)
    return [(r.run_key, dict(r.run_config), dict(r.tags)) for r in requests]


def test_queued_request_survives_a_restart_and_is_claimed_afterwards(world: World) -> None:
    # Requested by a process that then exits; claimed and run by new ones (new engines, new pools).
    agent_run_id = in_new_process(_request_in_this_process, world.env)
    row = _row(world.engine, agent_run_id)
    assert (row["status"], row["attempts"], row["lease_owner"]) == ("QUEUED", 0, None)

    [(run_key, run_config, tags)] = in_new_process(_claim_in_this_process, world.env)
    assert run_key == f"agent_run:{agent_run_id}:1"
    world.fake.release.set()
    request = dg.RunRequest(run_key=run_key, run_config=run_config, tags=tags)
    join_all([start_run_worker(request, world.env, SHORT_LEASE_RUN)], timeout_s=90)

    done = _row(world.engine, agent_run_id)
    assert (done["status"], done["attempts"]) == ("SUCCEEDED", 1)
    assert _attempt(transcript_kinds(world.engine, agent_run_id), 1) == COMPLETE
