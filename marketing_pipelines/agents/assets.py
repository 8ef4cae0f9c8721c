"""The agents' daily cost asset, ``agent_model_cost_daily``: what the model calls of each campaign cost per UTC day,
beside the measurement rollup (its group, its daily partitions, its backfill policy)."""

import warnings
from typing import Any

import dagster as dg

from marketing_pipelines.agents.costs import NANO_PER_USD, CostDaySummary, replace_model_cost_day, usd_text
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.measurement.assets import GROUP, OWNERS, measurement_partitions, partition_days
from marketing_pipelines.settings import PRICES_READ_ON, Settings

MODEL_COST_KEY = dg.AssetKey("agent_model_cost_daily")
MODEL_COST_DESCRIPTION = (
    "Table `agent_model_cost_daily`: one row is one (UTC day, campaign, model provider, model) with the agent runs "
    "that called the model that day, their model turns, the turns' input, output, cache read and cache write tokens, "
    "and their cost in nano-dollars (1e-9 USD, exact) at the price table (MARKETING_MODEL_PRICES). A turn's day is "
    "when it was recorded; `unknown_cost_turns` counts turns whose model had no price, which cost_nano_usd leaves "
    "out. Computed from the transcripts' model_turn steps (agent_run_step); join it to `measurement_daily_rollup` "
    "on (day, campaign_id)."
)


def _metadata(summary: CostDaySummary) -> dict[str, dg.MetadataValue]:
    ints = {
        "rows": summary.rows,
        "campaigns": summary.campaigns,
        "agent_runs": summary.agent_runs,
        "model_turns": summary.model_turns,
        "input_tokens": summary.input_tokens,
        "output_tokens": summary.output_tokens,
        "cache_read_tokens": summary.cache_read_tokens,
        "cache_write_tokens": summary.cache_write_tokens,
        "cost_nano_usd": summary.cost_nano_usd,
        "unknown_cost_turns": summary.unknown_cost_turns,
    }
    return {
        **{name: dg.MetadataValue.int(value) for name, value in ints.items()},
        # A float to plot over partitions; cost_nano_usd is the exact figure.
        "cost_usd": dg.MetadataValue.float(summary.cost_nano_usd / NANO_PER_USD),
        "cost": dg.MetadataValue.text(f"{usd_text(summary.cost_nano_usd)} USD"),
        "prices_read_on": dg.MetadataValue.text(PRICES_READ_ON),
    }


def build_model_cost_asset(settings: Settings) -> dg.AssetsDefinition:
    """``agent_model_cost_daily``, partitioned as the measurement assets are (MARKETING_MEASUREMENT_START_DATE),
    a backfill run replacing up to MARKETING_BACKFILL_DAYS_PER_RUN days."""
    shared: dict[str, Any] = {
        "key": MODEL_COST_KEY,
        "description": MODEL_COST_DESCRIPTION,
        "partitions_def": measurement_partitions(settings.measurement_start_date),
        "backfill_policy": dg.BackfillPolicy.multi_run(max_partitions_per_run=settings.backfill_days_per_run),
        "group_name": GROUP,
        "owners": OWNERS,
        "kinds": {"sql"},
    }
    with warnings.catch_warnings():
        # "Parameter `backfill_policy` ... is currently in beta", as for the measurement assets.
        warnings.simplefilter("ignore", dg.BetaWarning)

        @dg.asset(**shared)
        def agent_model_cost_daily(context: dg.AssetExecutionContext, app_db: AppDatabase) -> dg.MaterializeResult:
            engine = app_db.ready_engine()
            for day in partition_days(context):
                # Idempotent: each day is deleted and rebuilt in its own transaction.
                summary = replace_model_cost_day(engine, day)
                context.add_asset_metadata(_metadata(summary), partition_key=day.isoformat())
            return dg.MaterializeResult()

    return agent_model_cost_daily
