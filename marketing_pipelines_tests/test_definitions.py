"""The code location loads and exposes the expected jobs and sensors."""

from __future__ import annotations

import dagster as dg

from marketing_pipelines.definitions import defs


def test_definitions_load_with_expected_keys() -> None:
    dg.Definitions.validate_loadable(defs)
    repo = defs.get_repository_def()
    assert {"marketing_execution_job"} <= set(repo.job_names)
    sensors = {s.name: s for s in repo.sensor_defs}
    assert {
        "due_executions_sensor",
        "execution_run_failure_sensor",
        "execution_run_canceled_sensor",
        "queued_agent_runs_sensor",
        "agent_run_failure_sensor",
        "agent_run_canceled_sensor",
    } <= set(sensors)
    assert all(s.default_status == dg.DefaultSensorStatus.RUNNING for s in sensors.values())
