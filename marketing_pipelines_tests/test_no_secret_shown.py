"""No secret is ever shown: one planted in each place a user can put one, then every surface searched.

Planted: a webhook URL's user info, query and path, a header value, an API key read with a trailing
newline, and the payload an agent's model proposes. The executions go through the real batch job to a
receiver that answers errors quoting its request; the agent runs go through the real job to a local
OpenAI-compatible server. Searched: the command line's lists and shows (text, JSON, --body), the stored
errors, every event of every run (messages and metadata) and the alert message.
"""

from __future__ import annotations

import functools
import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.agents.jobs import agent_run_job
from marketing_pipelines.agents.models import model_resources
from marketing_pipelines.agents.providers.openai import OpenAIModel
from marketing_pipelines.agents.queue import request_agent_run
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import agent_run, agent_run_step, marketing_execution, marketing_execution_attempt
from marketing_pipelines.egress import EgressPolicy, parse_networks
from marketing_pipelines.executions.queue import schedule_execution
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.http import ServiceError, send_with_retries
from marketing_pipelines.redact import error_text, redact_text, redact_url, redact_urls, redact_value
from marketing_pipelines.sealing import key_source, new_key
from marketing_pipelines.settings import SettingsError, load_settings
from marketing_pipelines_tests.agents.runs import AGENT_RESOURCES
from marketing_pipelines_tests.built import due_executions_sensor, queued_agent_runs_sensor
from marketing_pipelines_tests.cli_runner import cli_for
from marketing_pipelines_tests.executions.runs import LOCAL, perform, sensor_requests
from marketing_pipelines_tests.factories import add_campaign, alert_for_failed_runs, settings_from
from marketing_pipelines_tests.webserver import Received, Recorder, webhook_server

USERINFO_SECRET = "PW_SECRET_1"
QUERY_SECRET = "Q_SECRET_2"
PATH_SECRET = "P_SECRET_3"
HEADER_SECRET = "H_SECRET_4"
API_KEY_SECRET = "K_SECRET_5"
AGENT_SECRET = "A_SECRET_6"
SECRETS = (USERINFO_SECRET, QUERY_SECRET, PATH_SECRET, HEADER_SECRET, API_KEY_SECRET, AGENT_SECRET)

# What the model proposes: a Slack-like webhook whose path and query are its token, and a bearer header.
AGENT_URL = f"https://hooks.example.com/services/T0/B0/{AGENT_SECRET}?token={AGENT_SECRET}"
DUE = "2030-01-01T00:00:00+00:00"
PROPOSAL = {
    "campaign_id": "spring-launch",
    "stage": "launch",
    "action": "webhook",
    "due": DUE,
    "payload": {"url": AGENT_URL, "headers": {"Authorization": f"Bearer {AGENT_SECRET}"}, "body": {"text": "go"}},
}
NO_BACKOFF = ExecutionSettings(retry_backoff_seconds=0)
# Header values are stored sealed (the command line's and a run's MARKETING_SECRETS_KEY): the schedule seals with
# these keys, the runs (executions and agents) open with the same one.
KEY = new_key()
KEYS = functools.partial(key_source, KEY, None)
WEBHOOK = WebhookClient(timeout_s=5, allow_networks=LOCAL, secrets_key=KEY)


def _hook_url(hook: Recorder) -> str:
    return f"http://user:{USERINFO_SECRET}@127.0.0.1:{hook.port}/services/T0/B0/{PATH_SECRET}?token={QUERY_SECRET}"


def _completion(message: dict[str, Any], finish_reason: str = "stop") -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5},
        }
    ).encode()


