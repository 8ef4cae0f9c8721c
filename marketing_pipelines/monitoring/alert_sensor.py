"""``marketing_alerts_sensor``: tells the alert webhook about failed runs and checks gone to ERROR, once.

Built on what Dagster already records, not on a loop of its own: failed runs are the instance's
``RUN_FAILURE`` events (the ones ``run_failure_sensor`` reads), checks are its asset check
executions. The cursor holds the last run-failure event's storage id and, per check, the last
execution seen and whether the check was failing at ERROR. It advances only when the message was
delivered (or alerts are off), so a receiver that is down gets the alert at a later tick, and a
restarted daemon, which resumes from the persisted cursor, never repeats one.

One tick sends at most one message, counting everything it found: a burst of failures in a minute
is one message. A check is alerted on when it goes to failing at ERROR, not at every evaluation
while it stays there; its recovery gives one short line.

Not a ``run_failure_sensor``: Dagster moves its cursor past a run whether the function delivered,
declined or raised, and calls it once per run (docs/ARCHITECTURE.md, "Why the alerts keep their own
cursor"; ``test_run_failure_sensor_limits.py`` asserts both).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines.agents.jobs import agent_run_job
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.executions.jobs import marketing_execution_job
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.monitoring.alerts import (
    ALERT_URL_ENV,
    Alert,
    AlertWebhook,
    CheckChange,
    describe_failed_runs,
    failure_reason,
    format_alert,
)

WATCHED_JOBS = frozenset({marketing_execution_job.name, agent_run_job.name})
# Run-failure events read per tick; more wait for the next tick (the cursor stops at the last read).
FETCH_LIMIT = 100
# Executions of one check read per tick: at one evaluation a minute, far more than a tick sees.
CHECK_HISTORY_LIMIT = 50
CURSOR_VERSION = 1


@dataclass(frozen=True)
class CheckState:
    last_id: int  # the last asset check execution record read
    at_error: bool  # its latest evaluation failed at severity ERROR


@dataclass(frozen=True)
class AlertCursor:
    run_failure_storage_id: int
    checks: Mapping[str, CheckState] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "v": CURSOR_VERSION,
                "run_failure_storage_id": self.run_failure_storage_id,
                "checks": {name: [s.last_id, s.at_error] for name, s in sorted(self.checks.items())},
            }
        )

    @classmethod
    def from_json(cls, text: str | None) -> AlertCursor | None:
        """The cursor, or None when there is none (the first tick) or it is not one of ours."""
        try:
            data = json.loads(text or "")
            return cls(
                int(data["run_failure_storage_id"]),
                {str(name): CheckState(int(i), bool(e)) for name, (i, e) in data["checks"].items()},
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


@dataclass(frozen=True)
class RunFailure:
    storage_id: int
    run_id: str
    job_name: str
    failed_at: datetime
    reason: str


def run_failures_after(instance: dg.DagsterInstance, after_storage_id: int) -> tuple[list[RunFailure], int]:
    """Failures of the watched jobs' runs recorded after ``after_storage_id``, oldest first, and the
    storage id to resume after (past other jobs' failures too)."""
    records = instance.fetch_run_status_changes(
        # The job filter is applied here, not in storage: SQLite's run-sharded storage ignores it.
        dg.RunStatusChangeRecordsFilter(dg.DagsterEventType.RUN_FAILURE, after_storage_id=after_storage_id),
        limit=FETCH_LIMIT,
        ascending=True,
    ).records
    failures = []
    for record in records:
        entry = record.event_log_entry
        if entry.job_name not in WATCHED_JOBS:
            continue
        event = entry.dagster_event
        data = event.event_specific_data if event else None
        error = getattr(data, "error", None)
        message = error.message if error is not None else (event.message if event else entry.user_message)
        failures.append(
            RunFailure(
                record.storage_id,
                entry.run_id,
                entry.job_name or "",
                datetime.fromtimestamp(entry.timestamp, UTC),
                failure_reason(message),
            )
        )
    return failures, max([after_storage_id, *(r.storage_id for r in records)])


def latest_run_failure_storage_id(instance: dg.DagsterInstance) -> int:
    records = instance.fetch_run_status_changes(dg.DagsterEventType.RUN_FAILURE, limit=1).records
    return records[0].storage_id if records else 0


def watched_checks(repository_def: dg.RepositoryDefinition | None) -> list[dg.AssetCheckKey]:
    """Every asset check of the code location: the queue health checks and any other that can reach ERROR."""
    if repository_def is None:
        return []
    return sorted(repository_def.asset_graph.asset_check_keys, key=lambda k: k.to_user_string())


def _evaluation(entry: dg.EventLogEntry | None) -> dg.AssetCheckEvaluation | None:
    """The evaluation a check execution record's event holds (None while the check is only planned)."""
    event = entry.dagster_event if entry else None
    data = event.event_specific_data if event else None
    return data if isinstance(data, dg.AssetCheckEvaluation) else None


def _check_detail(evaluation: dg.AssetCheckEvaluation) -> str:
    values = [
        f"{name}={entry.value:g}" if isinstance(entry.value, float) else f"{name}={entry.value}"
        for name, entry in list(evaluation.metadata.items())[:4]
        if isinstance(entry.value, (int, float, str))
    ]
    return "; ".join(filter(None, [evaluation.description or "", ", ".join(values)]))


def check_changes(
    instance: dg.DagsterInstance, keys: Sequence[dg.AssetCheckKey], states: Mapping[str, CheckState]
) -> tuple[list[CheckChange], dict[str, CheckState]]:
    """Checks that went to failing at ERROR, or came back, since ``states``; and the new states."""
    storage = instance.event_log_storage
    latest = storage.get_latest_asset_check_execution_by_key(list(keys))
    changes: list[CheckChange] = []
    new_states: dict[str, CheckState] = {}
    for key in keys:
        name = key.to_user_string()
        state = states.get(name, CheckState(0, False))
        newest = latest.get(key)
        if newest is None or newest.id <= state.last_id:
            new_states[name] = state
            continue
        history = storage.get_asset_check_execution_history(key, limit=CHECK_HISTORY_LIMIT)
        last_id, at_error, entered, detail, at = state.last_id, state.at_error, False, "", None
        for record in sorted((r for r in history if r.id > state.last_id), key=lambda r: r.id):
            evaluation = _evaluation(record.event)
            if evaluation is None:
                run = instance.get_run_by_id(record.run_id) if record.run_id else None
                if run is not None and not run.is_finished:
                    break  # its evaluation will update this very record: read it again next tick
                last_id = record.id
                continue
            now_at_error = not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR
            if now_at_error != at_error:
                at = datetime.fromtimestamp(record.event.timestamp if record.event else record.create_timestamp, UTC)
                if now_at_error and not entered:
                    entered, detail = True, _check_detail(evaluation)
            last_id, at_error = record.id, now_at_error
        new_states[name] = CheckState(last_id, at_error)
        if at is not None and (entered or (state.at_error and not at_error)):
            changes.append(CheckChange(name, at, entered_error=entered, at_error_now=at_error, description=detail))
    return changes, new_states


def baseline(instance: dg.DagsterInstance, keys: Sequence[dg.AssetCheckKey]) -> AlertCursor:
    """The cursor of a first tick: everything recorded so far counts as already told."""
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key(list(keys))
    checks = {}
    for key, record in latest.items():
        evaluation = _evaluation(record.event)
        at_error = (
            evaluation is not None and not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.ERROR
        )
        checks[key.to_user_string()] = CheckState(record.id, at_error)
    return AlertCursor(latest_run_failure_storage_id(instance), checks)


def _describe(app_db: AppDatabase | None, failures: Sequence[RunFailure], changes: Sequence[CheckChange]) -> Alert:
    """The alert with what the application database says each failed run held (``app_db`` None: not read)."""
    runs = [(f.run_id, f.job_name, f.failed_at, f.reason) for f in failures]
    jobs = (marketing_execution_job.name, agent_run_job.name)
    if app_db is None:
        return Alert(describe_failed_runs(None, runs, *jobs), changes)
    engine = app_db.ready_engine_or_skip()
    if isinstance(engine, dg.SkipReason):
        return Alert(describe_failed_runs(None, runs, *jobs, unavailable=engine.skip_message), changes)
    try:
        with engine.connect() as conn:
            return Alert(describe_failed_runs(conn, runs, *jobs), changes)
    except sa.exc.SQLAlchemyError as exc:
        # The alert matters more than its details: a database that fails is often why runs fail.
        return Alert(describe_failed_runs(None, runs, *jobs, unavailable=f"{type(exc).__name__} reading them"), changes)


@dg.sensor(
    name="marketing_alerts_sensor",
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Alerts a Slack-compatible webhook (MARKETING_ALERT_WEBHOOK_URL) once per failed execution or agent run "
        "and per asset check gone to failing at ERROR; one message per tick counts them all."
    ),
)
def marketing_alerts_sensor(
    context: dg.SensorEvaluationContext, alerts: AlertWebhook, webhook: WebhookClient, app_db: AppDatabase
) -> dg.SensorResult:
    keys = watched_checks(context.repository_def)
    cursor = AlertCursor.from_json(context.cursor)
    if cursor is None:
        return dg.SensorResult(
            skip_reason="First tick: alerts start from now; earlier failures are not sent.",
            cursor=baseline(context.instance, keys).to_json(),
        )
    failures, run_cursor = run_failures_after(context.instance, cursor.run_failure_storage_id)
    changes, states = check_changes(context.instance, keys, cursor.checks)
    advanced = AlertCursor(run_cursor, states).to_json()
    if not failures and not changes:
        return dg.SensorResult(skip_reason="Nothing failed since the last tick.", cursor=advanced)
    if not alerts.enabled:
        # Advanced all the same: turning alerts on later must not send a backlog of old failures.
        summary = _describe(None, failures, changes).summary()
        return dg.SensorResult(
            skip_reason=f"Alerts are off ({ALERT_URL_ENV} is not set): {summary} not sent.", cursor=advanced
        )
    alert = _describe(app_db, failures, changes)
    delivery = alerts.send(format_alert(alert, alerts.dagster_ui_url), webhook)
    if not delivery.delivered:
        # The cursor stays: the next tick sends these again, with whatever failed meanwhile.
        return dg.SensorResult(
            skip_reason=f"Alert ({alert.summary()}) not delivered, retried next tick: {delivery.detail}"
        )
    return dg.SensorResult(skip_reason=f"Alerted {alert.summary()}: {delivery.detail}.", cursor=advanced)
