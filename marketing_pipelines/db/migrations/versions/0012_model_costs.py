"""model costs: each agent run's tokens and cost, and the daily cost per campaign, provider and model

An agent run sums its model turns (tokens in, out, read from and written to the prompt cache, and the cost at the
price table in nano-dollars, exact integers) as each turn is recorded. ``agent_model_cost_daily`` is the asset of
the same name: one row per UTC day, campaign, provider and model, beside ``measurement_daily_rollup``.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 07:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

RUN_COLUMNS = {
    "model_turns": "Model calls answered",
    "input_tokens": "Input tokens billed at the full input price",
    "output_tokens": "Output tokens",
    "cache_read_tokens": "Input tokens read from the prompt cache",
    "cache_write_tokens": "Input tokens written to the prompt cache",
    "cost_nano_usd": "Cost of the turns with a price, in 1e-9 USD",
    "unknown_cost_turns": "Turns whose model had no price: their cost is not in cost_nano_usd",
}


def upgrade() -> None:
    # Constant server defaults: PostgreSQL 11+ adds these columns without rewriting agent_run. Runs recorded before
    # this revision show 0 (their turns' usage stays in their transcripts).
    for name, comment in RUN_COLUMNS.items():
        op.add_column("agent_run", sa.Column(name, sa.BigInteger, nullable=False, server_default="0", comment=comment))
    op.create_index(
        "ix_agent_run_step_model_turn_created",
        "agent_run_step",
        ["created_at"],
        postgresql_where=sa.text("kind = 'model_turn'"),
        sqlite_where=sa.text("kind = 'model_turn'"),
    )
    op.create_table(
        "agent_model_cost_daily",
        sa.Column("day", sa.Date(), nullable=False, comment="UTC day of the model turns"),
        sa.Column("campaign_id", sa.String(length=64), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column(
            "model", sa.String(length=100), nullable=False, comment="The model that answered, as its answer named it"
        ),
        sa.Column("agent_runs", sa.Integer(), nullable=False, comment="Agent runs with a model turn that day"),
        sa.Column("model_turns", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cache_read_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cache_write_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_nano_usd", sa.BigInteger(), nullable=False, comment="Cost of the turns with a price, 1e-9 USD"),
        sa.Column("unknown_cost_turns", sa.Integer(), nullable=False, comment="Turns not in cost_nano_usd: no price"),
        sa.Column("computed_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["campaign_id"], ["campaign.id"], name=op.f("fk_agent_model_cost_daily_campaign_id_campaign")
        ),
        sa.PrimaryKeyConstraint("day", "campaign_id", "provider", "model", name=op.f("pk_agent_model_cost_daily")),
    )
    op.create_index(
        "ix_agent_model_cost_daily_campaign_day", "agent_model_cost_daily", ["campaign_id", "day"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_agent_model_cost_daily_campaign_day", table_name="agent_model_cost_daily")
    op.drop_table("agent_model_cost_daily")
    op.drop_index("ix_agent_run_step_model_turn_created", table_name="agent_run_step")
    with op.batch_alter_table("agent_run") as batch:
        for name in RUN_COLUMNS:
            batch.drop_column(name)
