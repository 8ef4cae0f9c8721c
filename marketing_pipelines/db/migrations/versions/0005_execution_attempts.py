"""executions: one row per attempt (its Dagster run, outcome and error)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

OUTCOMES = ("SUCCEEDED", "RESCHEDULED", "FAILED", "CANCELLED", "LEASE_EXPIRED", "LEASE_LOST")


def upgrade() -> None:
    op.create_table(
        "marketing_execution_attempt",
        sa.Column("execution_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=True, comment="Dagster run that performed this attempt"),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True, comment="NULL while the attempt runs"),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint(
            f"outcome IS NULL OR outcome IN {OUTCOMES!r}", name=op.f("ck_marketing_execution_attempt_outcome")
        ),
        sa.ForeignKeyConstraint(
            ["execution_id"],
            ["marketing_execution.id"],
            name=op.f("fk_marketing_execution_attempt_execution_id_marketing_execution"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("execution_id", "attempt", name=op.f("pk_marketing_execution_attempt")),
    )


def downgrade() -> None:
    op.drop_table("marketing_execution_attempt")
