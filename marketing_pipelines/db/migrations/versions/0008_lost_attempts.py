"""lost attempts: how many of a row's attempts its workers lost before recording an outcome

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04 17:45:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TABLES = ("marketing_execution", "agent_run")


def upgrade() -> None:
    # A constant server default: PostgreSQL 11+ adds the column without rewriting the table.
    for table in TABLES:
        op.add_column(
            table,
            sa.Column(
                "lost_attempts",
                sa.Integer,
                nullable=False,
                server_default="0",
                comment="Attempts lost to the infrastructure (lease expired, run failed first); not spent",
            ),
        )


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("lost_attempts")
