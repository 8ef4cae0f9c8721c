"""model rate limits per provider, model and unit: calls, input tokens, output tokens, all tokens

``model_token_bucket`` held one bucket of calls per provider. Providers limit more than calls (Anthropic: requests,
input tokens and output tokens per minute per model class; OpenAI: requests and tokens), so each limit is a bucket
row keyed by provider, model ('*' for every model) and unit. Each provider's call bucket moves over as its
('*', 'requests') row, with its rate and what it held.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07 07:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_rate_limit",
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=100), nullable=False, comment="'*': every model of the provider"),
        sa.Column(
            "unit", sa.String(length=16), nullable=False, comment="requests, input_tokens, output_tokens or tokens"
        ),
        sa.Column("capacity", sa.Float(), nullable=False),
        sa.Column("refill_per_second", sa.Float(), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("configured_per_minute", sa.Float(), nullable=True, comment="Set by settings or limits set"),
        sa.Column("configured_capacity", sa.Float(), nullable=True, comment="The configured burst"),
        sa.Column("learned_per_minute", sa.Float(), nullable=True, comment="What the provider's headers said last"),
        sa.Column(
            "paused_until",
            sa.DateTime(timezone=True),
            nullable=True,
            comment="A 429's Retry-After, shared by every replica",
        ),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("capacity > 0", name=op.f("ck_model_rate_limit_capacity")),
        sa.CheckConstraint("refill_per_second > 0", name=op.f("ck_model_rate_limit_refill")),
        sa.CheckConstraint(
            "unit IN ('requests', 'input_tokens', 'output_tokens', 'tokens')", name=op.f("ck_model_rate_limit_unit")
        ),
        sa.PrimaryKeyConstraint("provider", "model", "unit", name=op.f("pk_model_rate_limit")),
    )
    op.execute(
        sa.text(
            "INSERT INTO model_rate_limit (provider, model, unit, capacity, refill_per_second, tokens, "
            "configured_per_minute, configured_capacity, updated_at) "
            "SELECT provider, '*', 'requests', capacity, refill_per_second, tokens, refill_per_second * 60, capacity, "
            "updated_at FROM model_token_bucket"
        )
    )
    op.drop_table("model_token_bucket")


def downgrade() -> None:
    op.create_table(
        "model_token_bucket",
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("capacity", sa.Float(), nullable=False),
        sa.Column("refill_per_second", sa.Float(), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("capacity > 0", name=op.f("ck_model_token_bucket_capacity")),
        sa.CheckConstraint("refill_per_second > 0", name=op.f("ck_model_token_bucket_refill")),
        sa.CheckConstraint("tokens >= 0", name=op.f("ck_model_token_bucket_tokens")),
        sa.PrimaryKeyConstraint("provider", name=op.f("pk_model_token_bucket")),
    )
    op.execute(
        sa.text(
            "INSERT INTO model_token_bucket (provider, capacity, refill_per_second, tokens, updated_at) "
            "SELECT provider, capacity, refill_per_second, CASE WHEN tokens < 0 THEN 0 ELSE tokens END, updated_at "
            "FROM model_rate_limit WHERE model = '*' AND unit = 'requests'"
        )
    )
    op.drop_table("model_rate_limit")
