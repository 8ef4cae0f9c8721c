"""unattended operation: indexes for queue health and a run's executions; REFUSED agent runs

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 20:30:00
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

OLD_AGENT_STATUSES = ("QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")
NEW_AGENT_STATUSES = (*OLD_AGENT_STATUSES, "REFUSED")


def _agent_status_check(statuses: tuple[str, ...]) -> None:
    # SQLite cannot alter a CHECK in place: batch mode rebuilds the table (env.py sets render_as_batch).
    with op.batch_alter_table("agent_run") as batch:
        batch.drop_constraint(op.f("ck_agent_run_status"), type_="check")
        batch.create_check_constraint(op.f("ck_agent_run_status"), f"status IN {statuses!r}")


def upgrade() -> None:
    # `status` answers "failed / succeeded in the last hour" from these, not by reading finished rows.
    op.create_index("ix_marketing_execution_finished", "marketing_execution", ["status", "finished_at"])
    op.create_index("ix_agent_run_finished", "agent_run", ["status", "finished_at"])
    # A run's executions are found through their attempts, not through a run tag per execution.
    op.create_index("ix_marketing_execution_attempt_run", "marketing_execution_attempt", ["run_id"])
    _agent_status_check(NEW_AGENT_STATUSES)


def downgrade() -> None:
    op.execute("DELETE FROM agent_run WHERE status = 'REFUSED'")
    _agent_status_check(OLD_AGENT_STATUSES)
    op.drop_index("ix_marketing_execution_attempt_run", table_name="marketing_execution_attempt")
    op.drop_index("ix_agent_run_finished", table_name="agent_run")
    op.drop_index("ix_marketing_execution_finished", table_name="marketing_execution")
