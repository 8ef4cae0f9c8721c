"""Requests refused when made leave a REFUSED agent run; FAILED and CANCELLED runs are retried as their requester."""

from __future__ import annotations

import multiprocessing as mp
import time
from datetime import datetime
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.agents.jobs import agent_run_job
from marketing_pipelines.agents.queue import (
    AgentRunRefused,
    cancel_agent_run,
    get_agent_run,
    list_agent_runs,
    request_agent_run,
    retry_agent_run,
    running_count,
    transcript,
)
from marketing_pipelines.agents.resources import AgentSettings
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import agent_run
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines_tests.agents.fake_models import unconfigured_models
from marketing_pipelines_tests.built import queued_agent_runs_sensor
from marketing_pipelines_tests.factories import add_campaign, settings_from


@pytest.fixture
def people(engine: sa.Engine) -> sa.Engine:
    add_campaign(engine, "spring-launch")
    add_campaign(engine, "secret-project")
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        users.add_user(conn, "ben")
        users.grant(conn, "ana", "campaign:read")
        users.grant(conn, "ben", "campaign:read", "spring-launch")
    return engine


def _request(engine: sa.Engine, **kw: Any) -> int:
    args: dict[str, Any] = {
        "agent": "campaign_brief",
        "campaign_id": "spring-launch",
        "requested_by": "ana",
        "input": {"stage": "launch"},
        "settings": settings_from({}),
    }
    args.update(kw)
    with engine.begin() as conn:
        return request_agent_run(conn, **args)


def _refused(engine: sa.Engine, **kw: Any) -> AgentRunRefused:
    """Request, keeping the REFUSED row as a caller that commits the refusal does."""
    with engine.begin() as conn:
        try:
            _request_in(conn, **kw)
        except AgentRunRefused as exc:
            return exc
    raise AssertionError("the request was not refused")


def _request_in(conn: sa.Connection, **kw: Any) -> int:
    args: dict[str, Any] = {
        "agent": "campaign_brief",
        "campaign_id": "spring-launch",
        "input": {"stage": "launch"},
        "settings": settings_from({}),
    }
    args.update(kw)
    return request_agent_run(conn, **args)


def _row(engine: sa.Engine, run_id: int) -> sa.RowMapping:
    with engine.connect() as conn:
        row = get_agent_run(conn, run_id)
    assert row is not None
    return row


def _claim(db_url: str, instance: dg.DagsterInstance) -> list[dg.RunRequest]:
    context = dg.build_sensor_context(
        instance=instance,
        resources={"app_db": AppDatabase(url=db_url), "agent_settings": AgentSettings()},
    )
    result = queued_agent_runs_sensor(context)
    return list(result.run_requests or []) if isinstance(result, dg.SensorResult) else []


def _run(db_url: str, instance: dg.DagsterInstance, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
    return agent_run_job.execute_in_process(
        run_config=request.run_config,
        tags=request.tags,
        instance=instance,
        resources={
            "app_db": AppDatabase(url=db_url),
            **unconfigured_models(),
            "webhook": WebhookClient(),
            "agent_settings": AgentSettings(),
        },
        raise_on_error=False,
    )


def _failed_run(engine: sa.Engine, db_url: str, instance: dg.DagsterInstance, user: str = "ben") -> int:
    """An agent run of ``user`` that FAILED after one attempt: its requester was deactivated before it ran."""
    run_id = _request(engine, requested_by=user, max_attempts=1)
    with engine.begin() as conn:
        users.set_active(conn, user, False)
    [request] = _claim(db_url, instance)
    assert not _run(db_url, instance, request).success
    with engine.begin() as conn:
        users.set_active(conn, user, True)
    assert _row(engine, run_id)["status"] == "FAILED"
    return run_id


# --- refused requests ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        # ben holds nothing on secret-project.
        ({"requested_by": "ben", "campaign_id": "secret-project"}, "holds no permission on campaign 'secret-project'"),
        # An inactive requester is refused whatever they hold.
        ({"requested_by": "carl"}, "user 'carl' is not active"),
    ],
)
def test_a_refused_request_is_recorded_as_refused_with_its_reason(
    people: sa.Engine, db_url: str, instance: dg.DagsterInstance, kw: dict[str, Any], reason: str
) -> None:
    with people.begin() as conn:
        users.add_user(conn, "carl")
        users.grant(conn, "carl", "campaign:read")
        users.set_active(conn, "carl", False)
    refused = _refused(people, **kw)
    assert isinstance(refused, InvalidInput) and reason in str(refused)
    assert f"recorded as agent run {refused.agent_run_id}, REFUSED" in str(refused)
    row = _row(people, refused.agent_run_id)
    assert (row["status"], row["requested_by"], row["attempts"]) == ("REFUSED", kw["requested_by"], 0)
    assert reason in row["error"] and row["finished_at"] is not None and row["lease_owner"] is None
    # What was captured on the campaign is kept: nothing of ben's (his grant is on another campaign), and
    # carl's global grant narrowed to it (inactive, not ungranted).
    assert row["permissions"] == ([] if kw["requested_by"] == "ben" else [["campaign:read", "spring-launch"]])
    with people.connect() as conn:
        assert [r["id"] for r in list_agent_runs(conn, status="REFUSED")] == [refused.agent_run_id]
        assert running_count(conn) == 0
    # Never claimed, never recovered: it stays as it is.
    assert _claim(db_url, instance) == []
    assert _row(people, refused.agent_run_id)["status"] == "REFUSED"


