"""The real ``dagster-daemon`` works the queues unattended: due work in the database ends SUCCEEDED.

Nobody starts a sensor or launches a run: the sensors are RUNNING by default in code, the daemon
ticks the claiming sensors (every 2 s here), the queued run coordinator launches the runs and each
run records its outcome in the application database (PostgreSQL, a throwaway database).
"""

from __future__ import annotations

import shutil
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines import run_tags
from marketing_pipelines.agents import users
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import agent_run, marketing_execution, marketing_execution_attempt
from marketing_pipelines.executions.queue import schedule_execution
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines_tests.built import due_executions_sensor
from marketing_pipelines_tests.factories import add_campaign, request_offline_analysis
from marketing_pipelines_tests.processes import REPO_ROOT, child_env, dagster_bin, running, start, wait_for

# Real daemon processes: end to end, left out of the quick loop.
pytestmark = pytest.mark.slow

EXECUTIONS = 3
# About 40 s on an idle 2-core machine (each run is two fresh Python processes); the bound leaves
# room for a machine busy with other work.
TIMEOUT_SECONDS = 120


def _seed(engine: sa.Engine) -> tuple[list[int], int]:
    add_campaign(engine, "spring-launch")
    due = datetime.now(UTC) - timedelta(seconds=1)
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        for permission in ("campaign:read", "measurement:read", "execution:read"):
            users.grant(conn, "ana", permission)
        execution_ids = [
            schedule_execution(
                conn,
                campaign_id="spring-launch",
                stage="launch",
                action="log",
                due_at=due,
                payload={"message": f"hello {i}"},
            )
            for i in range(EXECUTIONS)
        ]
        agent_run_id = request_offline_analysis(conn, "ana")
    return execution_ids, agent_run_id


def _statuses(engine: sa.Engine) -> dict[str, tuple[str, str | None]]:
    with engine.connect() as conn:
        executions = conn.execute(
            sa.select(marketing_execution.c.id, marketing_execution.c.status, marketing_execution.c.run_id)
        ).all()
        agents = conn.execute(sa.select(agent_run.c.id, agent_run.c.status, agent_run.c.run_id)).all()
    return {
        **{f"execution {r.id}": (r.status, r.run_id) for r in executions},
        **{f"agent run {r.id}": (r.status, r.run_id) for r in agents},
    }


