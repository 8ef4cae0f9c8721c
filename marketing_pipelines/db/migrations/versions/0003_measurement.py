"""measurement: events, rejects, importer tables, daily rollup

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 19:36:48.564595
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "github_release_asset_snapshot",
        sa.Column("asset_id", sa.BigInteger(), nullable=False),
        sa.Column("day", sa.Date(), nullable=False, comment="Partition day the snapshot stands for (its end)"),
        sa.Column("repo", sa.String(length=200), nullable=False),
        sa.Column("release_id", sa.BigInteger(), nullable=False),
        sa.Column("release_tag", sa.String(length=200), nullable=False),
        sa.Column("asset_name", sa.String(length=500), nullable=False),
        sa.Column("download_count", sa.BigInteger(), nullable=False, comment="Cumulative, as GitHub reported it"),
        sa.Column("fetched_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("asset_id", "day", name=op.f("pk_github_release_asset_snapshot")),
    )
    op.create_index(
        "ix_github_release_asset_snapshot_repo", "github_release_asset_snapshot", ["repo", "day"], unique=False
    )
    op.create_table(
        "github_release_download_daily",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("asset_id", sa.BigInteger(), nullable=False),
        sa.Column("repo", sa.String(length=200), nullable=False),
        sa.Column("release_tag", sa.String(length=200), nullable=False),
        sa.Column("asset_name", sa.String(length=500), nullable=False),
        sa.Column("download_count", sa.BigInteger(), nullable=False),
        sa.Column("downloads", sa.BigInteger(), nullable=False, comment="Delta since the previous snapshot, >= 0"),
        sa.Column("raw_delta", sa.BigInteger(), nullable=False),
        sa.Column("baseline", sa.Boolean(), nullable=False, comment="First snapshot of the repo: no delta known"),
        sa.Column("negative_clamped", sa.Boolean(), nullable=False),
        sa.CheckConstraint("downloads >= 0", name=op.f("ck_github_release_download_daily_downloads")),
        sa.PrimaryKeyConstraint("day", "asset_id", name=op.f("pk_github_release_download_daily")),
    )
    op.create_index(
        "ix_github_release_download_daily_repo", "github_release_download_daily", ["repo", "day"], unique=False
    )
    op.create_table(
        "github_repo_etag",
        sa.Column("repo", sa.String(length=200), nullable=False),
        sa.Column("etag", sa.String(length=500), nullable=False),
        sa.Column(
            "snapshot_day", sa.Date(), nullable=False, comment="Snapshot day holding the counts this ETag stands for"
        ),
        sa.Column("fetched_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("repo", name=op.f("pk_github_repo_etag")),
    )
    op.create_table(
        "marketing_event_reject",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("file", sa.String(length=1000), nullable=False),
        sa.Column("line_number", sa.Integer(), nullable=False),
        sa.Column("raw", sa.Text(), nullable=False, comment="The line as read, cut to 4000 characters"),
        sa.Column("raw_sha256", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.String(length=500), nullable=False),
        sa.Column("rejected_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_marketing_event_reject")),
        sa.UniqueConstraint(
            "file", "line_number", "raw_sha256", name=op.f("uq_marketing_event_reject_file_line_number_raw_sha256")
        ),
    )
    op.create_table(
        "site_analytics_daily",
        sa.Column("day", sa.Date(), nullable=False, comment="Day in the Plausible site's time zone"),
        sa.Column("utm_campaign", sa.String(length=200), nullable=False),
        sa.Column("page", sa.String(length=1000), nullable=False),
        sa.Column("visitors", sa.BigInteger(), nullable=False),
        sa.Column("pageviews", sa.BigInteger(), nullable=False),
        sa.Column("fetched_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("day", "utm_campaign", "page", name=op.f("pk_site_analytics_daily")),
    )
    op.create_table(
        "marketing_event",
        sa.Column("event_id", sa.String(length=200), nullable=False, comment="Caller's id; the dedupe key"),
        sa.Column("campaign_id", sa.String(length=64), nullable=False),
        sa.Column("stage", sa.String(length=64), nullable=False),
        sa.Column("event_type", sa.String(length=64), nullable=False),
        sa.Column("actor_id", sa.String(length=200), nullable=True),
        sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("source", sa.String(length=64), nullable=False),
        sa.Column(
            "properties", sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"), nullable=False
        ),
        sa.Column("ingested_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["campaign_id"], ["campaign.id"], name=op.f("fk_marketing_event_campaign_id_campaign")),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_marketing_event")),
    )
    op.create_index("ix_marketing_event_ingested_at", "marketing_event", ["ingested_at"], unique=False)
    op.create_index("ix_marketing_event_occurred_at", "marketing_event", ["occurred_at", "campaign_id"], unique=False)
    op.create_table(
        "measurement_daily_rollup",
        sa.Column("day", sa.Date(), nullable=False, comment="UTC day"),
        sa.Column("campaign_id", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("stage", sa.String(length=64), nullable=False),
        sa.Column("event_type", sa.String(length=64), nullable=False),
        sa.Column("raw_count", sa.BigInteger(), nullable=False),
        sa.Column(
            "unique_actors", sa.BigInteger(), nullable=True, comment="Exact distinct actors that day; NULL: unknown"
        ),
        sa.Column(
            "actors_hll", sa.LargeBinary(), nullable=True, comment="Serialized DataSketches HLL of the actor ids"
        ),
        sa.Column("rolled_up_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "source IN ('first_party', 'site_analytics', 'github_releases')",
            name=op.f("ck_measurement_daily_rollup_source"),
        ),
        sa.ForeignKeyConstraint(
            ["campaign_id"], ["campaign.id"], name=op.f("fk_measurement_daily_rollup_campaign_id_campaign")
        ),
        sa.PrimaryKeyConstraint(
            "day", "campaign_id", "source", "stage", "event_type", name=op.f("pk_measurement_daily_rollup")
        ),
    )
    op.create_index(
        "ix_measurement_daily_rollup_campaign_day", "measurement_daily_rollup", ["campaign_id", "day"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_measurement_daily_rollup_campaign_day", table_name="measurement_daily_rollup")
    op.drop_table("measurement_daily_rollup")
    op.drop_index("ix_marketing_event_occurred_at", table_name="marketing_event")
    op.drop_index("ix_marketing_event_ingested_at", table_name="marketing_event")
    op.drop_table("marketing_event")
    op.drop_table("site_analytics_daily")
    op.drop_table("marketing_event_reject")
    op.drop_table("github_repo_etag")
    op.drop_index("ix_github_release_download_daily_repo", table_name="github_release_download_daily")
    op.drop_table("github_release_download_daily")
    op.drop_index("ix_github_release_asset_snapshot_repo", table_name="github_release_asset_snapshot")
    op.drop_table("github_release_asset_snapshot")
