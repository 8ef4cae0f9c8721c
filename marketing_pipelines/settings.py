"""Every tunable of marketing-pipelines in one typed place, each read from its own MARKETING_* env var.

`load_settings()` reads the environment once per process (pydantic-settings) and validates as it
reads: a bad value fails with one line naming the variable, the value and what is expected, never
later as a confusing runtime error. The domains' ``defs`` turn these values into the config of their
resources (`ExecutionSettings`, `AgentSettings`, `WebhookClient`), so every value in
force shows under its resource in the Dagster UI, and a test sets a value by building the resource.

Only the values that shape definitions rather than runs are read when the code loads, and they show
in the UI as what they shape: ``measurement_start_date`` (the partitions),
``backfill_days_per_run`` (the assets' backfill policy), ``sensor_interval_seconds`` (each
claiming sensor's minimum interval) and ``late_events_interval_seconds`` (the late-events and
freshness sensors' minimum interval, and the freshness check's threshold).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import math
import os
from collections.abc import Mapping
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from marketing_pipelines.egress import api_root_problem, parse_networks
from marketing_pipelines.redact import remember_secrets, remember_url_secrets
from marketing_pipelines.sealing import KeySource, key_source
from marketing_pipelines.service_account import ServiceAccountKeyError, key_secrets, read_service_account_key

if TYPE_CHECKING:
    import dagster as dg

DEFAULT_DB_DIR = ".marketing"
DEFAULT_DB_FILE = "marketing.db"
SECRETS_KEY_FILE = "secrets.key"
ENV_PREFIX = "MARKETING_"
_T = TypeVar("_T")
MODEL_PROVIDERS = ("offline", "anthropic", "openai")


# The model price table's defaults, USD per million tokens, as the providers publish them for standard (not batch)
# calls; "cache_write" is Anthropic's 5-minute cache write (OpenAI bills no cache writes). Read on PRICES_READ_ON:
# Anthropic at platform.claude.com/docs/en/about-claude/pricing and its model pages (models/<name>/overview).
# Sonnet 5.5's page says $0.20 a cache read; price trackers report a cut to $0.10 from 2026-10-07 that no Anthropic
# page here confirms, so the page's price stands (it overstates, never understates). Haiku 5.5 is left out: it is
# priced by prompt length (5x above 100,000 tokens), which one price per token cannot say; give it in
# MARKETING_MODEL_PRICES at the rate its prompts pay. OpenAI's own pricing page (developers.openai.com/api/docs/pricing)
# was not reachable from here: its prices are the ones every gateway listing read then agrees on (Helicone, Vercel AI
# Gateway, LiteLLM), cached input being what OpenAI calls "cached input".
PRICES_READ_ON = "2026-12-07"
_ANTHROPIC_OLD_OPUS = {"input": 15.0, "output": 75.0, "cache_read": 1.5, "cache_write": 18.75}
_ANTHROPIC_OPUS = {"input": 5.0, "output": 25.0, "cache_read": 0.5, "cache_write": 6.25}
_ANTHROPIC_SONNET_4 = {"input": 3.0, "output": 15.0, "cache_read": 0.3, "cache_write": 3.75}
_ANTHROPIC_FABLE = {"input": 10.0, "output": 50.0, "cache_write": 12.5}
DEFAULT_MODEL_PRICES: dict[str, dict[str, float]] = {
    "claude-fable-5-1": {**_ANTHROPIC_FABLE, "cache_read": 0.25},
    "claude-fable-5": {**_ANTHROPIC_FABLE, "cache_read": 1.0},
    "claude-opus-5-5": {"input": 4.0, "output": 20.0, "cache_read": 0.2, "cache_write": 5.0},
    "claude-opus-5": _ANTHROPIC_OPUS,
    "claude-opus-4-8": _ANTHROPIC_OPUS,
    "claude-opus-4-7": _ANTHROPIC_OPUS,
    "claude-opus-4-6": _ANTHROPIC_OPUS,
    "claude-opus-4-5": _ANTHROPIC_OPUS,
    "claude-opus-4-1": _ANTHROPIC_OLD_OPUS,
    "claude-opus-4-0": _ANTHROPIC_OLD_OPUS,
    "claude-opus-4": _ANTHROPIC_OLD_OPUS,
    "claude-sonnet-5-5": {"input": 2.0, "output": 10.0, "cache_read": 0.2, "cache_write": 2.5},
    "claude-sonnet-5": {"input": 2.0, "output": 10.0, "cache_read": 0.2, "cache_write": 2.5},
    "claude-sonnet-4-6": _ANTHROPIC_SONNET_4,
    "claude-sonnet-4-5": _ANTHROPIC_SONNET_4,
    "claude-sonnet-4-0": _ANTHROPIC_SONNET_4,
    "claude-sonnet-4": _ANTHROPIC_SONNET_4,
    "claude-haiku-4-5": {"input": 1.0, "output": 5.0, "cache_read": 0.1, "cache_write": 1.25},
    "gpt-4.1": {"input": 2.0, "output": 8.0, "cache_read": 0.5, "cache_write": 2.0},
    "gpt-4.1-mini": {"input": 0.4, "output": 1.6, "cache_read": 0.1, "cache_write": 0.4},
    "gpt-4.1-nano": {"input": 0.1, "output": 0.4, "cache_read": 0.025, "cache_write": 0.1},
    "gpt-4o": {"input": 2.5, "output": 10.0, "cache_read": 1.25, "cache_write": 2.5},
    "gpt-4o-mini": {"input": 0.15, "output": 0.6, "cache_read": 0.075, "cache_write": 0.15},
}
PRICE_KEYS = ("input", "output", "cache_read", "cache_write")
# USD per million tokens: above this a price is a typo (the dearest published price is $75 of Opus 4.1's output).
MAX_PRICE_USD_PER_MTOK = 10_000
MAX_PRICED_MODELS = 1000
# A price is held exactly in pico-dollars per token (USD per million tokens to 6 decimals).
PRICE_DECIMALS = 6


def parse_model_prices(value: Any) -> dict[str, dict[str, float]]:
    """MARKETING_MODEL_PRICES (a JSON object, or the mapping in code) checked: the defaults with its models added or
    replaced. Raises ValueError naming the first model and key that is wrong. A model's missing cache prices are its
    input price (a provider that bills no cache reads or writes bills them as input)."""
    if isinstance(value, str):
        try:
            value = json.loads(value, parse_constant=_refuse_constant)
        except ValueError as exc:
            raise ValueError(f"is not a JSON object of model prices ({str(exc).splitlines()[0][:80]})") from None
    if not isinstance(value, Mapping):
        raise ValueError(
            'must be a JSON object like {"model": {"input": 3.0, "output": 15.0}} (USD per million tokens)'
        )
    if len(value) > MAX_PRICED_MODELS:
        raise ValueError(f"prices {len(value)} models; at most {MAX_PRICED_MODELS}")
    given: dict[str, dict[str, float]] = {}
    for model, price in value.items():
        if not (isinstance(model, str) and 0 < len(model) <= 100 and model.isascii() and model.isprintable()) or (
            any(c.isspace() for c in model)
        ):
            raise ValueError("a model name must be 1 to 100 printable ASCII characters without spaces")
        if not isinstance(price, Mapping):
            raise ValueError(f"model {model!r}: its price must be an object of {', '.join(PRICE_KEYS)}")
        unknown = sorted(str(key)[:40] for key in price if key not in PRICE_KEYS)
        if unknown:
            raise ValueError(f"model {model!r}: unknown key {unknown[0]!r}; the keys are {', '.join(PRICE_KEYS)}")
        missing = [key for key in ("input", "output") if key not in price]
        if missing:
            raise ValueError(f"model {model!r}: {missing[0]!r} is missing")
        checked = {key: _price(model, key, price[key]) for key in price}
        given[model] = {key: checked.get(key, checked["input"]) for key in PRICE_KEYS}
    return {**DEFAULT_MODEL_PRICES, **given}


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a price")


def _price(model: str, key: str, value: Any) -> float:
    what = f"model {model!r}: {key!r}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number (USD per million tokens)")
    # Compared before math.isfinite, which cannot take an int too large for a float; NaN fails every comparison.
    if not 0 <= value <= MAX_PRICE_USD_PER_MTOK or not math.isfinite(value):
        raise ValueError(f"{what} must be from 0 to {MAX_PRICE_USD_PER_MTOK} USD per million tokens")
    if Decimal(repr(float(value))).as_tuple().exponent < -PRICE_DECIMALS:  # type: ignore[operator]
        raise ValueError(f"{what} has more than {PRICE_DECIMALS} decimals")
    return float(value)


class SettingsError(ValueError):
    """A setting has a value we cannot use; the message names the env var."""


def default_database_url(cwd: Path | None = None) -> str:
    """The embedded default: a SQLite file under ``.marketing/`` of the current directory."""
    base = (cwd or Path.cwd()) / DEFAULT_DB_DIR / DEFAULT_DB_FILE
    return f"sqlite:///{base}"


def env_name(field: str) -> str:
    """The env var a field of `Settings` is read from: MARKETING_ and its name, or the service's own variable."""
    info = Settings.model_fields.get(field)
    alias = info.validation_alias if info is not None else None
    return alias if isinstance(alias, str) else f"{ENV_PREFIX}{field.upper()}"


