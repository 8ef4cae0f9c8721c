"""The shipped ``retention:`` block is what Dagster's daemon applies: old ticks of a sensor and of a schedule,
stored in a real instance, are deleted by the daemon's own tick code (``dagster._daemon.sensor`` and
``dagster._scheduler.scheduler``, which purge an instigator's old ticks each time they tick it), by status and age
as deploy/dagster.yaml says; younger ones stay.

The instance is SQLite (``instance_for_test``) with the block read from deploy/dagster.yaml; the code location is
``tick_retention_location`` in a code server of its own, as the daemon loads the project's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from dagster._core.definitions.run_request import InstigatorType
from dagster._core.remote_representation.external import RemoteSchedule, RemoteSensor
from dagster._core.scheduler.instigation import TickData, TickStatus
from dagster._core.test_utils import create_test_daemon_workspace_context, load_remote_repo
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import ModuleTarget
from dagster._daemon.sensor import execute_sensor_iteration
from dagster._scheduler.scheduler import launch_scheduled_runs
from dagster._utils.error import SerializableErrorInfo

# A code server process and the daemon's tick code: seconds, like the other tests of real Dagster processes.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
LOGGER = logging.getLogger("test_tick_retention")


def shipped_retention() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "deploy" / "dagster.yaml").read_text(encoding="utf-8"))["retention"]


@pytest.fixture(scope="module")
def workspace() -> Iterator[WorkspaceProcessContext]:
    with (
        dg.instance_for_test(overrides={"retention": shipped_retention()}) as instance,
        create_test_daemon_workspace_context(
            ModuleTarget(
                module_name="marketing_pipelines_tests.tick_retention_location",
                attribute=None,
                working_directory=str(ROOT),
                location_name="tick_retention",
            ),
            instance,
        ) as context,
    ):
        yield context


def _repo(workspace: WorkspaceProcessContext) -> Any:
    return load_remote_repo(workspace, "__repository__")


def _store_ticks(
    instance: dg.DagsterInstance, instigator: RemoteSensor | RemoteSchedule, kind: InstigatorType, ages: dict[str, Any]
) -> dict[str, int]:
    """One tick per (status, days old) in ``ages``, stored as the daemon stores them; their ids by label."""
    now = datetime.now(UTC)
    ids = {}
    for label, (status, days) in ages.items():
        tick = instance.create_tick(
            TickData(
                instigator_origin_id=instigator.get_remote_origin_id(),
                instigator_name=instigator.name,
                instigator_type=kind,
                status=status,
                timestamp=(now - timedelta(days=days)).timestamp(),
                selector_id=instigator.selector_id,
                run_ids=["a-run-id"] if status == TickStatus.SUCCESS else [],
                error=SerializableErrorInfo("evaluation failed", [], "Exception")
                if status == TickStatus.FAILURE
                else None,
                skip_reason="nothing to do" if status == TickStatus.SKIPPED else None,
            )
        )
        ids[label] = tick.tick_id
    return ids


def _kept(instance: dg.DagsterInstance, instigator: RemoteSensor | RemoteSchedule, ids: dict[str, int]) -> set[str]:
    remaining = {t.tick_id for t in instance.get_ticks(instigator.get_remote_origin_id(), instigator.selector_id)}
    return {label for label, tick_id in ids.items() if tick_id in remaining}


# Each status just past and just within deploy/dagster.yaml's days (sensor: skipped 1, success 7, failure and
# started 30).
SENSOR_TICKS = {
    "skipped 2 days ago": (TickStatus.SKIPPED, 2),
    "skipped 12 hours ago": (TickStatus.SKIPPED, 0.5),
    "succeeded 8 days ago": (TickStatus.SUCCESS, 8),
    "succeeded 6 days ago": (TickStatus.SUCCESS, 6),
    "failed 31 days ago": (TickStatus.FAILURE, 31),
    "failed 29 days ago": (TickStatus.FAILURE, 29),
    "started 31 days ago": (TickStatus.STARTED, 31),
}


def test_the_sensor_daemon_purges_old_ticks_by_the_shipped_days(workspace: WorkspaceProcessContext) -> None:
    instance = workspace.instance
    assert instance.get_tick_retention_settings(InstigatorType.SENSOR) == {
        TickStatus.SKIPPED: 1,
        TickStatus.SUCCESS: 7,
        TickStatus.FAILURE: 30,
        TickStatus.STARTED: 30,
    }
    sensor = _repo(workspace).get_sensor("always_skipping_sensor")
    ids = _store_ticks(instance, sensor, InstigatorType.SENSOR, SENSOR_TICKS)

    # One pass of the sensor daemon's loop: it evaluates the running sensor, records its tick, and purges.
    list(execute_sensor_iteration(workspace, LOGGER, threadpool_executor=None, submit_threadpool_executor=None))

    assert _kept(instance, sensor, ids) == {"skipped 12 hours ago", "succeeded 6 days ago", "failed 29 days ago"}
    [latest, *_] = instance.get_ticks(sensor.get_remote_origin_id(), sensor.selector_id)
    assert (latest.status, latest.skip_reason) == (TickStatus.SKIPPED, "nothing to do")


SCHEDULE_TICKS = {
    "skipped 91 days ago": (TickStatus.SKIPPED, 91),
    "succeeded 91 days ago": (TickStatus.SUCCESS, 91),
    "failed 91 days ago": (TickStatus.FAILURE, 91),
    "succeeded 89 days ago": (TickStatus.SUCCESS, 89),
    "skipped 2 days ago": (TickStatus.SKIPPED, 2),
}


def test_the_scheduler_purges_old_ticks_by_the_shipped_days(workspace: WorkspaceProcessContext) -> None:
    instance = workspace.instance
    assert set(instance.get_tick_retention_settings(InstigatorType.SCHEDULE).values()) == {90}
    schedule = _repo(workspace).get_schedule("every_minute_schedule")
    ids = _store_ticks(instance, schedule, InstigatorType.SCHEDULE, SCHEDULE_TICKS)

    # The scheduler's first pass starts the schedule (declared RUNNING in code); the pass a minute later ticks
    # it once, and that tick purges.
    start = datetime.now(UTC)
    list(launch_scheduled_runs(workspace, LOGGER, start, {}))
    list(launch_scheduled_runs(workspace, LOGGER, start + timedelta(seconds=61), {}))

    assert _kept(instance, schedule, ids) == {"succeeded 89 days ago", "skipped 2 days ago"}
    ticks = instance.get_ticks(schedule.get_remote_origin_id(), schedule.selector_id)
    assert [t.status for t in ticks if t.tick_id not in ids.values()] == [TickStatus.SKIPPED]
