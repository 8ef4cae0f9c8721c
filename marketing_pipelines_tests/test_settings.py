"""Settings: one typed source (pydantic-settings), shown in the UI as resource config, bounded the same everywhere."""

from __future__ import annotations

import os
import re
import subprocess
from datetime import date

import dagster as dg
import pytest

from marketing_pipelines.agents.resources import AgentSettings
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.definitions import build_defs
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.measurement.report.frames import RollupFrameIOManager
from marketing_pipelines.monitoring.alerts import AlertWebhook
from marketing_pipelines.monitoring.resources import HealthSettings
from marketing_pipelines.settings import (
    Settings,
    SettingsError,
    env_name,
    is_secret,
    load_settings,
    resource_from_settings,
    settings_of,
)
from marketing_pipelines_tests.built import DEFS
from marketing_pipelines_tests.processes import dagster_bin

# Settings that shape definitions rather than runs: the UI shows them as what they shape.
STRUCTURAL = {
    "measurement_start_date": "the measurement assets' partitions",
    "backfill_days_per_run": "the measurement assets' backfill policy",
    "sensor_interval_seconds": "each claiming sensor's minimum interval",
    "late_events_interval_seconds": "the late-events and freshness sensors' interval and the freshness threshold",
}
# Defaults of what the CLI requests (it reads them itself); no Dagster code reads them.
CLI_DEFAULTS = {
    "execution_max_attempts",
    "agent_max_run_seconds",
    "model_provider",
    "dagster_ui_url",
    "webhook_rotation_hours",
}


def _env_vars_shown_by_resources() -> set[str]:
    shown = set()
    for resource in DEFS.resources.values():
        if isinstance(resource, dg.ConfigurableResource):
            for field in type(resource).model_fields.values():
                shown.update(re.findall(r"Env var: (\w+)", field.description or ""))
    return shown


def test_every_runtime_setting_is_config_of_a_resource_in_the_definitions() -> None:
    shown = _env_vars_shown_by_resources()
    missing = {
        name
        for name in Settings.model_fields
        if name not in STRUCTURAL and name not in CLI_DEFAULTS and env_name(name) not in shown
    }
    assert missing == set()


def test_resources_carry_the_settings_values() -> None:
    settings = load_settings(
        executions_per_run=4, retry_backoff_seconds=2.5, webhook_concurrency=3, max_concurrent_agent_runs=7
    )
    executions, webhook = resource_from_settings(ExecutionSettings, settings), WebhookClient.from_settings(settings)
    agents = resource_from_settings(AgentSettings, settings)
    assert (executions.executions_per_run, executions.retry_backoff_seconds) == (4, 2.5)
    assert (webhook.concurrency, agents.max_concurrent_agent_runs) == (3, 7)
    # Backoff doubles per attempt and is capped at an hour.
    assert [executions.retry_delay_seconds(a) for a in (1, 2, 3)] == [2.5, 5.0, 10.0]
    assert ExecutionSettings(retry_backoff_seconds=3000).retry_delay_seconds(5) == 3600.0


def test_every_field_a_resource_declares_a_setting_takes_that_settings_value() -> None:
    # Each resource field declared with setting_field(name) is filled from Settings by that name: change
    # every such setting from its default and each field must follow, whatever its resource.
    changed = {"sensor_batch_size": 7, "executions_per_run": 9, "execution_lease_seconds": 61,
               "retry_backoff_seconds": 4.5, "webhook_timeout_seconds": 3.0, "webhook_concurrency": 5,
               "webhook_allow_networks": "127.0.0.0/8", "max_concurrent_agent_runs": 3,
               "max_model_calls_per_minute": 11, "agent_lease_grace_seconds": 77,
               "max_model_input_tokens_per_minute": 20_000, "max_model_output_tokens_per_minute": 4_000,
               "max_model_tokens_per_minute": 90_000, "model_prices": '{"m": {"input": 1, "output": 2}}',
               "health_due_lag_warn_seconds": 12.0, "health_due_lag_error_seconds": 13.0,
               "health_failed_last_hour_warn": 2, "health_failed_last_hour_error": 5,
               "dagster_ui_url": "http://127.0.0.1:3000", "alert_webhook_url": "https://hooks.example.com/T0/B0/x",
               "database_url": "sqlite:////tmp/elsewhere.db", "secrets_key": "k"}  # fmt: skip
    settings = load_settings(**changed)
    seen = set()
    for resource_class in (ExecutionSettings, WebhookClient, AgentSettings, HealthSettings, AlertWebhook,
                           AppDatabase, RollupFrameIOManager):  # fmt: skip
        resource = resource_from_settings(resource_class, settings, environ={})
        for field, name in settings_of(resource_class).items():
            seen.add(name)
            expected = getattr(settings, name)
            expected = expected.get_secret_value() if hasattr(expected, "get_secret_value") else expected
            assert getattr(resource, field) == (list(expected) if isinstance(expected, tuple) else expected), field
    assert seen == set(changed)


