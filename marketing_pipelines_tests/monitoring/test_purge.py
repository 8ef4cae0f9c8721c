"""The purge of old history on both databases: what it deletes and keeps, its batches, a retry racing it, the
``db purge`` command's counts and errors, and ``history_purge_job`` through a real Dagster execution."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.cli.db import RETENTION_DAYS
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import (
    AGENT_RUN_STATUSES,
    EXECUTION_STATUSES,
    agent_run,
    agent_run_step,
    marketing_event,
    marketing_event_reject,
    marketing_execution,
    marketing_execution_attempt,
)
from marketing_pipelines.executions.queue import retry_execution
from marketing_pipelines.monitoring.purge import (
    FINISHED_AGENT_RUN_STATUSES,
    FINISHED_EXECUTION_STATUSES,
    HISTORY_TABLES,
    count_history,
    history_cutoff,
    purge_batches,
)
from marketing_pipelines.monitoring.retention import HistoryRetention, history_purge_job, history_purge_schedule
from marketing_pipelines.settings import Settings
from marketing_pipelines_tests.agents.fake_models import unconfigured_models
from marketing_pipelines_tests.agents.runs import run_one
from marketing_pipelines_tests.built import due_executions_sensor
from marketing_pipelines_tests.cli_runner import cli_for
from marketing_pipelines_tests.executions.runs import perform, sensor_requests
from marketing_pipelines_tests.factories import add_campaign, bulk_due_executions, request_offline_analysis

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
CAMPAIGN = "spring-launch"
DAYS = 90


def _days_ago(days: float, now: datetime) -> datetime:
    return now - timedelta(days=days)


def _execution(conn: sa.Connection, now: datetime, status: str, finished: float | None, attempts: int = 0) -> int:
    """An execution created 400 days before ``now`` in ``status``, finished ``finished`` days ago, and its attempts."""
    long_ago = _days_ago(400, now)
    finished_at = None if finished is None else _days_ago(finished, now)
    execution_id = conn.execute(
        sa.insert(marketing_execution)
        .values(
            campaign_id=CAMPAIGN,
            stage="launch",
            action="log",
            payload={},
            due_at=long_ago,
            status=status,
            attempts=attempts,
            created_at=long_ago,
            updated_at=finished_at or long_ago,
            finished_at=finished_at,
        )
        .returning(marketing_execution.c.id)
    ).scalar_one()
    for attempt in range(1, attempts + 1):
        conn.execute(
            sa.insert(marketing_execution_attempt).values(
                execution_id=execution_id,
                attempt=attempt,
                run_id=f"run-{execution_id}-{attempt}",
                started_at=long_ago,
                finished_at=finished_at,
                outcome=None if finished_at is None else "RESCHEDULED",
            )
        )
    return execution_id


def _agent_run(conn: sa.Connection, now: datetime, status: str, finished: float | None, steps: int = 0) -> int:
    """An agent run requested 400 days before ``now`` in ``status``, finished ``finished`` days ago, with steps."""
    long_ago = _days_ago(400, now)
    finished_at = None if finished is None else _days_ago(finished, now)
    run_id = conn.execute(
        sa.insert(agent_run)
        .values(
            agent="campaign_brief",
            campaign_id=CAMPAIGN,
            input={},
            status=status,
            requested_by="ana",
            permissions=[],
            model_provider="offline",
            requested_at=long_ago,
            max_run_seconds=300,
            updated_at=finished_at or long_ago,
            finished_at=finished_at,
        )
        .returning(agent_run.c.id)
    ).scalar_one()
    for seq in range(1, steps + 1):
        conn.execute(
            sa.insert(agent_run_step).values(
                agent_run_id=run_id, attempt=1, seq=seq, kind="model_turn", content={}, created_at=long_ago
            )
        )
    return run_id


def _reject(conn: sa.Connection, now: datetime, days: float) -> None:
    conn.execute(
        sa.insert(marketing_event_reject).values(
            file="/data/events.jsonl",
            line_number=int(days * 10),
            raw="{",
            raw_sha256=f"{days:064}"[-64:],
            reason="not JSON",
            rejected_at=_days_ago(days, now),
        )
    )


def fill(engine: sa.Engine, now: datetime) -> dict[str, set[int]]:
    """Rows on each side of the 90-day line, in every status; the ids that must stay, by table."""
    add_campaign(engine, CAMPAIGN)
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        # Finished more than 90 days ago, with their attempts: history that goes.
        _execution(conn, now, "SUCCEEDED", 91, attempts=2)
        _execution(conn, now, "FAILED", 91, attempts=3)
        _execution(conn, now, "CANCELLED", 200, attempts=0)
        kept_executions = {
            _execution(conn, now, "SUCCEEDED", 89, attempts=1),  # finished within the 90 days
            _execution(conn, now, "FAILED", 0.5, attempts=3),
            _execution(conn, now, "SCHEDULED", None),  # due 400 days ago, still waiting
            _execution(conn, now, "RUNNING", None, attempts=1),  # its attempt is open
            # Unfinished with a stale finished_at (no code path leaves one): the status alone keeps it.
            _execution(conn, now, "RUNNING", 300, attempts=1),
        }
        _agent_run(conn, now, "SUCCEEDED", 91, steps=4)
        _agent_run(conn, now, "FAILED", 120, steps=2)
        _agent_run(conn, now, "CANCELLED", 95)
        _agent_run(conn, now, "REFUSED", 365)
        kept_runs = {
            _agent_run(conn, now, "SUCCEEDED", 10, steps=3),
            _agent_run(conn, now, "QUEUED", None),  # requested 400 days ago, still queued
            _agent_run(conn, now, "RUNNING", None, steps=2),
        }
        _reject(conn, now, 91)
        _reject(conn, now, 300)
        _reject(conn, now, 89)
        # Data, not history: an event from long ago stays.
        conn.execute(
            sa.insert(marketing_event).values(
                event_id="e-old",
                campaign_id=CAMPAIGN,
                stage="awareness",
                event_type="page_view",
                occurred_at=_days_ago(400, now),
                source="file",
                properties={},
                ingested_at=_days_ago(400, now),
            )
        )
    return {"marketing_execution": kept_executions, "agent_run": kept_runs}


# What fill() leaves for a purge at 90 days: 3 executions with 5 attempts, 4 agent runs with 6 steps, 2 rejects.
OLD = {
    "marketing_execution": 3,
    "marketing_execution_attempt": 5,
    "agent_run": 4,
    "agent_run_step": 6,
    "marketing_event_reject": 2,
}


def _rows(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
            for t in (*(sa.table(name) for name in HISTORY_TABLES), sa.table("marketing_event"))
        }


def _purge(engine: sa.Engine, cutoff: datetime, batch_rows: int) -> tuple[dict[str, int], int]:
    """Every batch's counts summed by table, and how many batches it took."""
    total, batches = dict.fromkeys(HISTORY_TABLES, 0), 0
    for batch in purge_batches(engine, cutoff, batch_rows):
        batches += 1
        for table, rows in batch.items():
            total[table] += rows
    return total, batches


