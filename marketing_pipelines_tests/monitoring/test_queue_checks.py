"""The queue observations and checks: severities at each threshold, the sensor's events, the checks run from the UI."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.monitoring.assets import AGENT_RUN_QUEUE, EXECUTION_QUEUE, EXECUTION_QUEUE_SPEC
from marketing_pipelines.monitoring.checks import queue_health_checks
from marketing_pipelines.monitoring.health import AgentRunsHealth, ExecutionsHealth, QueueHealth
from marketing_pipelines.monitoring.resources import HealthSettings, severity_of
from marketing_pipelines.monitoring.sensors import queue_health_sensor
from marketing_pipelines.settings import load_settings, resource_from_settings
from marketing_pipelines_tests.built import DEFS as code_location
from marketing_pipelines_tests.monitoring.rows import add_agent_run, add_execution, prepare

WARN, ERROR = dg.AssetCheckSeverity.WARN, dg.AssetCheckSeverity.ERROR
# Due lag WARN at 60 s and ERROR at 600 s; failures WARN at 2 and ERROR at 3.
THRESHOLDS = HealthSettings(
    due_lag_warn_seconds=60, due_lag_error_seconds=600, failed_last_hour_warn=2, failed_last_hour_error=3
)


@pytest.mark.parametrize(
    ("value", "severity"),
    [
        (0, None),  # nothing waits or failed
        (59.9, None),  # just below WARN
        (60, WARN),  # at WARN
        (599, WARN),
        (600, ERROR),  # at ERROR
        (10_000, ERROR),
    ],
)
def test_severity_of_a_value_against_its_thresholds(value: float, severity: dg.AssetCheckSeverity | None) -> None:
    assert severity_of(value, 60, 600) == severity


def reading(due_s: float | None, failed: int, queued_s: float | None, agent_failed: int) -> QueueHealth:
    return QueueHealth(
        measured_at=datetime.now(UTC),
        executions=ExecutionsHealth(int(due_s is not None), due_s, 0, failed, 0),
        agent_runs=AgentRunsHealth(int(queued_s is not None), queued_s, 0, agent_failed),
    )


@pytest.mark.parametrize(
    ("health", "expected"),
    [
        # Empty queues pass: no lag is 0 s of lag.
        (reading(None, 0, None, 0), [None, None, None, None]),
        (reading(30, 1, 59, 1), [None, None, None, None]),
        (reading(60, 2, 600, 3), [WARN, WARN, ERROR, ERROR]),
        (reading(3600, 3, 60, 2), [ERROR, ERROR, WARN, WARN]),
    ],
)
def test_verdicts_give_each_check_its_severity(
    health: QueueHealth, expected: list[dg.AssetCheckSeverity | None]
) -> None:
    verdicts = THRESHOLDS.verdicts(health)
    assert [(v.queue, v.check) for v in verdicts] == [
        ("executions", "due_lag"),
        ("executions", "failed_last_hour"),
        ("agent_runs", "due_lag"),
        ("agent_runs", "failed_last_hour"),
    ]
    assert [v.severity for v in verdicts] == expected


def test_health_settings_come_from_the_settings() -> None:
    settings = load_settings(
        health_due_lag_warn_seconds=10,
        health_due_lag_error_seconds=20,
        health_failed_last_hour_warn=3,
        health_failed_last_hour_error=4,
    )
    assert resource_from_settings(HealthSettings, settings) == HealthSettings(
        due_lag_warn_seconds=10, due_lag_error_seconds=20, failed_last_hour_warn=3, failed_last_hour_error=4
    )


def test_health_settings_are_held_to_the_settings_bounds() -> None:
    with pytest.raises(ValueError, match="due_lag_warn_seconds"):
        HealthSettings(due_lag_warn_seconds=0)


def fill(engine: sa.Engine) -> None:
    """Executions due 2 minutes (WARN), 1 failure (passed); agent runs queued 15 minutes (ERROR), 3 failed (ERROR)."""
    now = datetime.now(UTC)
    prepare(engine)
    add_execution(engine, "SCHEDULED", now - timedelta(minutes=2))
    add_execution(engine, "SCHEDULED", now + timedelta(hours=1))
    add_execution(engine, "RUNNING", now - timedelta(minutes=1))
    add_execution(engine, "FAILED", now - timedelta(minutes=30), now - timedelta(minutes=20))
    add_execution(engine, "SUCCEEDED", now - timedelta(minutes=30), now - timedelta(minutes=20))
    add_agent_run(engine, "QUEUED", now - timedelta(minutes=15))
    for _ in range(3):
        add_agent_run(engine, "FAILED", now - timedelta(minutes=30), now - timedelta(minutes=10))
    add_agent_run(engine, "REFUSED", now - timedelta(minutes=5), now - timedelta(minutes=5))


def evaluate(db_url: str, instance: dg.DagsterInstance, settings: HealthSettings = THRESHOLDS) -> dg.SensorResult:
    context = dg.build_sensor_context(
        instance=instance, resources={"app_db": AppDatabase(url=db_url), "health_settings": settings}
    )
    result = queue_health_sensor(context)
    assert isinstance(result, dg.SensorResult)
    return result


def test_sensor_observes_each_queue_with_numeric_metadata(db_url: str, engine: sa.Engine) -> None:
    fill(engine)
    with dg.instance_for_test() as instance:
        result = evaluate(db_url, instance)
    observations = {e.asset_key: e for e in result.asset_events if isinstance(e, dg.AssetObservation)}
    assert set(observations) == {EXECUTION_QUEUE, AGENT_RUN_QUEUE}
    executions = {k: v.value for k, v in observations[EXECUTION_QUEUE].metadata.items()}
    agent_runs = {k: v.value for k, v in observations[AGENT_RUN_QUEUE].metadata.items()}
    assert 120 <= executions.pop("oldest_due_seconds") < 600  # type: ignore[operator]
    assert 900 <= agent_runs.pop("oldest_queued_seconds") < 1400  # type: ignore[operator]
    assert executions == {"due": 1, "running": 1, "failed_last_hour": 1, "succeeded_last_hour": 1}
    assert agent_runs == {"queued": 1, "running": 0, "failed_last_hour": 3}
    # Every figure is a number the asset's page can plot.
    for observation in observations.values():
        assert all(isinstance(v, (dg.IntMetadataValue, dg.FloatMetadataValue)) for v in observation.metadata.values())
    assert result.run_requests == []


def test_sensor_evaluates_every_check_at_its_severity(db_url: str, engine: sa.Engine) -> None:
    fill(engine)
    with dg.instance_for_test() as instance:
        result = evaluate(db_url, instance)
    checks = {
        (e.asset_key.to_user_string(), e.check_name): e
        for e in result.asset_events
        if isinstance(e, dg.AssetCheckEvaluation)
    }
    outcomes = {key: (e.passed, e.severity) for key, e in checks.items()}
    assert outcomes == {
        ("execution_queue", "due_lag"): (False, WARN),
        ("execution_queue", "failed_last_hour"): (True, WARN),  # passed: Dagster ignores the severity
        ("agent_run_queue", "due_lag"): (False, ERROR),
        ("agent_run_queue", "failed_last_hour"): (False, ERROR),
    }
    metadata = {k: v.value for k, v in checks[("agent_run_queue", "failed_last_hour")].metadata.items()}
    assert metadata == {"value": 3, "warn_at": 2, "error_at": 3}
    assert "agent_runs due_lag" in (result.skip_reason.skip_message if result.skip_reason else "")


def test_sensor_passes_every_check_when_the_queues_keep_up(db_url: str, engine: sa.Engine) -> None:
    prepare(engine)
    add_execution(engine, "SCHEDULED", datetime.now(UTC) + timedelta(minutes=5))
    with dg.instance_for_test() as instance:
        result = evaluate(db_url, instance)
    evaluations = [e for e in result.asset_events if isinstance(e, dg.AssetCheckEvaluation)]
    assert len(evaluations) == 4 and all(e.passed for e in evaluations)
    assert result.skip_reason is not None and result.skip_reason.skip_message.endswith("all checks passed")


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("failing", [False, True])
def test_sensor_logs_only_when_a_check_starts_failing(db_url: str, engine: sa.Engine, failing: bool) -> None:
    prepare(engine)
    if failing:
        add_execution(engine, "SCHEDULED", datetime.now(UTC) - timedelta(hours=1))
    context = dg.build_sensor_context(
        instance=dg.DagsterInstance.ephemeral(),
        resources={"app_db": AppDatabase(url=db_url), "health_settings": THRESHOLDS},
    )
    handler = Records()
    context.log.addHandler(handler)
    first = queue_health_sensor(context)
    # 3600 s, or a second more when the tick reads the clock after a second boundary (a loaded CI machine).
    lagging = re.compile(r"executions due_lag 360[01] s \(ERROR")
    assert [(r.levelname, bool(lagging.search(r.getMessage()))) for r in handler.records] == (
        [("WARNING", True)] if failing else []
    )
    # The next tick, the same checks still failing: nothing more in the daemon's log (the UI has each tick).
    again = dg.build_sensor_context(
        instance=dg.DagsterInstance.ephemeral(),
        cursor=first.cursor,
        resources={"app_db": AppDatabase(url=db_url), "health_settings": THRESHOLDS},
    )
    quiet = Records()
    again.log.addHandler(quiet)
    assert isinstance(queue_health_sensor(again), dg.SensorResult)
    assert quiet.records == []


def test_the_instance_records_the_sensors_events_against_the_declared_checks(db_url: str, engine: sa.Engine) -> None:
    # What the daemon does with a tick's asset events: each is reported without a run.
    fill(engine)
    with dg.instance_for_test() as instance:
        for event in evaluate(db_url, instance).asset_events:
            instance.report_runless_asset_event(event)
        observed = instance.fetch_observations(AGENT_RUN_QUEUE, limit=1).records
        failed = instance.get_latest_asset_check_evaluation_record(dg.AssetCheckKey(AGENT_RUN_QUEUE, "due_lag"))
        passed = instance.get_latest_asset_check_evaluation_record(
            dg.AssetCheckKey(EXECUTION_QUEUE, "failed_last_hour")
        )
    assert observed[0].asset_observation is not None
    assert observed[0].asset_observation.metadata["queued"].value == 1
    assert failed is not None and failed.status.value == "FAILED"
    assert passed is not None and passed.status.value == "SUCCEEDED"


def test_sensor_skips_while_the_database_has_no_schema(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    sa.create_engine(url).connect().close()
    context = dg.build_sensor_context(
        instance=dg.DagsterInstance.ephemeral(),
        resources={"app_db": AppDatabase(url=url), "health_settings": THRESHOLDS},
    )
    result = queue_health_sensor(context)
    assert isinstance(result, dg.SkipReason) and "no schema" in (result.skip_message or "")


def test_a_check_executed_from_the_ui_reads_the_database_afresh(db_url: str, engine: sa.Engine) -> None:
    fill(engine)
    defs = dg.Definitions(
        assets=[EXECUTION_QUEUE_SPEC],
        asset_checks=[queue_health_checks],
        resources={"app_db": AppDatabase(url=db_url), "health_settings": THRESHOLDS},
    )
    selected = dg.AssetCheckKey(AGENT_RUN_QUEUE, "failed_last_hour")
    job = defs.resolve_implicit_global_asset_job_def().get_subset(
        asset_selection=set(), asset_check_selection={selected}
    )
    with dg.instance_for_test() as instance:
        result = job.execute_in_process(instance=instance)
    [evaluation] = result.get_asset_check_evaluations()  # the selected check only
    assert (evaluation.asset_key, evaluation.check_name) == (selected.asset_key, selected.name)
    assert (evaluation.passed, evaluation.severity) == (False, ERROR)
    assert evaluation.metadata["value"].value == 3


def test_the_code_location_observes_the_queues_every_minute() -> None:
    sensor = code_location.get_repository_def().get_sensor_def("queue_health_sensor")
    assert (sensor.minimum_interval_seconds, sensor.default_status) == (60, dg.DefaultSensorStatus.RUNNING)
    graph = code_location.resolve_asset_graph()
    assert {k.name for k in graph.asset_check_keys if k.asset_key == AGENT_RUN_QUEUE} == {
        "due_lag",
        "failed_last_hour",
    }
    assert isinstance(code_location.resources["health_settings"], HealthSettings)
