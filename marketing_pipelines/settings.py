"""Every tunable of marketing-pipelines in one typed place, each read from its own env var.

`Settings.from_env()` validates as it reads: a bad value fails with one line naming the
variable, the value and what is expected, never later as a confusing runtime error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from datetime import date
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_DB_DIR = ".marketing"
DEFAULT_DB_FILE = "marketing.db"


class SettingsError(ValueError):
    """A setting has a value we cannot use; the message names the env var."""


def default_database_url(cwd: Path | None = None) -> str:
    """The embedded default: a SQLite file under ``.marketing/`` of the current directory."""
    base = (cwd or Path.cwd()) / DEFAULT_DB_DIR / DEFAULT_DB_FILE
    return f"sqlite:///{base}"


def _int(minimum: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        value = int(raw)
        if value < minimum:
            raise ValueError(f"must be >= {minimum}")
        return value

    return parse


def _bounded_int(minimum: int, maximum: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        value = int(raw)
        if not minimum <= value <= maximum:
            raise ValueError(f"must be between {minimum} and {maximum}")
        return value

    return parse


def _networks(raw: str) -> tuple[str, ...]:
    # The egress policy's own parser, so the setting is refused here exactly as the policy would.
    from marketing_pipelines.executions.egress import parse_networks

    return tuple(str(network) for network in parse_networks(raw))


def _float(minimum: float) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        value = float(raw)
        if value < minimum:
            raise ValueError(f"must be >= {minimum}")
        return value

    return parse


@dataclass(frozen=True)
class _Var:
    env: str
    parse: Callable[[str], Any]
    help: str


# field name -> env var, parser, description. The README's configuration table mirrors this.
ENV_VARS: dict[str, _Var] = {
    "database_url": _Var("MARKETING_DATABASE_URL", str, "Application database URL (SQLite or PostgreSQL)."),
    "sensor_batch_size": _Var(
        "MARKETING_SENSOR_BATCH_SIZE", _bounded_int(1, 10_000), "Due rows a claiming sensor claims per tick."
    ),
    "sensor_interval_seconds": _Var(
        "MARKETING_SENSOR_INTERVAL_SECONDS", _bounded_int(1, 3600), "Minimum seconds between claiming sensor ticks."
    ),
    "executions_per_run": _Var(
        "MARKETING_EXECUTIONS_PER_RUN",
        _bounded_int(1, 1000),
        "Executions one marketing_execution_job run performs (1: one run per execution).",
    ),
    "webhook_allow_networks": _Var(
        "MARKETING_WEBHOOK_ALLOW_NETWORKS",
        lambda raw: _networks(raw),
        "Comma-separated CIDRs webhooks may reach beyond public addresses (loopback, private). Never link-local.",
    ),
    "webhook_concurrency": _Var(
        "MARKETING_WEBHOOK_CONCURRENCY", _bounded_int(1, 64), "Webhooks one run sends at once."
    ),
    "execution_lease_seconds": _Var(
        "MARKETING_EXECUTION_LEASE_SECONDS",
        _int(5),
        "Lease on a claimed execution; a run must start and renew within it.",
    ),
    "execution_max_attempts": _Var(
        "MARKETING_EXECUTION_MAX_ATTEMPTS", _int(1), "Default attempts per execution before it is FAILED."
    ),
    "retry_backoff_seconds": _Var(
        "MARKETING_RETRY_BACKOFF_SECONDS",
        _float(0),
        "Base delay before a failed execution's next attempt (doubles per attempt).",
    ),
    "webhook_timeout_seconds": _Var(
        "MARKETING_WEBHOOK_TIMEOUT_SECONDS", _float(0.1), "Timeout of one webhook action request."
    ),
    "max_concurrent_agent_runs": _Var(
        "MARKETING_MAX_CONCURRENT_AGENT_RUNS", _int(1), "Limit of the agent_runs Dagster concurrency pool."
    ),
    "max_model_calls_per_minute": _Var(
        "MARKETING_MAX_MODEL_CALLS_PER_MINUTE", _bounded_int(1, 100_000), "Token-bucket rate per model provider."
    ),
    "agent_lease_grace_seconds": _Var(
        "MARKETING_AGENT_LEASE_GRACE_SECONDS",
        _int(5),
        "Lease on a claimed agent run beyond its max_run_seconds (queue wait + start-up).",
    ),
    "agent_max_run_seconds": _Var("MARKETING_AGENT_MAX_RUN_SECONDS", _int(1), "Default time limit of one agent run."),
    "model_provider": _Var("MARKETING_MODEL_PROVIDER", str, "Model provider for agents: offline, anthropic or openai."),
    "measurement_start_date": _Var(
        "MARKETING_MEASUREMENT_START_DATE", date.fromisoformat, "First UTC day of the measurement partitions."
    ),
    "backfill_days_per_run": _Var(
        "MARKETING_BACKFILL_DAYS_PER_RUN",
        _bounded_int(1, 3660),
        "Days of the measurement assets one backfill run covers (BackfillPolicy.multi_run).",
    ),
}


@dataclass(frozen=True)
class Settings:
    database_url: str | None = None
    # Chosen from benchmarks/e2e_executions.py (docs/PERFORMANCE.md, section 6).
    sensor_batch_size: int = 1000
    sensor_interval_seconds: int = 3
    executions_per_run: int = 250
    webhook_concurrency: int = 16
    webhook_allow_networks: tuple[str, ...] = ()
    execution_lease_seconds: int = 300
    execution_max_attempts: int = 3
    retry_backoff_seconds: float = 60.0
    webhook_timeout_seconds: float = 10.0
    max_concurrent_agent_runs: int = 2
    max_model_calls_per_minute: int = 60
    agent_lease_grace_seconds: int = 300
    agent_max_run_seconds: int = 300
    model_provider: str = "offline"
    measurement_start_date: date = date(2026, 1, 1)
    # Chosen from benchmarks/backfill.py (docs/PERFORMANCE.md, section 8).
    backfill_days_per_run: int = 92

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in fields(cls):
            var = ENV_VARS[field.name]
            raw = environ.get(var.env)
            if raw is None or raw.strip() == "":
                continue
            try:
                values[field.name] = var.parse(raw.strip())
            except ValueError as exc:
                raise SettingsError(f"{var.env}={raw!r} is not valid: {exc}") from None
        settings = cls(**values)
        if settings.model_provider not in ("offline", "anthropic", "openai"):
            raise SettingsError(
                f"MARKETING_MODEL_PROVIDER={settings.model_provider!r} is not a provider; "
                "use offline, anthropic or openai"
            )
        return settings

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or default_database_url()