def test_the_statuses_are_each_either_finished_or_waiting() -> None:
    # A status added to the schema must be classified here before a purge may delete (or keep) it.
    assert set(EXECUTION_STATUSES) - set(FINISHED_EXECUTION_STATUSES) == {"SCHEDULED", "RUNNING"}
    assert set(AGENT_RUN_STATUSES) - set(FINISHED_AGENT_RUN_STATUSES) == {"QUEUED", "RUNNING"}
    assert set(FINISHED_EXECUTION_STATUSES) <= set(EXECUTION_STATUSES)
    assert set(FINISHED_AGENT_RUN_STATUSES) <= set(AGENT_RUN_STATUSES)


@pytest.mark.parametrize("batch_rows", [5000, 2, 1])
def test_old_finished_rows_go_with_their_children_and_every_other_row_stays(engine: sa.Engine, batch_rows: int) -> None:
    kept = fill(engine, NOW)
    before = _rows(engine)
    cutoff = history_cutoff(DAYS, NOW)
    assert count_history(engine, cutoff) == OLD

    deleted, batches = _purge(engine, cutoff, batch_rows)

    assert deleted == OLD
    # Batches of 1 and 2 rows take several transactions; each table's last batch is short (or none is needed).
    assert batches == {5000: 3, 2: 2 + 2 + 1, 1: 3 + 4 + 2}[batch_rows]
    assert _rows(engine) == {table: n - OLD.get(table, 0) for table, n in before.items()}
    with engine.connect() as conn:
        assert set(conn.execute(sa.select(marketing_execution.c.id)).scalars()) == kept["marketing_execution"]
        assert set(conn.execute(sa.select(agent_run.c.id)).scalars()) == kept["agent_run"]
        # No attempt or step is left without its row, nor one of a kept row deleted.
        orphans = sa.select(sa.func.count()).select_from(marketing_execution_attempt)
        orphans = orphans.where(marketing_execution_attempt.c.execution_id.not_in(sa.select(marketing_execution.c.id)))
        assert conn.execute(orphans).scalar_one() == 0
    assert count_history(engine, cutoff) == dict.fromkeys(HISTORY_TABLES, 0)
    assert _purge(engine, cutoff, batch_rows) == (dict.fromkeys(HISTORY_TABLES, 0), 0)


