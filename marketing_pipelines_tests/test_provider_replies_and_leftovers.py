"""Provider replies with lone surrogates are kept, ``webhooks add`` allows what the runs allow, and an agent run's
metadata counts the calls refused for its budget."""

from __future__ import annotations

import json
import os
from pathlib import Path

import dagster as dg
import httpx
import pytest
from click.testing import CliRunner, Result

from marketing_pipelines.agents.jobs import run_metadata
from marketing_pipelines.agents.providers.base import api_error_message
from marketing_pipelines.agents.providers.openai import _parse_openai_arguments
from marketing_pipelines.agents.runner import AgentResult
from marketing_pipelines.cli import main
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.sealing import new_key

KEY = new_key()  # endpoints are stored sealed; the key alone does not make the database a deployment's


@pytest.mark.parametrize(
    "raw",
    [
        '{"note": "a\\ud800b", "\\udfff": 1}',  # JSON text, as OpenAI sends arguments
        {"note": "a\ud800b", "\udfff": 1},  # an object, as some compatible servers send them
    ],
)
def test_openai_arguments_keep_no_lone_surrogate(raw: object) -> None:
    assert _parse_openai_arguments(raw) == ({"note": "a\ufffdb", "\ufffd": 1}, None)


@pytest.mark.parametrize(
    "error",
    [{"type": "invalid_request_error", "message": "bad \\ud800 input"}, "bad \\ud800 input"],
)
def test_an_api_error_message_keeps_no_lone_surrogate(error: object) -> None:
    body = json.dumps({"error": error}).replace("\\\\ud800", "\\ud800")  # the escape itself, not its backslash
    assert api_error_message(httpx.Response(400, content=body.encode())) == "bad \ufffd input"


def _embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str, **env: str) -> Result:
    """The command as a newcomer runs it: the embedded database under the current folder, no MARKETING_* set."""
    monkeypatch.chdir(tmp_path)
    unset = dict.fromkeys(k for k in os.environ if k.startswith("MARKETING_"))
    return CliRunner(env={**unset, "MARKETING_SECRETS_KEY": KEY, **env}).invoke(
        main, list(args), catch_exceptions=False
    )


def test_webhooks_add_on_the_embedded_database_allows_the_local_uis_receiver_as_schedule_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _embedded(tmp_path, monkeypatch, "db", "upgrade").exit_code == 0
    added = _embedded(tmp_path, monkeypatch, "webhooks", "add", "demo", "--url", "http://127.0.0.2:8123/hook")
    assert added.exit_code == 0, added.output
    assert added.stderr.startswith("endpoint demo -> http://127.0.0.2:8123;")
    # Not the UI itself on 127.0.0.1, nor any other loopback address.
    for name, url in (("ui", "http://127.0.0.1:3000/graphql"), ("other", "http://127.0.0.3/")):
        refused = _embedded(tmp_path, monkeypatch, "webhooks", "add", name, "--url", url)
        assert refused.exit_code == 1 and "MARKETING_WEBHOOK_ALLOW_NETWORKS" in refused.output
    # A deployment's database: its own setting decides, as its runs' does.
    named = {"MARKETING_DATABASE_URL": f"sqlite:///{tmp_path / '.marketing' / 'marketing.db'}"}
    again = ("webhooks", "add", "crm", "--url", "http://127.0.0.2:8123/hook")
    assert _embedded(tmp_path, monkeypatch, *again, **named).exit_code == 1


def test_an_agent_runs_metadata_counts_the_calls_refused_for_its_budget(sqlite_url: str) -> None:
    result = AgentResult(text="done", steps=3, tool_calls=10, denials=7, over_budget=6)
    metadata = run_metadata(get_engine(sqlite_url), 1, 1, result)
    assert (metadata["denials"], metadata["over_budget"]) == (dg.MetadataValue.int(7), dg.MetadataValue.int(6))