def test_invalid_requests_still_write_nothing(people: sa.Engine) -> None:
    with pytest.raises(InvalidInput, match="unknown campaign") as caught, people.begin() as conn:
        _request_in(conn, requested_by="ben", campaign_id="nope")
    assert not isinstance(caught.value, AgentRunRefused)
    with people.connect() as conn:
        assert list_agent_runs(conn) == []


# --- retry --------------------------------------------------------------------------------------


def test_retry_of_a_failed_run_queues_it_as_its_next_attempt_and_it_runs(
    people: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    run_id = _failed_run(people, db_url, instance)
    before = _row(people, run_id)
    with people.begin() as conn:
        users.grant(conn, "ben", "measurement:read", "spring-launch")  # granted since the request
        result = retry_agent_run(conn, run_id)
    assert (result.previous_status, result.attempts, result.max_attempts) == ("FAILED", 1, 3)
    row = _row(people, run_id)
    assert (row["status"], row["attempts"], row["max_attempts"], row["error"]) == ("QUEUED", 1, 3, None)
    assert (row["finished_at"], row["run_id"], row["requested_by"]) == (None, None, "ben")
    assert isinstance(row["requested_at"], datetime) and row["requested_at"] >= before["requested_at"]
    assert sorted(map(tuple, row["permissions"])) == [
        ("campaign:read", "spring-launch"),
        ("measurement:read", "spring-launch"),
    ]
    [request] = _claim(db_url, instance)
    assert request.run_key == f"agent_run:{run_id}:2"
    assert _run(db_url, instance, request).success
    assert _row(people, run_id)["status"] == "SUCCEEDED"
    with people.connect() as conn:
        attempts = {step["attempt"] for step in transcript(conn, run_id)}
    assert attempts == {2}  # attempt 1 failed before its first step; attempt 2 wrote under its own number


def test_retry_of_a_run_cancelled_while_queued(people: sa.Engine) -> None:
    run_id = _request(people, max_attempts=4)
    with people.begin() as conn:
        cancel_agent_run(conn, run_id, "not now")
        result = retry_agent_run(conn, run_id, attempts=5)
    assert (result.previous_status, result.attempts, result.max_attempts) == ("CANCELLED", 0, 5)
    assert _row(people, run_id)["status"] == "QUEUED"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # The requester was deactivated since.
        (lambda conn: users.set_active(conn, "ben", False), "not retried: user 'ben' is not active"),
        # The requester lost the permission on the campaign since.
        (
            lambda conn: users.revoke(conn, "ben", "campaign:read", "spring-launch"),
            "not retried: user 'ben' holds no permission on campaign 'spring-launch'",
        ),
    ],
)
def test_retry_rechecks_the_requester(
    people: sa.Engine, db_url: str, instance: dg.DagsterInstance, change: Any, message: str
) -> None:
    run_id = _failed_run(people, db_url, instance)
    with people.begin() as conn:
        change(conn)
    with pytest.raises(InvalidInput, match=message), people.begin() as conn:
        retry_agent_run(conn, run_id)
    assert _row(people, run_id)["status"] == "FAILED"


def test_only_failed_or_cancelled_runs_are_retried(people: sa.Engine) -> None:
    queued = _request(people)
    refused = _refused(people, requested_by="ben", campaign_id="secret-project").agent_run_id
    cases = [
        (queued, "is QUEUED; only FAILED or CANCELLED runs can be retried"),
        (refused, "was REFUSED when requested and cannot be retried"),
        (999, "unknown agent run 999"),
    ]
    for run_id, message in cases:
        with pytest.raises(InvalidInput, match=message), people.begin() as conn:
            retry_agent_run(conn, run_id)
    assert _row(people, refused)["status"] == "REFUSED"
    with pytest.raises(InvalidInput, match="attempts must be from 1 to 100"), people.begin() as conn:
        retry_agent_run(conn, queued, attempts=0)


def _retry_in_process(db_url: str, run_id: int, start: Any, out: Any) -> None:
    engine = get_engine(db_url)
    with engine.connect():
        pass  # connect before the race
    start.wait()
    try:
        with engine.begin() as conn:
            retry_agent_run(conn, run_id)
        out.put("retried")
    except InvalidInput as exc:
        out.put(str(exc))


def _waiting_on_locks(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        ).scalar_one()


def test_two_retries_at_once_move_the_row_once(people: sa.Engine, db_url: str, instance: dg.DagsterInstance) -> None:
    run_id = _failed_run(people, db_url, instance)
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(2, timeout=120), ctx.Queue()
    # Hold the row (PostgreSQL) or the database (SQLite) until both retries have read it as FAILED and
    # wait to write: only the status fence of the UPDATE can then tell them apart.
    blocker = people.connect()
    holding = blocker.begin()
    blocker.execute(sa.select(agent_run.c.id).where(agent_run.c.id == run_id).with_for_update())
    procs = [ctx.Process(target=_retry_in_process, args=(db_url, run_id, start, out)) for _ in range(2)]
    try:
        for p in procs:
            p.start()
        if people.dialect.name == "postgresql":
            deadline = time.monotonic() + 120
            while _waiting_on_locks(people) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _waiting_on_locks(people) == 2
    finally:
        holding.commit()
        blocker.close()
    answers = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    # PostgreSQL: both read FAILED and the loser's fenced UPDATE matched nothing. SQLite: BEGIN IMMEDIATE
    # made the loser wait before its read, so it read QUEUED.
    now = " now" if people.dialect.name == "postgresql" else ""
    assert answers == [f"agent run {run_id} is QUEUED{now}; only FAILED or CANCELLED runs can be retried", "retried"]
    row = _row(people, run_id)
    assert (row["status"], row["attempts"], row["max_attempts"]) == ("QUEUED", 1, 3)
