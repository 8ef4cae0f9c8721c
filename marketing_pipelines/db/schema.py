"""SQLAlchemy Core tables of the application database (Alembic migrations create them)."""

from __future__ import annotations

import sqlalchemy as sa

from marketing_pipelines.db.types import BigIntId, JSONType, UTCDateTime

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

EXECUTION_STATUSES = ("SCHEDULED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")


campaign = sa.Table(
    "campaign",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True, comment="Slug, e.g. spring-launch"),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("owner", sa.String(200), nullable=False),
    sa.Column("utm_campaign", sa.String(200), nullable=True, unique=True, comment="Site analytics mapping"),
    sa.Column("github_repo", sa.String(200), nullable=True, comment="owner/name; release downloads mapping"),
    sa.Column("pypi_package", sa.String(214), nullable=True, comment="PyPI project; package downloads mapping"),
    sa.Column("npm_package", sa.String(214), nullable=True, comment="npm package; package downloads mapping"),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
)


def _lost_attempts_column() -> sa.Column[int]:
    """Both leased queues count the attempts their workers lost (leasing/lease.py, MAX_LOST_ATTEMPTS)."""
    return sa.Column(
        "lost_attempts",
        sa.Integer,
        nullable=False,
        server_default="0",
        comment="Attempts lost to the infrastructure (lease expired, run failed first); not spent",
    )


marketing_execution = sa.Table(
    "marketing_execution",
    metadata,
    sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
    sa.Column("campaign_id", sa.String(64), sa.ForeignKey("campaign.id"), nullable=False),
    sa.Column("stage", sa.String(64), nullable=False),
    sa.Column("action", sa.String(64), nullable=False),
    sa.Column("payload", JSONType, nullable=False),
    sa.Column("due_at", UTCDateTime(), nullable=False),
    sa.Column("status", sa.String(16), nullable=False, server_default="SCHEDULED"),
    sa.Column("lease_owner", sa.String(200), nullable=True),
    sa.Column("lease_expires_at", UTCDateTime(), nullable=True),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("max_attempts", sa.Integer, nullable=False, server_default="3"),
    _lost_attempts_column(),
    # A run that never reached an execution's action (it never started, or its worker waited on this machine
    # until its lease ran out) gives its attempt back: counted here instead (leasing/lease.py, hand-backs).
    sa.Column(
        "unstarted_runs",
        sa.Integer,
        nullable=False,
        server_default="0",
        comment="Runs in a row that handed it back before its action began; delays the next claim",
    ),
    sa.Column(
        "handed_back",
        sa.Integer,
        nullable=False,
        server_default="0",
        comment="All runs that handed it back before its action began; not attempts",
    ),
    sa.Column("run_id", sa.String(64), nullable=True, comment="Dagster run of the latest attempt"),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("dedupe_key", sa.String(200), nullable=True, unique=True, comment="Caller key for idempotent scheduling"),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
    sa.Column("finished_at", UTCDateTime(), nullable=True),
    sa.CheckConstraint(f"status IN {EXECUTION_STATUSES!r}", name="status"),
    sa.CheckConstraint("max_attempts >= 1", name="max_attempts"),
    # Partial indexes: the due query and lease recovery touch only the few SCHEDULED / RUNNING
    # rows, so the indexes stay small however many finished rows accumulate.
    sa.Index(
        "ix_marketing_execution_due",
        "due_at",
        "id",
        postgresql_where=sa.text("status = 'SCHEDULED'"),
        sqlite_where=sa.text("status = 'SCHEDULED'"),
    ),
    sa.Index(
        "ix_marketing_execution_lease",
        "lease_expires_at",
        postgresql_where=sa.text("status = 'RUNNING'"),
        sqlite_where=sa.text("status = 'RUNNING'"),
    ),
    sa.Index("ix_marketing_execution_campaign", "campaign_id", "due_at"),
    # Queue health: finished in the last hour, by status.
    sa.Index("ix_marketing_execution_finished", "status", "finished_at"),
)

ATTEMPT_OUTCOMES = ("SUCCEEDED", "RESCHEDULED", "FAILED", "CANCELLED", "LEASE_EXPIRED", "LEASE_LOST")

