"""spend budgets: a daily limit per campaign or requester, in nano-dollars and tokens, and each scope's day account

``spend_budget`` holds the limits the command line sets; ``spend_ledger`` one row per scope and UTC day with what
the day's model calls cost and what calls in flight have reserved (agents/budgets.py). Amounts are integers.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 08:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

SCOPES = "scope IN ('campaign', 'requester')"


def upgrade() -> None:
    op.create_table(
        "spend_budget",
        sa.Column("scope", sa.String(length=16), nullable=False, comment="campaign or requester"),
        sa.Column(
            "scope_id", sa.String(length=64), nullable=False, comment="The campaign's id or the requesting user's"
        ),
        sa.Column("daily_nano_usd", sa.BigInteger(), nullable=True, comment="Money a UTC day may cost; NULL: no limit"),
        sa.Column("daily_tokens", sa.BigInteger(), nullable=True, comment="Tokens a UTC day may use; NULL: no limit"),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(SCOPES, name=op.f("ck_spend_budget_scope")),
        sa.CheckConstraint("daily_nano_usd >= 0", name=op.f("ck_spend_budget_daily_nano_usd")),
        sa.CheckConstraint("daily_tokens >= 0", name=op.f("ck_spend_budget_daily_tokens")),
        sa.CheckConstraint(
            "daily_nano_usd IS NOT NULL OR daily_tokens IS NOT NULL", name=op.f("ck_spend_budget_limit")
        ),
        sa.PrimaryKeyConstraint("scope", "scope_id", name=op.f("pk_spend_budget")),
    )
    op.create_table(
        "spend_ledger",
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("scope_id", sa.String(length=64), nullable=False),
        sa.Column("day", sa.Date(), nullable=False, comment="UTC day"),
        sa.Column("reserved_nano_usd", sa.BigInteger(), nullable=False, comment="Worst case of the calls in flight"),
        sa.Column("spent_nano_usd", sa.BigInteger(), nullable=False, comment="What answered calls cost"),
        sa.Column("reserved_tokens", sa.BigInteger(), nullable=False),
        sa.Column("spent_tokens", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(SCOPES, name=op.f("ck_spend_ledger_scope")),
        sa.CheckConstraint("reserved_nano_usd >= 0", name=op.f("ck_spend_ledger_reserved_nano_usd")),
        sa.CheckConstraint("spent_nano_usd >= 0", name=op.f("ck_spend_ledger_spent_nano_usd")),
        sa.CheckConstraint("reserved_tokens >= 0", name=op.f("ck_spend_ledger_reserved_tokens")),
        sa.CheckConstraint("spent_tokens >= 0", name=op.f("ck_spend_ledger_spent_tokens")),
        sa.PrimaryKeyConstraint("scope", "scope_id", "day", name=op.f("pk_spend_ledger")),
    )


def downgrade() -> None:
    op.drop_table("spend_ledger")
    op.drop_table("spend_budget")
