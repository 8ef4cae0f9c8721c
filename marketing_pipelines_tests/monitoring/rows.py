"""Rows of both queues in a chosen status and at chosen times, for the queue health tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from marketing_pipelines.agents.users import add_user
from marketing_pipelines.db.schema import agent_run, marketing_execution
from marketing_pipelines_tests.factories import add_campaign

CAMPAIGN = "spring-launch"
USER = "ana"


def prepare(engine: sa.Engine) -> None:
    """The campaign and user every row below refers to."""
    add_campaign(engine, CAMPAIGN)
    with engine.begin() as conn:
        add_user(conn, USER)


def add_execution(engine: sa.Engine, status: str, due_at: datetime, finished_at: datetime | None = None) -> None:
    now = datetime.now(UTC)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(marketing_execution).values(
                campaign_id=CAMPAIGN,
                stage="launch",
                action="log",
                payload={},
                due_at=due_at,
                status=status,
                created_at=due_at - timedelta(days=1),
                updated_at=now,
                finished_at=finished_at,
            )
        )


def add_agent_run(engine: sa.Engine, status: str, requested_at: datetime, finished_at: datetime | None = None) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.insert(agent_run).values(
                agent="planner",
                campaign_id=CAMPAIGN,
                input={},
                status=status,
                requested_by=USER,
                permissions=[],
                model_provider="offline",
                requested_at=requested_at,
                max_run_seconds=300,
                updated_at=datetime.now(UTC),
                finished_at=finished_at,
            )
        )
