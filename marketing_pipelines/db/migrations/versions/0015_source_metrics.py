"""measurement: one table for the importers built on the source contract, and campaigns' package names

The first two importers each had a table, an asset and a rollup join written for them. The sources added since
(GA4, PostHog, package downloads, GitHub traffic) write one row per (source, day, key, dimension, metric) to
``source_daily_metric``, and the rollup joins them to campaigns by the column their contract names. Package
downloads match a campaign by its PyPI or npm package, two new nullable columns.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 18:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "source_daily_metric",
        sa.Column(
            "source", sa.String(length=32), nullable=False, comment="The source's name, as the rollup's source column"
        ),
        sa.Column("day", sa.Date(), nullable=False, comment="UTC day (or the source's own day, its contract says)"),
        sa.Column("key", sa.String(length=214), nullable=False, comment="Matched to campaign.<contract.match>"),
        sa.Column("dimension", sa.String(length=1000), nullable=False, comment="e.g. a page or referrer; '' when none"),
        sa.Column("metric", sa.String(length=64), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.Column("fetched_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("value >= 0", name=op.f("ck_source_daily_metric_value")),
        sa.PrimaryKeyConstraint("source", "day", "key", "dimension", "metric", name=op.f("pk_source_daily_metric")),
    )
    with op.batch_alter_table("campaign") as batch:
        batch.add_column(
            sa.Column(
                "pypi_package",
                sa.String(length=214),
                nullable=True,
                comment="PyPI project; package downloads mapping",
            )
        )
        batch.add_column(
            sa.Column(
                "npm_package", sa.String(length=214), nullable=True, comment="npm package; package downloads mapping"
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("campaign") as batch:
        batch.drop_column("npm_package")
        batch.drop_column("pypi_package")
    op.drop_table("source_daily_metric")
