"""campaigns and executions

Revision ID: 0001
Revises:
Create Date: 2026-12-02 19:23:39.299360
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "campaign",
        sa.Column("id", sa.String(length=64), nullable=False, comment="Slug, e.g. spring-launch"),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("utm_campaign", sa.String(length=200), nullable=True, comment="Site analytics mapping"),
        sa.Column("github_repo", sa.String(length=200), nullable=True, comment="owner/name; release downloads mapping"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_campaign")),
        sa.UniqueConstraint("utm_campaign", name=op.f("uq_campaign_utm_campaign")),
    )
    op.create_table(
        "marketing_execution",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("campaign_id", sa.String(length=64), nullable=False),
        sa.Column("stage", sa.String(length=64), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column(
            "payload", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.Column("due_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(length=16), server_default="SCHEDULED", nullable=False),
        sa.Column("lease_owner", sa.String(length=200), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_attempts", sa.Integer(), server_default="3", nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=True, comment="Dagster run of the latest attempt"),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("dedupe_key", sa.String(length=200), nullable=True, comment="Caller key for idempotent scheduling"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('SCHEDULED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED')",
            name=op.f("ck_marketing_execution_status"),
        ),
        sa.CheckConstraint("max_attempts >= 1", name=op.f("ck_marketing_execution_max_attempts")),
        sa.ForeignKeyConstraint(
            ["campaign_id"], ["campaign.id"], name=op.f("fk_marketing_execution_campaign_id_campaign")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_marketing_execution")),
        sa.UniqueConstraint("dedupe_key", name=op.f("uq_marketing_execution_dedupe_key")),
    )
    op.create_index("ix_marketing_execution_campaign", "marketing_execution", ["campaign_id", "due_at"], unique=False)
    op.create_index(
        "ix_marketing_execution_due",
        "marketing_execution",
        ["due_at", "id"],
        unique=False,
        postgresql_where=sa.text("status = 'SCHEDULED'"),
        sqlite_where=sa.text("status = 'SCHEDULED'"),
    )
    op.create_index(
        "ix_marketing_execution_lease",
        "marketing_execution",
        ["lease_expires_at"],
        unique=False,
        postgresql_where=sa.text("status = 'RUNNING'"),
        sqlite_where=sa.text("status = 'RUNNING'"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_marketing_execution_lease",
        table_name="marketing_execution",
        postgresql_where=sa.text("status = 'RUNNING'"),
        sqlite_where=sa.text("status = 'RUNNING'"),
    )
    op.drop_index(
        "ix_marketing_execution_due",
        table_name="marketing_execution",
        postgresql_where=sa.text("status = 'SCHEDULED'"),
        sqlite_where=sa.text("status = 'SCHEDULED'"),
    )
    op.drop_index("ix_marketing_execution_campaign", table_name="marketing_execution")
    op.drop_table("marketing_execution")
    op.drop_table("campaign")
