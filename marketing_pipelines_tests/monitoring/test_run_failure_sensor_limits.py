"""What Dagster 1.13.27's ``run_failure_sensor`` does with failed runs, on a real instance with real runs.

These are the behaviours that keep ``marketing_alerts_sensor`` on a cursor of its own
(docs/ARCHITECTURE.md, "Watching it unattended"): whatever the function does with a run, raise or
decline, the sensor's cursor moves past it; it is called once per run; and the cursor is not ours
to set. If a Dagster upgrade changes any of them, this file fails and the decision is worth
revisiting.
"""

from __future__ import annotations

import dagster as dg
import pytest
from dagster._core.definitions.sensor_definition import SensorExecutionData


@dg.op
def explode() -> None:
    raise RuntimeError("boom")


@dg.job
def watched_job() -> None:
    explode()


def _fail(instance: dg.DagsterInstance, n: int) -> list[str]:
    """``n`` failed runs of ``watched_job``, oldest first."""
    results = [watched_job.execute_in_process(instance=instance, raise_on_error=False) for _ in range(n)]
    assert not any(r.success for r in results)
    return [r.run_id for r in results]


def _tick(sensor: dg.SensorDefinition, instance: dg.DagsterInstance, cursor: str | None) -> SensorExecutionData:
    # evaluate_tick is what the code server runs for a daemon tick (dagster/_grpc/impl.py); calling the
    # decorated function directly would skip the cursor handling these tests are about.
    return sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=cursor))


def _started(sensor: dg.SensorDefinition, instance: dg.DagsterInstance) -> str:
    first = _tick(sensor, instance, None)
    assert first.skip_message and first.skip_message.startswith("Initiating")  # the first tick only sets its cursor
    assert first.cursor is not None
    return first.cursor


def test_a_run_whose_evaluation_raised_is_never_seen_again(instance: dg.DagsterInstance) -> None:
    seen: list[str] = []

    @dg.run_failure_sensor(monitored_jobs=[watched_job])
    def deliver(context: dg.RunFailureSensorContext) -> None:
        seen.append(context.dagster_run.run_id)
        if len(seen) == 1:
            raise ConnectionError("the receiver is down")

    cursor = _started(deliver, instance)
    first, second = _fail(instance, 2)
    tick = _tick(deliver, instance, cursor)
    # The error goes to the tick (the daemon marks it FAILURE), and the cursor moves past the run all the
    # same: _handle_run_reactions in dagster/_daemon/sensor.py stores it ("side effects that we don't want
    # to repeat").
    assert [(r.dagster_run.run_id, r.error is not None) for r in tick.dagster_run_reactions or []] == [
        (first, True),
        (second, False),
    ]
    assert tick.cursor != cursor
    # With the receiver back, later ticks never offer the first run again: its alert is lost.
    for _ in range(2):
        tick = _tick(deliver, instance, tick.cursor)
    assert seen == [first, second]


def test_declining_a_run_moves_past_it_and_ends_the_tick(instance: dg.DagsterInstance) -> None:
    seen: list[str] = []

    @dg.run_failure_sensor(monitored_jobs=[watched_job])
    def decline(context: dg.RunFailureSensorContext) -> dg.SkipReason:
        seen.append(context.dagster_run.run_id)
        return dg.SkipReason("not delivered, try later")

    cursor: str | None = _started(decline, instance)
    runs = _fail(instance, 3)
    for _ in range(4):
        tick = _tick(decline, instance, cursor)
        cursor = tick.cursor
    # One run per tick (a returned value ends the evaluation), each offered once: "try later" is not
    # something the function can say, and a burst of N failures takes N ticks.
    assert seen == runs


def test_the_function_is_called_once_per_run_and_five_runs_per_tick(instance: dg.DagsterInstance) -> None:
    calls: list[list[str]] = []

    @dg.run_failure_sensor(monitored_jobs=[watched_job])
    def collect(context: dg.RunFailureSensorContext) -> None:
        calls.append([context.dagster_run.run_id])

    cursor = _started(collect, instance)
    runs = _fail(instance, 7)
    tick = _tick(collect, instance, cursor)
    # DAGSTER_RUN_STATUS_SENSOR_PROCESS_LIMIT, default 5: one call with one run each, the rest next tick.
    assert calls == [[r] for r in runs[:5]]
    _tick(collect, instance, tick.cursor)
    assert calls == [[r] for r in runs]


def test_the_cursor_is_not_the_functions_to_keep(instance: dg.DagsterInstance) -> None:
    @dg.run_failure_sensor(monitored_jobs=[watched_job])
    def keep_state(context: dg.RunFailureSensorContext) -> dg.SensorResult:
        return dg.SensorResult(cursor='{"pending": ["a run"]}')

    cursor = _started(keep_state, instance)
    _fail(instance, 1)
    with pytest.raises(dg.DagsterInvariantViolationError, match="The cursor is managed by the sensor"):
        _tick(keep_state, instance, cursor)
