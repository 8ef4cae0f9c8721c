"""campaign-scoped grants: agent runs still to run hold their requester's grants on their own campaign only

Runs queued before requests captured campaign-scoped grants (``grants_on_campaign``) may hold global
grants, or grants on other campaigns. Each run narrowed them again as it started; this migration narrows
them once, in the database, so the run takes its captured grants as they are. Finished runs keep what
they were captured with: it is the record of what they could do.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05 21:50:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

ALL_CAMPAIGNS = "*"  # schema.ALL_CAMPAIGNS when this was written; a migration keeps its own copy
STILL_TO_RUN = ("QUEUED", "RUNNING")

agent_run = sa.table(
    "agent_run",
    sa.column("id", sa.BigInteger),
    sa.column("campaign_id", sa.String),
    sa.column("status", sa.String),
    sa.column("permissions", sa.JSON),
)


def narrowed(permissions: list[list[str]], campaign_id: str) -> list[list[str]]:
    """``permissions`` ([permission, scope] pairs) that cover ``campaign_id``, each scoped to it alone."""
    return [
        list(g) for g in sorted({(p, campaign_id) for p, scope in permissions if scope in (ALL_CAMPAIGNS, campaign_id)})
    ]


def upgrade() -> None:
    conn = op.get_bind()
    rows = conn.execute(
        sa.select(agent_run.c.id, agent_run.c.campaign_id, agent_run.c.permissions).where(
            agent_run.c.status.in_(STILL_TO_RUN)
        )
    ).all()
    for row in rows:
        scoped = narrowed(row.permissions, row.campaign_id)
        if scoped != row.permissions:
            conn.execute(sa.update(agent_run).where(agent_run.c.id == row.id).values(permissions=scoped))


def downgrade() -> None:
    # Nothing to restore: the grants removed could not be used by the run (it acts on its campaign only).
    pass
