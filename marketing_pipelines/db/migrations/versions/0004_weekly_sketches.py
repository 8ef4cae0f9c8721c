"""measurement: weekly sketch index of the daily rollup

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 23:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "measurement_weekly_sketch",
        sa.Column("week_start", sa.Date(), nullable=False, comment="Monday of the UTC ISO week"),
        sa.Column("campaign_id", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("stage", sa.String(length=64), nullable=False),
        sa.Column("event_type", sa.String(length=64), nullable=False),
        sa.Column("days", sa.Integer(), nullable=False, comment="Daily rollup rows merged into this row"),
        sa.Column("raw_count", sa.BigInteger(), nullable=False, comment="Sum of the merged rows' raw_count"),
        sa.Column(
            "daily_rolled_up_at",
            sa.DateTime(timezone=True),
            nullable=False,
            comment="Latest rolled_up_at of the merged rows",
        ),
        sa.Column("actors_hll", sa.LargeBinary(), nullable=True, comment="Union of the week's sketches; NULL: unknown"),
        sa.Column("built_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["campaign_id"], ["campaign.id"], name=op.f("fk_measurement_weekly_sketch_campaign_id_campaign")
        ),
        sa.PrimaryKeyConstraint(
            "week_start", "campaign_id", "source", "stage", "event_type", name=op.f("pk_measurement_weekly_sketch")
        ),
    )
    op.create_index(
        "ix_measurement_weekly_sketch_campaign_week",
        "measurement_weekly_sketch",
        ["campaign_id", "week_start"],
        unique=False,
    )
    # Existing daily rollups get their weekly rows on the next rebuild of any day of the week
    # (`marketing-pipelines db rebuild-weekly-sketches` does all at once); until then reports use the daily sketches.


def downgrade() -> None:
    op.drop_index("ix_measurement_weekly_sketch_campaign_week", table_name="measurement_weekly_sketch")
    op.drop_table("measurement_weekly_sketch")
