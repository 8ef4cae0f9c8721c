"""SQLAlchemy Core tables of the application database (Alembic migrations create them)."""

from __future__ import annotations

import sqlalchemy as sa

from marketing_pipelines.db.types import BigIntId, JSONType, UTCDateTime

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

EXECUTION_STATUSES = ("SCHEDULED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")


campaign = sa.Table(
    "campaign",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True, comment="Slug, e.g. spring-launch"),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("owner", sa.String(200), nullable=False),
    sa.Column("utm_campaign", sa.String(200), nullable=True, unique=True, comment="Site analytics mapping"),
    sa.Column("github_repo", sa.String(200), nullable=True, comment="owner/name; release downloads mapping"),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
)

marketing_execution = sa.Table(
    "marketing_execution",
    metadata,
    sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
    sa.Column("campaign_id", sa.String(64), sa.ForeignKey("campaign.id"), nullable=False),
    sa.Column("stage", sa.String(64), nullable=False),
    sa.Column("action", sa.String(64), nullable=False),
    sa.Column("payload", JSONType, nullable=False),
    sa.Column("due_at", UTCDateTime(), nullable=False),
    sa.Column("status", sa.String(16), nullable=False, server_default="SCHEDULED"),
    sa.Column("lease_owner", sa.String(200), nullable=True),
    sa.Column("lease_expires_at", UTCDateTime(), nullable=True),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("max_attempts", sa.Integer, nullable=False, server_default="3"),
    sa.Column("run_id", sa.String(64), nullable=True, comment="Dagster run of the latest attempt"),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("dedupe_key", sa.String(200), nullable=True, unique=True, comment="Caller key for idempotent scheduling"),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
    sa.Column("finished_at", UTCDateTime(), nullable=True),
    sa.CheckConstraint(f"status IN {EXECUTION_STATUSES!r}", name="status"),
    sa.CheckConstraint("max_attempts >= 1", name="max_attempts"),
    # Partial indexes: the due query and lease recovery touch only the few SCHEDULED / RUNNING
    # rows, so the indexes stay small however many finished rows accumulate.
    sa.Index(
        "ix_marketing_execution_due",
        "due_at",
        "id",
        postgresql_where=sa.text("status = 'SCHEDULED'"),
        sqlite_where=sa.text("status = 'SCHEDULED'"),
    ),
    sa.Index(
        "ix_marketing_execution_lease",
        "lease_expires_at",
        postgresql_where=sa.text("status = 'RUNNING'"),
        sqlite_where=sa.text("status = 'RUNNING'"),
    ),
    sa.Index("ix_marketing_execution_campaign", "campaign_id", "due_at"),
)
