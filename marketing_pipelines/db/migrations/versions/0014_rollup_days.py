"""measurement: the days the rollup built, empty ones included

A day whose rollup holds no rows (no events, no imports) was indistinguishable from a day never built:
the report said to materialize it, the freshness check said "not built yet". One row per built day.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "measurement_rollup_day",
        sa.Column("day", sa.Date(), nullable=False, comment="UTC day"),
        sa.Column("rolled_up_at", sa.DateTime(timezone=True), nullable=False, comment="When the day was last rebuilt"),
        sa.Column(
            "row_count",
            sa.Integer(),
            nullable=False,
            comment="measurement_daily_rollup rows of the day; 0: built empty",
        ),
        sa.PrimaryKeyConstraint("day", name=op.f("pk_measurement_rollup_day")),
    )
    # The days built before this revision that hold rows; days built empty before it cannot be told from
    # days never built, and count as built once they are rebuilt.
    op.execute(
        sa.text(
            "INSERT INTO measurement_rollup_day (day, rolled_up_at, row_count) "
            "SELECT day, MAX(rolled_up_at), COUNT(*) FROM measurement_daily_rollup GROUP BY day"
        )
    )


def downgrade() -> None:
    op.drop_table("measurement_rollup_day")