def _daemon(tmp_path: Path, pg_url: str) -> tuple[Path, dict[str, str], list[str]]:
    """A DAGSTER_HOME with the repository's dagster.yaml, the daemon's environment and command."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "dagster.yaml", home / "dagster.yaml")
    env = child_env(
        DAGSTER_HOME=str(home),
        MARKETING_DATABASE_URL=pg_url,
        MARKETING_SENSOR_INTERVAL_SECONDS="2",
        MARKETING_MODEL_PROVIDER="offline",
    )
    return home, env, [dagster_bin("dagster-daemon"), "run", "-w", "workspace.yaml"]


def test_daemon_runs_due_executions_and_a_queued_agent_run_unattended(pg_url: str, tmp_path: Path) -> None:
    engine = get_engine(pg_url)
    execution_ids, agent_run_id = _seed(engine)
    home, env, argv = _daemon(tmp_path, pg_url)

    def all_succeeded() -> bool:
        statuses = _statuses(engine)
        return len(statuses) == EXECUTIONS + 1 and all(s == "SUCCEEDED" for s, _ in statuses.values())

    with running([]) as children:
        children.append(start("dagster-daemon", argv, env, tmp_path))
        wait_for(
            f"{EXECUTIONS} executions and 1 agent run to reach SUCCEEDED",
            all_succeeded,
            TIMEOUT_SECONDS,
            children,
            interval=1,
            detail=lambda: f"app database: {_statuses(engine)}",
        )

        statuses = _statuses(engine)
        run_ids = {run_id for _, run_id in statuses.values()}
        # The executions, due at once, were performed by one batched run; the agent run by its own.
        execution_runs = {run_id for key, (_, run_id) in statuses.items() if key.startswith("execution")}
        assert None not in run_ids and len(execution_runs) == 1 and len(run_ids) == 2, statuses
        with dg.DagsterInstance.from_config(str(home)) as instance:
            # Each row names the Dagster run that performed it; the run ends a moment after the
            # op recorded the outcome, so wait for that too.
            def dagster_runs_succeeded() -> bool:
                runs = [instance.get_run_by_id(run_id) for run_id in run_ids]
                return all(r is not None and r.status == dg.DagsterRunStatus.SUCCESS for r in runs)

            wait_for("the Dagster runs to reach SUCCESS", dagster_runs_succeeded, 60, children)
            runs = {run_id: instance.get_run_by_id(run_id) for run_id in run_ids}
            launched_by = {
                key: (runs[run_id].job_name, runs[run_id].tags.get("dagster/sensor_name"))
                for key, (_, run_id) in statuses.items()
            }
            states = {
                s.instigator_name: s
                for s in _sensor_states(instance)
                if s.instigator_name in ("due_executions_sensor", "queued_agent_runs_sensor")
            }
            ticks = [t for s in states.values() for t in instance.get_ticks(s.instigator_origin_id, s.selector_id)]

    assert launched_by == {
        **{f"execution {i}": ("marketing_execution_job", "due_executions_sensor") for i in execution_ids},
        f"agent run {agent_run_id}": ("agent_run_job", "queued_agent_runs_sensor"),
    }
    # Nobody turned the sensor on: its state is the default declared in code, and its ticks
    # launched exactly these runs.
    assert {name: s.status.value for name, s in states.items()} == {
        "due_executions_sensor": "DECLARED_IN_CODE",
        "queued_agent_runs_sensor": "DECLARED_IN_CODE",
    }
    assert {run_id for tick in ticks if tick.status.value == "SUCCESS" for run_id in tick.run_ids} == run_ids


def _sensor_states(instance: dg.DagsterInstance) -> list[Any]:
    # Read through the instance's own methods; the enums they return are compared by value, not imported
    # from dagster._core.
    return [s for s in instance.all_instigator_state() if s.instigator_type.value == "SENSOR"]


def _sensor_ticks(instance: dg.DagsterInstance, name: str) -> list[Any]:
    [state] = [s for s in _sensor_states(instance) if s.instigator_name == name]
    return list(instance.get_ticks(state.instigator_origin_id, state.selector_id))


@pytest.mark.parametrize(
    ("broken_table", "broken_sensor", "working_prefix"),
    [
        # Today's work still launches when the other domain's claim fails on every tick.
        ("agent_run", "queued_agent_runs_sensor", "execution"),
        ("marketing_execution", "due_executions_sensor", "agent run"),
    ],
)
def test_a_failing_domain_sensor_costs_the_other_domain_nothing(
    pg_url: str, tmp_path: Path, broken_table: str, broken_sensor: str, working_prefix: str
) -> None:
    engine = get_engine(pg_url)
    _seed(engine)
    working = {k for k in _statuses(engine) if k.startswith(working_prefix)}
    # The failure injected into one domain: its table refuses every UPDATE, so each claim raises
    # (reads still work: the other domain's agent may read executions through its tools).
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "CREATE FUNCTION refuse_update() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'injected failure: % refuses updates', TG_TABLE_NAME; END $$"
            )
        )
        conn.execute(
            sa.text(
                f"CREATE TRIGGER refuse BEFORE UPDATE ON {broken_table} FOR EACH ROW EXECUTE FUNCTION refuse_update()"
            )
        )
    home, env, argv = _daemon(tmp_path, pg_url)

    def working_statuses() -> dict[str, str]:
        with engine.connect() as conn:
            table = "agent_run" if working_prefix == "agent run" else "marketing_execution"
            rows = conn.execute(sa.text(f"SELECT id, status FROM {table}")).all()
        return {f"{working_prefix} {r.id}": r.status for r in rows}

    try:
        with running([]) as children:
            children.append(start("dagster-daemon", argv, env, tmp_path))
            wait_for(
                f"the {working_prefix}s to reach SUCCEEDED while {broken_sensor} fails",
                lambda: set(working_statuses()) == working and set(working_statuses().values()) == {"SUCCEEDED"},
                TIMEOUT_SECONDS,
                children,
                interval=1,
                detail=lambda: f"app database: {working_statuses()}",
            )
            with dg.DagsterInstance.from_config(str(home)) as instance:
                failed = wait_for(
                    f"a failed tick of {broken_sensor}",
                    lambda: [t for t in _sensor_ticks(instance, broken_sensor) if t.status.value == "FAILURE"],
                    60,
                    children,
                )
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TRIGGER refuse ON {broken_table}"))
            conn.execute(sa.text("DROP FUNCTION refuse_update()"))
    assert f"injected failure: {broken_table} refuses updates" in failed[0].error.to_string()


# Past the 10 s a claim may wait for its runs and a few 2 s ticks; the old wait alone was 120 s.
STRANDED_CLAIM_BOUND_SECONDS = 60


def test_a_claim_whose_tick_never_returned_is_claimed_again_within_seconds(pg_url: str, tmp_path: Path) -> None:
    """What a code server killed between committing its tick's claim and returning the run requests leaves:
    rows owned by a claim no run will ever carry. The real daemon's ticks claim them again within seconds,
    and no run is ever created for the dead claim."""
    engine = get_engine(pg_url)
    execution_ids, _ = _seed(engine)
    home, env, argv = _daemon(tmp_path, pg_url)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        # The tick, evaluated as a code server evaluates it; its run requests never reach the daemon.
        resources = {"app_db": AppDatabase(url=pg_url), "execution_settings": ExecutionSettings()}
        with dg.build_sensor_context(instance=instance, resources=resources) as context:
            lost = due_executions_sensor(context)
        assert isinstance(lost, dg.SensorResult) and lost.run_requests
        [dead_claim] = {request.tags[run_tags.CLAIMED_BY] for request in lost.run_requests}
        with engine.connect() as conn:
            owners = set(conn.execute(sa.select(marketing_execution.c.lease_owner)).scalars())
        assert owners == {dead_claim}

        def executions_succeeded() -> bool:
            statuses = _statuses(engine)
            return all(statuses[f"execution {i}"][0] == "SUCCEEDED" for i in execution_ids)

        with running([]) as children:
            children.append(start("dagster-daemon", argv, env, tmp_path))
            wait_for(
                f"the stranded executions to succeed within {STRANDED_CLAIM_BOUND_SECONDS} s",
                executions_succeeded,
                STRANDED_CLAIM_BOUND_SECONDS,
                children,
                interval=1,
                detail=lambda: f"app database: {_statuses(engine)}",
            )
        assert not instance.get_run_ids(dg.RunsFilter(tags={run_tags.CLAIMED_BY: dead_claim}))
    with engine.connect() as conn:
        attempts = conn.execute(
            sa.select(marketing_execution_attempt.c.execution_id, marketing_execution_attempt.c.outcome)
        ).all()
    # Each execution ran once: one attempt performed by a run, after the dead claim's attempt (none or ended).
    performed = Counter(execution_id for execution_id, outcome in attempts if outcome == "SUCCEEDED")
    assert performed == Counter(execution_ids)