def _answer_as_openai(server: Recorder, received: Received) -> None:
    """The Chat Completions API, scripted: the reply is set before the recorder writes it (calls are sequential)."""
    messages = received.body["messages"]
    task = next(m["content"] for m in messages if m["role"] == "user")
    if received.headers.get("authorization") != f"Bearer sk-{API_KEY_SECRET}":
        server.status, server.body = 401, json.dumps({"error": {"message": "invalid key"}}).encode()
    elif '"stage": "fail"' in task:
        # An API error that quotes the request: its URL and the credential it was sent with.
        quoted = f"cannot fetch {AGENT_URL}; Authorization: Bearer sk-{API_KEY_SECRET}"
        server.status, server.body = 400, json.dumps({"error": {"message": quoted}}).encode()
    elif messages[-1]["role"] == "tool":
        server.status, server.body = 200, _completion({"role": "assistant", "content": f"Scheduled {AGENT_URL}."})
    else:
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": "schedule_execution", "arguments": json.dumps(PROPOSAL)},
        }
        server.status = 200
        server.body = _completion({"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls")


def _run_executions(engine: sa.Engine, db_url: str, instance: dg.DagsterInstance, hook: Recorder) -> list[int]:
    """A webhook with secrets in its URL, headers and body (two attempts, both answered 500), and a log
    action quoting the URL (succeeds), through the real batch job."""
    url = _hook_url(hook)
    hook.status = 500
    hook.body = f"no hook at /services/T0/B0/{PATH_SECRET}?token={QUERY_SECRET} for key {HEADER_SECRET}; {url}".encode()
    payloads = {
        "webhook": {
            "url": url,
            "headers": {"X-Api-Key": HEADER_SECRET},
            "body": {"text": "launch", "callback": url, "api_key": HEADER_SECRET},
        },
        "log": {"message": f"pinged {url}"},
    }
    with engine.begin() as conn:
        ids = [
            schedule_execution(
                conn,
                campaign_id="spring-launch",
                stage="launch",
                action=action,
                due_at=datetime.now(UTC) - timedelta(seconds=1),
                payload=payload,
                max_attempts=2,
                egress=EgressPolicy(parse_networks(LOCAL)),
                keys=KEYS,
            )
            for action, payload in payloads.items()
        ]
    for _ in range(2):  # attempt 1: RESCHEDULED (and the log action SUCCEEDED); attempt 2: FAILED
        [request] = sensor_requests(due_executions_sensor, db_url, instance, NO_BACKOFF)
        perform(request, db_url, instance, WEBHOOK, settings=NO_BACKOFF)
    assert len(hook.received) == 2 and hook.received[0].headers["x-api-key"] == HEADER_SECRET
    return ids


def _run_agents(engine: sa.Engine, db_url: str, instance: dg.DagsterInstance) -> list[dg.ExecuteInProcessResult]:
    """An analyst whose model proposes a webhook with secrets (succeeds), and a brief whose API call fails."""
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        for permission in ("campaign:read", "measurement:read", "execution:read", "execution:write"):
            users.grant(conn, "ana", permission)
        for agent, given in (
            ("measurement_analyst", {"propose": {k: PROPOSAL[k] for k in ("stage", "action", "due", "payload")}}),
            ("campaign_brief", {"stage": "fail"}),
        ):
            request_agent_run(
                conn,
                agent=agent,
                campaign_id="spring-launch",
                requested_by="ana",
                input=given,
                provider="openai",
                settings=load_settings(),  # the key and base URL the test put in the environment
            )
    # As the code location loads them: the key an EnvVar, the base URL plain config.
    resources = {
        **model_resources(load_settings()),
        "app_db": AppDatabase(url=db_url),
        **AGENT_RESOURCES,
        "webhook": WebhookClient(secrets_key=KEY),
    }
    return [
        agent_run_job.execute_in_process(
            run_config=r.run_config, tags=r.tags, instance=instance, resources=resources, raise_on_error=False
        )
        for r in sensor_requests(queued_agent_runs_sensor, db_url, instance)
    ]


def _surfaces(engine: sa.Engine, db_url: str, instance: dg.DagsterInstance) -> dict[str, str]:
    cli = cli_for(db_url)
    with engine.connect() as conn:
        execution_ids = conn.execute(sa.select(marketing_execution.c.id)).scalars().all()
        agent_run_ids = conn.execute(sa.select(agent_run.c.id)).scalars().all()
        stored = {
            "last_error": conn.execute(sa.select(marketing_execution.c.last_error)).scalars().all(),
            "attempt errors": conn.execute(sa.select(marketing_execution_attempt.c.error)).scalars().all(),
            "agent_run.error": conn.execute(sa.select(agent_run.c.error)).scalars().all(),
            "stored agent errors": conn.execute(
                sa.select(agent_run_step.c.content).where(agent_run_step.c.kind == "error")
            ).all(),
        }
    commands = [
        ("executions", "list"),
        ("executions", "list", "--json"),
        ("agents", "list"),
        ("agents", "list", "--json"),
    ]
    commands += [
        ("executions", "show", str(i), *flags)
        for i in execution_ids
        for flags in ((), ("--json",), ("--body",), ("--body", "--json"))
    ]
    commands += [("agents", "show", str(i), *flags) for i in agent_run_ids for flags in ((), ("--json",))]
    surfaces: dict[str, str] = {}
    for command in commands:
        result = cli(*command)
        assert result.exit_code == 0, result.output
        surfaces[" ".join(command)] = result.output
    surfaces |= {place: json.dumps(rows, default=str) for place, rows in stored.items()}
    for run in instance.get_runs():
        # Every event whole: its message, metadata (outcome table, transcript, output), failure and error info.
        surfaces[f"run {run.run_id} events"] = "\n".join(dg.serialize_value(e) for e in instance.all_logs(run.run_id))
    surfaces["alert"] = alert_for_failed_runs(instance, engine)
    return surfaces


@pytest.mark.slow
def test_no_planted_secret_shows_on_any_surface(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance, hook: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_campaign(engine)
    with webhook_server() as openai:
        openai.on_request = lambda received: _answer_as_openai(openai, received)
        # A key pasted with its newline: stripped, not refused by httpx ("Illegal header value b'Bearer sk-...'").
        monkeypatch.setenv("OPENAI_API_KEY", f"sk-{API_KEY_SECRET}\n")
        monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{openai.port}/v1")
        analyst, brief = _run_agents(engine, db_url, instance)
        assert [r.headers["authorization"] for r in openai.received] == [f"Bearer sk-{API_KEY_SECRET}"] * 3
    _run_executions(engine, db_url, instance, hook)
    assert analyst.success and not brief.success
    # Every header value is stored sealed, the agent's proposal's as the command line's (issue 44 item 3).
    with engine.connect() as conn:
        payloads = conn.execute(sa.select(marketing_execution.c.payload)).scalars().all()
    headers = [value for p in payloads for value in (p.get("headers") or {}).values()]
    assert len(headers) == 2 and all(set(value) == {"sealed"} for value in headers), headers

    surfaces = _surfaces(engine, db_url, instance)

    leaks = {place: [s for s in SECRETS if s in text] for place, text in surfaces.items()}
    assert {place: found for place, found in leaks.items() if found} == {}
    # The searched surfaces hold what they should, so a search that found nothing did search something.
    assert "Alert" not in surfaces["alert"] and "2 failed runs" in surfaces["alert"]
    assert "http://127.0.0.1:" in surfaces["last_error"] and "HTTP 500" in surfaces["last_error"]
    assert "https://hooks.example.com/***" in surfaces["agents show 1 --json"]
    webhooks = [text for place, text in surfaces.items() if place.startswith("executions show ") and "webhook" in text]
    # Two webhook executions, each shown four ways: the body hidden but with --body, its secret-like values always.
    assert len(webhooks) == 8 and sum('"body": "***"' in text for text in webhooks) == 4
    assert any('"X-Api-Key": "***"' in text and '"api_key": "***"' in text for text in webhooks)


def test_a_header_value_with_a_newline_is_refused_without_quoting_it(engine: sa.Engine, db_url: str) -> None:
    add_campaign(engine)
    payload = {"url": "http://127.0.0.1:9/hook", "headers": {"X-Api-Key": f"{HEADER_SECRET}\n"}}
    schedule = ("executions", "schedule", "--campaign", "spring-launch", "--stage", "launch", "--action", "webhook")
    result = cli_for(db_url, MARKETING_WEBHOOK_ALLOW_NETWORKS="127.0.0.1/32")(
        *schedule, "--due", "now", "--payload", json.dumps(payload)
    )
    assert result.exit_code == 1 and "X-Api-Key" in result.output
    assert HEADER_SECRET not in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "key",
    [
        f"sk-{API_KEY_SECRET}\x07",  # a control character (after stripping the surrounding white space)
        f"sk-{API_KEY_SECRET}\nsk-another",  # two keys pasted on two lines
        f"sk-{API_KEY_SECRET} x",  # white space inside
        f"sk-{API_KEY_SECRET}é",  # not ASCII: httpx cannot encode it in a header
    ],
)
def test_an_api_key_that_could_never_be_sent_fails_loading_in_one_line_without_it(key: str) -> None:
    with pytest.raises(SettingsError) as raised:
        settings_from({"OPENAI_API_KEY": key})
    message = str(raised.value)
    assert (
        message.startswith("OPENAI_API_KEY=(a secret, not shown) is not valid: holds")
        and "\n" not in message
        and API_KEY_SECRET not in message
    )


def test_an_api_key_given_with_surrounding_white_space_is_stripped() -> None:
    assert OpenAIModel(api_key=f"  sk-{API_KEY_SECRET}\n").api_key == f"sk-{API_KEY_SECRET}"
    with pytest.raises(ValueError) as raised:
        OpenAIModel(api_key=f"sk-{API_KEY_SECRET}\x00x")
    assert API_KEY_SECRET not in str(raised.value)


def test_a_request_the_http_stack_cannot_write_is_not_retried_nor_quoted(hook: Recorder) -> None:
    sleeps: list[float] = []
    with httpx.Client() as client:
        # Not validated here on purpose: h11 refuses the value when it writes the request.
        request = client.build_request("POST", hook.url, headers={"authorization": f"Bearer sk-{API_KEY_SECRET}\n"})
        with pytest.raises(ServiceError) as raised:
            send_with_retries(client, request, service="openai", sleep=sleeps.append)
    assert sleeps == [] and hook.received == [] and not raised.value.transient
    assert "Illegal header value b'***'" in str(raised.value) and API_KEY_SECRET not in str(raised.value)


def test_httpx_request_log_lines_show_scheme_and_host_only(hook: Recorder, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="httpx")
    with httpx.Client() as client:
        send_with_retries(client, client.build_request("POST", _hook_url(hook)), service="webhook")
    [line] = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert f"http://127.0.0.1:{hook.port}/***" in line
    assert not [s for s in SECRETS if s in caplog.text]


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        # Slack, Telegram and Discord webhooks: the path is the token.
        ("https://hooks.slack.com/services/T0/B0/SECRET", "https://hooks.slack.com/***"),
        ("https://api.telegram.org/botTOKEN/sendMessage", "https://api.telegram.org/***"),
        ("https://discord.com/api/webhooks/1/TOKEN", "https://discord.com/***"),
        ("https://user:pw@host:8443/x?token=1#f", "https://host:8443/***"),
        ("http://[::1]:9/p?q=1", "http://[::1]:9/***"),
        # Nothing after the host: nothing hidden.
        ("https://host", "https://host"),
        ("https://host/", "https://host"),
        # Text matched beyond a URL's end (a quote in the host): the host is cut there.
        ("https://host'SECRET", "https://host/***"),
        ("https://host:99999/x", "<unparseable URL>"),
    ],
)
def test_redact_url_keeps_scheme_host_and_port_only(raw: str, shown: str) -> None:
    assert redact_url(raw) == shown


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # A quote inside the query does not end the URL.
        ("see https://h/x?a='1'&token=SECRET.", "see https://h/***."),
        # Parentheses, brackets, backslashes: a URL ends only at white space.
        ("(https://h/x?token=SECRET)", "(https://h/***)"),
        ("[link](https://h/b?token=SECRET) ok", "[link](https://h/***) ok"),
        ("https://h\\x?token=SECRET", "https://h/***"),
        ('{"url": "https://u:SECRET@h/x"}', '{"url": "https://h/***"}'),
    ],
)
def test_redact_urls_finds_urls_whatever_they_hold(text: str, shown: str) -> None:
    assert redact_urls(text) == shown


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # httpx's refusal of a header quotes its value, whole or cut.
        ("Illegal header value b'Bearer sk-SECRET\\n'", "Illegal header value b'***'"),
        ("Illegal header value b'Bearer sk-SEC", "Illegal header value b'***'"),
        # A stray b' in free text is no bytes literal: every word stays (issue 35 item 13b).
        ("moved b' to 'camp-b' only", "moved b' to 'camp-b' only"),
        ("note: b'camp-a and 'camp-b' only", "note: b'camp-a and 'camp-b' only"),
        ("stage camp-b' only", "stage camp-b' only"),
        ('sent b"tok-123" to camp-b', 'sent b"***" to camp-b'),
        ("Authorization: Bearer sk-SECRET", "Authorization: ***"),
        ("got X-Api-Key: SECRET from you", "got X-Api-Key: *** from you"),
        ('{"api_key": "SECRET", "max_tokens": 5}', '{"api_key": "***", "max_tokens": 5}'),
        ("sent with bearer SECRETTOKEN", "sent with bearer ***"),
        # Words that only look like names of secrets stay.
        ("the token bucket; keywords: spring", "the token bucket; keywords: spring"),
    ],
)
def test_redact_text_hides_credential_echoes(text: str, shown: str) -> None:
    assert redact_text(text) == shown


def test_redact_value_hides_headers_secret_like_keys_and_urls_at_any_depth() -> None:
    value = {
        "url": "https://u:SECRET@h/x?token=SECRET",
        "headers": {"X-Custom": "SECRET"},
        "body": {"apiKey": "SECRET", "items": [{"password": "SECRET", "keywords": ["spring"], "max_tokens": 5}]},
    }
    assert redact_value(value) == {
        "url": "https://h/***",
        "headers": {"X-Custom": "***"},
        "body": {"apiKey": "***", "items": [{"password": "***", "keywords": ["spring"], "max_tokens": 5}]},
    }
    deep: Any = "SECRET"
    for _ in range(100):
        deep = [deep]
    assert "SECRET" not in json.dumps(redact_value(deep))


def test_error_text_redacts_what_the_http_stack_quotes() -> None:
    exc = httpx.LocalProtocolError(f"Illegal header value b'Bearer sk-{API_KEY_SECRET}\\n'")
    assert error_text(exc) == "LocalProtocolError: Illegal header value b'***'"
    connect = httpx.ConnectError(f"cannot reach https://u:{USERINFO_SECRET}@h/x?token={QUERY_SECRET}")
    assert error_text(connect) == "ConnectError: cannot reach https://h/***"
