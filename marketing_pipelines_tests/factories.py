"""Small builders for test data, on the real tables through the project's own functions."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

import dagster as dg
import datasketches
import sqlalchemy as sa

from marketing_pipelines import run_tags
from marketing_pipelines.agents.jobs import agent_run_job
from marketing_pipelines.agents.queue import request_agent_run
from marketing_pipelines.db.campaigns import Campaign, upsert_campaign
from marketing_pipelines.db.schema import marketing_execution
from marketing_pipelines.executions.jobs import marketing_execution_job
from marketing_pipelines.executions.queue import EXECUTIONS
from marketing_pipelines.executions.sensors import executions_of_run
from marketing_pipelines.leasing.claims import take_over_rows
from marketing_pipelines.measurement import sketches
from marketing_pipelines.measurement.rollup.daily import RollupSummary, replace_rollup_days
from marketing_pipelines.monitoring.alert_sensor import run_failures_after
from marketing_pipelines.monitoring.alerts import Alert, describe_failed_runs, format_alert
from marketing_pipelines.settings import Settings, env_name, load_settings


def add_campaign(engine: sa.Engine, campaign_id: str = "spring-launch", **kw: Any) -> str:
    with engine.begin() as conn:
        upsert_campaign(conn, Campaign(id=campaign_id, name=kw.pop("name", campaign_id), owner="ana", **kw))
    return campaign_id


def bulk_due_executions(
    engine: sa.Engine, n: int, campaign_id: str = "spring-launch", max_attempts: int = 3, action: str = "log"
) -> None:
    """Insert ``n`` executions already due, spread over the last hour, in one statement."""
    now = datetime.now(UTC)
    rows = [
        {
            "campaign_id": campaign_id,
            "stage": "launch",
            "action": action,
            "payload": {"message": f"hello {i}"},
            "due_at": now - timedelta(seconds=3600 - i % 3600),
            "status": "SCHEDULED",
            "attempts": 0,
            "max_attempts": max_attempts,
            "created_at": now,
            "updated_at": now,
        }
        for i in range(n)
    ]
    with engine.begin() as conn:
        conn.execute(sa.insert(marketing_execution), rows)


def start_run(engine: sa.Engine, claimed_by: str, execution_ids: Sequence[int]) -> str:
    """Take a batch run's executions over from their claim, as the run does when it starts (no action);
    returns the owner the rows are leased to now."""
    run_id = f"{claimed_by}-run-{execution_ids[0]}"
    return take_over_rows(
        engine, EXECUTIONS, execution_ids, claimed_by=claimed_by, run_id=run_id, lease_seconds=300, log=print
    ).owner


def start_runs(engine: sa.Engine, requests: Sequence[Any]) -> None:
    """``start_run`` for each run request of a claiming tick."""
    for request in requests:
        start_run(engine, request.tags[run_tags.CLAIMED_BY], executions_of_run(request.run_config))


# The settings read from the services' own variables: credentials, models and addresses of the importers
# and model providers. A test gives them by variable name, as a deployment's environment would.
SERVICE_SETTINGS = tuple(name for name, info in Settings.model_fields.items() if info.validation_alias)


def settings_from(environ: Mapping[str, str]) -> Settings:
    """Settings whose services' variables are exactly ``environ``'s (by their own names), whatever this
    process's environment holds; every MARKETING_ setting as the environment has it. An empty value
    counts as unset, as it does in the environment (``env_ignore_empty``)."""
    by_variable = {env_name(field): field for field in SERVICE_SETTINGS}
    unset = {field: Settings.model_fields[field].default for field in SERVICE_SETTINGS}
    given = {by_variable[name]: value for name, value in environ.items() if value != ""}
    return load_settings(**(unset | given))


def request_offline_analysis(conn: sa.Connection, requested_by: str, campaign_id: str = "spring-launch") -> int:
    """One queued measurement_analyst run on the offline model, as a user with no provider key requests it."""
    return request_agent_run(
        conn,
        agent="measurement_analyst",
        campaign_id=campaign_id,
        requested_by=requested_by,
        provider="offline",
        settings=settings_from({}),
    )


def request_brief(conn: sa.Connection, provider: str = "anthropic", requested_by: str = "ana", **kw: Any) -> int:
    """One queued campaign_brief run (spring-launch, stage launch) on ``provider``, requested where the provider
    is configured: the key the run sends is its provider resource's, not these settings'."""
    return request_agent_run(
        conn,
        agent="campaign_brief",
        campaign_id="spring-launch",
        requested_by=requested_by,
        input={"stage": "launch"},
        provider=provider,
        settings=settings_from({"ANTHROPIC_API_KEY": "k", "OPENAI_API_KEY": "k"}),
        **kw,
    )


def replace_rollup_day(engine: sa.Engine, day: date) -> RollupSummary:
    """Rebuild one day of ``measurement_daily_rollup``, then its week, as a range run does for each of its days."""
    [summary] = replace_rollup_days(engine, [day])
    return summary


def sketch_of(actor_ids: Iterable[str]) -> datasketches.hll_sketch:
    """An HLL sketch of ``actor_ids``, as the rollup builds one per day (tests only: the rollup feeds its own)."""
    sketch = sketches.new_sketch()
    for actor_id in actor_ids:
        sketch.update(actor_id)
    return sketch


def alert_for_failed_runs(instance: dg.DagsterInstance, engine: sa.Engine) -> str:
    """The alert text marketing_alerts_sensor would send for every failed run on ``instance``."""
    failures, _ = run_failures_after(instance, 0)
    with engine.connect() as conn:
        failed = describe_failed_runs(
            conn,
            [(f.run_id, f.job_name, f.failed_at, f.reason) for f in failures],
            marketing_execution_job.name,
            agent_run_job.name,
        )
    return format_alert(Alert(failed))


def dump_app_database(engine: sa.Engine) -> str:
    """Every row of every table of the application database, as JSON text: what a database dump would reveal."""
    with engine.connect() as conn:
        tables = sa.MetaData()
        tables.reflect(conn)
        return "\n".join(
            json.dumps([list(row) for row in conn.execute(sa.select(t))], default=str) for t in tables.sorted_tables
        )
