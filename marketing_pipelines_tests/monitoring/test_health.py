"""Queue health figures on both databases, and ``marketing-pipelines status`` printing them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from marketing_pipelines.cli import main
from marketing_pipelines.cli.status import age_text
from marketing_pipelines.monitoring.health import AgentRunsHealth, ExecutionsHealth, queue_health
from marketing_pipelines_tests.measurement.fake_services import service_account_key
from marketing_pipelines_tests.monitoring.rows import add_agent_run, add_execution, prepare

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def ago(seconds: float, now: datetime = NOW) -> datetime:
    return now - timedelta(seconds=seconds)


def fill(engine: sa.Engine, now: datetime = NOW) -> None:
    """Rows on each side of every boundary the figures draw."""
    prepare(engine)
    add_execution(engine, "SCHEDULED", ago(300, now))  # due 5 minutes ago: the oldest due
    add_execution(engine, "SCHEDULED", ago(0, now))  # due exactly now: due
    add_execution(engine, "SCHEDULED", ago(-60, now))  # due in a minute: not yet
    add_execution(engine, "RUNNING", ago(400, now))  # running, whatever its due time
    add_execution(engine, "FAILED", ago(4000, now), ago(1800, now))  # failed within the hour
    add_execution(engine, "FAILED", ago(9000, now), ago(7200, now))  # failed two hours ago
    add_execution(engine, "SUCCEEDED", ago(600, now), ago(300, now))
    add_execution(engine, "SUCCEEDED", ago(600, now), ago(59 * 60, now))
    add_execution(engine, "SUCCEEDED", ago(9000, now), ago(61 * 60, now))  # just outside the hour
    add_execution(engine, "CANCELLED", ago(600, now), ago(60, now))  # counts nowhere
    add_agent_run(engine, "QUEUED", ago(90, now))  # the oldest queued
    add_agent_run(engine, "QUEUED", ago(30, now))
    add_agent_run(engine, "RUNNING", ago(500, now))
    add_agent_run(engine, "FAILED", ago(900, now), ago(600, now))  # failed within the hour
    add_agent_run(engine, "FAILED", ago(20000, now), ago(3 * 3600, now))  # failed three hours ago
    add_agent_run(engine, "REFUSED", ago(60, now), ago(60, now))  # refused on request: not a failure
    add_agent_run(engine, "SUCCEEDED", ago(900, now), ago(120, now))
    add_agent_run(engine, "CANCELLED", ago(900, now), ago(120, now))


def test_figures_count_each_row_on_its_side_of_each_boundary(engine: sa.Engine) -> None:
    fill(engine)
    with engine.connect() as conn:
        health = queue_health(conn, now=NOW)
    assert health.measured_at == NOW
    assert health.executions == ExecutionsHealth(
        due=2, oldest_due_seconds=300.0, running=1, failed_last_hour=1, succeeded_last_hour=2
    )
    assert health.agent_runs == AgentRunsHealth(queued=2, oldest_queued_seconds=90.0, running=1, failed_last_hour=1)


def test_an_empty_queue_has_no_age_and_prints_null(engine: sa.Engine) -> None:
    with engine.connect() as conn:
        health = queue_health(conn, now=NOW)
    assert health.as_json() == {
        "executions": {
            "due": 0,
            "oldest_due_seconds": None,
            "running": 0,
            "failed_last_hour": 0,
            "succeeded_last_hour": 0,
        },
        "agent_runs": {"queued": 0, "oldest_queued_seconds": None, "running": 0, "failed_last_hour": 0},
    }


def test_rows_that_only_wait_later_are_not_due(engine: sa.Engine) -> None:
    prepare(engine)
    add_execution(engine, "SCHEDULED", ago(-1))
    with engine.connect() as conn:
        assert queue_health(conn, now=NOW).executions.due == 0
        # The same row, read a second later, is due and has waited 0 s.
        later = queue_health(conn, now=NOW + timedelta(seconds=1)).executions
    assert (later.due, later.oldest_due_seconds) == (1, 0.0)


def test_without_a_given_time_the_figures_use_the_clock(engine: sa.Engine) -> None:
    # PostgreSQL's now() or this process's clock: a row due an hour ago has waited about an hour.
    now = datetime.now(UTC)
    fill(engine, now=now - timedelta(hours=1))
    with engine.connect() as conn:
        health = queue_health(conn)
    assert health.executions.due == 3  # what was due "in a minute" an hour ago is due now
    assert 3600 + 300 <= (health.executions.oldest_due_seconds or 0) < 3600 + 300 + 600
    assert health.executions.failed_last_hour == 0  # an hour on, the failure is older than the hour


# No measurement source configured, whatever the environment running the tests holds ("" is unset).
UNCONFIGURED = {
    "PLAUSIBLE_API_KEY": "",
    "PLAUSIBLE_SITE_ID": "",
    "GITHUB_TOKEN": "",
    "GA4_PROPERTY_ID": "",
    "GA4_SERVICE_ACCOUNT_JSON": "",
    "POSTHOG_API_KEY": "",
    "POSTHOG_PROJECT_ID": "",
    "MARKETING_PYPI_DOWNLOADS_ENABLED": "",
    "MARKETING_NPM_DOWNLOADS_ENABLED": "",
    "MARKETING_GITHUB_TRAFFIC_ENABLED": "",
}


def status(db_url: str, *args: str, **environ: str) -> str:
    env = {"MARKETING_DATABASE_URL": db_url, **UNCONFIGURED, **environ}
    result = CliRunner(env=env).invoke(main, ["status", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_status_json_prints_exactly_the_documented_shape(db_url: str, engine: sa.Engine) -> None:
    now = datetime.now(UTC)
    fill(engine, now=now)
    printed = json.loads(status(db_url, "--json"))
    assert list(printed) == ["executions", "agent_runs", "measurement_sources"]
    assert list(printed["executions"]) == [
        "due",
        "oldest_due_seconds",
        "running",
        "failed_last_hour",
        "succeeded_last_hour",
    ]
    assert list(printed["agent_runs"]) == ["queued", "oldest_queued_seconds", "running", "failed_last_hour"]
    executions, agent_runs = printed["executions"], printed["agent_runs"]
    # The command reads the clock a little after the rows were written: ages grow by that much.
    assert isinstance(executions.pop("oldest_due_seconds"), float)
    assert isinstance(agent_runs.pop("oldest_queued_seconds"), float)
    assert executions == {"due": 2, "running": 1, "failed_last_hour": 1, "succeeded_last_hour": 2}
    assert agent_runs == {"queued": 2, "running": 1, "failed_last_hour": 1}


def test_status_names_the_measurement_sources_not_configured_and_what_turns_each_on(db_url: str) -> None:
    lines = status(db_url).splitlines()
    assert lines[-1] == (
        "measurement sources not configured: site_analytics (set PLAUSIBLE_API_KEY and PLAUSIBLE_SITE_ID), "
        "github_releases (set GITHUB_TOKEN), ga4 (set GA4_PROPERTY_ID and GA4_SERVICE_ACCOUNT_JSON), posthog (set "
        "POSTHOG_API_KEY and POSTHOG_PROJECT_ID), github_traffic (set GITHUB_TOKEN and "
        "MARKETING_GITHUB_TRAFFIC_ENABLED=true), pypi_downloads (set MARKETING_PYPI_DOWNLOADS_ENABLED=true), "
        "npm_downloads (set MARKETING_NPM_DOWNLOADS_ENABLED=true)"
    )
    printed = json.loads(
        status(db_url, "--json", GITHUB_TOKEN="t", PLAUSIBLE_SITE_ID="example.com", MARKETING_NPM_DOWNLOADS_ENABLED="1")
    )
    assert printed["measurement_sources"] == {
        "site_analytics": {"configured": False, "set": ["PLAUSIBLE_API_KEY"]},
        "github_releases": {"configured": True, "set": []},
        "ga4": {"configured": False, "set": ["GA4_PROPERTY_ID", "GA4_SERVICE_ACCOUNT_JSON"]},
        "posthog": {"configured": False, "set": ["POSTHOG_API_KEY", "POSTHOG_PROJECT_ID"]},
        "github_traffic": {"configured": False, "set": ["MARKETING_GITHUB_TRAFFIC_ENABLED=true"]},
        "pypi_downloads": {"configured": False, "set": ["MARKETING_PYPI_DOWNLOADS_ENABLED=true"]},
        "npm_downloads": {"configured": True, "set": []},
    }
    everything = {
        "GITHUB_TOKEN": "t",
        "PLAUSIBLE_SITE_ID": "example.com",
        "PLAUSIBLE_API_KEY": "k",
        "POSTHOG_API_KEY": "phx_k",
        "POSTHOG_PROJECT_ID": "4242",
        "MARKETING_PYPI_DOWNLOADS_ENABLED": "true",
        "MARKETING_NPM_DOWNLOADS_ENABLED": "true",
        "MARKETING_GITHUB_TRAFFIC_ENABLED": "true",
        "GA4_PROPERTY_ID": "123456789",
        "GA4_SERVICE_ACCOUNT_JSON": json.dumps(service_account_key()),
    }
    assert "not configured" not in status(db_url, **everything)


def test_status_json_of_empty_queues_prints_null_ages(db_url: str) -> None:
    printed = json.loads(status(db_url, "--json"))
    assert printed["executions"]["oldest_due_seconds"] is None
    assert printed["agent_runs"]["oldest_queued_seconds"] is None


def test_status_prints_a_table_with_a_row_per_queue(db_url: str, engine: sa.Engine) -> None:
    prepare(engine)
    add_execution(engine, "SCHEDULED", datetime.now(UTC) - timedelta(hours=2))
    lines = status(db_url).splitlines()
    assert lines[0].split() == ["queue", "waiting", "oldest", "waiting", "running", "failed", "last", "hour",
                                "succeeded", "last", "hour"]  # fmt: skip
    assert lines[1].split() == ["executions", "(due)", "1", "2h", "00m", "0", "0", "0"]
    assert lines[2].split() == ["agent", "runs", "(queued)", "0", "-", "0", "0", "-"]


def test_status_on_a_database_without_schema_is_one_error_line(tmp_path: pytest.TempPathFactory) -> None:
    result = CliRunner(env={"MARKETING_DATABASE_URL": f"sqlite:///{tmp_path}/none.db"}).invoke(main, ["status"])
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert result.output.count("\n") == 1 and result.output.startswith("Error: ")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, None),  # nothing waits
        (0.4, "0s"),
        (59.9, "59s"),
        (65, "1m 05s"),
        (3600 + 120, "1h 02m"),
        (2 * 86_400 + 4 * 3600 + 59, "2d 04h"),
    ],
)
def test_age_text(seconds: float | None, text: str | None) -> None:
    assert age_text(seconds) == text
