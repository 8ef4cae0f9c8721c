"""`marketing-pipelines backfill` as a user runs it: an asset backfill, which the daemon runs in range runs.

``dagster job backfill`` (what docs/OPERATIONS.md gave before) stopped with DagsterHomeNotSetError where
DAGSTER_HOME was unset and, with it set, submitted one run per day at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.migrate import upgrade
from marketing_pipelines.db.schema import measurement_daily_rollup
from marketing_pipelines.local_dagster import code_location, dagster_home, local_environment
from marketing_pipelines.measurement.assets import RANGE_END_TAG, RANGE_START_TAG
from marketing_pipelines.measurement.backfill import ROLLUP_ASSET, AssetDays, backfill_plan
from marketing_pipelines.measurement.events.write import record_events
from marketing_pipelines.measurement.keys import ROLLUP_KEY
from marketing_pipelines.measurement.sources import PYPI_DOWNLOADS, SITE_ANALYTICS
from marketing_pipelines.settings import load_settings
from marketing_pipelines_tests.factories import add_campaign, settings_from
from marketing_pipelines_tests.test_doc_recipes import newcomer_environment

FIRST, LAST = date(2026, 11, 1), date(2026, 11, 30)


def backfill(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The command in ``folder`` as a newcomer's shell runs it: no DAGSTER_HOME, no MARKETING_* but ``env``."""
    return subprocess.run(
        [sys.executable, "-m", "marketing_pipelines.cli", "backfill", *args],
        cwd=folder,
        env={**newcomer_environment(), "PYTHONPATH": os.environ.get("PYTHONPATH", ""), **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def backfill_through(
    folder: Path, first: date, last: date, workspace: Path, home: Path, days_per_run: int
) -> subprocess.CompletedProcess[str]:
    """The command as a deployment's operator runs it: its workspace, its DAGSTER_HOME, days per run set."""
    return backfill(
        folder,
        "--from",
        first.isoformat(),
        "--to",
        last.isoformat(),
        "-w",
        str(workspace),
        DAGSTER_HOME=str(home),
        MARKETING_BACKFILL_DAYS_PER_RUN=str(days_per_run),
    )


def seeded(folder: Path) -> str:
    """The embedded database in ``folder`` with one event on each of two November days; its URL."""
    url = f"sqlite:///{folder / '.marketing' / 'marketing.db'}"
    (folder / ".marketing").mkdir(exist_ok=True)
    engine = get_engine(url)
    upgrade(engine)
    add_campaign(engine)
    event = {"campaign_id": "spring-launch", "stage": "awareness", "event_type": "page_view", "actor_id": "a"}
    with engine.begin() as conn:
        for n, day in enumerate((3, 20)):
            occurred = datetime(2026, 11, day, 12, tzinfo=UTC).isoformat()
            record_events(conn, [{**event, "event_id": f"e{n}", "occurred_at": occurred}])
    return url


def test_without_dagster_home_it_backfills_the_local_instance_as_one_asset_backfill(tmp_path: Path) -> None:
    seeded(tmp_path)
    done = backfill(tmp_path, "--from", FIRST.isoformat(), "--to", LAST.isoformat())
    assert done.returncode == 0, done.stderr
    home = tmp_path / ".marketing" / "dagster_home"
    with dg.DagsterInstance.from_config(str(home)) as instance:
        [created] = instance.get_backfills()
        assert created.is_asset_backfill and created.asset_selection == [ROLLUP_KEY]
        assert created.asset_backfill_data is not None
        [(key, days)] = created.asset_backfill_data.target_subset.partitions_subsets_by_asset_key.items()
        assert key == ROLLUP_KEY and sorted(days.get_partition_keys()) == [f"2026-11-{d:02}" for d in range(1, 31)]
    assert f"Backfill {created.backfill_id}: measurement_daily_rollup, 2026-11-01..2026-11-30 (30 days)" in done.stdout
    assert "as 1 run(s) of up to 92 days" in done.stdout
    assert "No dagster-daemon serves this instance now" in done.stderr


def test_with_imports_each_importer_is_asked_only_for_the_days_its_source_can_still_read() -> None:
    # PyPI keeps 180 days: a backfill reaching further asks its importer for the readable days only (a run of it
    # over older days fails before any request), Plausible (whole history) for all, the rollup for all.
    today = date(2026, 12, 7)
    configured = settings_from({"PLAUSIBLE_API_KEY": "k", "PLAUSIBLE_SITE_ID": "example.com"}).model_copy(
        update={"pypi_downloads_enabled": True}
    )
    first, last = today - timedelta(days=200), today - timedelta(days=150)
    plan, notes = backfill_plan(configured, True, first, last, today)
    readable = today - timedelta(days=180)
    assert plan == [
        AssetDays(SITE_ANALYTICS.asset, first, last),
        AssetDays(PYPI_DOWNLOADS.asset, readable, last),
        AssetDays(ROLLUP_ASSET, first, last),
    ]
    assert notes == [
        f"pypi_downloads_daily from {readable} only: pypi_downloads can be read only 180 days back; "
        "older days keep their stored rows"
    ]
    # A range wholly older than its lookback leaves the importer out, and says so; without --imports, the rollup.
    older, older_notes = backfill_plan(configured, True, first, first + timedelta(days=5), today)
    assert [p.asset for p in older] == [SITE_ANALYTICS.asset, ROLLUP_ASSET]
    assert older_notes == [
        "pypi_downloads_daily left out: pypi_downloads can be read only 180 days back; "
        "older days keep their stored rows"
    ]
    assert backfill_plan(configured, False, first, last, today) == ([AssetDays(ROLLUP_ASSET, first, last)], [])


def test_the_created_backfill_holds_each_importers_own_days(tmp_path: Path) -> None:
    seeded(tmp_path)
    today = datetime.now(UTC).date()
    first, last = today - timedelta(days=190), today - timedelta(days=170)
    start = (first - timedelta(days=1)).isoformat()
    done = backfill(
        tmp_path,
        "--imports",
        "--from",
        first.isoformat(),
        "--to",
        last.isoformat(),
        MARKETING_PYPI_DOWNLOADS_ENABLED="true",
        MARKETING_MEASUREMENT_START_DATE=start,
    )
    assert done.returncode == 0, done.stderr
    with dg.DagsterInstance.from_config(str(tmp_path / ".marketing" / "dagster_home")) as instance:
        [created] = instance.get_backfills()
    assert created.asset_backfill_data is not None
    subsets = created.asset_backfill_data.target_subset.partitions_subsets_by_asset_key
    days = {key.to_user_string(): sorted(subset.get_partition_keys()) for key, subset in subsets.items()}
    readable = today - timedelta(days=180)
    span = (last - first).days + 1
    assert days[ROLLUP_ASSET] == [(first + timedelta(days=n)).isoformat() for n in range(span)]
    assert days[PYPI_DOWNLOADS.asset] == [
        (readable + timedelta(days=n)).isoformat() for n in range((last - readable).days + 1)
    ]
    assert f"pypi_downloads_daily from {readable} only" in done.stdout


@pytest.mark.parametrize(
    ("first", "last", "error"),
    [
        # Before the partitions' first day (MARKETING_MEASUREMENT_START_DATE, default 2026-01-01).
        ("2025-12-30", "2026-01-02", "--from 2025-12-30 is before the first partition, 2026-01-01"),
        ("2026-11-30", "2026-11-01", "--from 2026-11-30 is after --to 2026-11-01"),
        ("2026-11-01", "2999-01-01", "--to 2999-01-01 is after today"),
        ("2026-11-31", "2026-12-01", "--from '2026-11-31' is not a day like 2026-11-26"),
    ],
)
def test_a_range_without_partitions_is_refused_before_anything_is_created(
    tmp_path: Path, first: str, last: str, error: str
) -> None:
    seeded(tmp_path)
    done = backfill(tmp_path, "--from", first, "--to", last)
    assert done.returncode == 1 and error in done.stderr, done.stderr
    assert not (tmp_path / ".marketing" / "dagster_home").exists()


@pytest.mark.slow
def test_the_daemon_runs_the_backfill_as_range_runs_of_the_deployment_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 40 days at 15 a run: 3 range runs (15, 15, 10 days), each SUCCESS; every day materialized once.
    url = seeded(tmp_path)
    monkeypatch.chdir(tmp_path)
    home = dagster_home()
    env = {**local_environment(load_settings(database_url=url), home), "MARKETING_BACKFILL_DAYS_PER_RUN": "15"}
    with (
        dg.DagsterInstance.from_config(str(home)) as instance,
        code_location(instance, env, start_daemon=True) as workspace,
    ):
        done = backfill_through(tmp_path, date(2026, 10, 22), LAST, workspace, home, days_per_run=15)
        assert done.returncode == 0, done.stderr
        assert "as 3 run(s) of up to 15 days" in done.stdout
        assert "No dagster-daemon" not in done.stderr
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            [created] = instance.get_backfills()
            if created.status.value != "REQUESTED":
                break
            time.sleep(2)
        assert created.status.value == "COMPLETED_SUCCESS", created.status
        runs = instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": created.backfill_id}))
        ranges = sorted((r.tags[RANGE_START_TAG], r.tags[RANGE_END_TAG], r.status) for r in runs)
        success = dg.DagsterRunStatus.SUCCESS
        assert ranges == [
            ("2026-10-22", "2026-11-05", success),
            ("2026-11-06", "2026-11-20", success),
            ("2026-11-21", "2026-11-30", success),
        ]
        assert len(instance.get_materialized_partitions(ROLLUP_KEY)) == 40
    with get_engine(url).connect() as conn:
        days = conn.execute(sa.select(measurement_daily_rollup.c.day).distinct()).scalars().all()
    assert sorted(days) == [date(2026, 11, 3), date(2026, 11, 20)]