# In a Settings field's json_schema_extra: the setting is shown by its variable's name only, never its
# value: not in a one-line error (``load_settings``), nor in the UI (a resource field filled from it is
# ``dg.EnvVar`` of its variable, ``resource_from_settings``). Every SecretStr field carries it, and so do
# strings that may hold a credential (a database URL, a webhook URL, a base URL of a self-hosted service).
_SECRET = "marketing_secret"
SECRET = {_SECRET: True}


class Settings(BaseSettings):
    """The README's configuration table mirrors these fields (env var = MARKETING_ + the upper-cased name)."""

    # populate_by_name: a field read from a service's own variable (an alias) is still given by its name in code.
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_ignore_empty=True, extra="ignore", frozen=True, populate_by_name=True
    )

    database_url: str | None = Field(
        None,
        description="Application database URL (SQLite or PostgreSQL); empty: the embedded SQLite default.",
        json_schema_extra=SECRET,
    )
    # Chosen from benchmarks/e2e_executions.py (docs/PERFORMANCE.md, section 6).
    sensor_batch_size: int = Field(
        5000,
        ge=1,
        le=10_000,
        description="Due rows claimed per tick, at most; executions claimed and still waiting for their runs count.",
    )
    sensor_interval_seconds: int = Field(3, ge=1, le=3600, description="Minimum seconds between claiming sensor ticks.")
    executions_per_run: int = Field(
        1000, ge=1, le=1000, description="Executions one marketing_execution_job run performs (1: one per run)."
    )
    webhook_concurrency: int = Field(32, ge=1, le=64, description="Webhooks one run sends at once.")
    webhook_allow_networks: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description="Comma-separated CIDRs webhooks may reach beyond public addresses (loopback, private). "
        "Never link-local.",
    )
    execution_lease_seconds: int = Field(
        300, ge=5, le=86_400, description="Lease on a claimed execution; a run must start and renew within it."
    )
    execution_max_attempts: int = Field(
        3, ge=1, le=100, description="Default attempts per execution before it is FAILED."
    )
    retry_backoff_seconds: float = Field(
        60.0,
        ge=0,
        le=86_400,
        allow_inf_nan=False,
        description="Base delay before a failed execution's next attempt (doubles per attempt).",
    )
    webhook_timeout_seconds: float = Field(
        10.0, ge=0.1, le=600, allow_inf_nan=False, description="Timeout of one webhook action request."
    )
    max_concurrent_agent_runs: int = Field(
        2, ge=1, le=1000, description="Limit of the agent_runs Dagster concurrency pool."
    )
    max_model_calls_per_minute: int = Field(60, ge=1, le=100_000, description="Token-bucket rate per model provider.")
    # Token limits in the providers' own units, for every model of every provider; unset, a unit is limited only
    # where `limits set` configured it or a provider's answer said what its limit is (db/token_bucket.py).
    max_model_input_tokens_per_minute: int | None = Field(
        None,
        ge=1,
        le=1_000_000_000,
        description="Input tokens per minute per provider (Anthropic's ITPM); unset: none.",
    )
    max_model_output_tokens_per_minute: int | None = Field(
        None,
        ge=1,
        le=1_000_000_000,
        description="Output tokens per minute per provider (Anthropic's OTPM); unset: none.",
    )
    max_model_tokens_per_minute: int | None = Field(
        None, ge=1, le=1_000_000_000, description="All tokens per minute per provider (OpenAI's TPM); unset: none."
    )
    agent_lease_grace_seconds: int = Field(
        300,
        ge=5,
        le=86_400,
        description=(
            "Agent-run lease: at the claim this plus the run's max_run_seconds (Dagster's queue and start-up); "
            "in the run this, renewed every third."
        ),
    )
    agent_max_run_seconds: int = Field(300, ge=1, le=86_400, description="Default time limit of one agent run.")
    model_provider: str = Field("offline", description="Model provider for agents: offline, anthropic or openai.")
    model_prices: Annotated[dict[str, dict[str, float]], NoDecode] = Field(
        DEFAULT_MODEL_PRICES,
        description="Model prices in USD per million tokens, a JSON object "
        '{"model": {"input": 3.0, "output": 15.0, "cache_read": 0.3, "cache_write": 3.75}} that adds to or replaces '
        f"the defaults (the providers' published prices, read on {PRICES_READ_ON}). A dated snapshot is priced as its "
        "model (claude-sonnet-4-5-20250929 as claude-sonnet-4-5); a model without a price has an unknown cost.",
    )
    measurement_start_date: date = Field(date(2026, 1, 1), description="First UTC day of the measurement partitions.")
    # Chosen from benchmarks/backfill.py (docs/PERFORMANCE.md, section 8).
    backfill_days_per_run: int = Field(
        92, ge=1, le=3660, description="Days of the measurement assets one backfill run covers (BackfillPolicy)."
    )
    late_events_interval_seconds: int = Field(
        300,
        ge=30,
        le=3600,
        description="Minimum seconds between ticks of the late-events sensor, which keeps today's rollup current; "
        "its freshness check WARNs when an event waits longer than twice this plus 60 s.",
    )

    # Unattended operation: queue health thresholds (asset checks on the queue observations), alerts, links.
    health_due_lag_warn_seconds: float = Field(
        300.0,
        ge=1,
        le=604_800,
        allow_inf_nan=False,
        description="Queue health check WARNs when the oldest due execution or queued agent run waits this long.",
    )
    health_due_lag_error_seconds: float = Field(
        1800.0,
        ge=1,
        le=604_800,
        allow_inf_nan=False,
        description="Queue health check is at ERROR (and alerts) when the oldest due row waits this long.",
    )
    health_failed_last_hour_warn: int = Field(
        1, ge=1, le=1_000_000, description="Queue health check WARNs at this many rows FAILED in the last hour."
    )
    health_failed_last_hour_error: int = Field(
        20,
        ge=1,
        le=1_000_000,
        description="Queue health check is at ERROR (and alerts) at this many rows FAILED in the last hour.",
    )
    alert_webhook_url: str | None = Field(
        None,
        description="Slack-compatible incoming webhook for alerts (failed runs, queue checks at ERROR); off if unset. "
        "Messages and the UI show only its scheme and host.",
        json_schema_extra=SECRET,
    )
    dagster_ui_url: str | None = Field(
        None, description="Base URL of the Dagster UI, for links to runs (e.g. http://127.0.0.1:3000)."
    )
    history_retention_days: int = Field(
        90,
        ge=1,
        le=3650,
        description="Days the history of finished work is kept (finished executions and their attempts, finished "
        "agent runs and their transcripts, rejected event-file lines); history_purge_schedule deletes older rows "
        "daily.",
    )
    # Trust at the boundary: registered webhook endpoints are stored sealed and sign what they send.
    secrets_key: SecretStr | None = Field(
        None,
        description="Fernet key(s), comma-separated, sealing webhook endpoint URLs and signing secrets; the first "
        "seals, all open. With a SQLite database and no key set, a secrets.key file beside it (the demo's); when "
        "both are there they must hold the same keys.",
        json_schema_extra=SECRET,
    )
    webhook_rotation_hours: float = Field(
        24.0,
        ge=0,
        le=720,
        allow_inf_nan=False,
        description="Hours a rotated endpoint's previous signing secret keeps signing alongside the new one.",
    )

    # The measurement importers, each read from its service's own variables (no MARKETING_ prefix). An
    # importer whose credentials are not all set is left out of the definitions (measurement/defs.py).
    plausible_api_key: SecretStr | None = Field(
        None,
        validation_alias="PLAUSIBLE_API_KEY",
        description="Plausible Stats API key (site analytics importer).",
        json_schema_extra=SECRET,
    )
    plausible_site_id: str | None = Field(
        None,
        validation_alias="PLAUSIBLE_SITE_ID",
        description="Site domain as registered in Plausible.",
        json_schema_extra=SECRET,
    )
    plausible_base_url: str = Field(
        "https://plausible.io",
        validation_alias="PLAUSIBLE_BASE_URL",
        description="Plausible origin; change for self-hosting.",
        json_schema_extra=SECRET,
    )
    posthog_api_key: SecretStr | None = Field(
        None,
        validation_alias="POSTHOG_API_KEY",
        description="PostHog personal API key with the Query Read scope (PostHog campaign events importer).",
        json_schema_extra=SECRET,
    )
    posthog_project_id: str | None = Field(
        None,
        validation_alias="POSTHOG_PROJECT_ID",
        description="PostHog project id (the number in the project's settings).",
        json_schema_extra=SECRET,
    )
    posthog_host: str = Field(
        "https://us.posthog.com",
        validation_alias="POSTHOG_HOST",
        description="PostHog origin: https://us.posthog.com (US Cloud), https://eu.posthog.com (EU Cloud), or a "
        "self-hosted instance's.",
        json_schema_extra=SECRET,
    )
    github_token: SecretStr | None = Field(
        None,
        validation_alias="GITHUB_TOKEN",
        description="GitHub token with read access to the campaigns' repositories (release downloads importer).",
        json_schema_extra=SECRET,
    )
    github_api_url: str = Field(
        "https://api.github.com",
        validation_alias="GITHUB_API_URL",
        description="GitHub API root; change for GitHub Enterprise.",
        json_schema_extra=SECRET,
    )
    # Traffic needs push access to each repository, which a token that reads releases may lack: off until turned on.
    github_traffic_enabled: bool = Field(
        False,
        description="Import the campaigns' github_repo views and clones per day from GitHub's traffic API "
        "(GITHUB_TOKEN needs push access: a classic token with repo, or fine-grained with Administration: read).",
    )
    # The package-download importers need no key: each is off until turned on, so a fresh machine fetches nothing.
    pypi_downloads_enabled: bool = Field(
        False, description="Import the campaigns' pypi_package downloads from pypistats.org (no key needed)."
    )
    pypistats_api_url: str = Field(
        "https://pypistats.org",
        validation_alias="PYPISTATS_API_URL",
        description="pypistats.org origin (PyPI downloads importer).",
        json_schema_extra=SECRET,
    )
    npm_downloads_enabled: bool = Field(
        False, description="Import the campaigns' npm_package downloads from api.npmjs.org (no key needed)."
    )
    npm_downloads_api_url: str = Field(
        "https://api.npmjs.org",
        validation_alias="NPM_DOWNLOADS_API_URL",
        description="npm download counts API origin (npm downloads importer).",
        json_schema_extra=SECRET,
    )
    ga4_property_id: str | None = Field(
        None,
        validation_alias="GA4_PROPERTY_ID",
        description="Google Analytics 4 property ID, the number under Admin > Property details (GA4 importer).",
        json_schema_extra=SECRET,
    )
    ga4_service_account_json: SecretStr | None = Field(
        None,
        validation_alias="GA4_SERVICE_ACCOUNT_JSON",
        description="A Google service account's JSON key: its text, or the path of its file. The service account "
        "must be a user (Viewer) of the GA4 property.",
        json_schema_extra=SECRET,
    )
    ga4_api_url: str = Field(
        "https://analyticsdata.googleapis.com",
        validation_alias="GA4_API_URL",
        description="Google Analytics Data API root.",
        json_schema_extra=SECRET,
    )
    ga4_token_url: str | None = Field(
        None,
        validation_alias="GA4_TOKEN_URL",
        description="A token endpoint the key's token_uri may name besides Google's "
        "(https://oauth2.googleapis.com/token); the signed assertion is sent to no other.",
        json_schema_extra=SECRET,
    )

    # The model providers, each read from its service's own variables. A provider without a key is
    # "not configured": the code location still loads, and a request for it is refused.
    anthropic_api_key: SecretStr | None = Field(
        None,
        validation_alias="ANTHROPIC_API_KEY",
        description="Anthropic API key (model provider anthropic).",
        json_schema_extra=SECRET,
    )
    anthropic_model: str = Field(
        "claude-sonnet-4-5", validation_alias="ANTHROPIC_MODEL", description="Model of the anthropic provider."
    )
    anthropic_base_url: str = Field(
        "https://api.anthropic.com",
        validation_alias="ANTHROPIC_BASE_URL",
        description="Anthropic API origin.",
        json_schema_extra=SECRET,
    )
    openai_api_key: SecretStr | None = Field(
        None,
        validation_alias="OPENAI_API_KEY",
        description="OpenAI (or compatible server) API key (model provider openai).",
        json_schema_extra=SECRET,
    )
    openai_model: str = Field(
        "gpt-4o-mini", validation_alias="OPENAI_MODEL", description="Model of the openai provider."
    )
    openai_base_url: str = Field(
        "https://api.openai.com/v1",
        validation_alias="OPENAI_BASE_URL",
        description="Chat Completions API root: OpenAI's, or an OpenAI-compatible server's.",
        json_schema_extra=SECRET,
    )

    @field_validator("health_due_lag_error_seconds", "health_failed_last_hour_error")
    @classmethod
    def _error_not_below_warn(cls, value: float, info: ValidationInfo) -> float:
        warn = info.data.get(str(info.field_name).replace("_error", "_warn"))
        if warn is not None and value < warn:
            raise ValueError(f"must be at least the WARN threshold ({warn:g})")
        return value

    @field_validator("webhook_allow_networks", mode="before")
    @classmethod
    def _networks(cls, value: Any) -> tuple[str, ...]:
        # The egress policy's own parser, so the setting is refused here exactly as the policy would.
        return tuple(str(network) for network in parse_networks(value))

    @field_validator(
        "plausible_base_url",
        "posthog_host",
        "github_api_url",
        "pypistats_api_url",
        "npm_downloads_api_url",
        "ga4_api_url",
        "ga4_token_url",
        "anthropic_base_url",
        "openai_base_url",
    )
    @classmethod
    def _api_root(cls, value: str | None) -> str | None:
        if value is None:
            return None
        problem = api_root_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("posthog_project_id")
    @classmethod
    def _posthog_project_id(cls, value: str | None) -> str | None:
        # It is a path segment of every request: digits only, so no value can reach another path.
        text = (value or "").strip()
        if text and not (text.isascii() and text.isdigit()):
            raise ValueError("must be the project's number (digits only), as PostHog's project settings show it")
        return text or None

    @field_validator("ga4_property_id")
    @classmethod
    def _ga4_property(cls, value: str | None) -> str | None:
        # The number alone, as the Data API's path takes it (properties/{id}:runReport); "properties/123" is accepted.
        text = (value or "").strip().removeprefix("properties/")
        if not text:
            return None
        if not (text.isascii() and text.isdigit() and len(text) <= 20):
            raise ValueError("must be the property's number (Admin > Property details), e.g. 123456789")
        return text

    @field_validator("ga4_service_account_json")
    @classmethod
    def _service_account_key(cls, value: SecretStr | None) -> SecretStr | None:
        # Read and checked at load (a file that is no service-account key stops it in one line); the problem
        # never quotes the key (service_account.py), and _one_line shows the variable's name only.
        text = value.get_secret_value().strip() if value is not None else ""
        if not text:
            return None
        try:
            read_service_account_key(text)
        except ServiceAccountKeyError as exc:
            raise ValueError(str(exc)) from None
        return SecretStr(text)

    @field_validator("anthropic_api_key", "openai_api_key")
    @classmethod
    def _api_key(cls, value: SecretStr | None) -> SecretStr | None:
        # Surrounding white space (a secrets file's trailing newline) is stripped; a key that could never
        # go into an HTTP header fails loading here, in one line naming the variable, never quoting it.
        text = value.get_secret_value().strip() if value is not None else ""
        if not text:
            return None
        problem = api_key_problem(text)
        if problem:
            raise ValueError(problem)
        return SecretStr(text)

    @field_validator("model_prices", mode="before")
    @classmethod
    def _model_prices(cls, value: Any) -> dict[str, dict[str, float]]:
        return parse_model_prices(value)

    def default_model_limits(self) -> dict[str, int]:
        """The per-minute limit of each unit configured for every model of a provider (db/token_bucket.py)."""
        return model_limits_of(self)

    @field_validator("model_provider")
    @classmethod
    def _provider(cls, value: str) -> str:
        if value not in MODEL_PROVIDERS:
            raise ValueError(f"is not a provider; use {', '.join(MODEL_PROVIDERS[:-1])} or {MODEL_PROVIDERS[-1]}")
        return value

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or default_database_url()

    def secrets_key_file(self) -> Path | None:
        """``secrets.key`` beside a SQLite database file: the embedded default's key, made by the demo."""
        url = self.resolved_database_url
        if not url.startswith("sqlite:///") or url == "sqlite:///:memory:":
            return None
        return Path(url.removeprefix("sqlite:///").split("?")[0]).parent / SECRETS_KEY_FILE

    def sealing_keys(self) -> KeySource:
        """MARKETING_SECRETS_KEY, else the SQLite database's key file, and which; SealingError when they differ."""
        variable = self.secrets_key.get_secret_value() if self.secrets_key is not None else None
        return key_source(variable, self.secrets_key_file())