def test_real_runs_go_with_their_attempts_and_transcript(db_url: str, instance: dg.DagsterInstance) -> None:
    engine = get_engine(db_url)
    add_campaign(engine, CAMPAIGN)
    bulk_due_executions(engine, 3)
    [request] = sensor_requests(due_executions_sensor, db_url, instance)
    assert perform(request, db_url, instance).success
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        users.grant(conn, "ana", "campaign:read")
        users.grant(conn, "ana", "measurement:read")
        request_offline_analysis(conn, "ana")
    assert run_one(db_url, instance, unconfigured_models()).success
    with engine.connect() as conn:
        steps = conn.execute(sa.select(sa.func.count()).select_from(agent_run_step)).scalar_one()
    assert steps > 0

    # Finished just now: a cutoff a minute ahead makes all of it old.
    deleted, _ = _purge(engine, datetime.now(UTC) + timedelta(minutes=1), 5000)

    assert deleted == {
        "marketing_execution": 3,
        "marketing_execution_attempt": 3,
        "agent_run": 1,
        "agent_run_step": steps,
        "marketing_event_reject": 0,
    }


def test_a_row_being_retried_is_skipped_not_waited_for(pg_url: str) -> None:
    engine = get_engine(pg_url)
    add_campaign(engine, CAMPAIGN)
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        retried = _execution(conn, NOW, "FAILED", 91, attempts=3)
        other = _execution(conn, NOW, "FAILED", 91, attempts=3)
    # An operator's `executions retry` holds the row, uncommitted, while the purge runs.
    with engine.begin() as retry:
        retry_execution(retry, retried, 3)
        deleted, _ = _purge(engine, history_cutoff(DAYS, NOW), 5000)
    assert deleted["marketing_execution"] == 1 and deleted["marketing_execution_attempt"] == 3
    with engine.connect() as conn:
        rows = dict(conn.execute(sa.select(marketing_execution.c.id, marketing_execution.c.status)).all())
        attempts = conn.execute(
            sa.select(sa.func.count()).where(marketing_execution_attempt.c.execution_id == retried)
        ).scalar_one()
    assert rows == {retried: "SCHEDULED"} and other not in rows
    assert attempts == 3  # the retried execution keeps its history


# ---- marketing-pipelines db purge --------------------------------------------------------------------


