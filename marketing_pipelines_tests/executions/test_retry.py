"""`executions retry`: FAILED or CANCELLED executions back in the queue, attempts counting on, the same key.

Also `executions show` linking each attempt to its run when MARKETING_DAGSTER_UI_URL is set.
"""

from __future__ import annotations

import json
import multiprocessing as mp
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.schema import marketing_execution as t
from marketing_pipelines.egress import EgressPolicy, parse_networks
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.executions.queue import (
    MAX_TOTAL_ATTEMPTS,
    get_execution,
    list_attempts,
    retry_execution,
    retry_executions,
    schedule_execution,
)
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines_tests.built import due_executions_sensor
from marketing_pipelines_tests.cli_runner import Cli, cli_for
from marketing_pipelines_tests.executions.runs import LOCAL, outcomes, perform, sensor_requests
from marketing_pipelines_tests.factories import add_campaign
from marketing_pipelines_tests.webserver import Recorder

BACKING_OFF = ExecutionSettings(retry_backoff_seconds=600)
HOUR = timedelta(hours=1)


def _cli(db_url: str, ui_url: str | None = None) -> Cli:
    return cli_for(db_url, **({"MARKETING_DAGSTER_UI_URL": ui_url} if ui_url else {}))


@pytest.fixture
def cli(db_url: str) -> Cli:
    return _cli(db_url)


def _schedule(engine: sa.Engine, campaign_id: str = "spring-launch", **kw: Any) -> int:
    add_campaign(engine, campaign_id)
    with engine.begin() as conn:
        return schedule_execution(
            conn,
            campaign_id=campaign_id,
            stage="launch",
            action=kw.pop("action", "log"),
            due_at=datetime.now(UTC) - timedelta(seconds=1),
            payload=kw.pop("payload", {"message": "hi"}),
            egress=EgressPolicy(parse_networks(LOCAL)),
            **kw,
        )


def _finish(engine: sa.Engine, execution_id: int, status: str, attempts: int = 3, ago: timedelta = HOUR) -> None:
    """Put a row where a finished execution is (the job's own path is exercised by the first test)."""
    with engine.begin() as conn:
        conn.execute(
            sa.update(t)
            .where(t.c.id == execution_id)
            .values(
                status=status,
                attempts=attempts,
                max_attempts=max(attempts, 1),
                last_error=f"{status.lower()} for the test",
                finished_at=datetime.now(UTC) - ago,
            )
        )


def _row(engine: sa.Engine, execution_id: int) -> sa.RowMapping:
    with engine.connect() as conn:
        row = get_execution(conn, execution_id)
    assert row is not None
    return row


def test_a_retried_webhook_runs_again_as_the_next_attempt_with_the_same_key_and_links_to_each_run(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, hook: Recorder, cli: Cli
) -> None:
    hook.status = 500
    execution_id = _schedule(engine, action="webhook", payload={"url": hook.url, "body": {}}, max_attempts=1)
    [request] = sensor_requests(due_executions_sensor, db_url, instance)
    failed = perform(request, db_url, instance, settings=BACKING_OFF)
    assert outcomes(failed) == {execution_id: "FAILED"}

    result = cli("executions", "retry", str(execution_id), "--max-attempts", "2")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == (f"execution {execution_id} retried (was FAILED): due now, up to 2 more attempt(s)")
    hook.status = 200
    [request] = sensor_requests(due_executions_sensor, db_url, instance)
    succeeded = perform(request, db_url, instance, settings=BACKING_OFF)
    assert outcomes(succeeded) == {execution_id: "SUCCEEDED"}

    # The receiver sees one effect delivered twice: the same key, the attempt in its own header.
    assert [r.headers["idempotency-key"] for r in hook.received] == [f"marketing-execution-{execution_id}"] * 2
    assert [r.headers["marketing-attempt"] for r in hook.received] == ["1", "2"]
    with engine.connect() as conn:
        history = [(a["attempt"], a["run_id"], a["outcome"]) for a in list_attempts(conn, execution_id)]
    assert history == [(1, failed.run_id, "FAILED"), (2, succeeded.run_id, "SUCCEEDED")]
    row = _row(engine, execution_id)
    assert (row["status"], row["attempts"], row["max_attempts"]) == ("SUCCEEDED", 2, 3)

    shown = _cli(db_url, "http://127.0.0.1:3000/")("executions", "show", str(execution_id))
    assert shown.exit_code == 0, shown.output
    for attempt, run in ((1, failed), (2, succeeded)):
        assert f"attempt {attempt}: http://127.0.0.1:3000/runs/{run.run_id}" in shown.output
    as_json = json.loads(cli("executions", "show", str(execution_id), "--json").output)
    assert [a["run_url"] for a in as_json["attempts"]] == [None, None]  # no UI URL set: no links
    with_ui = _cli(db_url, "https://ui.example/d")("executions", "show", str(execution_id), "--json")
    assert [a["run_url"] for a in json.loads(with_ui.output)["attempts"]] == [
        f"https://ui.example/d/runs/{failed.run_id}",
        f"https://ui.example/d/runs/{succeeded.run_id}",
    ]