marketing_execution_attempt = sa.Table(
    "marketing_execution_attempt",
    metadata,
    sa.Column("execution_id", BigIntId, sa.ForeignKey("marketing_execution.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("attempt", sa.Integer, primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=True, comment="Dagster run that performed this attempt"),
    sa.Column("started_at", UTCDateTime(), nullable=False),
    sa.Column(
        "began_at",
        UTCDateTime(),
        nullable=True,
        comment="When its action was dispatched; NULL: the run took it over but never reached the action",
    ),
    sa.Column("finished_at", UTCDateTime(), nullable=True),
    sa.Column("outcome", sa.String(16), nullable=True, comment="NULL while the attempt runs"),
    sa.Column("error", sa.Text, nullable=True),
    sa.CheckConstraint(f"outcome IS NULL OR outcome IN {ATTEMPT_OUTCOMES!r}", name="outcome"),
    # A run's executions: a batch run carries no tag per execution, its attempts name it.
    sa.Index("ix_marketing_execution_attempt_run", "run_id"),
)

# --- users, permissions and the agent-run queue ----------------------------------------------

# REFUSED: the request was refused when it was made (e.g. no permission); kept so it leaves a trace.
AGENT_RUN_STATUSES = ("QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "REFUSED")
ALL_CAMPAIGNS = "*"

app_user = sa.Table(
    "app_user",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("display_name", sa.String(200), nullable=False),
    sa.Column("active", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Column("created_at", UTCDateTime(), nullable=False),
)

user_permission = sa.Table(
    "user_permission",
    metadata,
    sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
    sa.Column("user_id", sa.String(64), sa.ForeignKey("app_user.id", ondelete="CASCADE"), nullable=False),
    sa.Column("permission", sa.String(64), nullable=False),
    # '*' grants the permission on every campaign; otherwise a campaign id. Not NULL, so the
    # unique constraint below also dedupes global grants (NULLs are distinct in a UNIQUE).
    sa.Column("campaign_scope", sa.String(64), nullable=False, server_default=ALL_CAMPAIGNS),
    sa.Column("granted_at", UTCDateTime(), nullable=False),
    sa.UniqueConstraint("user_id", "permission", "campaign_scope"),
)

# What an agent run's model turns used and cost, summed over every attempt (migration 0012).
AGENT_RUN_COST_COLUMNS = {
    "model_turns": "Model calls answered",
    "input_tokens": "Input tokens billed at the full input price",
    "output_tokens": "Output tokens",
    "cache_read_tokens": "Input tokens read from the prompt cache",
    "cache_write_tokens": "Input tokens written to the prompt cache",
    "cost_nano_usd": "Cost of the turns with a price, in 1e-9 USD",
    "unknown_cost_turns": "Turns whose model had no price: their cost is not in cost_nano_usd",
}

agent_run = sa.Table(
    "agent_run",
    metadata,
    sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
    sa.Column("agent", sa.String(64), nullable=False),
    sa.Column("campaign_id", sa.String(64), sa.ForeignKey("campaign.id"), nullable=False),
    sa.Column("input", JSONType, nullable=False),
    sa.Column("status", sa.String(16), nullable=False, server_default="QUEUED"),
    sa.Column("requested_by", sa.String(64), sa.ForeignKey("app_user.id"), nullable=False),
    sa.Column("permissions", JSONType, nullable=False, comment="Permission set captured at request time"),
    sa.Column("model_provider", sa.String(32), nullable=False),
    sa.Column("requested_at", UTCDateTime(), nullable=False),
    sa.Column("lease_owner", sa.String(200), nullable=True),
    sa.Column("lease_expires_at", UTCDateTime(), nullable=True),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("max_attempts", sa.Integer, nullable=False, server_default="2"),
    _lost_attempts_column(),
    sa.Column("run_id", sa.String(64), nullable=True),
    sa.Column("max_run_seconds", sa.Integer, nullable=False),
    sa.Column("output", JSONType, nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.Column("started_at", UTCDateTime(), nullable=True),
    sa.Column("finished_at", UTCDateTime(), nullable=True),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
    # The run's model turns summed (agents/costs.py record_turn), in the transaction that records each turn.
    *(
        sa.Column(name, sa.BigInteger, nullable=False, server_default="0", comment=comment)
        for name, comment in AGENT_RUN_COST_COLUMNS.items()
    ),
    sa.CheckConstraint(f"status IN {AGENT_RUN_STATUSES!r}", name="status"),
    sa.CheckConstraint("max_attempts >= 1", name="max_attempts"),
    sa.CheckConstraint("max_run_seconds >= 1", name="max_run_seconds"),
    sa.Index(
        "ix_agent_run_queued",
        "requested_at",
        "id",
        postgresql_where=sa.text("status = 'QUEUED'"),
        sqlite_where=sa.text("status = 'QUEUED'"),
    ),
    sa.Index(
        "ix_agent_run_lease",
        "lease_expires_at",
        postgresql_where=sa.text("status = 'RUNNING'"),
        sqlite_where=sa.text("status = 'RUNNING'"),
    ),
    sa.Index("ix_agent_run_requested_by", "requested_by", "requested_at"),
    sa.Index("ix_agent_run_finished", "status", "finished_at"),
)

agent_run_step = sa.Table(
    "agent_run_step",
    metadata,
    sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
    sa.Column("agent_run_id", BigIntId, sa.ForeignKey("agent_run.id", ondelete="CASCADE"), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("seq", sa.Integer, nullable=False),
    sa.Column("kind", sa.String(32), nullable=False, comment="model_turn, tool_call, tool_result, denial, error"),
    sa.Column("name", sa.String(64), nullable=True),
    sa.Column("content", JSONType, nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.UniqueConstraint("agent_run_id", "attempt", "seq"),
    # agent_model_cost_daily reads one UTC day of model turns (migration 0012).
    sa.Index(
        "ix_agent_run_step_model_turn_created",
        "created_at",
        postgresql_where=sa.text("kind = 'model_turn'"),
        sqlite_where=sa.text("kind = 'model_turn'"),
    ),
)

# Model-call limits, a token bucket per provider, model and unit (calls, input tokens, output tokens, all tokens).
# model '*' is every model of the provider. tokens may go below zero: a call that used more than it reserved
# settles the difference, so the bucket owes it instead of drifting.
MODEL_LIMIT_UNITS = ("requests", "input_tokens", "output_tokens", "tokens")
EVERY_MODEL = "*"

model_rate_limit = sa.Table(
    "model_rate_limit",
    metadata,
    sa.Column("provider", sa.String(32), primary_key=True),
    sa.Column("model", sa.String(100), primary_key=True, comment="'*': every model of the provider"),
    sa.Column("unit", sa.String(16), primary_key=True, comment="requests, input_tokens, output_tokens or tokens"),
    sa.Column("capacity", sa.Float, nullable=False),
    sa.Column("refill_per_second", sa.Float, nullable=False),
    sa.Column("tokens", sa.Float, nullable=False),
    sa.Column("configured_per_minute", sa.Float, nullable=True, comment="Set by settings or limits set"),
    sa.Column("configured_capacity", sa.Float, nullable=True, comment="The configured burst"),
    sa.Column("learned_per_minute", sa.Float, nullable=True, comment="What the provider's headers said last"),
    sa.Column("paused_until", UTCDateTime(), nullable=True, comment="A 429's Retry-After, shared by every replica"),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
    sa.CheckConstraint("capacity > 0", name="capacity"),
    sa.CheckConstraint("refill_per_second > 0", name="refill"),
    sa.CheckConstraint(f"unit IN {MODEL_LIMIT_UNITS!r}", name="unit"),
)

# Daily spend budgets (agents/budgets.py): a limit per campaign or per requester, in nano-dollars (1e-9 USD) and
# tokens, and each scope's account per UTC day. Amounts are exact integers, never floats.
SPEND_SCOPES = ("campaign", "requester")

spend_budget = sa.Table(
    "spend_budget",
    metadata,
    sa.Column("scope", sa.String(16), primary_key=True, comment="campaign or requester"),
    sa.Column("scope_id", sa.String(64), primary_key=True, comment="The campaign's id or the requesting user's"),
    sa.Column("daily_nano_usd", sa.BigInteger, nullable=True, comment="Money a UTC day may cost; NULL: no limit"),
    sa.Column("daily_tokens", sa.BigInteger, nullable=True, comment="Tokens a UTC day may use; NULL: no limit"),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
    sa.CheckConstraint(f"scope IN {SPEND_SCOPES!r}", name="scope"),
    sa.CheckConstraint("daily_nano_usd >= 0", name="daily_nano_usd"),
    sa.CheckConstraint("daily_tokens >= 0", name="daily_tokens"),
    sa.CheckConstraint("daily_nano_usd IS NOT NULL OR daily_tokens IS NOT NULL", name="limit"),
)

spend_ledger = sa.Table(
    "spend_ledger",
    metadata,
    sa.Column("scope", sa.String(16), primary_key=True),
    sa.Column("scope_id", sa.String(64), primary_key=True),
    sa.Column("day", sa.Date, primary_key=True, comment="UTC day"),
    sa.Column("reserved_nano_usd", sa.BigInteger, nullable=False, comment="Worst case of the calls in flight"),
    sa.Column("spent_nano_usd", sa.BigInteger, nullable=False, comment="What answered calls cost"),
    sa.Column("reserved_tokens", sa.BigInteger, nullable=False),
    sa.Column("spent_tokens", sa.BigInteger, nullable=False),
    sa.Column("updated_at", UTCDateTime(), nullable=False),
    sa.CheckConstraint(f"scope IN {SPEND_SCOPES!r}", name="scope"),
    sa.CheckConstraint("reserved_nano_usd >= 0", name="reserved_nano_usd"),
    sa.CheckConstraint("spent_nano_usd >= 0", name="spent_nano_usd"),
    sa.CheckConstraint("reserved_tokens >= 0", name="reserved_tokens"),
    sa.CheckConstraint("spent_tokens >= 0", name="spent_tokens"),
)

# --- measurement -----------------------------------------------------------------------------

marketing_event = sa.Table(
    "marketing_event",
    metadata,
    sa.Column("event_id", sa.String(200), primary_key=True, comment="Caller's id; the dedupe key"),
    sa.Column("campaign_id", sa.String(64), sa.ForeignKey("campaign.id"), nullable=False),
    sa.Column("stage", sa.String(64), nullable=False),
    sa.Column("event_type", sa.String(64), nullable=False),
    sa.Column("actor_id", sa.String(200), nullable=True),
    sa.Column("occurred_at", UTCDateTime(), nullable=False),
    sa.Column("source", sa.String(64), nullable=False),
    sa.Column("properties", JSONType, nullable=False),
    sa.Column("ingested_at", UTCDateTime(), nullable=False),
    # "One day of events" is a range on occurred_at; the rollup groups the day by campaign.
    sa.Index("ix_marketing_event_occurred_at", "occurred_at", "campaign_id"),
    # "Events ingested since" for the late-events sensor.
    sa.Index("ix_marketing_event_ingested_at", "ingested_at"),
)

marketing_event_reject = sa.Table(
    "marketing_event_reject",
    metadata,
    sa.Column("id", BigIntId, primary_key=True, autoincrement=True),
    sa.Column("file", sa.String(1000), nullable=False),
    sa.Column("line_number", sa.Integer, nullable=False),
    sa.Column("raw", sa.Text, nullable=False, comment="The line as read, cut to 4000 characters"),
    sa.Column("raw_sha256", sa.String(64), nullable=False),
    sa.Column("reason", sa.String(500), nullable=False),
    sa.Column("rejected_at", UTCDateTime(), nullable=False),
    # Loading the same file twice must add nothing, rejects included; the hash keeps a changed line distinct.
    sa.UniqueConstraint("file", "line_number", "raw_sha256"),
)

site_analytics_daily = sa.Table(
    "site_analytics_daily",
    metadata,
    sa.Column("day", sa.Date, primary_key=True, comment="Day in the Plausible site's time zone"),
    sa.Column("utm_campaign", sa.String(200), primary_key=True),
    sa.Column("page", sa.String(1000), primary_key=True),
    sa.Column("visitors", sa.BigInteger, nullable=False),
    sa.Column("pageviews", sa.BigInteger, nullable=False),
    sa.Column("fetched_at", UTCDateTime(), nullable=False),
)

# What the importers built on the source contract (measurement/sources.py) fetch: one number of one source for one
# day and one campaign key, split by one dimension where the source has one. The contract says which key matches a
# campaign (its ``match`` column of ``campaign``) and which metrics the rollup sums (``counted``).
source_daily_metric = sa.Table(
    "source_daily_metric",
    metadata,
    sa.Column("source", sa.String(32), primary_key=True, comment="The source's name, as the rollup's source column"),
    sa.Column("day", sa.Date, primary_key=True, comment="UTC day (or the source's own day, its contract says)"),
    sa.Column("key", sa.String(214), primary_key=True, comment="Matched to campaign.<contract.match>"),
    sa.Column("dimension", sa.String(1000), primary_key=True, comment="e.g. a page or referrer; '' when none"),
    sa.Column("metric", sa.String(64), primary_key=True),
    sa.Column("value", sa.BigInteger, nullable=False),
    sa.Column("fetched_at", UTCDateTime(), nullable=False),
    sa.CheckConstraint("value >= 0", name="value"),
)

github_release_asset_snapshot = sa.Table(
    "github_release_asset_snapshot",
    metadata,
    sa.Column("asset_id", sa.BigInteger, primary_key=True),
    sa.Column("day", sa.Date, primary_key=True, comment="Partition day the snapshot stands for (its end)"),
    sa.Column("repo", sa.String(200), nullable=False),
    sa.Column("release_id", sa.BigInteger, nullable=False),
    sa.Column("release_tag", sa.String(200), nullable=False),
    sa.Column("asset_name", sa.String(500), nullable=False),
    sa.Column("download_count", sa.BigInteger, nullable=False, comment="Cumulative, as GitHub reported it"),
    sa.Column("fetched_at", UTCDateTime(), nullable=False),
    sa.Index("ix_github_release_asset_snapshot_repo", "repo", "day"),
)

github_release_download_daily = sa.Table(
    "github_release_download_daily",
    metadata,
    sa.Column("day", sa.Date, primary_key=True),
    sa.Column("asset_id", sa.BigInteger, primary_key=True),
    sa.Column("repo", sa.String(200), nullable=False),
    sa.Column("release_tag", sa.String(200), nullable=False),
    sa.Column("asset_name", sa.String(500), nullable=False),
    sa.Column("download_count", sa.BigInteger, nullable=False),
    sa.Column("downloads", sa.BigInteger, nullable=False, comment="Delta since the previous snapshot, >= 0"),
    sa.Column("raw_delta", sa.BigInteger, nullable=False),
    sa.Column("baseline", sa.Boolean, nullable=False, comment="First snapshot of the repo: no delta known"),
    sa.Column("negative_clamped", sa.Boolean, nullable=False),
    sa.CheckConstraint("downloads >= 0", name="downloads"),
    sa.Index("ix_github_release_download_daily_repo", "repo", "day"),
)

github_repo_etag = sa.Table(
    "github_repo_etag",
    metadata,
    sa.Column("repo", sa.String(200), primary_key=True),
    sa.Column("etag", sa.String(500), nullable=False),
    sa.Column("snapshot_day", sa.Date, nullable=False, comment="Snapshot day holding the counts this ETag stands for"),
    sa.Column("fetched_at", UTCDateTime(), nullable=False),
)

measurement_daily_rollup = sa.Table(
    "measurement_daily_rollup",
    metadata,
    sa.Column("day", sa.Date, primary_key=True, comment="UTC day"),
    sa.Column("campaign_id", sa.String(64), sa.ForeignKey("campaign.id"), primary_key=True),
    sa.Column("source", sa.String(32), primary_key=True),
    sa.Column("stage", sa.String(64), primary_key=True),
    sa.Column("event_type", sa.String(64), primary_key=True),
    sa.Column("raw_count", sa.BigInteger, nullable=False),
    sa.Column("unique_actors", sa.BigInteger, nullable=True, comment="Exact distinct actors that day; NULL: unknown"),
    sa.Column("actors_hll", sa.LargeBinary, nullable=True, comment="Serialized DataSketches HLL of the actor ids"),
    sa.Column("rolled_up_at", UTCDateTime(), nullable=False),
    # ``source`` is first_party or a measurement source's name (measurement/sources.py SOURCES): not checked here,
    # so a source added in code needs no migration (0016 dropped the check of the first three).
    # The report reads one campaign over a range of days.
    sa.Index("ix_measurement_daily_rollup_campaign_day", "campaign_id", "day"),
)

# What the agents' model calls cost, per UTC day (of each model turn), campaign, provider and model: beside
# measurement_daily_rollup on (day, campaign_id). Derived from agent_run_step's model_turn rows by the asset
# agent_model_cost_daily, which replaces a day whole.
agent_model_cost_daily = sa.Table(
    "agent_model_cost_daily",
    metadata,
    sa.Column("day", sa.Date, primary_key=True, comment="UTC day of the model turns"),
    sa.Column("campaign_id", sa.String(64), sa.ForeignKey("campaign.id"), primary_key=True),
    sa.Column("provider", sa.String(32), primary_key=True),
    sa.Column("model", sa.String(100), primary_key=True, comment="The model that answered, as its answer named it"),
    sa.Column("agent_runs", sa.Integer, nullable=False, comment="Agent runs with a model turn that day"),
    sa.Column("model_turns", sa.Integer, nullable=False),
    sa.Column("input_tokens", sa.BigInteger, nullable=False),
    sa.Column("output_tokens", sa.BigInteger, nullable=False),
    sa.Column("cache_read_tokens", sa.BigInteger, nullable=False),
    sa.Column("cache_write_tokens", sa.BigInteger, nullable=False),
    sa.Column("cost_nano_usd", sa.BigInteger, nullable=False, comment="Cost of the turns with a price, 1e-9 USD"),
    sa.Column("unknown_cost_turns", sa.Integer, nullable=False, comment="Turns not in cost_nano_usd: no price"),
    sa.Column("computed_at", UTCDateTime(), nullable=False),
    sa.Index("ix_agent_model_cost_daily_campaign_day", "campaign_id", "day"),
)

# One row per UTC day the rollup built, written in the transaction that rebuilt the day: a day built with no
# rows (no events, no imports) is told apart from a day never built, which measurement_daily_rollup alone cannot.
measurement_rollup_day = sa.Table(
    "measurement_rollup_day",
    metadata,
    sa.Column("day", sa.Date, primary_key=True, comment="UTC day"),
    sa.Column("rolled_up_at", UTCDateTime(), nullable=False, comment="When the day was last rebuilt"),
    sa.Column(
        "row_count", sa.Integer, nullable=False, comment="measurement_daily_rollup rows of the day; 0: built empty"
    ),
)

# A derived index of the daily rollup, not a second source of truth: one row per ISO week (Monday,
# UTC) and daily-rollup key, holding the union of that week's daily sketches. A 90-day report then
# merges about 13 weekly sketches per key instead of 90 daily ones. The report uses a row only when
# its fingerprint (days, raw_count, daily_rolled_up_at) still matches the daily rows it was built
# from, and otherwise falls back to the daily sketches, so a stale row can slow a report, never skew it.
measurement_weekly_sketch = sa.Table(
    "measurement_weekly_sketch",
    metadata,
    sa.Column("week_start", sa.Date, primary_key=True, comment="Monday of the UTC ISO week"),
    sa.Column("campaign_id", sa.String(64), sa.ForeignKey("campaign.id"), primary_key=True),
    sa.Column("source", sa.String(32), primary_key=True),
    sa.Column("stage", sa.String(64), primary_key=True),
    sa.Column("event_type", sa.String(64), primary_key=True),
    sa.Column("days", sa.Integer, nullable=False, comment="Daily rollup rows merged into this row"),
    sa.Column("raw_count", sa.BigInteger, nullable=False, comment="Sum of the merged rows' raw_count"),
    sa.Column("daily_rolled_up_at", UTCDateTime(), nullable=False, comment="Latest rolled_up_at of the merged rows"),
    sa.Column("actors_hll", sa.LargeBinary, nullable=True, comment="Union of the week's sketches; NULL: unknown"),
    sa.Column("built_at", UTCDateTime(), nullable=False),
    sa.Index("ix_measurement_weekly_sketch_campaign_week", "campaign_id", "week_start"),
)

# A registered webhook destination. Its URL (whose path is often a token) and its Standard Webhooks
# signing secrets are sealed with MARKETING_SECRETS_KEY (sealing.py); only the origin is plain, for lists.
webhook_endpoint = sa.Table(
    "webhook_endpoint",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("campaign_id", sa.String(64), sa.ForeignKey("campaign.id"), nullable=True, comment="NULL: any campaign"),
    sa.Column("origin", sa.String(300), nullable=False, comment="scheme://host[:port] of the URL, for display"),
    sa.Column("url_sealed", sa.Text, nullable=False),
    sa.Column("secret_sealed", sa.Text, nullable=False, comment="Current signing secret (whsec_...), sealed"),
    sa.Column("previous_secret_sealed", sa.Text, nullable=True, comment="Secret before the last rotation, sealed"),
    sa.Column("previous_secret_until", UTCDateTime(), nullable=True, comment="The previous secret signs until then"),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("rotated_at", UTCDateTime(), nullable=True),
)