def test_the_command_prints_what_it_deleted_from_each_table(db_url: str) -> None:
    engine = get_engine(db_url)
    fill(engine, datetime.now(UTC))
    cli = cli_for(db_url)

    dry = cli("db", "purge", "--older-than-days", "90", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert dry.output.startswith("would delete the history finished before ")
    assert _table(dry.output) == OLD
    assert count_history(engine, history_cutoff(DAYS)) == OLD  # nothing deleted

    done = cli("db", "purge", "--older-than-days", "90")
    assert done.exit_code == 0, done.output
    assert done.output.startswith("deleted the history finished before ") and "(90 days ago)" in done.output
    assert _table(done.output) == OLD
    assert _table(cli("db", "purge", "--older-than-days", "90").output) == dict.fromkeys(HISTORY_TABLES, 0)


def test_the_command_takes_its_default_from_the_setting(sqlite_url: str) -> None:
    fill(get_engine(sqlite_url), datetime.now(UTC))
    # 100 days: only what finished more than 100 days ago (an execution, two agent runs, a reject).
    result = cli_for(sqlite_url, MARKETING_HISTORY_RETENTION_DAYS="100")("db", "purge", "--dry-run")
    assert "(100 days ago)" in result.output
    assert _table(result.output) == {
        "marketing_execution": 1,
        "marketing_execution_attempt": 0,
        "agent_run": 2,
        "agent_run_step": 2,
        "marketing_event_reject": 1,
    }


def _table(output: str) -> dict[str, int]:
    lines = output.splitlines()
    assert lines[1].split() == ["table", "rows"]
    return {table: int(rows) for table, rows in (line.split() for line in lines[2:])}


BAD_DAYS = "Error: Invalid value for '--older-than-days': "


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["--older-than-days", "0"], {}, BAD_DAYS + "0 is not in the range 1<=x<=3650"),
        (["--older-than-days", "-5"], {}, BAD_DAYS + "-5 is not in the range 1<=x<=3650"),
        (["--older-than-days", "3651"], {}, BAD_DAYS + "3651 is not in the range 1<=x<=3650"),
        (["--older-than-days", "ninety"], {}, BAD_DAYS + "'ninety' is not a valid integer range"),
        # The setting, when the option is left out.
        (
            [],
            {"MARKETING_HISTORY_RETENTION_DAYS": "0"},
            "Error: MARKETING_HISTORY_RETENTION_DAYS='0' is not valid: must be between 1 and 3650",
        ),
    ],
)  # fmt: skip
def test_a_bad_age_is_one_line_and_deletes_nothing(
    sqlite_url: str, args: list[str], env: dict[str, str], expected: str
) -> None:
    engine = get_engine(sqlite_url)
    fill(engine, datetime.now(UTC))
    result = cli_for(sqlite_url, **env)("db", "purge", *args)
    assert result.exit_code != 0
    assert result.output.startswith(expected) and result.output.count("\n") == 1, result.output
    assert count_history(engine, history_cutoff(DAYS)) == OLD


def test_the_command_accepts_exactly_what_the_setting_accepts() -> None:
    info = Settings.model_fields["history_retention_days"]
    bounds = {type(m).__name__: m for m in info.metadata}
    assert (RETENTION_DAYS.min, RETENTION_DAYS.max) == (bounds["Ge"].ge, bounds["Le"].le)
    assert RETENTION_DAYS.min_open is RETENTION_DAYS.max_open is False


# ---- history_purge_job and its schedule ----------------------------------------------------------------


def _purge_run(db_url: str, instance: dg.DagsterInstance, days: int = DAYS) -> dg.ExecuteInProcessResult:
    return history_purge_job.execute_in_process(
        instance=instance,
        resources={"app_db": AppDatabase(url=db_url), "history_retention": HistoryRetention(retention_days=days)},
        raise_on_error=False,
    )


def _step_metadata(result: dg.ExecuteInProcessResult) -> dict[str, object]:
    for event in result.events_for_node("purge_history"):
        if event.event_type_value == "STEP_OUTPUT":
            return {k: v.value for k, v in event.step_output_data.metadata.items()}
        if event.event_type_value == "STEP_FAILURE":
            failure = event.step_failure_data.user_failure_data
            assert failure is not None, "the step failed without saying what it had deleted"
            return {k: v.value for k, v in failure.metadata.items()}
    raise AssertionError("the step neither produced an output nor failed")


