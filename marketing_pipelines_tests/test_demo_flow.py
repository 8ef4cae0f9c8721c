"""The whole demo, twice in one folder: its runs are its jobs' runs, launched by their sensors on a real
daemon; the second demo adds no work and no run, and says what it reused."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import agent_run, marketing_execution
from marketing_pipelines.demo import run_demo
from marketing_pipelines.local_dagster import DEMO_RECEIVER_ADDRESS, LOCATION_NAME, daemon_running, dagster_home
from marketing_pipelines.measurement.keys import ROLLUP_KEY
from marketing_pipelines.settings import Settings, load_settings
from marketing_pipelines_tests.cli_runner import cli_for


def _rows(engine: sa.Engine) -> tuple[list[tuple[int, str]], int]:
    with engine.connect() as conn:
        executions = conn.execute(
            sa.select(marketing_execution.c.id, marketing_execution.c.status).order_by(marketing_execution.c.id)
        ).all()
        runs = conn.execute(sa.select(sa.func.count()).select_from(agent_run)).scalar_one()
    return [tuple(r) for r in executions], runs


def _embedded_default(folder: Path) -> Settings:
    # The demo's own default database, under the folder it runs in (the demo writes its Dagster home there too).
    return load_settings(database_url=f"sqlite:///{folder / '.marketing' / 'marketing.db'}")


def _runs(folder: Path) -> list[dg.DagsterRun]:
    with dg.DagsterInstance.from_config(str(dagster_home(folder))) as instance:
        return list(instance.get_runs())


def test_the_demo_runs_through_the_daemon_and_a_second_demo_adds_no_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Through the command line, as a user runs it, on the embedded default's file in this folder.
    monkeypatch.chdir(tmp_path)
    cli = cli_for(f"sqlite:///{tmp_path / '.marketing' / 'marketing.db'}")
    first_run = cli("demo", "--days", "2")
    assert first_run.exit_code == 0, first_run.output
    first_lines = first_run.output.splitlines()
    engine = get_engine(f"sqlite:///{tmp_path / '.marketing' / 'marketing.db'}")
    first = _rows(engine)
    # 5 scheduled executions, 3 agent runs and ben's refused request (kept as agent run 4), and the
    # one follow-up an agent proposed (due tomorrow).
    assert [s for _, s in first[0]] == ["SUCCEEDED"] * 5 + ["SCHEDULED"] and first[1] == 4
    assert any("(recorded as agent run 4, REFUSED)" in line for line in first_lines)
    shown = cli("agents", "show", "4")
    assert shown.exit_code == 0, shown.output
    assert "status: REFUSED" in shown.output and "dev-tools-beta" in shown.output
    # The webhook went to a registered endpoint, signed under a key the demo made, readable by its owner only.
    assert any("the webhook receiver got 1 request(s), 1 with a valid signature" in line for line in first_lines)
    assert (tmp_path / ".marketing" / "secrets.key").stat().st_mode & 0o777 == 0o600
    # Every run is a run of the code location's job (what the UI's job pages and sensor histories list),
    # launched by its claiming sensor; the rollup's by `dagster job launch`, as an operator's would be.
    runs = _runs(tmp_path)
    assert {r.status for r in runs} == {dg.DagsterRunStatus.SUCCESS}
    assert all(r.remote_job_origin is not None for r in runs)
    assert {r.remote_job_origin.location_name for r in runs} == {LOCATION_NAME}  # type: ignore[union-attr]
    launched_by = sorted((r.job_name, r.tags.get("dagster/sensor_name", "")) for r in runs)
    assert launched_by == [
        ("agent_run_job", "queued_agent_runs_sensor"),
        ("agent_run_job", "queued_agent_runs_sensor"),
        ("agent_run_job", "queued_agent_runs_sensor"),
        ("marketing_execution_job", "due_executions_sensor"),
        ("measurement_rollup_job", ""),
    ]
    with dg.DagsterInstance.from_config(str(dagster_home(tmp_path))) as instance:
        records = instance.fetch_materializations(ROLLUP_KEY, limit=100).records
        # The demo's daemon is gone and says so: a next command does not wait for it.
        assert not daemon_running(instance)
    # Each day rolled up once, and its metadata names the importers the demo runs without.
    assert len(records) == 2
    assert {r.asset_materialization.metadata["sources_not_configured"].value for r in records} == {  # type: ignore[union-attr]
        "site_analytics_daily: set PLAUSIBLE_API_KEY and PLAUSIBLE_SITE_ID; github_release_downloads_daily: "
        "set GITHUB_TOKEN; ga4_daily: set GA4_PROPERTY_ID and GA4_SERVICE_ACCOUNT_JSON; posthog_daily: set "
        "POSTHOG_API_KEY and POSTHOG_PROJECT_ID; github_traffic_daily: set GITHUB_TOKEN and "
        "MARKETING_GITHUB_TRAFFIC_ENABLED=true; pypi_downloads_daily: set MARKETING_PYPI_DOWNLOADS_ENABLED=true; "
        "npm_downloads_daily: set MARKETING_NPM_DOWNLOADS_ENABLED=true"
    }

    second_run = cli("demo", "--days", "2")
    assert second_run.exit_code == 0, second_run.output
    second_lines = second_run.output.splitlines()
    assert _rows(engine) == first
    assert [r.run_id for r in _runs(tmp_path)] == [r.run_id for r in runs]
    assert any("schema current" in line for line in second_lines)
    assert any("scheduled executions []; reused [1, 2, 3, 4, 5]" in line for line in second_lines)
    assert any(line.startswith("[3/4] Nothing to run") for line in second_lines)
    assert any("0 run(s) on the instance" in line for line in second_lines)
    assert any("queued agent runs []; reused [1, 2, 3]" in line for line in second_lines)
    assert any("(recorded as agent run 4, REFUSED, by an earlier demo)" in line for line in second_lines)
    refused = cli("agents", "list", "--status", "REFUSED", "--json")
    assert refused.exit_code == 0, refused.output
    assert [(r["id"], r["requested_by"], r["campaign_id"]) for r in json.loads(refused.output)] == [
        (4, "ben", "dev-tools-beta")
    ]


@pytest.mark.slow
def test_the_demo_while_the_ui_daemon_runs_lets_it_do_the_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What `marketing-pipelines ui` starts, less the webserver: a daemon on the demo's own Dagster
    # home and database, allowed to reach the demo's receiver on its own address (127.0.0.2).
    from marketing_pipelines_tests.processes import child_env, dagster_bin, running, start, wait_for

    monkeypatch.chdir(tmp_path)
    home = dagster_home(tmp_path)
    env = child_env(
        DAGSTER_HOME=str(home),
        MARKETING_DATABASE_URL=f"sqlite:///{tmp_path / '.marketing' / 'marketing.db'}",
        MARKETING_WEBHOOK_ALLOW_NETWORKS=f"{DEMO_RECEIVER_ADDRESS}/32",
        MARKETING_SENSOR_INTERVAL_SECONDS="2",
    )
    argv = [dagster_bin("dagster-daemon"), "run", "-m", "marketing_pipelines.definitions"]
    lines: list[str] = []
    with running([]) as children, dg.DagsterInstance.from_config(str(home)) as instance:
        children.append(start("dagster-daemon", argv, env, tmp_path, cwd=tmp_path))
        wait_for("the daemon's first heartbeat", lambda: "SENSOR" in instance.get_daemon_heartbeats(), 120, children)
        run_demo(_embedded_default(tmp_path), days=1, echo=lines.append)
        engine = get_engine(f"sqlite:///{tmp_path / '.marketing' / 'marketing.db'}")
        executions, runs = _rows(engine)
        wait_for(
            "the daemon's runs to end",
            lambda: all(r.is_finished for r in instance.get_runs()),
            60,
            children,
        )
        statuses = {(r.job_name, r.status) for r in instance.get_runs()}
    assert any("The UI's dagster-daemon is running on this instance" in line for line in lines)
    # The key file the demo made after the daemon loaded is found when its run sends.
    assert any("the webhook receiver got 1 request(s), 1 with a valid signature" in line for line in lines)
    # All the demo's work done by the daemon, nothing failed or left pending (the agent's follow-up
    # is due tomorrow; ben's refused request is kept as a REFUSED agent run).
    assert [s for _, s in executions] == ["SUCCEEDED"] * 5 + ["SCHEDULED"] and runs == 4
    # The rollup too: the demo queued its run, the UI's daemon launched it.
    assert {status for _, status in statuses} == {dg.DagsterRunStatus.SUCCESS}
    assert {job for job, _ in statuses} == {"marketing_execution_job", "agent_run_job", "measurement_rollup_job"}


def test_the_demo_home_has_the_repositorys_instance_settings() -> None:
    # The package cannot read the repository's dagster.yaml once installed, so it carries a copy;
    # this keeps the two from drifting apart.
    import yaml

    from marketing_pipelines.local_dagster import DAGSTER_YAML
    from marketing_pipelines_tests.processes import REPO_ROOT

    local, repository = yaml.safe_load(DAGSTER_YAML), yaml.safe_load((REPO_ROOT / "dagster.yaml").read_text())
    # The one difference, on purpose: the local home runs the daemon's loops on its own thread, so a stop
    # of `ui` cuts no tick (local_dagster.DAGSTER_YAML says why; test_ui_stop.py shows it).
    assert local["sensors"] == {"use_threads": False} and local.pop("backfills") == {"use_threads": False}
    assert local["run_coordinator"]["config"].pop("dequeue_use_threads") is False
    for config in (local, repository):
        config.pop("sensors")
        config["run_coordinator"]["config"] = {
            key: value
            for key, value in config["run_coordinator"]["config"].items()
            if key not in ("dequeue_use_threads", "dequeue_num_workers")
        }
    assert local == repository
