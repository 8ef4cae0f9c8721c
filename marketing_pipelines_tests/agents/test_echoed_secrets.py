"""A secret a service echoes back is hidden wherever the run stores, logs or sends it: a model provider's 401
that quotes the API key (OpenAI's "Incorrect API key provided: sk-...") leaves no trace of the key in the
agent run's error, its transcript, the Dagster event log or the alert; settings marked secret are hidden the
same way once loaded (issue 35 item 9).
"""

from __future__ import annotations

import json
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.agents.queue import get_agent_run, transcript
from marketing_pipelines.redact import redact_text, redact_value, remember_secrets, shown_text
from marketing_pipelines.settings import load_settings
from marketing_pipelines_tests.agents.fake_models import rejecting_models
from marketing_pipelines_tests.agents.runs import run_one
from marketing_pipelines_tests.factories import add_campaign, alert_for_failed_runs, request_brief

# Shaped like each provider's keys; nothing else in the run holds them.
KEYS = {
    "openai": "sk-proj-Echoed0penAIKey4f9c2b7e1d",
    "anthropic": "sk-ant-api03-Echoed4nthropicKey8a1e",
}


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_key_the_provider_echoes_shows_nowhere(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance, provider: str
) -> None:
    key = KEYS[provider]
    add_campaign(engine, "spring-launch")
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        users.grant(conn, "ana", "campaign:read")
        # The request only needs the provider configured; the key the run sends is the resource's alone, so
        # what hides it is the run having sent it (http.send_with_retries), not these settings.
        agent_run_id = request_brief(conn, provider, max_attempts=1)

    result = run_one(db_url, instance, rejecting_models(provider, key))

    assert not result.success
    with engine.connect() as conn:
        row = get_agent_run(conn, agent_run_id)
        steps = transcript(conn, agent_run_id)
    assert row is not None and row["status"] == "FAILED"
    assert "credentials rejected (HTTP 401)" in row["error"] and "***" in row["error"]
    alert = alert_for_failed_runs(instance, engine)
    surfaces = {
        "agent_run.error": row["error"],
        "transcript": json.dumps([dict(s) for s in steps], default=str),
        "event log": "\n".join(dg.serialize_value(e) for e in instance.all_logs(result.run_id)),
        "alert": alert,
    }
    assert "credentials rejected" in surfaces["alert"]
    # The key whole, and enough of it to be useful: its part after the provider's prefix.
    leaks = {place: text for place, text in surfaces.items() if key in text or key[-20:] in text}
    assert not leaks, leaks


def test_each_secret_setting_is_hidden_once_loaded() -> None:
    values: dict[str, Any] = {
        "openai_api_key": "sk-proj-SettingOpenAIKey123",
        "anthropic_api_key": "sk-ant-SettingAnthropicKey456",
        "github_token": "ghp_SettingGitHubToken789",
        "plausible_api_key": "SettingPlausibleKey012",
        "plausible_site_id": "stats-site.example",
        # Two keys, comma-separated: each is hidden alone too.
        "secrets_key": "FirstFernetKeyAAAAAAAA=,SecondFernetKeyBBBBBBB=",
        "database_url": "postgresql://app:DbPassw0rdSecret@db.example:5432/marketing",
        "alert_webhook_url": "https://hooks.slack.com/services/T0AAAA/B0BBBB/SlackPathT0ken345",
        "openai_base_url": "https://llm.example/v1?api-version=QueryT0kenValue",
    }
    hidden = [
        "sk-proj-SettingOpenAIKey123",
        "sk-ant-SettingAnthropicKey456",
        "ghp_SettingGitHubToken789",
        "SettingPlausibleKey012",
        "stats-site.example",
        "FirstFernetKeyAAAAAAAA=",
        "SecondFernetKeyBBBBBBB=",
        "DbPassw0rdSecret",
        "SlackPathT0ken345",
        "QueryT0kenValue",
    ]
    text = " | ".join(f"echoed {value}" for value in hidden)
    assert all(value in redact_text(text) for value in hidden)  # nothing a pattern would find
    load_settings(**values)
    shown = redact_text(text)
    assert not [value for value in hidden if value in shown], shown
    # A host, a user name and a plain path are no secrets and stay readable.
    assert redact_text("db.example app /marketing llm.example") == "db.example app /marketing llm.example"


def test_remembered_secrets_hide_everywhere_redaction_applies() -> None:
    remember_secrets("Bearer TokenAfterScheme42", "short", "", None)
    assert redact_text("the token TokenAfterScheme42 was refused") == "the token *** was refused"
    assert shown_text("quoted: TokenAfterScheme42\x1b") == "quoted: ***\\x1b"
    assert redact_value({"note": ["TokenAfterScheme42"]}) == {"note": ["***"]}
    # Too short to remember: it would hide every word that holds it.
    assert redact_text("a short word") == "a short word"