@pytest.mark.parametrize("status", ["FAILED", "CANCELLED"])
def test_retry_puts_the_execution_back_due_now_with_a_fresh_budget(engine: sa.Engine, status: str) -> None:
    execution_id = _schedule(engine)
    _finish(engine, execution_id, status, attempts=3)
    with engine.begin() as conn:
        conn.execute(sa.update(t).values(lease_owner="run:gone", lease_expires_at=datetime.now(UTC)))
        assert retry_execution(conn, execution_id, budget=4) == status
    row = _row(engine, execution_id)
    assert (row["status"], row["attempts"], row["max_attempts"]) == ("SCHEDULED", 3, 7)
    assert row["due_at"] <= datetime.now(UTC) + timedelta(seconds=5)  # PostgreSQL's clock may lead a little
    assert row["due_at"] >= datetime.now(UTC) - timedelta(minutes=1)
    assert (row["last_error"], row["finished_at"], row["lease_owner"], row["lease_expires_at"]) == (None,) * 4


@pytest.mark.parametrize(
    ("status", "attempts", "message"),
    [
        ("SCHEDULED", 0, "execution {id} is SCHEDULED; only FAILED or CANCELLED executions can be retried"),
        ("RUNNING", 1, "execution {id} is RUNNING; only FAILED or CANCELLED executions can be retried"),
        ("SUCCEEDED", 1, "execution {id} is SUCCEEDED; only FAILED or CANCELLED executions can be retried"),
        # Past the cap on attempts: its action or payload needs fixing, not more attempts.
        ("FAILED", MAX_TOTAL_ATTEMPTS - 2, "would pass the limit of 1000"),
    ],
)
def test_retry_of_an_execution_that_cannot_be_retried_is_one_line_and_changes_nothing(
    engine: sa.Engine, cli: Cli, status: str, attempts: int, message: str
) -> None:
    execution_id = _schedule(engine)
    _finish(engine, execution_id, status, attempts=attempts)
    before = dict(_row(engine, execution_id))
    result = cli("executions", "retry", str(execution_id), "--max-attempts", "3")
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and message.format(id=execution_id) in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert dict(_row(engine, execution_id)) == before


def test_retry_of_a_missing_execution_is_one_line(engine: sa.Engine, cli: Cli) -> None:
    add_campaign(engine)
    result = cli("executions", "retry", "404")
    assert result.exit_code == 1
    assert result.output == "Error: execution 404 does not exist; see marketing-pipelines executions list\n"


def test_a_second_retry_finds_the_execution_scheduled(engine: sa.Engine) -> None:
    execution_id = _schedule(engine)
    _finish(engine, execution_id, "FAILED")
    with engine.begin() as conn:
        retry_execution(conn, execution_id, budget=3)
    with engine.begin() as conn, pytest.raises(InvalidInput, match="is SCHEDULED"):
        retry_execution(conn, execution_id, budget=3)
    assert _row(engine, execution_id)["max_attempts"] == 6  # not 9: the budget was given once


def _retry_worker(db_url: str, ids: list[int], start: Any, out: Any) -> None:
    from marketing_pipelines.db.engine import get_engine

    engine = get_engine(db_url)
    retried = []
    start.wait()
    for execution_id in ids:
        try:
            with engine.begin() as conn:
                retry_execution(conn, execution_id, budget=3)
            retried.append(execution_id)
        except InvalidInput:
            pass
    out.put(retried)


def test_processes_retrying_the_same_executions_at_once_retry_each_once(db_url: str, engine: sa.Engine) -> None:
    ids = [_schedule(engine) for _ in range(30)]
    for execution_id in ids:
        _finish(engine, execution_id, "FAILED")
    ctx = mp.get_context("spawn")
    workers = 3
    start, out = ctx.Barrier(workers + 1, timeout=120), ctx.Queue()
    procs = [ctx.Process(target=_retry_worker, args=(db_url, ids, start, out)) for _ in range(workers)]
    for p in procs:
        p.start()
    start.wait()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert Counter(i for retried in results for i in retried) == dict.fromkeys(ids, 1)
    assert {_row(engine, i)["max_attempts"] for i in ids} == {6}