def test_a_secret_setting_is_an_env_var_in_the_resource_when_its_variable_is_set() -> None:
    settings = load_settings(alert_webhook_url="https://hooks.example.com/T0/B0/secret-token")
    shown = resource_from_settings(AlertWebhook, settings, environ={"MARKETING_ALERT_WEBHOOK_URL": "x"})
    # An EnvVar: the launchpad and run config show the variable's name, never the URL.
    assert isinstance(shown.url, dg.EnvVar) and shown.url == "MARKETING_ALERT_WEBHOOK_URL"
    # Given in code (a test, the demo), the value itself.
    assert resource_from_settings(AlertWebhook, settings, environ={}).url == settings.alert_webhook_url


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: ExecutionSettings(batch_size=0), "batch_size"),  # below the setting's minimum
        (lambda: ExecutionSettings(executions_per_run=1001), "executions_per_run"),  # above its maximum
        (lambda: ExecutionSettings(retry_backoff_seconds=float("nan")), "retry_backoff_seconds"),  # not finite
        (lambda: WebhookClient(concurrency=65), "concurrency"),
        (lambda: WebhookClient(allow_networks=["10.0.0.0/8", "nope"]), "allow_networks"),
        (lambda: AgentSettings(max_model_calls_per_minute=0), "max_model_calls_per_minute"),
    ],
)
def test_resource_config_is_held_to_the_settings_bounds(build, field: str) -> None:  # type: ignore[no-untyped-def]
    # A value edited in the launchpad meets the same bounds as the env var.
    with pytest.raises(ValueError, match=field):
        build()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sensor_batch_size": 0}, "MARKETING_SENSOR_BATCH_SIZE=0 is not valid: must be between 1 and 10000"),
        ({"retry_backoff_seconds": float("inf")}, "MARKETING_RETRY_BACKOFF_SECONDS=inf is not valid: must be"),
        ({"webhook_allow_networks": "169.254.0.0/16,x"}, "'x' is not an IP network"),
        ({"model_provider": "llama"}, "MARKETING_MODEL_PROVIDER='llama' is not valid: is not a provider"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_variable(overrides: dict, message: str) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(**overrides)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_the_definitions_are_shaped_by_the_settings_they_are_built_from() -> None:
    settings = load_settings(
        executions_per_run=7,
        sensor_interval_seconds=11,
        late_events_interval_seconds=40,
        backfill_days_per_run=9,
        measurement_start_date=date(2026, 6, 1),
    )
    built = build_defs(settings)
    assert built.resources["execution_settings"].executions_per_run == 7
    intervals = {s.name: s.minimum_interval_seconds for s in built.get_repository_def().sensor_defs}
    assert intervals["due_executions_sensor"] == intervals["queued_agent_runs_sensor"] == 11
    assert intervals["measurement_late_events_sensor"] == intervals["measurement_freshness_sensor"] == 40
    rollup = built.resolve_assets_def(dg.AssetKey("measurement_daily_rollup"))
    assert rollup.partitions_def is not None and rollup.partitions_def.get_first_partition_key() == "2026-06-01"
    assert rollup.backfill_policy is not None and rollup.backfill_policy.max_partitions_per_run == 9
    # The defaults build other definitions: nothing was fixed when the modules were imported.
    assert DEFS.resolve_assets_def(dg.AssetKey("measurement_daily_rollup")).backfill_policy != rollup.backfill_policy


def test_a_bad_setting_stops_the_code_location_from_loading_with_one_clear_line() -> None:
    # What Dagster's loader prints for a deployment's environment, which only a process of its own has.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MARKETING_")}
    failed = subprocess.run(
        [dagster_bin("dagster"), "definitions", "validate", "-m", "marketing_pipelines.definitions"],
        env={**clean, "MARKETING_EXECUTIONS_PER_RUN": "0"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert failed.returncode != 0
    assert "MARKETING_EXECUTIONS_PER_RUN='0' is not valid: must be between 1 and 1000" in failed.stdout + failed.stderr


def test_the_services_own_variables_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # Read by their own names (no MARKETING_ prefix), given in code by the field's name.
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_from_the_environment")
    monkeypatch.setenv("PLAUSIBLE_BASE_URL", "https://stats.example.org")
    settings = load_settings()
    assert settings.github_token is not None and settings.github_token.get_secret_value() == "ghp_from_the_environment"
    assert settings.plausible_base_url == "https://stats.example.org"
    assert load_settings(github_token="given").github_token.get_secret_value() == "given"  # type: ignore[union-attr]
    assert (env_name("github_token"), env_name("sensor_batch_size")) == ("GITHUB_TOKEN", "MARKETING_SENSOR_BATCH_SIZE")


def test_a_bad_service_variable_is_named_and_a_secret_is_not_quoted() -> None:
    with pytest.raises(SettingsError) as model_error:
        load_settings(anthropic_model=5)
    assert str(model_error.value).startswith("ANTHROPIC_MODEL=5 is not valid")
    # A base URL may carry credentials (a self-hosted origin): shown by name only, as a key is.
    with pytest.raises(SettingsError) as url_error:
        load_settings(plausible_base_url=5)
    assert str(url_error.value).startswith("PLAUSIBLE_BASE_URL=(a secret, not shown) is not valid")
    with pytest.raises(SettingsError) as token_error:
        load_settings(github_token=987654321)
    message = str(token_error.value)
    assert message.startswith("GITHUB_TOKEN=(a secret, not shown) is not valid") and "987654321" not in message
    # The same for MARKETING_ secrets: the sealing key's bad value was quoted before.
    with pytest.raises(SettingsError) as key_error:
        load_settings(secrets_key=123456789)
    assert "123456789" not in str(key_error.value) and "MARKETING_SECRETS_KEY=" in str(key_error.value)


def test_one_marker_makes_a_setting_secret_in_errors_and_in_the_ui() -> None:
    secret = {name for name in Settings.model_fields if is_secret(name)}
    # Every SecretStr is marked, and every URL that may carry a credential.
    assert {name for name, info in Settings.model_fields.items() if "SecretStr" in str(info.annotation)} <= secret
    assert {name for name in Settings.model_fields if name.endswith(("_url", "_base_url"))} - secret == {
        "dagster_ui_url"
    }
    # A resource field filled from a marked setting says so and becomes an EnvVar of its variable when set.
    for resource in DEFS.resources.values():
        for field, name in settings_of(type(resource)).items():
            if name in secret:
                description = type(resource).model_fields[field].description or ""
                assert description.endswith("(shown by name only)."), description