def api_key_problem(key: str) -> str | None:
    """Why ``key`` (already stripped) cannot go into an HTTP header, without quoting it; None when it can.

    httpx refuses a header value with a newline only when it writes the request, and its error quotes
    the value ("Illegal header value b'Bearer sk-...'"), so a key is checked before any request.
    """
    if not key:
        return "is empty"
    if not (key.isascii() and key.isprintable()) or any(c.isspace() for c in key):
        return "holds white space, a control character or a non-ASCII character inside (the value is not shown)"
    return None


def dagster_ui_base(url: str | None) -> str | None:
    """The Dagster UI's base URL for links to runs (``MARKETING_DAGSTER_UI_URL``) without its trailing
    slash; None when unset. Raises ValueError unless it is an http(s) URL without credentials, query or
    fragment: a link is shown to people, and what it carries beyond the address would be shown too."""
    if not url:
        return None
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parses the port, raising on a bad one
    except ValueError:
        parts = None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or parts.query
        or parts.fragment
    ):
        raise ValueError("it must be an http(s) URL without credentials, query or fragment, e.g. http://127.0.0.1:3000")
    return url.rstrip("/")


def _bounds(field: str) -> str | None:
    """ "must be between 1 and 1000" for a field with both bounds, so the line says what is accepted."""
    info = Settings.model_fields.get(field)
    limits = {type(m).__name__: m for m in (info.metadata if info else [])}
    if "Ge" in limits and "Le" in limits:
        return f"must be between {limits['Ge'].ge:g} and {limits['Le'].le:g}"
    return None