def test_retry_failed_retries_the_matching_failed_executions_in_one_go(engine: sa.Engine, cli: Cli) -> None:
    old_failure = _schedule(engine)
    recent = [_schedule(engine) for _ in range(2)]
    cancelled = _schedule(engine)
    other_campaign = _schedule(engine, "autumn-sale")
    succeeded = _schedule(engine)
    _finish(engine, old_failure, "FAILED", ago=timedelta(days=3))
    for execution_id in [*recent, other_campaign]:
        _finish(engine, execution_id, "FAILED")
    _finish(engine, cancelled, "CANCELLED")
    _finish(engine, succeeded, "SUCCEEDED", attempts=1)
    since = (datetime.now(UTC) - timedelta(days=1)).isoformat()

    result = cli("executions", "retry", "--failed", "--campaign", "spring-launch", "--since", since)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == (
        f"retried 2 execution(s), due now, up to 3 more attempt(s) each: {recent[0]}, {recent[1]}"
    )
    statuses = {i: _row(engine, i)["status"] for i in [old_failure, *recent, cancelled, other_campaign, succeeded]}
    assert statuses == {
        old_failure: "FAILED",  # finished before --since
        recent[0]: "SCHEDULED",
        recent[1]: "SCHEDULED",
        cancelled: "CANCELLED",  # only with --cancelled
        other_campaign: "FAILED",
        succeeded: "SUCCEEDED",
    }
    with_cancelled = cli("executions", "retry", "--failed", "--cancelled", "--max-attempts", "1")
    assert with_cancelled.output.startswith("retried 3 execution(s), due now, up to 1 more attempt(s) each: ")
    assert {_row(engine, i)["status"] for i in [old_failure, cancelled, other_campaign]} == {"SCHEDULED"}
    assert _row(engine, cancelled)["max_attempts"] == 3 + 1


def test_retry_failed_leaves_executions_past_the_attempt_cap(engine: sa.Engine) -> None:
    ok, worn_out = _schedule(engine), _schedule(engine)
    _finish(engine, ok, "FAILED", attempts=MAX_TOTAL_ATTEMPTS - 3)
    _finish(engine, worn_out, "FAILED", attempts=MAX_TOTAL_ATTEMPTS - 2)
    with engine.begin() as conn:
        retried = retry_executions(conn, budget=3)
    assert (retried.ids, retried.over_cap) == ((ok,), 1)
    assert (_row(engine, ok)["max_attempts"], _row(engine, worn_out)["status"]) == (MAX_TOTAL_ATTEMPTS, "FAILED")


@pytest.mark.parametrize(
    ("args", "exit_code", "message"),
    [
        ([], 2, "give an execution id, or --failed to retry every FAILED execution"),
        (["{id}", "--failed"], 2, "give an execution id or --failed, not both"),
        (["{id}", "--campaign", "spring-launch"], 2, "--campaign can only be used with --failed"),
        (["{id}", "--cancelled", "--since", "2026-01-01T00:00:00Z"], 2, "--cancelled, --since can only be used"),
        (["--failed", "--since", "yesterday"], 1, "--since 'yesterday' is not ISO-8601"),
        (["--failed", "--since", "2026-01-01"], 1, "has no UTC offset; add one, e.g. 2026-01-01T00:00:00+00:00"),
        (["--failed", "--campaign", "nope"], 1, "unknown campaign 'nope'"),
        (["--failed", "--max-attempts", "0"], 2, "is not in the range 1<=x<=100"),
    ],
)
def test_bad_retry_arguments_are_named_and_change_nothing(
    engine: sa.Engine, cli: Cli, args: list[str], exit_code: int, message: str
) -> None:
    execution_id = _schedule(engine)
    _finish(engine, execution_id, "FAILED")
    result = cli("executions", "retry", *[a.format(id=execution_id) for a in args])
    assert result.exit_code == exit_code
    assert message in result.output and "Traceback" not in result.output
    assert _row(engine, execution_id)["status"] == "FAILED"


@pytest.mark.parametrize(
    "ui_url",
    ["ftp://127.0.0.1:3000", "http://user:secret@127.0.0.1:3000", "http://127.0.0.1:3000/?x=1", "127.0.0.1:3000"],
)
def test_show_refuses_a_ui_url_that_is_not_a_plain_http_url(db_url: str, engine: sa.Engine, ui_url: str) -> None:
    execution_id = _schedule(engine)
    result = _cli(db_url, ui_url)("executions", "show", str(execution_id))
    assert result.exit_code == 1
    assert result.output.startswith("Error: MARKETING_DAGSTER_UI_URL=") and "must be an http(s) URL" in result.output
    assert "secret" not in result.output
