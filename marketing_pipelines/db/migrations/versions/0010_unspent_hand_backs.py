"""unspent hand-backs: when an attempt's action began, and the runs that gave an execution back before it did

An attempt is spent only on the receiver: a run that never started, or whose worker never reached the
action before its lease ran out, gives the attempt back. ``began_at`` tells the two apart; the two counters
say how often it happened (in a row, which delays the next claim, and in all).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

COUNTERS = {
    "unstarted_runs": "Runs in a row that handed it back before its action began; delays the next claim",
    "handed_back": "All runs that handed it back before its action began; not attempts",
}


def upgrade() -> None:
    # Constant server defaults and a nullable column: PostgreSQL 11+ adds them without rewriting the tables.
    for name, comment in COUNTERS.items():
        op.add_column(
            "marketing_execution",
            sa.Column(name, sa.Integer, nullable=False, server_default="0", comment=comment),
        )
    op.add_column(
        "marketing_execution_attempt",
        sa.Column(
            "began_at",
            sa.DateTime(timezone=True),
            nullable=True,
            comment="When its action was dispatched; NULL: the run took it over but never reached the action",
        ),
    )
    # Attempts recorded before this revision reached their action, or were recorded as lost all the same.
    op.execute(sa.text("UPDATE marketing_execution_attempt SET began_at = started_at"))


def downgrade() -> None:
    with op.batch_alter_table("marketing_execution_attempt") as batch:
        batch.drop_column("began_at")
    with op.batch_alter_table("marketing_execution") as batch:
        for name in COUNTERS:
            batch.drop_column(name)