def _one_line(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    field = str(error["loc"][0]) if error["loc"] else "?"
    # A field read from its service's variable is named by that alias in the error.
    field = next((name for name, info in Settings.model_fields.items() if info.validation_alias == field), field)
    message = str(error["msg"]).removeprefix("Value error, ")
    message = message[:1].lower() + message[1:]
    if error["type"] in ("greater_than_equal", "less_than_equal", "finite_number"):
        message = _bounds(field) or message
    shown = "(a secret, not shown)" if field in Settings.model_fields and is_secret(field) else repr(error.get("input"))
    return f"{env_name(field)}={shown} is not valid: {message}"


def model_limits_of(source: Any) -> dict[str, int]:
    """Unit -> per-minute limit of the ``max_model_*_per_minute`` fields ``source`` (Settings or AgentSettings)
    sets; an unset token limit is left out (that unit limited only where configured or stated by a provider)."""
    limits = {
        "requests": source.max_model_calls_per_minute,
        "input_tokens": source.max_model_input_tokens_per_minute,
        "output_tokens": source.max_model_output_tokens_per_minute,
        "tokens": source.max_model_tokens_per_minute,
    }
    return {unit: value for unit, value in limits.items() if value is not None}


def load_settings(**overrides: Any) -> Settings:
    """The environment's settings (``overrides`` win over it); raises SettingsError naming the variable.

    Every secret setting's value is remembered (``remember_settings_secrets``), so it is hidden from any text
    this process stores, logs or sends from then on.
    """
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError(_one_line(exc)) from None
    remember_settings_secrets(settings)
    return settings


# The secret setting that is a webhook: its path is its token (Slack's /services/T0/B0/<token>).
_WEBHOOK_SETTINGS = frozenset({"alert_webhook_url"})
# The secret settings that are a service-account key (its JSON text or its file's path).
_KEY_SETTINGS = frozenset({"ga4_service_account_json"})


def remember_settings_secrets(settings: Settings) -> None:
    """``redact.remember_secrets`` of each secret setting's value: a key whole and each of a comma-separated
    list's keys (MARKETING_SECRETS_KEY=new,old); of a URL only what may be a credential (user info, query,
    a webhook's path), as its host or a database file's path is no secret and recurs in ordinary text."""
    for name in Settings.model_fields:
        value = getattr(settings, name)
        if not is_secret(name) or value is None:
            continue
        text = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
        if name in _KEY_SETTINGS:
            # A key's secret parts, not its JSON text (whose public parts recur in ordinary text) nor its path.
            remember_secrets(*key_secrets(text))
        elif "://" in text:
            remember_url_secrets(text, path_is_secret=name in _WEBHOOK_SETTINGS)
        else:
            remember_secrets(text, *text.split(","))


@functools.cache
def current_settings() -> Settings:
    """`load_settings()` once per process: what the code location's definitions are built from."""
    return load_settings()


# The key, in a resource field's json_schema_extra, naming the setting the field is (``setting_field``).
_SETTING = "marketing_setting"


def is_secret(name: str) -> bool:
    """Whether setting ``name`` is shown by its variable's name only (``SECRET`` in its field)."""
    extra = Settings.model_fields[name].json_schema_extra
    return isinstance(extra, dict) and bool(extra.get(_SECRET))


def setting_field(name: str) -> Any:
    """A resource field that is the setting ``name``: same default and bounds, its env var in the description.

    Resources declare ``batch_size: int = setting_field("sensor_batch_size")``, so a value edited
    in the launchpad is held to the same bounds as the env var, and the UI says where it comes from;
    ``resource_from_settings`` fills the field from ``Settings`` by that name. The field of a secret
    setting (``is_secret``) is given as ``dg.EnvVar`` of its variable, so the UI shows the variable's
    name, never the value.
    """
    info, secret = Settings.model_fields[name], is_secret(name)
    # The setting's field as Field() arguments (pydantic's supported way to derive a field from another;
    # FieldInfo.merge_field_infos is deprecated), with its constraints given back as the keywords they came from.
    arguments = {**info.asdict()["attributes"], **_constraint_arguments(name, info.metadata)}
    arguments.update(
        # Dagster's config holds lists, not tuples: a setting's tuple default is the resource field's list.
        default=list(info.default) if isinstance(info.default, tuple) else info.default,
        description=f"{info.description} Env var: {env_name(name)}{' (shown by name only)' if secret else ''}.",
        json_schema_extra={_SETTING: name},
        # A service's variable is the setting's alias; the resource's field keeps its own name.
        alias=None,
        alias_priority=None,
        validation_alias=None,
        serialization_alias=None,
    )
    return Field(**arguments)


def _constraint_arguments(name: str, metadata: list[Any]) -> dict[str, Any]:
    """The ``Field()`` keywords that give a field the constraints setting ``name`` holds (``ge=1`` for ``Ge(1)``).

    ``Field()`` turns its constraint keywords into metadata objects whose attributes carry the keywords'
    names (``annotated_types.Ge(ge=1)``, ``AllowInfNan(allow_inf_nan=False)``, one object holding
    ``pattern`` and ``max_digits``), so each object's attributes are the keywords that made it.
    """
    arguments: dict[str, Any] = {}
    for constraint in metadata:
        if constraint is NoDecode:
            # How pydantic-settings parses the variable; a resource's config is never read from one.
            continue
        if isinstance(constraint, type):
            raise TypeError(f"setting {name}: {constraint!r} is a marker, not a constraint Field() takes")
        # Ge, Le, AllowInfNan... are dataclasses; pattern= and max_digits= share one plain object.
        arguments.update(dataclasses.asdict(constraint) if dataclasses.is_dataclass(constraint) else vars(constraint))
    return arguments


def settings_of(resource_class: type) -> dict[str, str]:
    """Each field of ``resource_class`` declared with ``setting_field`` -> the setting it is."""
    fields = {}
    for field, info in resource_class.model_fields.items():  # type: ignore[attr-defined]
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if isinstance(extra.get(_SETTING), str):
            fields[field] = extra[_SETTING]
    return fields


def resource_from_settings(
    resource_class: type[_T], settings: Settings, *, environ: Mapping[str, str] | None = None, **values: Any
) -> _T:
    """``resource_class`` with every field declared by ``setting_field(name)`` set to ``settings.name``.

    The one way the definitions turn settings into resource config. ``values`` set fields that are
    not settings (or replace one). A secret field gets ``dg.EnvVar`` of its variable when that is set
    in ``environ`` (default: os.environ, where the code location loads), else the value ``settings``
    holds (given in code, or empty).
    """
    for field, name in settings_of(resource_class).items():
        if field in values:
            continue
        value = getattr(settings, name)
        if is_secret(name):
            plain = value.get_secret_value() if isinstance(value, SecretStr) else value
            value = env_var_if_set(env_name(name), environ) or plain
        elif isinstance(value, tuple):
            value = list(value)
        values[field] = value
    return resource_class(**values)


def env_var_if_set(name: str, environ: Mapping[str, str] | None = None) -> dg.EnvVar | None:
    """``dg.EnvVar(name)`` when the variable is set where the code location loads, else None.

    For secrets (API keys, a database URL with a password): an EnvVar keeps the value out of the
    run config shown in the UI (only the variable's name shows), but one that is unset in the run
    process fails resource initialisation and with it the whole run. A deployment without the
    variable must still load and run what does not need it, so an unset variable becomes None.
    Setting it later takes a reload of the code location, as any change to the environment does.
    """
    import dagster as dg  # here, not at the top: the CLI imports settings and must start without dagster

    return dg.EnvVar(name) if (os.environ if environ is None else environ).get(name) else None


def shown_in_ui(cls: type[_T]) -> type[_T]:
    """A resource class whose docstring the Dagster UI shows as Markdown, as it reads in the code.

    Dagster shows a resource's class docstring as its description, rendered as Markdown. Python 3.11
    keeps a docstring's indentation, which Markdown reads as a code block from the second paragraph
    on, and RST's ``literal`` would show its doubled backticks: the docstring is dedented, and each
    ``literal`` becomes Markdown's single-backtick code.
    """
    if cls.__doc__:
        cls.__doc__ = inspect.cleandoc(cls.__doc__).replace("``", "`")
    return cls
