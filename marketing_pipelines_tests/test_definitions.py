"""The code location loads and defines exactly these assets, checks, jobs, sensors, schedules and resources.

Exact sets: a definition added or dropped fails here until the list below says so.
"""

from __future__ import annotations

import dagster as dg

from marketing_pipelines.measurement.sources import SOURCES, missing_variables
from marketing_pipelines_tests.built import DEFAULTS, DEFS

# Each importer is defined only where its source is configured (measurement/sources.py). DEFS is built from
# DEFAULTS, whose services' variables are unset whatever this process's environment holds (GITHUB_TOKEN
# exported in a developer's shell included), so neither importer is: the sets below are read off the same
# settings the definitions were built from.
CONFIGURED = {s.asset for s in SOURCES if s.name not in missing_variables(DEFAULTS)}
ASSETS = {
    "marketing_event",
    "measurement_daily_rollup",
    "agent_model_cost_daily",
    "execution_queue",
    "agent_run_queue",
} | CONFIGURED
IMPORTER_CHECKS = {
    ("site_analytics_daily", "site_counts_consistent"),
    ("github_release_downloads_daily", "no_unflagged_negative_download_delta"),
}
ASSET_CHECKS = {check for check in IMPORTER_CHECKS if check[0] in CONFIGURED} | {
    ("measurement_daily_rollup", "first_party_count_matches_events"),
    ("measurement_daily_rollup", "unique_actors_within_raw_count"),
    ("measurement_daily_rollup", "today_is_current"),
    ("execution_queue", "due_lag"),
    ("execution_queue", "failed_last_hour"),
    ("agent_run_queue", "due_lag"),
    ("agent_run_queue", "failed_last_hour"),
}
JOBS = {
    "marketing_execution_job",
    "agent_run_job",
    "measurement_daily_job",
    "measurement_rollup_job",
    "history_purge_job",
}
SENSORS = {
    "due_executions_sensor",
    "execution_run_failure_sensor",
    "execution_run_canceled_sensor",
    "queued_agent_runs_sensor",
    "agent_run_failure_sensor",
    "agent_run_canceled_sensor",
    "measurement_automation_sensor",
    "measurement_late_events_sensor",
    "measurement_freshness_sensor",
    "queue_health_sensor",
    "marketing_alerts_sensor",
}
SCHEDULES = {"measurement_daily_schedule", "history_purge_schedule"}
# The one list to update when a resource is added or renamed.
RESOURCES = [
    "agent_settings",
    "alerts",
    "anthropic_model",
    "app_db",
    "execution_settings",
    "ga4",
    "github",
    "github_traffic",
    "health_settings",
    "history_retention",
    "npm_downloads",
    "offline_model",
    "openai_model",
    "plausible",
    "posthog",
    "pypistats",
    "rollup_frames",
    "webhook",
]


def test_definitions_load_with_exactly_the_expected_keys() -> None:
    dg.Definitions.validate_loadable(DEFS)
    repo = DEFS.get_repository_def()
    graph = DEFS.resolve_asset_graph()
    assert {key.to_user_string() for key in graph.get_all_asset_keys()} == ASSETS
    assert {(key.asset_key.to_user_string(), key.name) for key in graph.asset_check_keys} == ASSET_CHECKS
    # Dagster's implicit job of all assets (__ASSET_JOB) is not one of ours.
    assert {name for name in repo.job_names if not name.startswith("__")} == JOBS
    assert {s.name for s in repo.sensor_defs} == SENSORS
    assert {s.name for s in repo.schedule_defs} == SCHEDULES
    assert sorted(DEFS.resources) == sorted(RESOURCES)


def test_sensors_start_running() -> None:
    # A fresh deployment's daemon ticks them with nobody clicking "start".
    sensors = DEFS.get_repository_def().sensor_defs
    assert {s.name: s.default_status for s in sensors} == {s.name: dg.DefaultSensorStatus.RUNNING for s in sensors}


def _descriptions() -> dict[str, str | None]:
    """Every description the UI shows, by what it describes: assets, checks, jobs, sensors, schedules, resources."""
    repo, graph = DEFS.get_repository_def(), DEFS.resolve_asset_graph()
    shown: dict[str, str | None] = {
        f"asset {k.to_user_string()}": graph.get(k).description for k in graph.get_all_asset_keys()
    }
    shown |= {
        f"check {k.asset_key.to_user_string()}:{k.name}": graph.get(k).description for k in graph.asset_check_keys
    }
    # Dagster's implicit __ASSET_JOB is not shown as a job.
    shown |= {f"job {j.name}": j.description for j in repo.get_all_jobs() if not j.name.startswith("__")}
    shown |= {f"sensor {s.name}": s.description for s in repo.sensor_defs}
    shown |= {f"schedule {s.name}": s.description for s in repo.schedule_defs}
    shown |= {f"resource {n}": r.get_resource_definition().description for n, r in DEFS.resources.items()}
    return shown


def test_every_description_reads_as_markdown_in_the_ui() -> None:
    # Each thing a user finds in the UI says what it is. The UI renders descriptions as Markdown: a line
    # indented four spaces (a docstring's second paragraph on Python 3.11) shows as a code block, and
    # RST's ``literal`` shows its doubled backticks.
    problems = {}
    for what, description in _descriptions().items():
        if not description:
            problems[what] = "no description"
        elif "``" in description:
            problems[what] = "RST double backticks"
        elif any(line.startswith("    ") for line in description.splitlines()):
            problems[what] = "an indented line, which Markdown shows as code"
    assert problems == {}