def test_the_job_deletes_and_its_run_shows_what(db_url: str, instance: dg.DagsterInstance) -> None:
    engine = get_engine(db_url)
    fill(engine, datetime.now(UTC))

    result = _purge_run(db_url, instance)

    assert result.success
    metadata = _step_metadata(result)
    assert {table: metadata[table] for table in HISTORY_TABLES} == OLD
    assert metadata["retention_days"] == DAYS
    assert count_history(engine, history_cutoff(DAYS)) == dict.fromkeys(HISTORY_TABLES, 0)


@pytest.fixture
def agent_runs_kept_by_a_trigger(engine: sa.Engine) -> Iterator[None]:
    """A trigger refusing every delete from agent_run: the purge fails there, after the executions' batches.
    PostgreSQL's trigger is dropped afterwards (the session's database is shared by the tests)."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(
                sa.text(
                    "CREATE FUNCTION keep_agent_runs() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN RAISE EXCEPTION 'agent runs are kept here'; END $$"
                )
            )
            conn.execute(
                sa.text(
                    "CREATE TRIGGER keep_agent_runs BEFORE DELETE ON agent_run "
                    "FOR EACH ROW EXECUTE FUNCTION keep_agent_runs()"
                )
            )
        else:
            conn.execute(
                sa.text(
                    "CREATE TRIGGER keep_agent_runs BEFORE DELETE ON agent_run "
                    "BEGIN SELECT RAISE(ABORT, 'agent runs are kept here'); END"
                )
            )
    yield
    with engine.begin() as conn:
        conn.execute(
            sa.text("DROP TRIGGER keep_agent_runs" + (" ON agent_run" if conn.dialect.name == "postgresql" else ""))
        )
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("DROP FUNCTION keep_agent_runs()"))


def test_a_purge_that_fails_midway_fails_its_run_and_says_what_it_deleted(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance, agent_runs_kept_by_a_trigger: None
) -> None:
    fill(engine, datetime.now(UTC))

    result = _purge_run(db_url, instance)

    assert not result.success
    metadata = _step_metadata(result)
    # The executions' batches committed before the failure; the failing batch left the agent runs whole.
    assert {table: metadata[table] for table in HISTORY_TABLES} == {
        "marketing_execution": 3,
        "marketing_execution_attempt": 5,
        "agent_run": 0,
        "agent_run_step": 0,
        "marketing_event_reject": 0,
    }
    [failure] = [e for e in result.events_for_node("purge_history") if e.event_type_value == "STEP_FAILURE"]
    description = failure.step_failure_data.user_failure_data.description or ""
    assert description.startswith("The purge stopped: ") and "agent runs are kept here" in description
    assert count_history(engine, history_cutoff(DAYS))["agent_run_step"] == OLD["agent_run_step"]


def test_a_database_without_the_schema_fails_the_run(tmp_path_factory: pytest.TempPathFactory) -> None:
    url = f"sqlite:///{tmp_path_factory.mktemp('empty') / 'never-migrated.db'}"
    get_engine(url).connect().close()  # an empty file, as a database nobody upgraded
    with dg.instance_for_test() as instance:
        result = _purge_run(url, instance)
    assert not result.success
    [failure] = [e for e in result.events_for_node("purge_history") if e.event_type_value == "STEP_FAILURE"]
    assert "run `marketing-pipelines db upgrade`" in failure.step_failure_data.error.to_string()


def test_the_schedule_requests_one_run_a_day() -> None:
    assert history_purge_schedule.job_name == history_purge_job.name
    assert history_purge_schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    context = dg.build_schedule_context(scheduled_execution_time=datetime(2026, 12, 3, 3, 30, tzinfo=UTC))
    request = history_purge_schedule.evaluate_tick(context).run_requests
    assert [r.run_key for r in request or []] == ["history-purge:2026-12-03"]
