"""webhook endpoints: registered destinations with sealed URLs and signing secrets

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 23:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from marketing_pipelines.db.types import UTCDateTime

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "webhook_endpoint",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("campaign_id", sa.String(64), nullable=True, comment="NULL: any campaign"),
        sa.Column("origin", sa.String(300), nullable=False, comment="scheme://host[:port] of the URL, for display"),
        sa.Column("url_sealed", sa.Text, nullable=False),
        sa.Column("secret_sealed", sa.Text, nullable=False, comment="Current signing secret (whsec_...), sealed"),
        sa.Column("previous_secret_sealed", sa.Text, nullable=True, comment="Secret before the last rotation, sealed"),
        sa.Column(
            "previous_secret_until", UTCDateTime(), nullable=True, comment="The previous secret signs until then"
        ),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("rotated_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_webhook_endpoint")),
        sa.ForeignKeyConstraint(
            ["campaign_id"], ["campaign.id"], name=op.f("fk_webhook_endpoint_campaign_id_campaign")
        ),
    )


def downgrade() -> None:
    op.drop_table("webhook_endpoint")
