"""users, permissions, agent runs and token buckets

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 19:32:39.001368
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "app_user",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("display_name", sa.String(length=200), nullable=False),
        sa.Column("active", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_app_user")),
    )
    op.create_table(
        "model_token_bucket",
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("capacity", sa.Float(), nullable=False),
        sa.Column("refill_per_second", sa.Float(), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("capacity > 0", name=op.f("ck_model_token_bucket_capacity")),
        sa.CheckConstraint("refill_per_second > 0", name=op.f("ck_model_token_bucket_refill")),
        sa.CheckConstraint("tokens >= 0", name=op.f("ck_model_token_bucket_tokens")),
        sa.PrimaryKeyConstraint("provider", name=op.f("pk_model_token_bucket")),
    )
    op.create_table(
        "agent_run",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("agent", sa.String(length=64), nullable=False),
        sa.Column("campaign_id", sa.String(length=64), nullable=False),
        sa.Column(
            "input", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.Column("status", sa.String(length=16), server_default="QUEUED", nullable=False),
        sa.Column("requested_by", sa.String(length=64), nullable=False),
        sa.Column(
            "permissions",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
            comment="Permission set captured at request time",
        ),
        sa.Column("model_provider", sa.String(length=32), nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lease_owner", sa.String(length=200), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_attempts", sa.Integer(), server_default="2", nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=True),
        sa.Column("max_run_seconds", sa.Integer(), nullable=False),
        sa.Column(
            "output", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=True
        ),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "status IN ('QUEUED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED')", name=op.f("ck_agent_run_status")
        ),
        sa.CheckConstraint("max_attempts >= 1", name=op.f("ck_agent_run_max_attempts")),
        sa.CheckConstraint("max_run_seconds >= 1", name=op.f("ck_agent_run_max_run_seconds")),
        sa.ForeignKeyConstraint(["campaign_id"], ["campaign.id"], name=op.f("fk_agent_run_campaign_id_campaign")),
        sa.ForeignKeyConstraint(["requested_by"], ["app_user.id"], name=op.f("fk_agent_run_requested_by_app_user")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agent_run")),
    )
    op.create_index(
        "ix_agent_run_lease",
        "agent_run",
        ["lease_expires_at"],
        unique=False,
        postgresql_where=sa.text("status = 'RUNNING'"),
        sqlite_where=sa.text("status = 'RUNNING'"),
    )
    op.create_index(
        "ix_agent_run_queued",
        "agent_run",
        ["requested_at", "id"],
        unique=False,
        postgresql_where=sa.text("status = 'QUEUED'"),
        sqlite_where=sa.text("status = 'QUEUED'"),
    )
    op.create_index("ix_agent_run_requested_by", "agent_run", ["requested_by", "requested_at"], unique=False)
    op.create_table(
        "user_permission",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("user_id", sa.String(length=64), nullable=False),
        sa.Column("permission", sa.String(length=64), nullable=False),
        sa.Column("campaign_scope", sa.String(length=64), server_default="*", nullable=False),
        sa.Column("granted_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["app_user.id"], name=op.f("fk_user_permission_user_id_app_user"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_user_permission")),
        sa.UniqueConstraint(
            "user_id", "permission", "campaign_scope", name=op.f("uq_user_permission_user_id_permission_campaign_scope")
        ),
    )
    op.create_table(
        "agent_run_step",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("agent_run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column(
            "kind", sa.String(length=32), nullable=False, comment="model_turn, tool_call, tool_result, denial, error"
        ),
        sa.Column("name", sa.String(length=64), nullable=True),
        sa.Column(
            "content", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_run_id"],
            ["agent_run.id"],
            name=op.f("fk_agent_run_step_agent_run_id_agent_run"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_agent_run_step")),
        sa.UniqueConstraint("agent_run_id", "attempt", "seq", name=op.f("uq_agent_run_step_agent_run_id_attempt_seq")),
    )


def downgrade() -> None:
    op.drop_table("agent_run_step")
    op.drop_table("user_permission")
    op.drop_index("ix_agent_run_requested_by", table_name="agent_run")
    op.drop_index(
        "ix_agent_run_queued",
        table_name="agent_run",
        postgresql_where=sa.text("status = 'QUEUED'"),
        sqlite_where=sa.text("status = 'QUEUED'"),
    )
    op.drop_index(
        "ix_agent_run_lease",
        table_name="agent_run",
        postgresql_where=sa.text("status = 'RUNNING'"),
        sqlite_where=sa.text("status = 'RUNNING'"),
    )
    op.drop_table("agent_run")
    op.drop_table("model_token_bucket")
    op.drop_table("app_user")
