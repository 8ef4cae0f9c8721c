"""measurement: the rollup takes rows of any source the contract declares

``measurement_daily_rollup.source`` was checked against the three origins of revision 0003 (first_party,
site_analytics, github_releases). The sources built on the source contract (0015; measurement/sources.py
``SOURCES``) write rollup rows under their own names, which that check refused, failing every rollup of a day
they imported. The names now live in one place, the code's source table; the check is dropped rather than
widened by each source's migration.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07 19:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("measurement_daily_rollup") as batch:
        batch.drop_constraint(op.f("ck_measurement_daily_rollup_source"), type_="check")


def downgrade() -> None:
    # Rows of the newer sources would violate the old check: they are dropped first (the rollup rebuilds them).
    op.execute(
        "DELETE FROM measurement_daily_rollup WHERE source NOT IN ('first_party', 'site_analytics', 'github_releases')"
    )
    with op.batch_alter_table("measurement_daily_rollup") as batch:
        batch.create_check_constraint(
            op.f("ck_measurement_daily_rollup_source"), "source IN ('first_party', 'site_analytics', 'github_releases')"
        )
