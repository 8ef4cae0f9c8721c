"""The code location loads and defines exactly these assets, checks, jobs, sensors, schedules and resources.

Exact sets: a definition added or dropped fails here until the list below says so.
"""

from __future__ import annotations

import dagster as dg

from marketing_pipelines.definitions import defs

ASSETS = {
    "marketing_event",
    "site_analytics_daily",
    "github_release_downloads_daily",
    "measurement_daily_rollup",
    "execution_queue",
    "agent_run_queue",
}
ASSET_CHECKS = {
    ("site_analytics_daily", "site_counts_consistent"),
    ("github_release_downloads_daily", "no_unflagged_negative_download_delta"),
    ("measurement_daily_rollup", "first_party_count_matches_events"),
    ("measurement_daily_rollup", "unique_actors_within_raw_count"),
    ("execution_queue", "due_lag"),
    ("execution_queue", "failed_last_hour"),
    ("agent_run_queue", "due_lag"),
    ("agent_run_queue", "failed_last_hour"),
}
JOBS = {"marketing_execution_job", "agent_run_job", "measurement_daily_job", "measurement_rollup_job"}
SENSORS = {
    "due_executions_sensor",
    "execution_run_failure_sensor",
    "execution_run_canceled_sensor",
    "queued_agent_runs_sensor",
    "agent_run_failure_sensor",
    "agent_run_canceled_sensor",
    "measurement_late_events_sensor",
    "queue_health_sensor",
    "marketing_alerts_sensor",
}
SCHEDULES = {"measurement_daily_schedule"}
# The one list to update when a resource is added or renamed.
RESOURCES = [
    "agent_settings",
    "alerts",
    "anthropic_model",
    "app_db",
    "execution_settings",
    "github",
    "health_settings",
    "models",
    "offline_model",
    "openai_model",
    "plausible",
    "rollup_frames",
    "webhook",
]


def test_definitions_load_with_exactly_the_expected_keys() -> None:
    dg.Definitions.validate_loadable(defs)
    repo = defs.get_repository_def()
    graph = defs.resolve_asset_graph()
    assert {key.to_user_string() for key in graph.get_all_asset_keys()} == ASSETS
    assert {(key.asset_key.to_user_string(), key.name) for key in graph.asset_check_keys} == ASSET_CHECKS
    # Dagster's implicit job of all assets (__ASSET_JOB) is not one of ours.
    assert {name for name in repo.job_names if not name.startswith("__")} == JOBS
    assert {s.name for s in repo.sensor_defs} == SENSORS
    assert {s.name for s in repo.schedule_defs} == SCHEDULES
    assert sorted(defs.resources) == sorted(RESOURCES)


def test_sensors_start_running() -> None:
    # A fresh deployment's daemon ticks them with nobody clicking "start".
    sensors = defs.get_repository_def().sensor_defs
    assert {s.name: s.default_status for s in sensors} == {s.name: dg.DefaultSensorStatus.RUNNING for s in sensors}
